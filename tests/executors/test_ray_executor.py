"""executor=ray on a real local Ray instance (2 CPUs) against a deterministic loopback server.

Proves the contract (merged files equal an executor=local run's), exactly-once generation
when a worker process is killed mid-run, and resume after the driver is killed with SIGKILL.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from run_support import (
    REPO,
    assert_exactly_once,
    assert_same_run,
    provider_overrides,
    run_cfg,
    varied_answers,
)

from storyforge.executors import shard_of
from storyforge.jobs.tinystories_shards import LOCK_FILE
from storyforge.pipeline import run_in
from storyforge.tasks.tinystories.outputs import EXPORTS
from tests.support.fake_server import FakeServer

EXPORT_FILES = [f"{name}.jsonl" for name in EXPORTS]

# Failed requests become error records at once, and the run keeps them instead of failing.
FAILING_REQUESTS = ["provider.max_retries=0", "provider.max_error_rate=0.5"]


def _journal_lines(out: Path) -> int:
    """Complete lines in the run's journal(s): the shards' under executor=ray, else the run's own."""
    paths = [*out.glob("shards/*/generations.jsonl"), out / "generations.jsonl"]
    return sum(p.read_bytes().count(b"\n") for p in paths if p.exists())


def _settled_lines(out: Path, quiet_s: float = 2.0, limit_s: float = 30.0) -> int:
    """Journal lines once nothing has been appended for ``quiet_s``: Ray workers of a killed driver
    may finish a batch before Ray ends them (the shard lock keeps them from racing a rerun)."""
    deadline = time.monotonic() + limit_s
    lines, since = _journal_lines(out), time.monotonic()
    while time.monotonic() - since < quiet_s:
        assert time.monotonic() < deadline, "the journals kept growing after the driver was killed"
        time.sleep(0.1)
        now = _journal_lines(out)
        if now != lines:
            lines, since = now, time.monotonic()
    return lines


def _write_seed_file(path: Path, seeds: Path) -> Path:
    """The given seeds plus lines a loader must reject: not JSON, a duplicate id, a bad record."""
    lines = seeds.read_text("utf-8").splitlines()
    bad = ["{not json", lines[3], json.dumps({"id": "broken", "theme": 3})]
    path.write_text(
        "\n".join([*lines[:5], bad[0], *lines[5:12], bad[1], bad[2], *lines[12:]]) + "\n", "utf-8"
    )
    return path


