"""The run's error budget stops a run only when its error rate is certain to end above the limit.

Runs of any shape (chains, attempts, a judge) with any outcome per request are driven through
:class:`ErrorBudget` the way the regeneration and judge passes drive it; whenever it stops a
run, that same run carried to its end (counted here independently) has more errors than the
limit allows, so stopping lost nothing a finished run would have kept.
"""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from storyforge.errors import ProviderError
from storyforge.providers.error_budget import ErrorBudget, run_error_counts

# One request's outcome: failed after every retry, failed the rules, or passed them; then the
# judge's verdict for an answer that passed the rules.
# (Weighted towards success, so runs that end under the limit are common.)
GENERATION = st.sampled_from(["ok"] * 6 + ["rules"] * 2 + ["error"])
VERDICT = st.sampled_from(["pass"] * 4 + ["fail"] * 2 + ["error"])


@st.composite
def runs(draw: st.DrawFn) -> tuple[int, bool, float, list[list[tuple[str, str]]]]:
    attempts = draw(st.integers(1, 4))
    judged = draw(st.booleans())
    rate = draw(st.sampled_from([0.0, 0.05, 0.2, 0.5]))
    chains = draw(st.integers(1, 12))
    outcomes = [[(draw(GENERATION), draw(VERDICT)) for _ in range(attempts)] for _ in range(chains)]
    return attempts, judged, rate, outcomes


def _drive(
    budget: ErrorBudget | None, attempts: int, judged: bool, outcomes: list[list[tuple[str, str]]]
) -> tuple[int, int]:
    """Run the chains (as regenerate does); the run's (units, errors) at its end."""
    units = errors = 0
    alive = list(range(len(outcomes)))
    for attempt in range(1, attempts + 1):
        if not alive:
            break
        if budget is not None:
            budget.attempt = attempt
            budget.start("regeneration" if attempt > 1 else "generation", len(alive), 0)
        units += len(alive)
        passing, failing = [], []
        for chain in alive:
            generation = outcomes[chain][attempt - 1][0]
            if generation == "error":
                errors += 1
                if budget is not None:
                    budget.failed("generation")
            elif generation == "rules":
                failing.append(chain)
            else:
                passing.append(chain)
        if budget is not None:
            budget.finish("generation")
        if judged:
            verdicts = [outcomes[chain][attempt - 1][1] for chain in passing]
            units += len(passing)
            errors += verdicts.count("error")
            failing += [chain for chain, verdict in zip(passing, verdicts, strict=True) if verdict == "fail"]
            if budget is not None:
                budget.judge_pass(len(passing), verdicts.count("error"))
        alive = sorted(failing)
    return units, errors


@settings(max_examples=400, deadline=None)
@given(runs())
@example((1, True, 0.2, [[("error", "pass")], [("ok", "pass")], [("ok", "pass")]]))
def test_a_stop_is_certain_and_a_finished_run_is_counted_as_the_manifest_counts_it(run) -> None:
    attempts, judged, rate, outcomes = run
    units, errors = _drive(None, attempts, judged, outcomes)
    budget = ErrorBudget(max_error_rate=rate, attempts=attempts, judged=judged)
    try:
        assert _drive(budget, attempts, judged, outcomes) == (units, errors)
    except ProviderError:
        assert errors > rate * units  # the finished run would have failed the limit too
    else:
        assert (budget.units, budget.errors) == (units, errors)


def test_the_manifest_count_covers_every_attempt_and_the_judge() -> None:
    manifest = {
        "generation": {"total": 100, "errors_in_file": 1},
        "regeneration": {
            "attempts": [{"attempt": 2, "total": 10, "errors_in_file": 2}],
            "judge": {"verdicts": {"pass": 80, "fail": 5, "error": 3}},
        },
    }
    counts = run_error_counts(manifest)
    assert (counts.units, counts.errors, counts.judged, counts.judge_errors) == (198, 6, 88, 3)
    assert counts.exceeds(0.03) and not counts.exceeds(0.05)
    assert counts.describe() == (
        "6 of 198 requests and judged answers (3.0%) are errors: 3 failed request(s), 3 judge error(s)"
    )


def _drive_pipelined(
    budget: ErrorBudget | None, attempts: int, outcomes: list[list[str]], order: list[int]
) -> tuple[int, int]:
    """Run the chains pipelined (as generate_chains does, no judge): one pass for every attempt,
    the answers coming in the interleaving ``order`` (indices into the chains still going)."""
    units = errors = 0
    if budget is not None:
        budget.start("generation", len(outcomes), 0)
    going = {chain: 0 for chain in range(len(outcomes))}  # chain -> attempts answered
    picks = iter(order)
    while going:
        alive = sorted(going)
        chain = alive[next(picks, 0) % len(alive)]
        attempt = going[chain] + 1
        outcome = outcomes[chain][attempt - 1]
        units += 1
        if outcome == "error":
            errors += 1
            if budget is not None:
                budget.failed("generation")
        if outcome == "rules" and attempt < attempts:
            going[chain] = attempt
            if budget is not None:
                budget.grow(1)
        else:
            del going[chain]
            if budget is not None:
                budget.ended(attempts - attempt)
    if budget is not None:
        budget.finish("generation")
    return units, errors


@settings(max_examples=400, deadline=None)
@given(
    st.integers(1, 4).flatmap(
        lambda attempts: st.tuples(
            st.just(attempts),
            st.sampled_from([0.0, 0.05, 0.2, 0.5]),
            st.lists(st.lists(GENERATION, min_size=attempts, max_size=attempts), min_size=1, max_size=12),
            st.lists(st.integers(0, 11), max_size=60),
        )
    )
)
def test_pipelined_chains_stop_only_when_certain_and_are_counted_whole(run) -> None:
    attempts, rate, outcomes, order = run
    units, errors = _drive_pipelined(None, attempts, outcomes, order)
    budget = ErrorBudget(max_error_rate=rate, attempts=attempts)
    try:
        assert _drive_pipelined(budget, attempts, outcomes, order) == (units, errors)
    except ProviderError:
        assert errors > rate * units  # the finished run would have failed the limit too
    else:
        assert (budget.units, budget.errors) == (units, errors)
