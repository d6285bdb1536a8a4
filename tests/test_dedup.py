"""Exact and near-duplicate outputs: clusters, kept members, explanations and exports.

The clustering is tested on texts with a known shingle Jaccard (planted edits), the export
through ``process_completions`` exactly as a run calls it, and the determinism by a
hypothesis property over input order and batch boundaries.
"""

from __future__ import annotations

import dataclasses
import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storyforge.config.dedup import dedup_settings
from storyforge.errors import ConfigError
from storyforge.quality.dedup import (
    RUN,
    DedupConf,
    Key,
    SignatureBuilder,
    Signatures,
    find_clusters,
    jaccard,
    shingle_hashes,
)
from storyforge.tasks.tinystories.exports import ExportOptions
from storyforge.tasks.tinystories.outputs import process_completions

ROOT = Path(__file__).resolve().parent.parent

WORDS = [f"w{i:04d}" for i in range(5000)]


def base_text(seed: int, n: int = 200) -> str:
    """``n`` distinct words: every 5-word shingle occurs once."""
    return " ".join(random.Random(seed).sample(WORDS, n))


def edited(text: str, edits: int, seed: int = 0) -> str:
    """``text`` with ``edits`` words replaced, 20 words apart (each edit changes 5 shingles)."""
    tokens = text.split()
    for k in range(edits):
        tokens[10 + 20 * k] = f"new{seed}x{k}"
    return " ".join(tokens)


def cluster_texts(texts: dict[Key, str], settings_: DedupConf | None = None, batches: int = 1) -> Any:
    dedup = settings_ or DedupConf()
    keys = list(texts)
    parts = []
    for b in range(batches):
        builder = SignatureBuilder(dedup)
        for index in range(b, len(keys), batches):
            builder.add(keys[index], index, texts[keys[index]])
        parts.append(builder.build())
    signatures = Signatures.concat(parts, dedup.num_perm)
    return find_clusters(signatures, dedup, lambda where: texts[keys[where]])


def k(seed: str, sample: int = 0, attempt: int = 0) -> Key:
    return (RUN, seed, sample, attempt)


def shape(result: Any) -> list[tuple[Key, ...]]:
    """Each cluster as its member keys, kept first."""
    return [tuple(m.key for m in c.members) for c in result.clusters]


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("Once upon a time, a cat sat.", "once upon a time,   a CAT sat."),
        ("Tom ran.\nHe fell.", "  tom ran. he fell.  "),
        ("ＡＢＣ story here", "abc story here"),  # NFKC: full-width letters
    ],
)
def test_exact_duplicates_differing_in_whitespace_and_case(first: str, second: str) -> None:
    result = cluster_texts({k("s1"): first, k("s2"): second})
    assert shape(result) == [(k("s1"), k("s2"))]
    dropped = result.clusters[0].members[1]
    assert (dropped.match, dropped.jaccard, dropped.jaccard_estimated) == ("exact", 1.0, 1.0)


@pytest.mark.parametrize(
    ("edits", "target", "clustered"),
    [(2, 0.90, True), (3, 0.85, True), (7, 0.70, False)],
)
def test_planted_near_duplicates_at_known_jaccard(edits: int, target: float, clustered: bool) -> None:
    """Default threshold 0.8: 0.9 and 0.85 are near-duplicates, 0.7 is not."""
    base = base_text(1)
    variant = edited(base, edits)
    exact = jaccard(shingle_hashes(base, 5), shingle_hashes(variant, 5))
    assert abs(exact - target) < 0.01  # the planted similarity is what the row says
    others = {k(f"o{i}"): base_text(100 + i) for i in range(20)}  # unrelated texts stay alone
    result = cluster_texts({k("s2"): variant, k("s1"): base, **others})
    if clustered:
        assert shape(result) == [(k("s1"), k("s2"))]
        member = result.clusters[0].members[1]
        assert member.match == "near"
        assert member.jaccard == round(exact, 4)
        assert abs(member.jaccard_estimated - exact) < 0.15
    else:
        assert shape(result) == []


