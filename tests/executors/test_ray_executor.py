"""executor=ray on a real local Ray instance (2 CPUs) against a deterministic loopback server.

Proves the contract (merged files equal an executor=local run's), exactly-once generation
when a worker process is killed mid-run, and resume after the driver is killed with SIGKILL.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
from run_support import REPO, assert_exactly_once, assert_same_run, provider_overrides, run_cfg

from storyforge.executors.ray_executor import start_local_ray
from storyforge.jobs import tinystories as job
from storyforge.testing.fake_server import FakeServer


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """One private Ray instance with 2 CPUs for the whole module."""
    start_local_ray(2)
    yield
    ray.shutdown()


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
    """Generated seeds and a seed file with bad lines: every merged file equals the local run's."""
    with FakeServer() as server:
        common = ["task.n_seeds=30", *provider_overrides(server.base_url, samples=2)]
        job.run(run_cfg(*common), tmp_path / "local")
        ray_args = ["executor=ray", "executor.shards=3"]
        capfd.readouterr()
        manifest = job.run(run_cfg(*common, *ray_args), tmp_path / "ray")
        bar = capfd.readouterr().err
        assert_same_run(tmp_path / "local", tmp_path / "ray")
        timings = manifest["executor"].pop("timings")
        assert manifest["executor"] == {"name": "ray", "address": "local", "shards": 3}
        assert set(timings) == {"render_s", "merge_s", "generate_s", "validate_s"}
        assert "60/60" in bar and "on 3 shards" in bar  # one bar for the whole job, fed by the shards
        # Every shard got seeds, so the merge really interleaved three files.
        assert all(
            (tmp_path / "ray" / "shards" / f"{k:04d}" / "prompts.jsonl").stat().st_size for k in range(3)
        )

        seeds = _write_seed_file(tmp_path / "seeds.jsonl", tmp_path / "local" / "prompts_seed.jsonl")
        from_file = ["task.n_seeds=1", f"seeds_path={seeds}", *provider_overrides(server.base_url)]
        job.run(run_cfg(*from_file), tmp_path / "file-local")
        job.run(run_cfg(*from_file, *ray_args), tmp_path / "file-ray")
    assert_same_run(tmp_path / "file-local", tmp_path / "file-ray")
    rejected = (tmp_path / "file-ray" / "rejected_seeds.jsonl").read_text("utf-8").splitlines()
    assert [json.loads(line)["line"] for line in rejected] == [6, 14, 15]


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
        manifest = job.run(cfg, out)
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
    """kill -9 the driver mid-run, rerun into the same directory: only the missing requests are sent."""
    out = tmp_path / "run"
    n_seeds = 160
    with FakeServer(latency_s=0.05) as server:
        # One request in flight per shard (2 in all) keeps the run going for a few seconds.
        overrides = provider_overrides(server.base_url, concurrency=1 if executor == "ray" else 2)
        args = [f"task.n_seeds={n_seeds}", *overrides, f"executor={executor}"]
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
        manifest = job.run(run_cfg(*args), out)
        sent = server.request_count - sent_before
    assert_exactly_once(out / "generations.jsonl", out / "prompts.jsonl", 1)
    # A torn last line is cut and asked again, so at most one more than the missing ones.
    assert n_seeds - kept <= sent <= n_seeds - kept + (2 if executor == "ray" else 1)
    assert manifest["generation"]["resumed"] == n_seeds - sent


def test_a_shard_error_reaches_the_driver_as_itself(
    hydra_conf: None, local_ray: None, tmp_path: Path
) -> None:
    """replay=only with an empty cache fails in a shard; the driver raises the same ProviderError, named."""
    from storyforge.errors import ProviderError

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
        ProviderError, match=r"provider\.replay=only: \d request\(s\) are not in the response cache"
    ):
        job.run(cfg, tmp_path / "out")
