"""Near-duplicate search at scale: 100,000 outputs of ~600 characters with planted families.

Takes: ``--outputs`` (100,000), ``--families`` (5,000 families of 2..5 near-copies of one
story, each copy 1..2 word edits away, shingle Jaccard ~0.83..0.95 to its original),
``--signature-sample`` (20,000 texts for the datasketch/rensa comparison). Gives, for the
TinyStories dedup/diversity step exactly as a run calls it (``run_quality`` over a completion
file and a seed file, in a child process so its peak memory is its own):

* wall time and peak RSS of the step, against the goals (< 60 s, < 1 GiB), and against a
  baseline in the same child: reading and parsing the same completion file once;
* recall and precision over planted pairs (two outputs of one family), against the goals
  (recall >= 0.95 at the default threshold 0.8, precision >= 0.99);
* the MinHash signatures of datasketch (what storyforge uses) against rensa's on the same
  shingles: the ratio the choice in pyproject.toml rests on.

    python bench/dedup_bench.py
    python bench/dedup_bench.py --outputs 20000 --families 1000   # quick

Absolute figures move with the machine's load (2 shared cores); ratios compare runs made
one after the other in the same process.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import random
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tqdm import tqdm

from storyforge.quality.dedup import DedupConf
from storyforge.quality.text import shingles, words

VOCAB = [
    "".join(
        random.Random(i).choice("abcdefghijklmnopqrstuvwxyz") for _ in range(random.Random(-i).randint(2, 8))
    )
    for i in range(6000)
]
THEMES = ["friendship", "kindness", "courage", "sharing", "curiosity", "honesty"]


def story(rng: random.Random) -> str:
    """~600 characters: sentences of 6..14 words from a 6,000-word vocabulary."""
    out: list[str] = []
    size = 0
    while size < 600:
        sentence = " ".join(rng.choice(VOCAB) for _ in range(rng.randint(6, 14)))
        sentence = sentence[0].upper() + sentence[1:] + "."
        out.append(sentence)
        size += len(sentence) + 1
    return " ".join(out)


def near_copy(text: str, rng: random.Random) -> str:
    """``text`` with one or two words replaced (each replacement changes 5 shingles of ~100)."""
    tokens = text.split(" ")
    for _ in range(rng.randint(1, 2)):
        i = rng.randrange(len(tokens))
        tokens[i] = rng.choice(VOCAB) + ("." if tokens[i].endswith(".") else "")
    return " ".join(tokens)


def write_inputs(directory: Path, outputs: int, families: int) -> list[int]:
    """The seed and completion files; returns each output's family (-1 for none), by line."""
    rng = random.Random(20261125)
    family_of: list[int] = []
    texts: list[str] = []
    for family in range(families):
        original = story(rng)
        members = [original, *(near_copy(original, rng) for _ in range(rng.randint(1, 4)))]
        texts += members
        family_of += [family] * len(members)
    while len(texts) < outputs:
        texts.append(story(rng))
        family_of.append(-1)
    order = list(range(outputs))
    rng.shuffle(order)  # families scattered over the file, as samples of different seeds would be
    with (
        open(directory / "prompts_seed.jsonl", "w", encoding="utf-8") as seeds,
        open(directory / "completions.jsonl", "w", encoding="utf-8") as completions,
    ):
        for line, index in enumerate(order):
            seed_id = f"ts-{line:06d}"
            seed = {
                "id": seed_id,
                "split": "val" if line % 20 == 0 else "train",
                "theme": THEMES[line % len(THEMES)],
                "protagonist": f"child {line % 97}",
                "required": ["a"] * (2 + line % 3),
                "banned": [],
            }
            seeds.write(json.dumps(seed) + "\n")
            completions.write(json.dumps({"id": seed_id, "output": texts[index]}) + "\n")
    return [family_of[index] for index in order]


def _child(directory: str, queue: Any) -> None:
    from storyforge.tasks.tinystories.completions import read_completions
    from storyforge.tasks.tinystories.dedup_stage import run_quality

    path = Path(directory)
    start = time.perf_counter()
    lines = sum(1 for _ in read_completions(path / "completions.jsonl"))
    read_s = time.perf_counter() - start
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    before = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    quality = run_quality(
        path,
        path / "prompts_seed.jsonl",
        path / "completions.jsonl",
        None,
        dedup=DedupConf(),
    )
    took = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    queue.put(
        {
            "lines": lines,
            "read_s": read_s,
            "dedup_s": took,
            "cpu_s": cpu,
            "peak_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
            "rss_before_kib": base_rss,
            "summary": quality.summary["dedup"] | {"by_field": None},
        }
    )


