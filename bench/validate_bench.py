"""Output-check speed: ``validate_output`` against a minimal straight-line implementation.

Takes: ``--n`` (20000 outputs), ``--repeat`` (7 rounds), ``--pass-rate`` (0.7, the share of
generated outputs built to pass). Gives: per implementation, the best per-output time over
the rounds (each round times every implementation once, interleaved, in this one process),
outputs per second, and the ratio to the baseline; the goal is a ratio <= 1.0, the stretch
goal <= 0.67. Also the sentence count alone (``re.split`` + strip vs ``count_sentences``),
since that is where the baseline spends most of its time.

The outputs are realistic TinyStories answers: ~600 characters, 5-10 sentences of short
words, mixed ``.``/``!``/``?``/``...`` endings, the seed's required phrases present or not,
now and then a banned phrase, a missing final stop or a trailing newline. The baseline is
what one writes from the seed spec in a minute (compiled ``[.!?]+`` split, strip, substring
checks on ``lower()``), returning only the labels, so it does less than ``validate_output``
(no reasons, no result object). Both are checked to give the same labels before timing.

    python bench/validate_bench.py
    python bench/validate_bench.py --n 50000 --repeat 11
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from storyforge.tasks.tinystories.validate import SeedChecks, count_sentences, validate_output

OBJECTS = [
    "red ball", "blue kite", "wooden spoon", "yellow umbrella", "green apple", "little boat",
    "shiny key", "paper hat", "warm blanket", "toy train", "old map", "glass jar",
]  # fmt: skip
BANNED = ["dragon", "monster", "the end", "suddenly", "magic wand", "so happy"]
WORDS = [
    "the", "a", "little", "big", "happy", "sad", "kind", "brave", "friend", "tree", "park", "sun",
    "rain", "bird", "dog", "cat", "went", "saw", "found", "gave", "shared", "helped", "said",
    "smiled", "played", "ran", "jumped", "home", "day", "morning", "garden", "water",
]  # fmt: skip
ENDINGS = [".", ".", ".", ".", "!", "?", "...", "!?"]

_SPLIT = re.compile(r"[.!?]+")


def baseline(seed: dict[str, Any], text: object) -> tuple[str, ...]:
    """The seed spec's checks, written straight from its text."""
    if not isinstance(text, str) or not text.strip():
        return ("other",)
    low = text.lower()
    count = 0
    for segment in _SPLIT.split(text):
        if segment.strip():
            count += 1
    labels = []
    for phrase in seed["required"]:
        if phrase.lower() not in low:
            labels.append("missing_required")
            break
    for phrase in seed["banned"]:
        if phrase.lower() in low:
            labels.append("contains_banned")
            break
    if not seed["min_sentences"] <= count <= seed["max_sentences"]:
        labels.append("wrong_sentence_count")
    if len(text) > 2000:
        labels.append("too_long")
    return tuple(labels)


def make_case(rng: random.Random, index: int, pass_rate: float) -> tuple[dict[str, Any], str]:
    """One seed and one ~600-character output for it."""
    required = rng.sample(OBJECTS, rng.randint(2, 4))
    banned = rng.sample(BANNED, rng.randint(0, 2))
    seed = {
        "id": f"ts-{index:06d}",
        "required": required,
        "banned": banned,
        "min_sentences": 6,
        "max_sentences": 9,
    }
    good = rng.random() < pass_rate
    n_sentences = rng.randint(6, 9) if good else rng.choice([4, 5, 6, 7, 8, 10, 11])
    phrases = list(required) if good or rng.random() < 0.5 else required[1:]
    if not good and banned and rng.random() < 0.3:
        phrases.append(banned[0])
    sentences = []
    for i in range(n_sentences):
        words = [rng.choice(WORDS) for _ in range(rng.randint(12, 16))]
        if i < len(phrases):
            words.insert(rng.randint(1, len(words)), phrases[i])
        sentences.append(" ".join(words).capitalize() + rng.choice(ENDINGS))
    text = " ".join(sentences)
    if rng.random() < 0.1:
        text = text.rstrip(".!?")
    if rng.random() < 0.2:
        text += "\n"
    return seed, text


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--pass-rate", type=float, default=0.7)
    args = parser.parse_args()

    rng = random.Random(20240601)
    cases = [make_case(rng, i, args.pass_rate) for i in range(args.n)]
    checks = [SeedChecks.from_seed(seed) for seed, _ in cases]
    prepared = list(zip(checks, (text for _, text in cases), strict=True))
    texts = [text for _, text in cases]

    for seed, text in cases:
        if validate_output(seed, text).labels != baseline(seed, text):
            raise SystemExit(f"label mismatch on {seed['id']}: {text!r}")
    passed = sum(validate_output(seed, text).passed for seed, text in cases)

    def run_baseline() -> None:
        for seed, text in cases:
            baseline(seed, text)

    def run_validate() -> None:
        for seed, text in cases:
            validate_output(seed, text)

    def run_checks() -> None:
        for seed_checks, text in prepared:
            seed_checks.validate(text)

    def count_baseline() -> None:
        for text in texts:
            len([s for s in _SPLIT.split(text) if s.strip()])

    def count_fast() -> None:
        for text in texts:
            count_sentences(text)

    runs: dict[str, Callable[[], None]] = {
        "baseline (straight-line)": run_baseline,
        "validate_output(seed dict)": run_validate,
        "SeedChecks.validate": run_checks,
        "count: re.split + strip": count_baseline,
        "count: count_sentences": count_fast,
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.repeat):
        for name, fn in runs.items():
            times[name].append(timed(fn) / args.n)

    mean_chars = statistics.fmean(len(t) for t in texts)
    print(
        f"{args.n} outputs, mean {mean_chars:.0f} chars, {passed / args.n:.0%} pass; best of {args.repeat} rounds"
    )
    print(f"{'implementation':<28} {'us/output':>10} {'outputs/s':>12} {'ratio':>7}")
    for name in runs:
        best = min(times[name])
        reference = min(
            times["count: re.split + strip" if name.startswith("count") else "baseline (straight-line)"]
        )
        print(f"{name:<28} {best * 1e6:>10.2f} {1 / best:>12,.0f} {best / reference:>7.2f}")
    ratio = min(times["validate_output(seed dict)"]) / min(times["baseline (straight-line)"])
    verdict = "stretch goal met" if ratio <= 0.67 else "goal met" if ratio <= 1.0 else "SLOWER than baseline"
    print(f"validate_output / baseline = {ratio:.2f} ({verdict}; goal <= 1.0, stretch <= 0.67)")


if __name__ == "__main__":
    main()
