"""Variety figures of a set of outputs, and which seed fields go with repeats.

Takes: texts under a sort key (grouped by the caller: the run, each theme, each split) and
:class:`DiversityConf`. Gives:

* :class:`BottomSample`: the ``sample`` texts with the lowest hash of their key. It is the
  same set whatever the order the texts arrive in or how they were split among workers
  (:meth:`BottomSample.merge`), and bounds memory; when a group has no more texts than
  ``sample`` the figures are exact.
* :func:`diversity_metrics`: distinct-1/2/3, compression ratio, self-BLEU, the share of the
  top openings and the most repeated 4-grams of one group's sample (definitions in
  docs/diversity.md, repeated in each function's docstring).
* :func:`attribution`: the duplicate rate of outputs by the value of each seed field.
"""

from __future__ import annotations

import bisect
import hashlib
import heapq
import random
import zlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from storyforge.errors import ConfigError
from storyforge.extras import require
from storyforge.quality.text import opening, words
from storyforge.sealed import Sealed

__all__ = [
    "BottomSample",
    "DiversityConf",
    "attribution",
    "compression_ratio",
    "distinct_n",
    "diversity_metrics",
    "rank",
    "self_bleu",
]


@dataclass
class DiversityConf(Sealed):
    """``dedup.diversity``: whether the figures are computed, and how much of each group they
    read (the schema :mod:`storyforge.config.dedup` registers; :meth:`check` holds its rules)."""

    enabled: bool = True
    """``dedup.diversity.enabled=false``: no figures (nothing is sampled or scored)."""
    sample: int = 5000
    """Texts of the whole run the figures are computed on (those whose key hashes lowest)."""
    group_sample: int = 1000
    """The same for each theme and split."""
    bleu_sample: int = 200
    """Texts of that sample scored for self-BLEU, each against the other ``bleu_sample - 1``."""
    bleu_seed: int = 0
    top_openings: int = 20
    top_ngrams: int = 10

    def check(self) -> None:
        """The rules the schema's types do not say; :class:`ConfigError` names the key."""
        if self.sample < 1 or self.group_sample < 1:
            raise ConfigError(
                f"dedup.diversity.sample and group_sample must be >= 1, got {self.sample}, {self.group_sample}"
            )
        if not 2 <= self.bleu_sample <= 1000:
            raise ConfigError(f"dedup.diversity.bleu_sample must be in 2..1000, got {self.bleu_sample}")
        if self.top_openings < 1 or self.top_ngrams < 0:
            raise ConfigError("dedup.diversity.top_openings must be >= 1 and top_ngrams >= 0")


def rank(key: Any) -> int:
    """The 64-bit hash of ``key`` that orders a :class:`BottomSample`."""
    return int.from_bytes(hashlib.blake2b(repr(key).encode(), digest_size=8).digest(), "big")


class BottomSample:
    """The ``size`` texts whose key hashes lowest: order- and partition-independent."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.count = 0
        self._heap: list[tuple[int, Any, str]] = []  # (-rank, key, text): a max-heap of the kept

    def add(self, key: Any, text: str, rank_: int | None = None) -> None:
        """Offer ``text``; ``rank_`` is ``rank(key)`` when the caller already has it."""
        self.count += 1
        item = (-(rank(key) if rank_ is None else rank_), key, text)
        if len(self._heap) < self.size:
            heapq.heappush(self._heap, item)
        elif item > self._heap[0]:
            heapq.heapreplace(self._heap, item)

    def merge(self, other: BottomSample) -> None:
        count = self.count + other.count
        for negative, key, text in other._heap:
            self.add(key, text, -negative)
        self.count = count

    def texts(self) -> list[str]:
        """The kept texts in key order."""
        return [text for _, _, text in sorted(self._heap, key=lambda item: item[1])]


class _Distinct:
    """:func:`distinct_n` over texts given one at a time (their tokens need not all be held)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.total = 0
        self.seen: set[tuple[str, ...]] = set()

    def add(self, tokens: Sequence[str]) -> None:
        n = self.n
        self.total += max(len(tokens) - n + 1, 0)
        self.seen.update(zip(*(tokens[i:] for i in range(n)), strict=False))  # the n-grams as tuples

    def ratio(self) -> float | None:
        return round(len(self.seen) / self.total, 4) if self.total else None


