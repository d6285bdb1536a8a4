"""What regeneration did: pass rate by attempt, label transitions, and attempt pairs for DPO.

Takes: one :meth:`AttemptStats.add` per validated attempt of ``attempts.jsonl`` (chain, attempt
number, verdict) and the passing / failing attempts for :class:`AttemptPairs`. Gives: the
``regeneration`` section of ``report/summary.json`` (:meth:`AttemptStats.summary`), its
Markdown (:func:`attempts_markdown`) and the ``export.dpo_pairing=attempts`` pairs.

Pass rate by attempt: of the chains (a seed's sample), the share passing at attempt 1, by
attempt 2, ..., by attempt K, each with a 95% Wilson score interval. Transitions: for every
failed attempt followed by another, each of its labels counts once towards what the next
attempt turned out to be (``pass`` or each of its labels), so one reads which failures the
next attempt repairs and which it trades for another.

Attempt pairs: chosen = the chain's passing attempt, rejected = the failed attempt just before
it (the answer the passing one repaired), prompt = the original prompt. A chain that never
passed, or passed at once, gives no pair; failed attempts labelled ``other`` (empty, non-text)
are never the rejected side.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from storyforge.tasks.tinystories.validate import LABELS

__all__ = [
    "AttemptPair",
    "AttemptPairs",
    "AttemptStats",
    "JudgeMarginPairs",
    "attempts_markdown",
    "percent",
    "wilson",
    "wilson_interval",
]

Z95 = 1.959963984540054


def wilson_interval(passed: int, total: int, z: float = Z95) -> tuple[float, float] | None:
    """The Wilson score interval of ``passed / total`` (None when ``total`` is 0).

    Unlike the normal approximation it stays inside [0, 1] and is not empty at 0 or n passes.
    """
    if total <= 0:
        return None
    p = passed / total
    z2 = z * z
    denominator = 1 + z2 / total
    center = (p + z2 / (2 * total)) / denominator
    half = z * math.sqrt(p * (1 - p) / total + z2 / (4 * total * total)) / denominator
    return max(0.0, center - half), min(1.0, center + half)


def percent(rate: float | None) -> str:
    """A rate as the reports show it: ``12.3%``, or ``n/a`` when there is none."""
    return "n/a" if rate is None else f"{100 * rate:.1f}%"


def wilson(passed: int, total: int) -> tuple[float, float] | None:
    """:func:`wilson_interval` at 95%, each end rounded to 4 places (as the reports show it)."""
    interval = wilson_interval(passed, total)
    return None if interval is None else (round(interval[0], 4), round(interval[1], 4))


@dataclass(slots=True)
class AttemptStats:
    """Running counts over the attempts of every chain (memory: one entry per open chain)."""

    chains: int = 0
    # attempt k -> chains whose first pass is at attempt k
    first_pass: Counter[int] = field(default_factory=Counter)
    attempts: Counter[int] = field(default_factory=Counter)
    transitions: Counter[tuple[str, str]] = field(default_factory=Counter)
    max_attempt: int = 1
    _open: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def add(self, *, chain: str, attempt: int, passed: bool, labels: tuple[str, ...], final: bool) -> None:
        """One attempt, in chain order (attempt 1 first)."""
        if attempt == 1:
            self.chains += 1
        self.attempts[attempt] += 1
        self.max_attempt = max(self.max_attempt, attempt)
        before = self._open.pop(chain, None)
        if before is not None:
            for label in before:
                if passed:
                    self.transitions[(label, "pass")] += 1
                else:
                    for after in labels:
                        self.transitions[(label, after)] += 1
        if passed:
            self.first_pass[attempt] += 1
        elif not final:
            self._open[chain] = labels

    def update(self, other: AttemptStats) -> None:
        """Add another part's counts (its chains are disjoint from these)."""
        self.chains += other.chains
        self.first_pass.update(other.first_pass)
        self.attempts.update(other.attempts)
        self.transitions.update(other.transitions)
        self.max_attempt = max(self.max_attempt, other.max_attempt)

    def summary(self, max_attempts: int | None = None) -> dict[str, Any]:
        """The ``regeneration`` section: pass rate by attempt with intervals, transitions."""
        top = max(max_attempts or 1, self.max_attempt)
        by_attempt = []
        passed = 0
        for k in range(1, top + 1):
            passed += self.first_pass.get(k, 0)
            interval = wilson(passed, self.chains)
            by_attempt.append(
                {
                    "attempt": k,
                    "requests": self.attempts.get(k, 0),
                    "passed_by": passed,
                    "pass_rate": round(passed / self.chains, 4) if self.chains else None,
                    "interval_95": list(interval) if interval else None,
                }
            )
        targets = ["pass", *LABELS]
        return {
            "chains": self.chains,
            "by_attempt": by_attempt,
            "transitions": {
                label: {target: self.transitions.get((label, target), 0) for target in targets}
                for label in LABELS
                if any(self.transitions.get((label, target), 0) for target in targets)
            },
        }


