"""Regeneration against a scripted loopback server: chains, repair turns, exports, resume, replay."""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hydra import compose

from storyforge.config.regenerate import RegenerateConf, regenerate_settings
from storyforge.errors import ConfigError
from storyforge.pipeline import run_in
from tests.support.fake_server import FakeServer
from tests.support.scripted_stories import FAILED_STORY, FIRST_SEED, instruction_of, is_repair, script

SEEDS = 6
REPO = Path(__file__).resolve().parents[2]


def _cfg(server: FakeServer | str, tmp: Path, *extra: str) -> Any:
    url = server if isinstance(server, str) else server.base_url
    return compose(
        "config",
        overrides=[
            "task=tinystories",
            f"task.n_seeds={SEEDS}",
            "provider=openai",
            f"provider.base_url={url}",
            "provider.model=fake",
            f"provider.seed={FIRST_SEED}",
            "provider.samples=2",
            "provider.concurrency=2",
            "provider.progress=false",
            f"cache.path={tmp / 'cache.sqlite'}",
            "export.plots=false",
            "dedup=none",  # the scripted stories of one seed are the same text
            *extra,
        ],
    )


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text("utf-8").splitlines() if line.strip()]


def _bytes(run: Path, names: tuple[str, ...]) -> dict[str, bytes]:
    return {name: (run / name).read_bytes() for name in names}


EXPORTS = ("attempts.jsonl", "validated.jsonl", "sft.jsonl", "rejects.jsonl", "dpo.jsonl")


@pytest.mark.parametrize(("attempts", "by_attempt"), [(1, [0.5]), (2, [0.5, 1.0]), (3, [0.5, 1.0, 1.0])])
def test_pass_rate_rises_by_the_scripted_amount(hydra_conf, tmp_path, attempts, by_attempt):
    """Sample 0 of every seed fails once then passes: K=1 keeps 50%, K>=2 reaches 100%."""
    run = tmp_path / "run"
    with FakeServer(script=script) as server:
        cfg = _cfg(server, tmp_path, f"regenerate.max_attempts={attempts}", "export.dpo_pairing=attempts")
        manifest = run_in(cfg, run)
        sent = server.request_count
    summary = manifest["completions"]
    if attempts == 1:
        assert "regeneration" not in manifest and "regeneration" not in summary
        assert summary["pass_rate"] == 0.5 and sent == 2 * SEEDS
        assert not (run / "attempts.jsonl").exists()
        return
    assert sent == 2 * SEEDS + SEEDS  # one more request per failing chain, none after a pass
    rates = [row["pass_rate"] for row in summary["regeneration"]["by_attempt"]]
    assert rates == by_attempt[:2]  # the table stops at the last attempt any chain made
    assert summary["pass_rate"] == 1.0 and summary["validated"] == 2 * SEEDS
    low, high = summary["regeneration"]["by_attempt"][0]["interval_95"]
    assert low < 0.5 < high
    transitions = summary["regeneration"]["transitions"]
    assert transitions["wrong_sentence_count"]["pass"] == SEEDS
    assert transitions["missing_required"]["pass"] == SEEDS
    assert manifest["regeneration"]["still_failing"] == 0
    assert [r["attempt"] for r in manifest["regeneration"]["attempts"]] == [2]