def distinct_n(token_lists: Iterable[Sequence[str]], n: int) -> float | None:
    """Distinct n-grams over all n-grams of the texts (each text's own n-grams; none across)."""
    distinct = _Distinct(n)
    for tokens in token_lists:
        distinct.add(tokens)
    return distinct.ratio()


def compression_ratio(texts: Sequence[str]) -> float | None:
    """UTF-8 bytes of the texts joined by newlines over their zlib (level 6) size: higher = more repetitive."""
    joined = "\n".join(texts).encode()
    return round(len(joined) / len(zlib.compress(joined, 6)), 4) if joined else None


def self_bleu(texts: Sequence[str], *, sample: int, seed: int) -> float | None:
    """Mean sentence BLEU of each of ``sample`` texts drawn with ``random.Random(seed)`` against
    all the other drawn texts as its references, on sacrebleu's 0..100 scale.

    Each score is exactly ``sacrebleu.sentence_bleu(text, others)`` (13a tokens, BLEU-4,
    exponential smoothing, effective order); the n-grams of each text are extracted once and
    each text's clipping counts come from the best and second-best count of every n-gram, so
    the cost grows with ``sample`` instead of ``sample`` squared. ``None`` for fewer than two texts.
    """
    if len(texts) < 2:
        return None
    drawn = random.Random(seed).sample(list(texts), min(sample, len(texts)))
    # sacrebleu only when scored: a run that only renders prompts imports this module for
    # its settings and stays small.
    require("sacrebleu", extra="quality", for_what="the diversity metrics (self-BLEU)")
    from sacrebleu.metrics.bleu import BLEU
    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

    tokenize = _tokenizer(Tokenizer13a)
    lengths: list[int] = []  # of each drawn text; its n-grams are folded into best and let go
    best: dict[tuple[str, ...], tuple[int, int, int]] = {}  # n-gram -> (max count, its text, second)
    get = best.get
    for index, text in enumerate(drawn):
        grams, length = _ngrams(tokenize(text.rstrip()))
        lengths.append(length)
        for gram, count in grams.items():
            top = get(gram)
            if top is None:
                best[gram] = (count, index, 0)
            elif count > top[0]:
                best[gram] = (count, index, top[0])
            elif count > top[2]:
                best[gram] = (top[0], top[1], count)
    # A text's clipped count of an n-gram is its own count, but where it alone holds the most
    # (then the most any other text holds): take each such text's excess off its n-grams.
    excess = [0] * (4 * len(drawn))
    for gram, (most, index, second) in best.items():
        if most > second:
            excess[4 * index + len(gram) - 1] += most - second
    del best
    ordered = sorted(lengths)
    scores = []
    for index, length in enumerate(lengths):
        # every position of an n-gram is counted: the text's n-grams of each order
        total = [max(length - n, 0) for n in range(4)]
        correct = [total[n] - excess[4 * index + n] for n in range(4)]
        score = BLEU.compute_bleu(
            correct, total, length, _closest(ordered, length), smooth_method="exp", effective_order=True
        )
        scores.append(score.score)
    return round(sum(scores) / len(scores), 2)


def _ngrams(line: str) -> tuple[Counter[tuple[str, ...]], int]:
    """The counts of the 1- to 4-grams of the tokenized ``line`` (as tuples) and its length:
    what sacrebleu's ``extract_all_word_ngrams(line, 1, 4)`` gives, counted in C."""
    tokens = line.split()
    grams: Counter[tuple[str, ...]] = Counter()
    for n in range(1, 5):
        grams.update(zip(*(tokens[i:] for i in range(n)), strict=False))
    return grams, len(tokens)