@pytest.mark.parametrize(
    ("keys", "kept"),
    [
        ([k("s2", 0), k("s1", 3), k("s1", 1)], k("s1", 1)),  # lowest seed, then sample
        ([k("s1", 2, 1), k("s1", 2, 0)], k("s1", 2, 0)),  # then attempt
        ([k("b", 0), k("a10", 0), k("a9", 0)], k("a10", 0)),  # seed ids compare as strings
        ([k("s9", 0), (0, "000:000000000001", 0, 0)], (0, "000:000000000001", 0, 0)),  # earlier data first
    ],
)
def test_tie_break_keeps_the_lowest_key(keys: list[Key], kept: Key) -> None:
    text = base_text(7)
    texts = {key: edited(text, i % 2) for i, key in enumerate(keys)}
    result = cluster_texts(texts)
    assert len(result.clusters) == 1
    assert result.clusters[0].kept.key == kept
    assert set(result.dropped) == set(keys) - {kept}


def test_empty_run_and_run_of_one() -> None:
    assert shape(cluster_texts({})) == []
    assert shape(cluster_texts({k("s1"): "Just one story."})) == []


def test_chained_members_join_one_cluster_and_report_jaccard_to_the_kept_one() -> None:
    a = base_text(3)
    b = edited(a, 2, seed=1)
    c = edited(b, 4, seed=2)  # close to b, further from a
    result = cluster_texts({k("s1"): a, k("s2"): b, k("s3"): c})
    assert shape(result) == [(k("s1"), k("s2"), k("s3"))]
    to_kept = {m.key: m.jaccard for m in result.clusters[0].members}
    assert to_kept[k("s3")] == round(jaccard(shingle_hashes(a, 5), shingle_hashes(c, 5)), 4)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"threshold": 0.0}, "dedup.threshold"),
        ({"threshold": 1.5}, "dedup.threshold"),
        ({"shingle_words": 0}, "dedup.shingle_words"),
        ({"num_perm": 8}, "dedup.num_perm"),
        ({"against": (Path("/nonexistent/sft.jsonl"),)}, "does not exist"),
        ({"against": (Path("earlier.csv"),)}, "neither .jsonl nor .parquet"),
    ],
)
def test_bad_settings_name_the_key(change: dict[str, Any], message: str) -> None:
    """Settings built in code meet the group's rules where outputs are signed, as a run's config does."""
    with pytest.raises(ConfigError, match=message):
        SignatureBuilder(DedupConf(**change))


FAMILY = [base_text(50 + i) for i in range(4)]


@settings(max_examples=25, deadline=None)
@given(
    members=st.lists(
        st.tuples(st.sampled_from(["s1", "s2", "s3", "s4", "s5"]), st.integers(0, 2), st.integers(0, 5)),
        min_size=0,
        max_size=14,
        unique_by=lambda t: t[:2],
    ),
    order=st.randoms(use_true_random=False),
    batches=st.integers(1, 4),
)
def test_input_order_and_batches_never_change_clusters(
    members: list[tuple[str, int, int]], order: random.Random, batches: int
) -> None:
    """Shuffling the input (and splitting it as shards do) gives the same clusters and kept members."""
    texts = {}
    for seed, sample, variant in members:
        family = FAMILY[variant % len(FAMILY)]
        texts[k(seed, sample)] = edited(family, variant // 2, seed=variant) if variant < 4 else family.upper()
    reference = cluster_texts(texts)
    shuffled = list(texts.items())
    order.shuffle(shuffled)
    again = cluster_texts(dict(shuffled), batches=batches)
    assert shape(again) == shape(reference)
    assert [c.id for c in again.clusters] == [c.id for c in reference.clusters]
    assert [[(m.match, m.jaccard) for m in c.members] for c in again.clusters] == [
        [(m.match, m.jaccard) for m in c.members] for c in reference.clusters
    ]


# --- through the completion stage -------------------------------------------------------------

STORY = (
    "Mia found a red ball in the park. She said hello to a happy dog. "
    "They played all day with the ball. At night Mia went home and slept."
)
OTHER = (
    "Leo built a small boat from wood. He sailed it on the quiet lake. "
    "A duck swam beside the boat. Leo laughed and waved at the duck."
)


def seed(seed_id: str, theme: str = "friendship") -> dict[str, Any]:
    return {
        "id": seed_id,
        "split": "train",
        "theme": theme,
        "protagonist": "Mia",
        "required": ["ball"],
        "banned": [],
        "min_sentences": 3,
        "max_sentences": 5,
        "instruction": f"Write a story ({seed_id}).",
    }


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), "utf-8")
    return path