def test_repair_turn_names_the_failure_and_exports_use_the_original_prompt(hydra_conf, tmp_path):
    """The second attempt is prompt + failed answer + a repair turn in words; SFT/DPO keep the prompt."""
    run = tmp_path / "run"
    with FakeServer(script=script) as server:
        run_in(_cfg(server, tmp_path, "regenerate.max_attempts=3", "export.dpo_pairing=attempts"), run)
        repairs = [r.json for r in server.received if is_repair(r.json)]
    assert len(repairs) == SEEDS
    prompts = {p["id"]: p["messages"] for p in _lines(run / "prompts.jsonl")}
    seeds = {s["id"]: s for s in _lines(run / "prompts_seed.jsonl")}
    for body in repairs:
        first, failed, repair = body["messages"]
        assert failed == {"role": "assistant", "content": FAILED_STORY}
        seed = next(s for s in seeds.values() if s["instruction"] == first["content"])
        assert (
            f"Your story has 1 sentence; it must have {seed['min_sentences']} to {seed['max_sentences']}."
            in (repair["content"])
        )
        for phrase in seed["required"]:
            assert f'It does not contain "{phrase}".' in repair["content"]
        assert body["seed"] == FIRST_SEED + 2  # sample 0, attempt 2: seed + 0 + (2 - 1) * samples

    validated = _lines(run / "validated.jsonl")
    assert Counter((r["sample"], r["attempt"], r["passed"]) for r in validated) == {
        (0, 1, False): SEEDS,
        (0, 2, True): SEEDS,
        (1, 1, True): SEEDS,
    }
    assert all(r["chain"] == f"{r['id']}#{r['sample']}" and len(r["request_hash"]) == 64 for r in validated)
    sft = _lines(run / "sft.jsonl")
    assert len(sft) == 2 * SEEDS
    for row in sft:
        assert row["messages"][:-1] == prompts[row["id"]]  # the original prompt, never the repair
    dpo = _lines(run / "dpo.jsonl")
    assert sorted(
        (r["id"], r["chosen_sample"], r["chosen_attempt"], r["rejected_attempt"]) for r in dpo
    ) == sorted((seed_id, 0, 2, 1) for seed_id in seeds)
    for row in dpo:
        assert row["prompt"] == prompts[row["id"]]
        assert row["rejected"] == [{"role": "assistant", "content": FAILED_STORY}]
        assert row["rejected_labels"] == ["missing_required", "wrong_sentence_count"]
        assert instruction_of(row["prompt"]) == seeds[row["id"]]["instruction"]
    report = (run / "report" / "summary.md").read_text("utf-8")
    assert "## Regeneration" in report and "| wrong_sentence_count | 6 |" in report


def test_feedback_false_samples_again_with_the_next_seed(hydra_conf, tmp_path):
    run = tmp_path / "run"
    with FakeServer(script=script) as server:
        run_in(_cfg(server, tmp_path, "regenerate.max_attempts=2", "regenerate.feedback=false"), run)
        second = [r.json for r in server.received if r.json["seed"] == FIRST_SEED + 2]
    assert len(second) == SEEDS
    assert all(len(body["messages"]) == 1 for body in second)  # the prompt again, no repair turn


def test_feedback_false_without_a_seed_is_refused(hydra_conf, tmp_path):
    """Without provider.seed the same request would come back from the cache unchanged: the run
    is refused before anything is sent."""
    with FakeServer(script=lambda body: FAILED_STORY) as server:
        cfg = _cfg(
            server, tmp_path, "regenerate.max_attempts=2", "regenerate.feedback=false", "provider.seed=null"
        )
        with pytest.raises(ConfigError, match="provider.seed"):
            run_in(cfg, tmp_path / "run")
        assert server.request_count == 0


def test_interrupted_chain_resumes_without_resending_and_replay_rebuilds_the_files(hydra_conf, tmp_path):
    """A journal cut mid-attempt (as kill -9 leaves it) resumes with exactly the missing requests;
    provider.replay=only with no server rebuilds the same files."""
    run = tmp_path / "run"
    with FakeServer(script=script) as server:
        run_in(_cfg(server, tmp_path, "regenerate.max_attempts=3"), run)
        first = _bytes(run, EXPORTS)
        journal = run / "generations.attempt2.jsonl"
        lines = journal.read_bytes().splitlines(keepends=True)
        journal.write_bytes(b"".join(lines[:2]) + lines[2][:17])  # two whole lines and a torn one
        before = server.request_count
        run_in(_cfg(server, tmp_path, "regenerate.max_attempts=3", "cache.path=null"), run)
        assert server.request_count - before == SEEDS - 2  # the torn line and the rest, once each
    attempt2 = _lines(journal)
    assert sorted((r["id"], r["sample"]) for r in attempt2) == sorted(
        {(r["id"], r["sample"]) for r in attempt2}
    )
    assert len(attempt2) == SEEDS
    assert _bytes(run, ("validated.jsonl", "sft.jsonl", "dpo.jsonl")) == {
        k: v for k, v in first.items() if k in ("validated.jsonl", "sft.jsonl", "dpo.jsonl")
    }

    # The server is gone; the cache answers every attempt.
    replayed = tmp_path / "replayed"
    with FakeServer(script=script) as dead:
        url = dead.base_url
    cfg = _cfg(url, tmp_path, "regenerate.max_attempts=3", "provider.replay=only")
    run_in(cfg, replayed)
    assert _bytes(replayed, ("validated.jsonl", "sft.jsonl", "rejects.jsonl", "dpo.jsonl")) == {
        k: v for k, v in first.items() if k != "attempts.jsonl"
    }


