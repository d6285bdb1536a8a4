"""What regeneration did: pass rate by attempt and label transitions.

Takes: one :meth:`AttemptStats.add` per validated attempt of ``attempts.jsonl`` (chain, attempt
number, verdict). Gives: the ``regeneration`` section of ``report/summary.json``
(:meth:`AttemptStats.summary`) and its Markdown (:func:`attempts_markdown`); the
``export.dpo_pairing=attempts`` pairs are :class:`storyforge.tasks.tinystories.exports.AttemptPairs`.

Pass rate by attempt: of the chains (a seed's sample), the share passing at attempt 1, by
attempt 2, ..., by attempt K, each with a 95% Wilson score interval. Transitions: for every
failed attempt followed by another, each of its labels counts once towards what the next
attempt turned out to be (``pass`` or each of its labels), so one reads which failures the
next attempt repairs and which it trades for another.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from storyforge.tasks.tinystories.validate import LABELS

__all__ = [
    "AttemptStats",
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