def run_stage(tmp_path: Path, completions: list[dict[str, Any]], dedup: dict[str, Any]) -> dict[str, Any]:
    """The completion stage with the ``dedup`` group ``dedup`` (read as a run reads it)."""
    seeds = write_jsonl(tmp_path / "prompts_seed.jsonl", [seed("s1"), seed("s2", "kindness"), seed("s3")])
    source = write_jsonl(tmp_path / "completions.jsonl", completions)
    return process_completions(
        ExportOptions(), tmp_path / "out", seeds, None, source, dedup=dedup_settings({"dedup": dedup})
    )


def read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text("utf-8").splitlines()]


def test_repeats_go_to_rejects_with_the_data_label_and_are_never_chosen(tmp_path: Path) -> None:
    completions = [
        {"id": "s2", "sample": 0, "output": STORY},  # the same story, but a later seed
        {"id": "s1", "sample": 1, "output": "  " + STORY.upper()},  # exact repeat, lowest key: kept
        {"id": "s1", "sample": 0, "output": "The end."},  # fails the checks
        {"id": "s3", "sample": 0, "output": OTHER + " The ball was gone."},
        {"id": "s2", "sample": 1, "output": "A ball. Gone."},  # fails: would pair with s2/0 if it passed
    ]
    summary = run_stage(tmp_path, completions, {})
    out = tmp_path / "out"
    assert [(r["id"], r["sample"]) for r in read(out / "sft.jsonl")] == [("s1", 1), ("s3", 0)]
    rejects = {(r["id"], r["sample"]): r for r in read(out / "rejects.jsonl")}
    repeat = rejects[("s2", 0)]
    assert repeat["labels"] == [] and repeat["data_labels"] == ["near_duplicate"]
    assert repeat["cluster"] == "dup-000001"
    assert rejects[("s1", 0)]["data_labels"] == [] and rejects[("s1", 0)]["labels"]
    assert all(row["chosen_sample"] != 0 or row["id"] != "s2" for row in read(out / "dpo.jsonl"))
    assert [row["id"] for row in read(out / "dpo.jsonl")] == ["s1"]  # s2's only pass was a repeat
    (cluster,) = read(out / "duplicates.jsonl")
    assert cluster["kept"] == {"id": "s1", "sample": 1, "attempt": 0}
    assert [(m["id"], m["sample"], m["match"], m["kept"]) for m in cluster["members"]] == [
        ("s1", 1, "kept", True),
        ("s2", 0, "exact", False),
    ]
    assert cluster["members"][1]["shared_shingles"][0] == "mia found a red ball"
    assert cluster["members"][1]["shared_shingle_count"] > 10
    dedup = summary["dedup"]
    assert (dedup["texts"], dedup["dropped"], dedup["exact_duplicates"], dedup["near_duplicates"]) == (
        5,
        1,
        1,
        0,
    )
    by_theme = {row["value"]: row for row in dedup["by_field"]["theme"]}
    assert by_theme["kindness"] == {"value": "kindness", "outputs": 2, "duplicates": 1, "rate": 0.5}
    assert summary["diversity"]["run"]["exact_duplicate_rate"] == 0.2
    rejects_table = pq.read_table(out / "rejects.parquet")
    assert rejects_table.column("data_labels").to_pylist().count(["near_duplicate"]) == 1


def test_dedup_off_keeps_every_passing_output(tmp_path: Path) -> None:
    completions = [{"id": "s1", "output": STORY}, {"id": "s2", "output": STORY}]
    summary = run_stage(tmp_path, completions, {"enabled": False})
    assert len(read(tmp_path / "out" / "sft.jsonl")) == 2
    assert summary["dedup"] == {"enabled": False}
    assert not (tmp_path / "out" / "duplicates.jsonl").exists()
    assert summary["diversity"]["run"]["texts"] == 2  # the figures are still there


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_against_an_earlier_export_drops_what_it_already_holds(tmp_path: Path, kind: str) -> None:
    earlier_rows = [
        {
            "id": "old-7",
            "sample": 0,
            "split": "train",
            "messages": [
                {"role": "user", "content": "Write."},
                {"role": "assistant", "content": edited(STORY, 0) + " The dog barked."},
            ],
        },
        {"id": "old-8", "sample": 0, "split": "train", "messages": [{"role": "user", "content": "Hi"}]},
    ]
    if kind == "jsonl":
        earlier = write_jsonl(tmp_path / "sft.jsonl", earlier_rows)
    else:
        earlier = tmp_path / "sft.parquet"
        pq.write_table(pa.Table.from_pylist(earlier_rows), earlier)
    completions = [{"id": "s1", "output": STORY}, {"id": "s3", "output": OTHER + " A ball."}]
    summary = run_stage(tmp_path, completions, {"against": str(earlier)})
    out = tmp_path / "out"
    assert [r["id"] for r in read(out / "sft.jsonl")] == ["s3"]
    (cluster,) = read(out / "duplicates.jsonl")
    assert cluster["kept"] == {"source": earlier.name, "row": 1, "id": "old-7", "sample": 0}
    member = cluster["members"][1]
    assert (member["id"], member["match"]) == ("s1", "near") and member["jaccard"] >= 0.8
    assert summary["dedup"]["against_duplicates"] == 1
    assert summary["dedup"]["against"] == [str(earlier)]