def _closest(lengths: Sequence[int], length: int) -> int:
    """sacrebleu's reference length for a text of ``length`` among the others of ``lengths``
    (all the texts' lengths, sorted, this one's included): the closest, the shorter on a tie."""
    lo, hi = bisect.bisect_left(lengths, length), bisect.bisect_right(lengths, length)
    if hi - lo > 1:  # another text of the same length
        return length
    below = lengths[lo - 1] if lo > 0 else None
    above = lengths[hi] if hi < len(lengths) else None
    if above is None or (below is not None and length - below <= above - length):
        assert below is not None
        return below
    return above


_TOKENIZERS: dict[type, Any] = {}


def _tokenizer(kind: type) -> Any:
    """One tokenizer of ``kind`` for the process: sacrebleu caches its tokenized lines per
    instance, so a text scored in several groups (the run, its theme, its split) is split once."""
    tokenize = _TOKENIZERS.get(kind)
    if tokenize is None:
        tokenize = _TOKENIZERS[kind] = kind()
    return tokenize


def diversity_metrics(texts: Sequence[str], settings: DiversityConf) -> dict[str, Any]:
    """The variety figures of ``texts`` (one group's sample, in key order); ``settings`` is
    held to :meth:`DiversityConf.check` (settings built in code as a run's config)."""
    settings.check()
    # One pass, each text's tokens let go once counted (a group's tokens are never all held).
    distinct = [_Distinct(n) for n in (1, 2, 3)]
    openings: Counter[str] = Counter()
    fourgrams: Counter[str] = Counter()
    for text in texts:
        t = words(text)
        for counter in distinct:
            counter.add(t)
        if t:
            openings[opening(t)] += 1
        fourgrams.update(set(map(" ".join, zip(t, t[1:], t[2:], t[3:], strict=False))))
    top = openings.most_common(settings.top_openings)
    n = len(texts)
    return {
        "texts": n,
        "distinct_1": distinct[0].ratio(),
        "distinct_2": distinct[1].ratio(),
        "distinct_3": distinct[2].ratio(),
        "compression_ratio": compression_ratio(texts),
        "self_bleu": self_bleu(texts, sample=settings.bleu_sample, seed=settings.bleu_seed),
        # only openings two or more outputs share count: with every opening different the
        # share is 0, however few outputs there are
        "top_openings_share": round(sum(c for _, c in top if c > 1) / n, 4) if n else None,
        "top_openings": [{"opening": text, "count": count} for text, count in top],
        "repeated_4grams": [
            {"ngram": opening(gram.split(" "), 4), "texts": count, "share": round(count / n, 4)}
            for gram, count in heapq.nsmallest(
                settings.top_ngrams, fourgrams.items(), key=lambda kv: (-kv[1], kv[0])
            )
            if count > 1
        ],
    }


def attribution(
    outputs: Iterable[tuple[str, bool]], fields: Mapping[str, Mapping[str, str]], *, top: int = 20
) -> dict[str, list[dict[str, Any]]]:
    """Per seed field, per value: outputs, dropped duplicates and their rate, highest rate first
    (the ``top`` values of each field, so a field with thousands of values stays readable).

    ``outputs`` holds (seed id, dropped as a duplicate) per output; ``fields`` seed id -> the
    seed's field values (for instance theme, protagonist, required-phrase count).
    """
    counts: dict[str, dict[str, list[int]]] = {}
    for seed_id, dropped in outputs:
        for name, value in fields.get(seed_id, {}).items():
            entry = counts.setdefault(name, {}).setdefault(value, [0, 0])
            entry[0] += 1
            entry[1] += dropped
    out: dict[str, list[dict[str, Any]]] = {}
    for name, values in sorted(counts.items()):
        ranked = sorted(values.items(), key=lambda kv: (-kv[1][1] / kv[1][0], -kv[1][0], kv[0]))
        out[name] = [
            {"value": value, "outputs": total, "duplicates": dup, "rate": round(dup / total, 4)}
            for value, (total, dup) in ranked[:top]
        ]
    return out
