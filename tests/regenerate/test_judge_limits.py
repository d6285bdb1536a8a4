"""A judge's answer is parsed under size, depth and number limits: a verdict past them is a judge
error (never a crash), and a rerun over the journaled answer ends the same way."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from test_judge import SEEDS, _cfg, _lines, is_judge

from storyforge.pipeline import run_in
from tests.support.fake_server import FakeServer
from tests.support.scripted_stories import instruction_of, passing_story

HOSTILE = {
    "a 5,000-digit number": '{"verdict": "pass", "rule": "none", "reason": "ok", "n": ' + "9" * 5000 + "}",
    "a 40-digit number": '{"verdict": "pass", "rule": "none", "reason": "ok", "n": ' + "9" * 40 + "}",
    "nested 300,000 deep": "[" * 300_000 + "]" * 300_000,
    "nested 20,000 deep in 40 KB": '{"verdict": "pass", "x": ' + "[" * 20_000 + "]" * 20_000 + "}",
    "an infinite number": '{"verdict": "pass", "rule": "none", "reason": "ok", "n": 1e999}',
}
WHY = {
    "a 5,000-digit number": "not JSON (a number too long to read",
    "a 40-digit number": "a number longer than a verdict may hold",
    "nested 300,000 deep": "longer than a verdict may be",
    "nested 20,000 deep in 40 KB": "not JSON (arrays or objects nested too deeply",
    "an infinite number": "a number too large for a verdict",
}


@pytest.mark.parametrize("verdict", sorted(HOSTILE))
def test_a_verdict_past_the_limits_is_a_judge_error(hydra_conf: None, tmp_path: Path, verdict: str) -> None:
    def hostile(body: Mapping[str, Any]) -> str:
        if is_judge(body):
            return HOSTILE[verdict]
        return passing_story(instruction_of(list(body["messages"])))

    run = tmp_path / "run"
    # every verdict is an error: the run goes on (under the default error rate it would stop)
    extra = ("judge.retries=0", "cache.path=null", "provider.max_error_rate=1")
    with FakeServer(script=hostile) as server:
        first = run_in(_cfg(server.base_url, tmp_path, *extra), run)
        sent = server.request_count
        again = run_in(_cfg(server.base_url, tmp_path, *extra), run)
        assert server.request_count == sent  # the journaled verdicts are read, not asked again
    for manifest in (first, again):
        assert manifest["regeneration"]["judge"]["verdicts"] == {"pass": 0, "fail": 0, "error": SEEDS}
    reasons = {tuple(r["reasons"]) for r in _lines(run / "validated.jsonl")}
    assert len(reasons) == 1
    assert WHY[verdict] in next(iter(reasons))[0]
    assert json.loads(json.dumps(first["regeneration"]["judge"]))  # the manifest stays JSON
