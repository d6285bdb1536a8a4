"""executor=ray with regeneration, a judge and a cost limit: each shard runs its own chains and
the merged files equal an executor=local run's, byte for byte (a scripted loopback server)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from run_support import assert_same_run, run_cfg

from storyforge.config.pricing import Price
from storyforge.errors import BudgetExceeded, exit_code
from storyforge.pipeline import run_in
from tests.support.fake_server import FakeServer, Fault, Received
from tests.support.scripted_stories import FIRST_SEED, instruction_of, is_repair, passing_story, script

SHARDS = ["executor=ray", "executor.shards=3"]
PRICE = Price(input=1000.0, cached_input=500.0, output=20000.0)
PRICED = "+pricing.models.fake={input: 1000.0, cached_input: 500.0, output: 20000.0}"


def _common(url: str, *extra: str) -> list[str]:
    return [
        "task.n_seeds=9",
        "provider=openai",
        f"provider.base_url={url}",
        "provider.model=fake",
        f"provider.seed={FIRST_SEED}",
        "provider.samples=2",
        "provider.concurrency=2",
        "provider.progress=false",
        "cache.path=null",  # each run asks the server itself: request counts compare like for like
        "export.plots=false",
        "dedup=none",  # the scripted stories of one seed are the same text
        *extra,
    ]


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text("utf-8").splitlines() if line.strip()]


def _judged_script(body: Mapping[str, Any]) -> str:
    """Sample 0's first story fails the rules (:func:`script`); the judge fails a story without
    "gently", which every repair adds: sample 1 passes the rules, fails the judge, then passes."""
    if "response_format" in body:
        story = str(body["messages"][-1]["content"])
        verdict = "pass" if "gently" in story else "fail"
        return json.dumps({"verdict": verdict, "rule": "violence", "reason": "Zob saw a fight"})
    if is_repair(body):
        return passing_story(instruction_of(list(body["messages"]))).replace("Zob saw", "Zob gently saw", 1)
    return script(body)


def _out_of_order(received: Received) -> Fault | None:
    """Holds every other request (by a hash of its body) for 20 ms, so answers finish out of order."""
    body = json.dumps(received.json, sort_keys=True).encode()
    return Fault.stall(0.02) if hashlib.sha256(body).digest()[0] % 2 else None


@pytest.mark.parametrize(
    ("answers", "extra"),
    [
        (script, ["regenerate.max_attempts=3", "regenerate.feedback=true", "export.dpo_pairing=attempts"]),
        (_judged_script, ["judge=content_safety", "regenerate.max_attempts=3", PRICED]),
        (script, [PRICED, "provider.max_cost_usd=1000"]),
    ],
    ids=["regenerate", "judge", "priced-without-chains"],
)
def test_chains_on_ray_write_the_same_files_as_a_local_run(
    hydra_conf: None,
    local_ray: None,
    tmp_path: Path,
    answers: Any,
    extra: list[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="storyforge")
    with FakeServer(script=answers, rule=_out_of_order) as server:
        run_in(run_cfg(*_common(server.base_url, *extra)), tmp_path / "local")
        sent = server.request_count
        manifest = run_in(run_cfg(*_common(server.base_url, *extra), *SHARDS), tmp_path / "ray")
        assert server.request_count == 2 * sent  # every attempt (and verdict) sent once, as locally
    assert_same_run(tmp_path / "local", tmp_path / "ray")
    summary = manifest["completions"]
    if "regenerate.max_attempts=3" not in extra:  # the shards validated apart, the cost added up
        assert summary["pass_rate"] == 0.5 and not (tmp_path / "ray" / "attempts.jsonl").exists()
        paid = _paid(_lines(tmp_path / "ray" / "generations.jsonl"))
        assert manifest["cost"]["this_run"]["spent_usd"] == pytest.approx(paid, abs=1e-6)
        assert summary["cost"]["total_usd"] == pytest.approx(paid, abs=1e-6)
        return
    rates = [row["pass_rate"] for row in summary["regeneration"]["by_attempt"]]
    assert rates[0] < rates[-1] == summary["pass_rate"] == 1.0
    shards = [tmp_path / "ray" / "shards" / f"{k:04d}" for k in range(3)]
    # Each shard ran its own chains into its own attempt journal, merged into the run's.
    attempt2 = [_lines(d / "generations.attempt2.jsonl") for d in shards]
    assert all(attempt2) and sum(map(len, attempt2)) == len(
        _lines(tmp_path / "ray" / "generations.attempt2.jsonl")
    )
    chains = _lines(tmp_path / "ray" / "attempts.jsonl")
    assert len({row["chain"] for row in chains}) == 18  # each sample of each seed its own chain
    if answers is _judged_script:
        assert manifest["regeneration"]["judge"]["verdicts"] == {"pass": 18, "fail": 9, "error": 0}
        # the driver's one line for the shards' judge passes (on the terminal and in run.log)
        assert "judge, 3 shards: 27 answer(s): pass 18, fail 9, error 0" in caplog.text
        assert manifest["cost"]["total_usd"] == summary["cost"]["total_usd"] > 0
    else:
        pairs = _lines(tmp_path / "ray" / "dpo.jsonl")
        assert len(pairs) == 9 and all(pair["rejected"][-1]["content"] == "The end." for pair in pairs)


def _paid(records: list[dict[str, Any]]) -> float:
    return sum(
        PRICE.cost(prompt=r["usage"]["prompt_tokens"], cached=0, completion=r["usage"]["completion_tokens"])
        for r in records
    )


def test_a_cost_limit_stops_each_shard_at_its_share_and_a_higher_limit_finishes_as_locally(
    hydra_conf: None, local_ray: None, tmp_path: Path
) -> None:
    """Every shard stops at the answer that crossed its share of the limit (one request in
    flight per shard); the same limit sends nothing; a higher one finishes without resending."""
    common = [*_common("URL", "regenerate.max_attempts=2", PRICED), "provider.concurrency=1"]
    run = tmp_path / "ray"
    with FakeServer(script=script) as server:
        cfg = [c.replace("URL", server.base_url) for c in common]
        run_in(run_cfg(*cfg, "provider.max_cost_usd=1000"), tmp_path / "local")
        server.request_count = 0
        with pytest.raises(BudgetExceeded, match=r"provider.max_cost_usd=6 reached") as caught:
            run_in(run_cfg(*cfg, *SHARDS, "provider.max_cost_usd=6"), run)
        assert exit_code(caught.value) == 5
        journals = [_lines(run / "shards" / f"{k:04d}" / "generations.jsonl") for k in range(3)]
        prompts = [len(_lines(run / "shards" / f"{k:04d}" / "prompts.jsonl")) for k in range(3)]
        assert server.request_count == sum(map(len, journals))  # nothing in flight was lost
        for journal, share in zip(journals, [6 * n / 9 for n in prompts], strict=True):
            assert _paid(journal[:-1]) < share <= _paid(journal)  # stopped at the crossing answer
        assert not (run / "validated.jsonl").exists()

        sent = server.request_count
        with pytest.raises(BudgetExceeded):  # the same limit: nothing more is sent
            run_in(run_cfg(*cfg, *SHARDS, "provider.max_cost_usd=6"), run)
        assert server.request_count == sent

        manifest = run_in(run_cfg(*cfg, *SHARDS, "provider.max_cost_usd=1000"), run)
        assert server.request_count - sent == 18 + 9 - sent  # the rest, each once
    assert manifest["generation"]["resumed"] == sent
    assert_same_run(tmp_path / "local", run, resumed=True)


def test_a_worker_killed_mid_chain_is_retried_and_each_attempt_is_journaled_once(
    hydra_conf: None, local_ray: None, tmp_path: Path
) -> None:
    """SIGKILL shard 0's worker while it journals attempt 2: Ray starts the shard again, it
    resumes its chains from its journals, and the merged files equal a local run's."""
    out = tmp_path / "ray"
    shard = out / "shards" / "0000"
    killed: dict[str, int] = {}

    def kill_mid_chain() -> None:
        journal = shard / "generations.attempt2.jsonl"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if journal.exists() and journal.read_bytes().count(b"\n") >= 2:
                killed["pid"] = int((shard / "worker.pid").read_text("ascii"))
                killed["lines"] = journal.read_bytes().count(b"\n")
                os.kill(killed["pid"], signal.SIGKILL)
                return
            time.sleep(0.005)

    extra = ["task.n_seeds=16", "regenerate.max_attempts=3", "provider.concurrency=1"]
    with FakeServer(script=script, latency_s=0.05) as server:
        killer = threading.Thread(target=kill_mid_chain)
        killer.start()
        run_in(run_cfg(*_common(server.base_url), *extra, "executor=ray", "executor.shards=2"), out)
        killer.join()
        server.latency_s = 0.0
        run_in(run_cfg(*_common(server.base_url), *extra), tmp_path / "local")
    assert "pid" in killed, "no worker was killed"
    failing = (shard / "prompts.jsonl").read_bytes().count(b"\n")  # sample 0 of each seed fails once
    assert killed["lines"] < failing, "attempt 2 had finished before the kill"
    assert int((shard / "worker.pid").read_text("ascii")) != killed["pid"]  # it ran again
    for name in ("generations.attempt2.jsonl", "attempts.jsonl"):
        rows = _lines(out / name)
        counts = Counter((r["id"], r["sample"], r.get("attempt")) for r in rows)
        assert max(counts.values()) == 1 and len(rows) == (16 if name.endswith("2.jsonl") else 48)
    assert_same_run(tmp_path / "local", out, resumed=True)