def attempts_markdown(section: Mapping[str, Any]) -> str:
    """The report's regeneration section as Markdown tables."""
    lines = [
        "## Regeneration",
        "",
        f"{section['chains']} chains (one per seed and sample).",
        "",
        "| attempt | requests | passed by then | pass rate | 95% interval |",
        "|---:|---:|---:|---:|---|",
    ]
    for row in section["by_attempt"]:
        rate = percent(row["pass_rate"])
        interval = row["interval_95"]
        shown = "n/a" if interval is None else f"{percent(interval[0])} to {percent(interval[1])}"
        lines.append(f"| ≤{row['attempt']} | {row['requests']} | {row['passed_by']} | {rate} | {shown} |")
    transitions = section["transitions"]
    if transitions:
        targets = ["pass", *LABELS]
        lines += [
            "",
            "What each label of a failed attempt turned into on the next attempt:",
            "",
            "| label | " + " | ".join(targets) + " |",
            "|---|" + "---:|" * len(targets),
        ]
        for label, row in transitions.items():
            lines.append(f"| {label} | " + " | ".join(str(row[target]) for target in targets) + " |")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptPair:
    """A chain's passing attempt and the failed one before it, with their file offsets."""

    seed_id: str
    sample: int
    chosen_attempt: int
    chosen_offset: int
    rejected_attempt: int
    rejected_offset: int
    rejected_labels: tuple[str, ...]


class AttemptPairs:
    """Keeps, per chain, its last usable failed attempt and its passing one."""

    def __init__(self) -> None:
        self._fails: dict[tuple[str, int], tuple[int, int, tuple[str, ...]]] = {}
        self._pairs: dict[str, list[AttemptPair]] = {}

    def add_fail(self, seed_id: str, sample: int, attempt: int, offset: int, labels: tuple[str, ...]) -> None:
        self._fails[(seed_id, sample)] = (attempt, offset, labels)

    def add_pass(self, seed_id: str, sample: int, attempt: int, offset: int) -> None:
        failed = self._fails.pop((seed_id, sample), None)
        if failed is None or failed[0] != attempt - 1:
            return
        self._pairs.setdefault(seed_id, []).append(
            AttemptPair(
                seed_id=seed_id,
                sample=sample,
                chosen_attempt=attempt,
                chosen_offset=offset,
                rejected_attempt=failed[0],
                rejected_offset=failed[1],
                rejected_labels=failed[2],
            )
        )

    def seeds_with_pairs(self) -> int:
        return len(self._pairs)

    def pairs(self, seed_order: Iterable[str]) -> Iterator[AttemptPair]:
        """The pairs seed by seed in ``seed_order``, then by sample."""
        for seed_id in seed_order:
            yield from sorted(self._pairs.get(seed_id, ()), key=lambda pair: pair.sample)


def attempt_dpo_record(
    pair: AttemptPair,
    split: str | None,
    prompt: list[Any],
    chosen: str,
    rejected: str,
    finish_reasons: tuple[str | None, str | None] = (None, None),
) -> dict[str, Any]:
    """A TRL conversational preference row from one chain (the original prompt, never the
    repair conversation), plus which attempts were paired."""
    from storyforge.tasks.tinystories.exports import Pair, dpo_record

    same_sample = Pair(
        seed_id=pair.seed_id,
        chosen_sample=pair.sample,
        chosen_offset=pair.chosen_offset,
        rejected_sample=pair.sample,
        rejected_offset=pair.rejected_offset,
        rejected_labels=pair.rejected_labels,
    )
    return dpo_record(same_sample, split, prompt, chosen, rejected, finish_reasons) | {
        "chosen_attempt": pair.chosen_attempt,
        "rejected_attempt": pair.rejected_attempt,
    }


class JudgeMarginPairs:
    """``export.dpo_pairing=judge_margin``: per seed, the answer the judge rated best against one
    it failed, with their score difference (``margin``) when the verdict schema has a ``score``.

    Chosen: a passing answer (rules and judge), the highest ``score`` first, then the lowest
    sample. Rejected: an answer that passed the rules but the judge failed, the lowest ``score``
    first, then the lowest sample. Memory: one candidate of each kind per seed.
    """

    def __init__(self) -> None:
        self._best: dict[str, tuple[float, int, int, float | None]] = {}
        self._worst: dict[str, tuple[float, int, int, float | None, tuple[str, ...]]] = {}

    def add_pass(self, seed_id: str, sample: int, offset: int, score: float | None) -> None:
        entry = (-(score if score is not None else math.inf), sample, offset, score)
        if seed_id not in self._best or entry[:2] < self._best[seed_id][:2]:
            self._best[seed_id] = entry

    def add_judged_fail(
        self, seed_id: str, sample: int, offset: int, score: float | None, labels: tuple[str, ...]
    ) -> None:
        entry = (score if score is not None else -math.inf, sample, offset, score, labels)
        if seed_id not in self._worst or entry[:2] < self._worst[seed_id][:2]:
            self._worst[seed_id] = entry

    def seeds_with_pairs(self) -> int:
        return sum(1 for seed_id in self._best if seed_id in self._worst)

    def pairs(self, seed_order: Iterable[str]) -> Iterator[tuple[Any, float | None]]:
        """(Pair, margin) seed by seed in ``seed_order``."""
        from storyforge.tasks.tinystories.exports import Pair

        for seed_id in seed_order:
            best, worst = self._best.get(seed_id), self._worst.get(seed_id)
            if best is None or worst is None:
                continue
            margin = round(best[3] - worst[3], 6) if best[3] is not None and worst[3] is not None else None
            yield (
                Pair(
                    seed_id=seed_id,
                    chosen_sample=best[1],
                    chosen_offset=best[2],
                    rejected_sample=worst[1],
                    rejected_offset=worst[2],
                    rejected_labels=worst[4],
                ),
                margin,
            )