def test_each_sample_has_its_own_chain(hydra_conf, tmp_path):
    """samples=3: only sample 0 fails; chains 1 and 2 end at attempt 1, chain 0 at attempt 2."""
    run = tmp_path / "run"
    with FakeServer(script=script) as server:
        run_in(_cfg(server, tmp_path, "regenerate.max_attempts=2", "provider.samples=3"), run)
    chains = Counter((r["sample"], r["attempt"]) for r in _lines(run / "attempts.jsonl"))
    assert chains == {(0, 1): SEEDS, (0, 2): SEEDS, (1, 1): SEEDS, (2, 1): SEEDS}
    finals = [r for r in _lines(run / "attempts.jsonl") if r["final"]]
    assert len(finals) == 3 * SEEDS


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("regenerate.max_attempts=0", "regenerate.max_attempts must be 1..20"),
        ("regenerate.max_attempts=21", "regenerate.max_attempts must be 1..20"),
        ("regenerate.template=/nonexistent/repair.yaml", "regenerate.template: no such file"),
    ],
)
def test_bad_settings_fail_before_anything_is_written(hydra_conf, tmp_path, override, message):
    with FakeServer(script=script) as server:
        extra = (
            [override] if override.startswith("regenerate.max") else [override, "regenerate.max_attempts=2"]
        )
        with pytest.raises(ConfigError, match=message):
            run_in(_cfg(server, tmp_path, *extra), tmp_path / "run")
        assert server.request_count == 0
    assert not (tmp_path / "run").exists()