def planted_scores(directory: Path, family_of: list[int]) -> tuple[float, float, int, int]:
    """Recall and precision over pairs of outputs: planted (same family) vs found (same cluster)."""
    line_of = {f"ts-{line:06d}": line for line in range(len(family_of))}
    found: set[tuple[int, int]] = set()
    with open(directory / "duplicates.jsonl", encoding="utf-8") as fh:
        for raw in fh:
            members = sorted(line_of[m["id"]] for m in json.loads(raw)["members"])
            found.update(itertools.combinations(members, 2))
    by_family: dict[int, list[int]] = {}
    for line, family in enumerate(family_of):
        if family >= 0:
            by_family.setdefault(family, []).append(line)
    planted = {pair for lines in by_family.values() for pair in itertools.combinations(sorted(lines), 2)}
    hits = len(found & planted)
    return hits / len(planted), (hits / len(found) if found else 1.0), len(planted), len(found)


def compare_signatures(directory: Path, n: int) -> tuple[float, float]:
    """Seconds for datasketch and rensa MinHash signatures (128 permutations) of the same ``n`` shingle sets."""
    import rensa
    import xxhash
    from datasketch import MinHash

    sets = []
    with open(directory / "completions.jsonl", encoding="utf-8") as fh:
        for raw in itertools.islice(fh, n):
            sets.append(shingles(words(json.loads(raw)["output"]), 5))
    start = time.perf_counter()
    template = MinHash(num_perm=128, seed=1, scheme="affine32", hashfunc=xxhash.xxh32_intdigest)
    for tokens in tqdm(sets, desc="datasketch", unit=" texts", disable=None):
        minhash = template.copy()
        minhash.update_batch([t.encode() for t in tokens])
    datasketch_s = time.perf_counter() - start
    start = time.perf_counter()
    rensa.RMinHash.digests_from_token_sets(sets, 128, 1)
    rensa_s = time.perf_counter() - start
    return datasketch_s, rensa_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outputs", type=int, default=100_000)
    parser.add_argument("--families", type=int, default=5_000)
    parser.add_argument("--signature-sample", type=int, default=20_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dedup_bench_") as tmp:
        directory = Path(tmp)
        family_of = write_inputs(directory, args.outputs, args.families)
        size = (directory / "completions.jsonl").stat().st_size
        print(f"{args.outputs} outputs ({size / 1e6:.1f} MB), {args.families} planted families")
        queue: Any = multiprocessing.get_context("spawn").Queue()
        child = multiprocessing.get_context("spawn").Process(target=_child, args=(tmp, queue))
        child.start()
        result = queue.get()
        child.join()
        recall, precision, planted, found = planted_scores(directory, family_of)
        datasketch_s, rensa_s = compare_signatures(directory, args.signature_sample)
    dedup_s, peak = result["dedup_s"], result["peak_rss_kib"] / 1024**2
    print(
        f"dedup + diversity step: {dedup_s:.1f} s (goal < 60 s); reading the file alone: {result['read_s']:.1f} s "
        f"(step / read = {dedup_s / result['read_s']:.1f}x); CPU time of the step {result['cpu_s']:.1f} s "
        "(the wall time on a busy shared machine is longer)"
    )
    print(
        f"peak RSS of the child: {peak:.2f} GiB (goal < 1 GiB; {result['rss_before_kib'] / 1024**2:.2f} GiB "
        "before the step)"
    )
    summary = result["summary"]
    print(
        f"clusters {summary['clusters']}, dropped {summary['dropped']} "
        f"({summary['exact_duplicates']} exact, {summary['near_duplicates']} near)"
    )
    print(
        f"planted pairs {planted}, found pairs {found}: recall {recall:.4f} (goal >= 0.95), "
        f"precision {precision:.4f} (goal >= 0.99)"
    )
    print(
        f"signatures of {args.signature_sample} texts: datasketch {datasketch_s:.2f} s, rensa {rensa_s:.2f} s "
        f"(datasketch / rensa = {datasketch_s / rensa_s:.1f}x)"
    )


if __name__ == "__main__":
    main()