def test_empty_completion_file_and_a_run_of_one(tmp_path: Path) -> None:
    summary = run_stage(tmp_path, [], {})
    assert summary["dedup"]["texts"] == 0 and summary["dedup"]["clusters"] == 0
    assert summary["diversity"]["run"]["distinct_1"] is None
    assert summary["diversity"]["run"]["duplicate_rate"] is None
    assert (tmp_path / "out" / "duplicates.jsonl").read_bytes() == b""
    one = run_stage(tmp_path, [{"id": "s1", "output": STORY}], {})
    assert one["dedup"]["texts"] == 1 and one["dedup"]["dropped"] == 0
    assert one["diversity"]["run"]["self_bleu"] is None  # needs two texts
    assert one["diversity"]["run"]["duplicate_rate"] == 0.0


@pytest.mark.parametrize(
    ("node", "message"),
    [
        ({"threshold": 2.0}, "dedup.threshold must be in"),
        ({"thresold": 0.5}, "dedup.thresold"),
        ({"against": 3}, "dedup.against must be a path"),
        ({"diversity": {"bleu_sample": 1}}, "dedup.diversity.bleu_sample"),
    ],
)
def test_config_errors_name_the_key(node: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        dedup_settings({"dedup": node})


@pytest.mark.parametrize(
    "against", ["earlier.jsonl", ["earlier.jsonl", "older.parquet"]], ids=["path", "list"]
)
def test_the_groups_settings_are_its_schema_checked_absolute_and_sealed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, against: str | list[str]
) -> None:
    """``dedup.against`` (a path or a list) becomes absolute paths; nothing of the group can change."""
    monkeypatch.chdir(tmp_path)
    names = [against] if isinstance(against, str) else against
    for name in names:
        (tmp_path / name).touch()
    conf = dedup_settings({"dedup": {"against": against, "diversity": {"sample": 7}}})
    assert isinstance(conf, DedupConf) and conf.diversity.sample == 7
    assert conf.against_files == tuple(tmp_path / name for name in names)
    with pytest.raises(dataclasses.FrozenInstanceError):
        conf.threshold = 0.5
    with pytest.raises(dataclasses.FrozenInstanceError):
        conf.diversity.sample = 1


def test_signing_loads_datasketchs_minhash_without_scipy() -> None:
    """MinHash comes from datasketch without the package's ``__init__`` (which loads scipy for
    its LSH classes); a later ``import datasketch`` gives the same class, and the signatures
    are the ones the whole package's MinHash computes."""
    script = (
        "import json, sys\n"
        "from storyforge.quality.dedup import DedupConf, SignatureBuilder\n"
        "builder = SignatureBuilder(DedupConf())\n"
        "builder.add((1, 's', 0, 0), 0, 'the cat sat on the mat and looked at the dog there')\n"
        "loaded = sorted(m for m in ('scipy', 'datasketch', 'datasketch.lsh') if m in sys.modules)\n"
        "import datasketch, xxhash\n"
        "from datasketch.minhash import MinHash\n"
        "whole = datasketch.MinHash(num_perm=128, seed=1, scheme='affine32', hashfunc=xxhash.xxh32_intdigest)\n"
        "whole.update_batch([s.encode() for s in ['the cat sat on the', 'cat sat on the mat',\n"
        "    'sat on the mat and', 'on the mat and looked', 'the mat and looked at',\n"
        "    'mat and looked at the', 'and looked at the dog', 'looked at the dog there']])\n"
        "same = whole.hashvalues.astype('uint32').tolist() == builder.build().minhash[0].tolist()\n"
        "print(json.dumps([loaded, datasketch.MinHash is MinHash, same]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True, timeout=120
    )
    assert json.loads(proc.stdout) == [[], True, True]
