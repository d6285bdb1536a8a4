"""The run's error budget: failed requests and judge errors counted over every pass of a run.

Takes: ``provider.max_error_rate``, the run's shape (``regenerate.max_attempts``, whether a
judge runs) and, pass by pass, what the runner and the judge report: a pass's requests, each
request that failed after every retry, each judged answer with no valid verdict. Gives:
:class:`ErrorBudget`, which stops the run (:class:`~storyforge.errors.ProviderError`, exit
status 4) as soon as its error rate is certain to end above the limit, and
:func:`run_error_counts`, the whole run's count read from the manifest's figures.

The rate: errors over units, where a unit is a generation request of any attempt (its journal
line, kept from an earlier run or sent now) or an answer sent to the judge, and an error is a
request that failed after every retry or a judged answer left without a valid verdict after
``judge.retries``. Counting over the whole run, not per pass, is what lets 2 failed repair
requests out of 102 pass under a 5% limit, and lets a server that dies mid-run be stopped
after the few failures that already exceed the limit over the most units the run can still
have: a chain of attempt ``k`` has at most ``max_attempts - k`` more attempts, each judged at
most once.

Which URLs have answered is kept here too, so the runner's no-answer check
(:class:`~storyforge.providers.sending.FailFast`) does not start again at each pass: a repair
pass whose few requests all fail on a server that answered attempt 1 is not a dead URL.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from storyforge.errors import ProviderError

__all__ = ["ErrorBudget", "RunErrors", "run_error_counts"]


@dataclass(slots=True, kw_only=True)
class ErrorBudget:
    """Errors and units of a run so far, checked against the limit (see the module)."""

    max_error_rate: float
    attempts: int = 1
    """``regenerate.max_attempts``: the most attempts a chain can have."""
    judged: bool = False
    """Whether a judge runs (each attempt's passing answers are judged once)."""
    attempt: int = 1
    """The attempt the passes now running belong to (the caller sets it)."""
    answered: set[str] = field(default_factory=set)
    """The provider URLs that have answered a request in this run."""
    units: int = 0
    errors: int = 0
    judge_errors: int = 0
    _chains: int = 0
    _pass: list[int] | None = None
    """The running generation pass's units and errors."""
    _grown: int = 0
    _ended: int = 0

    def start(self, stage: str, total: int, kept_errors: int) -> None:
        """A generation pass of ``total`` requests begins, ``kept_errors`` of them errors already.

        Judge passes count their answers' verdicts instead (:meth:`judge_pass`)."""
        if stage == "judge":
            return
        self._pass = [total, kept_errors]
        self._chains = total
        self.check()

    def failed(self, stage: str, records: int = 1) -> None:
        """A request of the running pass failed after every retry (``records`` error records:
        one per sample it asked for)."""
        if stage == "judge" or self._pass is None:
            return
        self._pass[1] += records
        self.check()

    def grow(self, units: int) -> None:
        """``units`` later attempts join the running pass (chains sent each attempt as soon as
        the one before is checked, all in one pass): they were already counted among the
        attempts still to come, so the bound does not change."""
        if self._pass is None:
            return
        self._pass[0] += units
        self._grown += units

    def ended(self, unused: int) -> None:
        """A chain of the running pass ended with ``unused`` attempts it will never make: the
        most units the run can have shrinks by as many."""
        if self._pass is not None and unused:
            self._ended += unused
            self.check()

    def finish(self, stage: str) -> None:
        """The running pass is over (its counts join the run's)."""
        if stage == "judge" or self._pass is None:
            return
        total, errors = self._pass
        self.units += total
        self.errors += errors
        self._pass = None
        self._grown = self._ended = 0

    def judge_pass(self, answers: int, errors: int) -> None:
        """The judge pass of the current attempt is over: ``errors`` of ``answers`` got no verdict."""
        self.units += answers
        self.errors += errors
        self.judge_errors += errors
        self.check(judging=True)

    def check(self, *, judging: bool = False) -> None:
        """Raise when the errors so far exceed the limit over the most units the run can have."""
        total, errors = self._pass or (0, 0)
        left = max(0, self.attempts - self.attempt)
        if judging:  # the chains of this attempt: each at most `left` more attempts, each judged
            later = self._chains * left * (2 if self.judged else 1)
        else:  # this attempt's answers judged, then `left` more attempts, each judged
            later = self._chains * (left + (left + 1 if self.judged else 0))
        bound = self.units + total + max(0, later - self._grown - self._ended)
        failed = self.errors + errors
        if failed > self.max_error_rate * bound:
            limit = f"provider.max_error_rate={self.max_error_rate:g}"
            if judging and self.judge_errors:
                raise ProviderError(
                    f"judge: {self.judge_errors} judged answer(s) got no valid verdict, {failed} "
                    f"error(s) of at most {bound} requests and judged answers this run can have: more "
                    f"than {limit} allows, so the run stops before writing any export (those of an "
                    "earlier run are left as they were); check the judge (judge.provider, "
                    "judge.structured_output, judge.max_tokens) and rerun"
                )
            what = (
                f"{failed} error(s) (requests that failed after every retry, and judge errors), of at "
                f"most {bound} requests and judged answers this run can have"
                if self.judge_errors
                else f"{failed} request(s) failed after every retry, of at most {bound} this run can make"
            )
            raise ProviderError(
                f"{what}: more than {limit} allows, so the run stops early without writing exports; "
                "the answers so far are kept in the journals; rerun into the same directory to "
                "retry the failed requests"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class RunErrors:
    """The whole run's errors and units, from its figures (see the module for the rule)."""

    units: int
    errors: int
    judged: int
    judge_errors: int

    def exceeds(self, max_error_rate: float) -> bool:
        return bool(self.units) and self.errors / self.units > max_error_rate

    def describe(self) -> str:
        """E.g. ``4 of 12 requests (33.3%) failed after every retry``, or with a judge
        ``5 of 24 requests and judged answers (20.8%) are errors: 2 failed requests, 3 judge errors``."""
        rate = f"{self.errors / self.units:.1%}" if self.units else "0.0%"
        if not self.judged:
            return f"{self.errors} of {self.units} requests ({rate}) failed after every retry"
        failed = self.errors - self.judge_errors
        return (
            f"{self.errors} of {self.units} requests and judged answers ({rate}) are errors: "
            f"{failed} failed request(s), {self.judge_errors} judge error(s)"
        )


def run_error_counts(manifest: Mapping[str, Any]) -> RunErrors:
    """The run's errors over every generation attempt and judge pass in ``manifest``'s figures."""
    generation = manifest.get("generation") or {}
    units, errors = int(generation.get("total") or 0), int(generation.get("errors_in_file") or 0)
    regeneration = manifest.get("regeneration") or {}
    for attempt in regeneration.get("attempts") or ():
        units += int(attempt.get("total") or 0)
        errors += int(attempt.get("errors_in_file") or 0)
    # a run's judge is in its regeneration figures; a judged completions file's at the top
    verdicts = (regeneration.get("judge") or manifest.get("judge") or {}).get("verdicts") or {}
    judged = sum(int(n) for n in verdicts.values())
    judge_errors = int(verdicts.get("error") or 0)
    return RunErrors(
        units=units + judged, errors=errors + judge_errors, judged=judged, judge_errors=judge_errors
    )