def test_ray_run_writes_the_same_files_as_a_local_run(
    hydra_conf: None, local_ray: None, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Generated seeds and a seed file with bad lines: every merged file equals the local run's.

    The answers pass, fail (DPO pairs), come back empty or fail at the provider, so every data
    set, its Parquet twin and the report have rows of each kind to put in order.
    """
    with FakeServer(rule=varied_answers(errors=True)) as server:
        common = ["task.n_seeds=30", *provider_overrides(server.base_url, samples=2), *FAILING_REQUESTS]
        local = run_in(run_cfg(*common), tmp_path / "local")
        ray_args = ["executor=ray", "executor.shards=3"]
        capfd.readouterr()
        manifest = run_in(run_cfg(*common, *ray_args), tmp_path / "ray")
        bar = capfd.readouterr().err
        assert_same_run(tmp_path / "local", tmp_path / "ray")
        summary = local["completions"]
        assert summary["passed"] and summary["failed"] and summary["exports"]["rows"]["dpo"]
        assert summary["labels"]["other"] > manifest["generation"]["errors"] > 0
        timings = manifest["executor"].pop("timings")
        assert manifest["executor"] == {"name": "ray", "address": "local", "shards": 3}
        assert set(timings) == {"render_s", "merge_s", "generate_s", "dedup_s", "shard_validate_s"}
        # Repeated answers: the same clusters and kept members on 3 shards as in one process
        # (duplicates.jsonl and the rejects are among the files compared above).
        assert summary["dedup"]["exact_duplicates"] > 0
        clusters = (tmp_path / "ray" / "duplicates.jsonl").read_text("utf-8").splitlines()
        assert len(clusters) == summary["dedup"]["clusters"] > 0
        repeats = [
            json.loads(line) for line in (tmp_path / "ray" / "rejects.jsonl").read_text("utf-8").splitlines()
        ]
        assert sum(r["data_labels"] == ["near_duplicate"] for r in repeats) == summary["dedup"]["dropped"]
        assert "60/60" in bar and "on 3 shards" in bar  # one bar for the whole job, fed by the shards
        # Every shard got seeds, so the merge really interleaved three files.
        assert all(
            (tmp_path / "ray" / "shards" / f"{k:04d}" / "prompts.jsonl").stat().st_size for k in range(3)
        )

        seeds = _write_seed_file(tmp_path / "seeds.jsonl", tmp_path / "local" / "prompts_seed.jsonl")
        from_file = [
            "task.n_seeds=1",
            f"seeds_path={seeds}",
            *provider_overrides(server.base_url),
            *FAILING_REQUESTS,
        ]
        run_in(run_cfg(*from_file), tmp_path / "file-local")
        run_in(run_cfg(*from_file, *ray_args), tmp_path / "file-ray")
    assert_same_run(tmp_path / "file-local", tmp_path / "file-ray")
    rejected = (tmp_path / "file-ray" / "rejected_seeds.jsonl").read_text("utf-8").splitlines()
    assert [json.loads(line)["line"] for line in rejected] == [6, 14, 15]


def test_each_shard_validates_its_own_journal_on_a_worker(
    hydra_conf: None, local_ray: None, tmp_path: Path
) -> None:
    """The rows of every data set are written by the shards' workers, citing the merged file's
    lines; the driver only interleaves their bytes, so its own validation lap is no per-record work."""
    out = tmp_path / "ray"
    with FakeServer(rule=varied_answers(errors=False)) as server:
        overrides = provider_overrides(server.base_url, samples=2)
        manifest = run_in(run_cfg("task.n_seeds=24", *overrides, "executor=ray", "executor.shards=2"), out)
    shards = [out / "shards" / f"{k:04d}" for k in range(2)]
    journal = (out / "generations.jsonl").read_bytes().splitlines()
    for name in EXPORT_FILES:
        run_lines = (out / name).read_bytes().splitlines()
        shard_lines = [(shard / name).read_bytes().splitlines() for shard in shards]
        assert sorted(run_lines) == sorted(shard_lines[0] + shard_lines[1]), name
        for k, lines in enumerate(shard_lines):
            assert all(shard_of(json.loads(line)["id"], 2) == k for line in lines), name
        assert (out / name).with_suffix(".parquet").is_file()  # the merged file's twin, not the shards'
        assert not any((shard / name).with_suffix(".parquet").exists() for shard in shards)
    for record in map(json.loads, (out / "validated.jsonl").read_bytes().splitlines()):
        cited = json.loads(journal[record["line"] - 1])
        assert (cited["id"], cited["sample"]) == (record["id"], record["sample"])
    assert all(int((shard / "worker.pid").read_text("ascii")) != os.getpid() for shard in shards)
    summary = manifest["completions"]
    assert summary["validated"] == 48 and summary["passed"] and summary["exports"]["rows"]["dpo"]
    timings = manifest["executor"]["timings"]
    assert timings["shard_validate_s"] > 0 and timings["merge_s"] > 0


def test_a_worker_killed_while_validating_is_retried_and_the_files_match_a_local_run(
    hydra_conf: None, local_ray: None, tmp_path: Path
) -> None:
    """SIGKILL the worker that validates shard 0, with stale files in its directory: Ray starts the
    validation again, it rewrites the shard's files whole, and the run equals a local run."""
    out = tmp_path / "ray"
    shard = out / "shards" / "0000"
    killed: dict[str, int] = {}

    def kill_the_validating_worker() -> None:
        deadline = time.monotonic() + 60
        while not (shard / "generations.jsonl").is_file() or not (shard / "generations.jsonl").stat().st_size:
            assert time.monotonic() < deadline, "shard 0 never generated"
            time.sleep(0.01)
        with (shard / LOCK_FILE).open("wb") as lock:
            # Generation holds the shard lock until it is done; then this test holds it, so the
            # validation task, which starts after the driver merged the journals, waits here.
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            merged, pid_file = out / "generations.jsonl", shard / "worker.pid"
            while not merged.is_file() or pid_file.stat().st_mtime_ns < merged.stat().st_mtime_ns:
                assert time.monotonic() < deadline, "shard 0 was never validated"
                time.sleep(0.01)
            killed["pid"] = int(pid_file.read_text("ascii"))
            os.kill(killed["pid"], signal.SIGKILL)
            (shard / "validated.jsonl").write_bytes(b'{"stale": true}\n' * 50)
            while int(pid_file.read_text("ascii")) == killed["pid"]:
                assert time.monotonic() < deadline, "the validation was not started again"
                time.sleep(0.01)

    with FakeServer(rule=varied_answers(errors=False)) as server:
        common = ["task.n_seeds=24", *provider_overrides(server.base_url, samples=2)]
        run_in(run_cfg(*common), tmp_path / "local")
        killer = threading.Thread(target=kill_the_validating_worker)
        killer.start()
        run_in(run_cfg(*common, "executor=ray", "executor.shards=2"), out)
        killer.join()
    assert "pid" in killed, "no worker was killed"
    assert_same_run(tmp_path / "local", out)


def test_a_killed_worker_is_retried_and_every_request_is_written_once(
    hydra_conf: None, local_ray: None, tmp_path: Path
) -> None:
    """SIGKILL a worker mid-generation: Ray starts the shard again and it resumes its journal."""
    out = tmp_path / "run"
    killed: dict[str, int] = {}

    def kill_a_worker() -> None:
        shard = out / "shards" / "0000"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            journal = shard / "generations.jsonl"
            if journal.exists() and journal.read_bytes().count(b"\n") >= 5:
                killed["pid"] = int((shard / "worker.pid").read_text("ascii"))
                killed["lines"] = journal.read_bytes().count(b"\n")
                os.kill(killed["pid"], signal.SIGKILL)
                return
            time.sleep(0.01)

    with FakeServer(latency_s=0.05) as server:
        cfg = run_cfg(
            "task.n_seeds=60", *provider_overrides(server.base_url), "executor=ray", "executor.shards=2"
        )
        killer = threading.Thread(target=kill_a_worker)
        killer.start()
        manifest = run_in(cfg, out)
        killer.join()
    assert "pid" in killed, "no worker was killed"
    shard_total = (out / "shards" / "0000" / "prompts.jsonl").read_bytes().count(b"\n")
    assert killed["lines"] < shard_total, "the shard had finished before the kill"
    assert int((out / "shards" / "0000" / "worker.pid").read_text("ascii")) != killed["pid"]  # it ran again
    records = assert_exactly_once(out / "generations.jsonl", out / "prompts.jsonl", 1)
    assert all(r["error"] is None for r in records)
    assert manifest["generation"]["total"] == 60 and manifest["generation"]["errors"] == 0


@pytest.mark.parametrize("executor", ["local", "ray"])
def test_a_driver_killed_with_sigkill_resumes_when_rerun(
    hydra_conf: None, local_ray: None, tmp_path: Path, executor: str
) -> None:
    """kill -9 the driver mid-run, rerun into the same directory: only the missing requests are
    sent, and the files are those of a run that was never stopped."""
    out = tmp_path / "run"
    n_seeds = 160
    with FakeServer(latency_s=0.05, rule=varied_answers(errors=False)) as server:
        # One request in flight per shard (2 in all) keeps the run going for a few seconds.
        overrides = provider_overrides(server.base_url, concurrency=1 if executor == "ray" else 2)
        common = [f"task.n_seeds={n_seeds}", *overrides]
        args = [*common, f"executor={executor}"]
        if executor == "ray":
            args += ["executor.shards=2", "executor.num_cpus=2"]
        proc = subprocess.Popen(
            [sys.executable, "run.py", *args, f"hydra.run.dir={out}"],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 90
            while _journal_lines(out) < 10:
                assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
                assert time.monotonic() < deadline, "no generation within 90 s"
                time.sleep(0.01)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            # The private Ray instance a driver starts outlives it for a moment: end its raylet
            # and helpers (the driver's process group) so its workers stop soon. Until they do,
            # they may append a few more answers; the shard lock keeps a rerun from racing them.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        kept = _settled_lines(out)
        assert 10 <= kept < n_seeds, "the run was not stopped mid-way"
        sent_before = server.request_count
        manifest = run_in(run_cfg(*args), out)
        sent = server.request_count - sent_before
        server.latency_s = 0.0
        run_in(run_cfg(*common), tmp_path / "uninterrupted")
    assert_exactly_once(out / "generations.jsonl", out / "prompts.jsonl", 1)
    # A torn last line is cut and asked again, so at most one more than the missing ones.
    assert n_seeds - kept <= sent <= n_seeds - kept + (2 if executor == "ray" else 1)
    assert manifest["generation"]["resumed"] == n_seeds - sent
    assert_same_run(tmp_path / "uninterrupted", out, resumed=True)


def test_a_shard_error_reaches_the_driver_as_itself(
    hydra_conf: None, local_ray: None, tmp_path: Path
) -> None:
    """replay=only with an empty cache fails in a shard; the driver raises the same DataError, named."""
    from storyforge.errors import DataError

    cache = tmp_path / "cache.sqlite"
    cfg = run_cfg(
        "task.n_seeds=6",
        *provider_overrides("http://127.0.0.1:9/v1"),
        f"cache.path={cache}",
        "provider.replay=only",
        "executor=ray",
        "executor.shards=2",
    )
    with pytest.raises(
        DataError, match=r"provider\.replay=only: \d request\(s\) are not in the response cache"
    ):
        run_in(cfg, tmp_path / "out")


def _tree(root: Path) -> dict[str, bytes]:
    """Every file below ``root`` (Hydra's snapshot and logs aside), by relative path."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".hydra" not in p.parts and p.suffix != ".log"
    }


@pytest.mark.parametrize(
    "overrides",
    [
        ["task=research_qa", "stage=all", "task.progress=false"],
        ["task=research_qa", "model=rag_trained", "task.prompt_mode=with_context", "task.progress=false"],
        ["task=turn_generation"],
        ["task=chapter_summarization"],
        ["task=writing_assistant", "budget=small_context"],
    ],
    ids=[
        "research_qa-all",
        "research_qa-context",
        "turn_generation",
        "chapter_summarization",
        "writing_assistant",
    ],
)
def test_every_task_kind_runs_on_ray_as_it_runs_locally(
    hydra_conf: None,
    local_ray: None,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    overrides: list[str],
) -> None:
    """research_qa and the render tasks are jobs like TinyStories: executor=ray runs their unit on
    a worker and writes the same files, byte for byte; what is printed still reaches this terminal."""
    capfd.readouterr()
    local = run_in(run_cfg(*overrides), tmp_path / "local")
    printed = capfd.readouterr().out
    remote = run_in(run_cfg(*overrides, "executor=ray", "executor.shards=3"), tmp_path / "ray")
    assert capfd.readouterr().out == printed
    # The summaries name their run directory; otherwise they are the same.
    assert json.dumps(remote).replace(str(tmp_path / "ray"), "RUN") == json.dumps(local).replace(
        str(tmp_path / "local"), "RUN"
    )
    expected = _tree(tmp_path / "local")
    assert expected and _tree(tmp_path / "ray") == expected
    if overrides[0] != "task=research_qa":
        assert printed.startswith("=== ") and set(expected) == {"messages.json", "trace.json"}
