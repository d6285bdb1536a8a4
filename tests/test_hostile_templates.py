"""Hostile templates end in their documented error, within the memory cap, and never hang.

Each case of ``tests/hostile_cases.py`` (nested loops, amplifying filters, data expansion,
data reading the context, deep data, lone surrogates, an alias bomb) runs in a fresh
interpreter, which reports how it ended and the peak memory Python allocated
(``tracemalloc``). The time each case takes is printed by ``bench/hostile_bench.py`` (all
well under 2 s); here a generous timeout only guards against a case that would never end,
since timed assertions on a shared machine fail for reasons that are not the code's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hostile_cases import CASES, MEMORY_CAP

_SCRIPT = Path(__file__).with_name("hostile_cases.py")


@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_case_ends_in_its_documented_outcome(name: str) -> None:
    """The case ends in its documented error (limit and node path) or warning, under 200 MB."""
    done = subprocess.run(
        [sys.executable, str(_SCRIPT), name], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    outcome = json.loads(done.stdout.splitlines()[-1])
    case = CASES[name]
    assert outcome["error"] == case.error, outcome
    if case.limit is not None:
        assert (outcome["limit"], outcome["path"]) == (case.limit, case.path)
        assert outcome["message"].startswith(f"{case.path}: ")
        assert case.limit in outcome["message"]
    if case.warning is not None:
        assert any(case.warning in w for w in outcome["warnings"]), outcome["warnings"]
    assert outcome["peak_bytes"] < MEMORY_CAP, outcome
    assert outcome["same_outcome_twice"], outcome