def test_the_nodes_settings_are_its_schema_checked_and_sealed(tmp_path, monkeypatch):
    """The one type of the node: ``~`` in the template expanded where it is read, nothing can change."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "repair.yaml").touch()
    conf = regenerate_settings({"regenerate": {"max_attempts": 3, "template": "~/repair.yaml"}})
    assert (
        isinstance(conf, RegenerateConf) and conf.enabled and conf.template_file == tmp_path / "repair.yaml"
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        conf.max_attempts = 1
    with pytest.raises(ConfigError, match="regenerate.template: no such file"):
        regenerate_settings({"regenerate": {"template": "~/missing.yaml"}})


def test_without_a_provider_regeneration_is_refused(hydra_conf, tmp_path):
    cfg = compose("config", overrides=["task=tinystories", "task.n_seeds=2", "regenerate.max_attempts=2"])
    with pytest.raises(ConfigError, match="asks a model again"):
        run_in(cfg, tmp_path / "run")
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_sweep_report_has_pass_rate_by_attempt_per_setting(hydra_conf, tmp_path):
    """Two jobs of a sweep over regenerate.max_attempts: one row each, a column per attempt."""
    from storyforge.sweep import write_sweep

    root = tmp_path / "sweep"
    with FakeServer(script=script) as server:
        for job, attempts in (("0", 1), ("1", 3)):
            override = f"regenerate.max_attempts={attempts}"
            run_in(_cfg(server, tmp_path, override), root / job)
            (root / job / ".hydra").mkdir()
            (root / job / ".hydra" / "overrides.yaml").write_text(f"- {override}\n", "utf-8")
    write_sweep(root, plots=False)
    md = (root / "sweep_report.md").read_text("utf-8")
    assert "| job | `regenerate.max_attempts` | ≤1 attempt | ≤2 attempts |" in md
    assert "| 1 | 3 | 50.0% | 100.0% |" in md
    assert "| 0 | 1 |" in md.split("## Pass rate by attempt")[0]  # K=1 has no regeneration row
    assert "| 0 | 1 |" not in md.split("## Pass rate by attempt")[1].split("##")[0]


def _journal_lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


@pytest.mark.slow
def test_sigkill_mid_chain_resumes_and_sends_each_remaining_attempt_once(hydra_conf, tmp_path):
    """kill -9 run.py while attempt 2 is being sent; the rerun sends only the attempts not in
    the journal (plus at most the torn one), and every chain's attempt is written once."""
    import os
    import signal
    import subprocess
    import sys
    import time

    run, n_seeds = tmp_path / "run", 40
    with FakeServer(script=script, latency_s=0.05) as server:
        args = [
            "task=tinystories",
            f"task.n_seeds={n_seeds}",
            "provider=openai",
            f"provider.base_url={server.base_url}",
            "provider.model=fake",
            f"provider.seed={FIRST_SEED}",
            "provider.samples=2",
            "provider.concurrency=1",
            "provider.progress=false",
            "cache.path=null",
            "export.plots=false",
            "dedup=none",  # the scripted stories of one seed are the same text
            "regenerate.max_attempts=3",
        ]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        }
        proc = subprocess.Popen(
            [sys.executable, "run.py", *args, f"hydra.run.dir={run}"],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        journal = run / "generations.attempt2.jsonl"
        try:
            deadline = time.monotonic() + 120
            while _journal_lines(journal) < 5:
                assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
                assert time.monotonic() < deadline, "attempt 2 did not start within 120 s"
                time.sleep(0.005)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
        kept = _journal_lines(journal)
        assert 5 <= kept < n_seeds, "the run was not stopped mid-attempt"
        before = server.request_count
        manifest = run_in(compose("config", overrides=args), run)
        sent = server.request_count - before
    assert n_seeds - kept <= sent <= n_seeds - kept + 1
    assert manifest["regeneration"]["attempts"][0]["resumed"] == n_seeds - sent
    records = _lines(journal)
    assert len(records) == len({(r["id"], r["sample"]) for r in records}) == n_seeds
    assert manifest["completions"]["pass_rate"] == 1.0


@pytest.mark.slow
def test_repairs_go_out_while_a_first_answer_hangs_and_a_kill_loses_none(hydra_conf, tmp_path):
    """The run's first request hangs; the other chains' repair requests are sent and journaled
    meanwhile (no attempt waits for the whole attempt before it). After kill -9 then, the rerun
    sends only the hung chain's attempts, and every attempt is journaled once."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.support.fake_server import Fault, Received

    hung: list[Received] = []

    def hang_first(received: Received) -> Fault | None:
        body = received.json
        first = isinstance(body, dict) and body.get("seed") == FIRST_SEED and not is_repair(body)
        if first and not hung:
            hung.append(received)
            return Fault.stall(300.0)
        return None

    run, n_seeds = tmp_path / "run", SEEDS
    args = [
        "task=tinystories",
        f"task.n_seeds={n_seeds}",
        "provider=openai",
        "provider.model=fake",
        f"provider.seed={FIRST_SEED}",
        "provider.samples=2",
        "provider.concurrency=2",
        "provider.timeout_s=600",
        "provider.progress=false",
        "cache.path=null",
        "export.plots=false",
        "dedup=none",  # the scripted stories of one seed are the same text
        "regenerate.max_attempts=3",
    ]
    journal = run / "generations.attempt2.jsonl"
    with FakeServer(script=script, rule=hang_first) as server:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        }
        proc = subprocess.Popen(
            [sys.executable, "run.py", *args, f"provider.base_url={server.base_url}", f"hydra.run.dir={run}"],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 120
            # Sample 0 of every seed fails once: every chain's repair but the hung one's.
            while _journal_lines(journal) < n_seeds - 1:
                assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
                assert time.monotonic() < deadline, "the repairs waited for the hung first answer"
                time.sleep(0.01)
            assert len(hung) == 1 and proc.poll() is None  # the hung answer is still outstanding
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
    first = _lines(run / "generations.jsonl")
    assert len(first) == 2 * n_seeds - 1  # all but the hung request
    with FakeServer(script=script) as server:
        manifest = run_in(compose("config", overrides=[*args, f"provider.base_url={server.base_url}"]), run)
        sent = server.request_count
    assert sent == 2  # the hung chain's first attempt and its repair, nothing else
    assert manifest["regeneration"]["attempts"][0]["resumed"] == n_seeds - 1
    for name, count in (("generations.jsonl", 2 * n_seeds), ("generations.attempt2.jsonl", n_seeds)):
        records = _lines(run / name)
        assert len(records) == len({(r["id"], r["sample"]) for r in records}) == count, name
    assert not (run / "generations.attempt3.jsonl").exists()  # every repair passed
    assert manifest["completions"]["pass_rate"] == 1.0
