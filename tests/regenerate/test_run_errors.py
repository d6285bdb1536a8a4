"""Errors a run can trust: judge errors and failed requests counted over the whole run, against
scripted loopback servers (real HTTP).

A judge whose answers are not verdicts stops the run (exit 4) with a line per judge pass on the
terminal and in run.log, and leaves earlier exports as they were; the report counts verdicts,
the rules cited and the errors; failed repair requests under ``provider.max_error_rate`` let
the run write its exports, and a server that dies mid-run is stopped as soon as the limit is
certain to be passed; ``completions=FILE`` with a provider is refused unless a judge is asked
for, and then only the judge is sent requests.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hydra import compose

from storyforge.errors import ConfigError, ProviderError
from storyforge.pipeline import run_in
from tests.support.fake_server import FakeServer, Fault, Received
from tests.support.scripted_stories import (
    FAILED_STORY,
    FIRST_SEED,
    instruction_of,
    is_repair,
    passing_story,
)

REPO = Path(__file__).resolve().parents[2]
EXPORTS = ("validated.jsonl", "sft.jsonl", "rejects.jsonl", "dpo.jsonl", "report/summary.json")


def is_judge(body: Mapping[str, Any]) -> bool:
    return "response_format" in body or "json_schema" in body


def story_of(body: Mapping[str, Any]) -> str:
    text = str(body["messages"][-1]["content"])
    return text.split("The story:\n", 1)[1].split("\n\nAnswer with", 1)[0]


def _digest(text: str) -> int:
    return int(hashlib.sha256(text.encode()).hexdigest(), 16)


def not_json(body: Mapping[str, Any]) -> str:
    """Stories pass the rules; the judge answers in words, never JSON."""
    if is_judge(body):
        return "This story is fine."
    return passing_story(instruction_of(list(body["messages"])))


def mixed(body: Mapping[str, Any]) -> str:
    """Stories pass the rules; the judge passes, fails (rule by the story) or answers in words."""
    if not is_judge(body):
        return passing_story(instruction_of(list(body["messages"])))
    pick = _digest(story_of(body)) % 3
    if pick == 0:
        return json.dumps({"verdict": "pass", "rule": "none", "reason": "kind"})
    if pick == 1:
        return json.dumps({"verdict": "fail", "rule": "violence", "reason": "a fight"})
    return "not a verdict"


def _overrides(url: str, seeds: int, *extra: str) -> list[str]:
    return [
        "task=tinystories",
        f"task.n_seeds={seeds}",
        "provider=openai",
        f"provider.base_url={url}",
        "provider.model=fake",
        f"provider.seed={FIRST_SEED}",
        "provider.concurrency=2",
        "provider.progress=false",
        "provider.max_retries=1",
        "provider.backoff_base_s=0.01",
        "provider.backoff_max_s=0.02",
        "cache.path=null",
        "export.plots=false",
        "dedup=none",  # the scripted stories of one seed are the same text
        *extra,
    ]


def _cfg(url: str, seeds: int, *extra: str) -> Any:
    return compose("config", overrides=_overrides(url, seeds, *extra))


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text("utf-8").splitlines() if line.strip()]


def _run_py(run: Path, overrides: list[str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    return subprocess.run(  # noqa: PLW1510 - the exit status is asserted
        [sys.executable, "run.py", *overrides, f"hydra.run.dir={run}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_judge_that_never_answers_json_stops_the_run_and_says_so(tmp_path):
    run = tmp_path / "run"
    with FakeServer(script=not_json) as server:
        result = _run_py(run, _overrides(server.base_url, 4, "judge=content_safety"))
    assert result.returncode == 4, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    line = "judge, attempt 1: 4 answer(s): pass 0, fail 0, error 4 (not JSON: 4)"
    assert line in result.stdout  # the terminal (Hydra's console log)
    assert line in (run / "run.log").read_text("utf-8")
    last = [text for text in result.stderr.splitlines() if text.strip()][-1]
    assert last.startswith("error: judge: 4 judged answer(s) got no valid verdict")
    assert "provider.max_error_rate=0.05" in last
    assert not (run / "sft.jsonl").exists() and not (run / "validated.jsonl").exists()


def test_the_report_counts_verdicts_rules_and_judge_errors(hydra_conf, tmp_path):
    run = tmp_path / "run"
    with FakeServer(script=mixed) as server:
        manifest = run_in(
            _cfg(server.base_url, 12, "judge=content_safety", "judge.retries=0", "provider.max_error_rate=1"),
            run,
        )
        judged = [r.json for r in server.received if is_judge(r.json)]
    picks = [_digest(story_of(body)) % 3 for body in judged]
    expected = {"pass": picks.count(0), "fail": picks.count(1), "error": picks.count(2)}
    assert len(judged) == 12 and all(expected.values())  # every kind of answer is there
    judge = json.loads((run / "report" / "summary.json").read_text("utf-8"))["judge"]
    assert judge == {
        "verdicts": expected,
        "rules": {"violence": expected["fail"]},
        "errors": {"not JSON": expected["error"]},
    }
    assert manifest["regeneration"]["judge"]["verdicts"] == expected
    assert manifest["regeneration"]["judge"]["errors"] == {"not JSON": expected["error"]}
    markdown = (run / "report" / "summary.md").read_text("utf-8")
    assert "## Judge" in markdown
    assert (
        f"12 judged answer(s) (every attempt): pass {expected['pass']}, fail {expected['fail']}, " in markdown
    )
    assert f"| violence | {expected['fail']} |" in markdown
    assert f"| not JSON | {expected['error']} |" in markdown


def test_stage_judge_with_a_failing_judge_leaves_the_exports_as_they_were(hydra_conf, tmp_path):
    run = tmp_path / "run"
    with FakeServer(script=not_json) as server:
        run_in(_cfg(server.base_url, 4), run)
        before = {name: (run / name).read_bytes() for name in EXPORTS}
        assert len(_lines(run / "sft.jsonl")) == 4
        with pytest.raises(ProviderError, match=r"judge: 4 judged answer\(s\) got no valid verdict"):
            run_in(_cfg(server.base_url, 4, "stage=judge", "judge=content_safety"), run)
    assert {name: (run / name).read_bytes() for name in EXPORTS} == before


def _drop_repairs(received: Received) -> Fault | None:
    """Every repair conversation is dropped (connection closed with no answer)."""
    body = received.json
    return Fault.drop() if isinstance(body, dict) and is_repair(body) else None


def _fails_first(failing: int):
    """The first attempt of sample 0 fails for the first ``failing`` seeds (by instruction order)."""
    chosen: list[str] = []

    def script(body: Mapping[str, Any]) -> str:
        instruction = instruction_of(list(body["messages"]))
        first = body.get("seed") == FIRST_SEED and not is_repair(body)
        if first and (instruction in chosen or len(chosen) < failing):
            if instruction not in chosen:
                chosen.append(instruction)
            return FAILED_STORY
        return passing_story(instruction)

    return script


def test_failed_repair_requests_under_the_limit_let_the_run_write_its_exports(hydra_conf, tmp_path):
    """2 dropped repair requests out of 102 requests in all are under 5%: exit 0, exports written."""
    run = tmp_path / "run"
    with FakeServer(script=_fails_first(2), rule=_drop_repairs) as server:
        manifest = run_in(
            _cfg(
                server.base_url,
                51,
                "regenerate.max_attempts=2",
                "provider.samples=2",
                "provider.concurrency=1",
            ),
            run,
        )
    assert manifest["generation"]["total"] == 102
    assert [(a["attempt"], a["total"], a["errors"]) for a in manifest["regeneration"]["attempts"]] == [
        (2, 2, 2)
    ]
    assert len(_lines(run / "sft.jsonl")) == 100  # every passing answer is exported


def test_failed_repair_requests_over_the_limit_stop_the_run(hydra_conf, tmp_path):
    """12 dropped repair requests of at most 112: over 5% once the 6th fails, exports not written."""
    run = tmp_path / "run"
    with FakeServer(script=_fails_first(12), rule=_drop_repairs) as server:
        cfg = _cfg(
            server.base_url, 50, "regenerate.max_attempts=2", "provider.samples=2", "provider.concurrency=1"
        )
        with pytest.raises(ProviderError, match=r"6 request\(s\) failed after every retry, of at most 112"):
            run_in(cfg, run)
        repairs = [r for r in server.received if is_repair(r.json)]
    assert len(repairs) == 6 * 2  # each tried twice (provider.max_retries=1), the other 6 never sent
    assert not (run / "sft.jsonl").exists()


def test_a_server_that_dies_mid_run_is_stopped_once_the_limit_is_certain(hydra_conf, tmp_path):
    """40 requests planned, 5%: the third failure is certain to pass the limit, so the run stops
    there rather than retrying the other 27 requests."""
    answered = 10

    def dead_after(received: Received) -> Fault | None:
        return Fault.drop() if server.request_count > answered else None

    run = tmp_path / "run"
    with FakeServer(script=_fails_first(0), rule=dead_after) as server:
        with pytest.raises(ProviderError, match=r"3 request\(s\) failed after every retry, of at most 40"):
            run_in(_cfg(server.base_url, 40, "provider.concurrency=1"), run)
        sent = server.request_count
    assert sent == answered + 3 * 2  # three requests, each tried twice
    records = _lines(run / "generations.jsonl")
    assert len(records) == answered + 3 and sum(r["error"] is not None for r in records) == 3


def test_completions_with_a_provider_and_no_judge_is_refused_before_any_request(hydra_conf, tmp_path):
    completions = tmp_path / "completions.jsonl"
    completions.write_text(json.dumps({"id": "ts-0000000", "output": "Hi."}) + "\n", "utf-8")
    with FakeServer(script=not_json) as server:
        cfg = _cfg(server.base_url, 4, f"completions={completions}")
        with pytest.raises(ConfigError, match=r"completions=.* provider=openai would generate new ones"):
            run_in(cfg, tmp_path / "run")
        assert server.request_count == 0


def test_a_completions_file_is_judged_with_the_judges_provider_only(hydra_conf, tmp_path):
    """The answers of a finished run judged as a completions file: judge requests only, each
    answer's verdict in the checks, the file's line numbers kept."""
    with FakeServer(script=mixed) as server:
        run_in(_cfg(server.base_url, 12), tmp_path / "first")
        completions = tmp_path / "completions.jsonl"
        lines = (tmp_path / "first" / "generations.jsonl").read_text("utf-8").splitlines()
        completions.write_text("\n".join([lines[0], "{not json", *lines[1:]]) + "\n", "utf-8")
        generated = server.request_count
        cfg = _cfg(
            server.base_url,
            12,
            f"completions={completions}",
            "judge=content_safety",
            "judge.retries=0",
            "provider.max_error_rate=1",
        )
        manifest = run_in(cfg, tmp_path / "judged")
        sent = [r.json for r in server.received[generated:]]
    assert len(sent) == 12 and all(is_judge(body) for body in sent)
    picks = [_digest(story_of(body)) % 3 for body in sent]
    verdicts = {"pass": picks.count(0), "fail": picks.count(1), "error": picks.count(2)}
    assert manifest["judge"]["verdicts"] == verdicts
    assert manifest["completions"]["passed"] == verdicts["pass"]
    validated = _lines(tmp_path / "judged" / "validated.jsonl")
    reasons = sorted(r["reasons"][0].split(":")[0] for r in validated if not r["passed"])
    assert reasons == ["judge"] * verdicts["fail"] + ["judge error"] * verdicts["error"]
    assert manifest["completions"]["problems"]["malformed"]["lines"] == [2]
