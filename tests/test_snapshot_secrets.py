"""A password in ``provider.base_url`` never reaches the ``.hydra`` snapshot or stderr, and a run
that stops before its job (a typo in a key, a run directory in use) never writes into the snapshot
of the run that owns the directory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PASSWORD = "pw-Secr3t-Hunter2x"
URL = f"http://storyuser:{PASSWORD}@127.0.0.1:9/v1"
HOLD = """
import sys, time
from pathlib import Path
from storyforge.run_lock import hold_run_dir
with hold_run_dir(Path(sys.argv[1]), lock_name=".hydra/run.lock"):  # as run.py locks it
    print("held", flush=True)
    time.sleep(120)
"""


def _env(**more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HYDRA_", "STORYFORGE_"))}
    cache_dir = os.environ["STORYFORGE_RESPONSE_CACHE_DIR"]  # the test's own (tests/conftest.py)
    return {**env, "PYTHONPATH": str(ROOT), "STORYFORGE_RESPONSE_CACHE_DIR": cache_dir, **more}


def _run(run_dir: Path, *extra: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "run.py"), "task.n_seeds=2", f"hydra.run.dir={run_dir}", *extra],
        cwd=run_dir.parent,
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def _files(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def _with_password(files: dict[str, bytes]) -> list[str]:
    return [name for name, data in files.items() if PASSWORD.encode() in data]


@pytest.mark.parametrize("full_error", [False, True])
def test_a_typo_stops_the_run_before_any_snapshot_holds_the_password(
    tmp_path: Path, full_error: bool
) -> None:
    run_dir = tmp_path / "run"
    env = {"HYDRA_FULL_ERROR": "1"} if full_error else {}
    result = _run(
        run_dir, "provider=openai", "provider.model=tiny", f"provider.base_url={URL}", "+sed=1", **env
    )
    assert result.returncode != 0
    assert "sed: unknown key" in result.stderr
    assert PASSWORD not in result.stderr + result.stdout  # Hydra's "Error executing job" line too
    assert not run_dir.exists() or _with_password(_files(run_dir)) == []


def test_a_refused_run_leaves_the_running_runs_snapshot_alone(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    first = _run(run_dir, "seed=1")
    assert first.returncode == 0, first.stderr
    before = _files(run_dir / ".hydra")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True, env=_env()
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        refused = _run(
            run_dir, "seed=2", "provider=openai", "provider.model=tiny", f"provider.base_url={URL}"
        )
        assert refused.returncode == 2
        assert "is in use by" in refused.stderr
        assert PASSWORD not in refused.stderr + refused.stdout
        after = _files(run_dir / ".hydra")
        after.pop("run.lock"), before.pop("run.lock")
        assert after == before
        assert _with_password(_files(run_dir)) == []
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()


def test_a_sweep_keeps_the_password_out_of_its_files_and_its_failed_jobs_lines(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "run.py"),
            "-m",
            "task.n_seeds=2",
            "provider=openai",
            "provider.model=tiny",
            f"provider.base_url={URL}",
            "constraints.min_sentences=10,11",
            f"hydra.sweep.dir={sweep}",
        ],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert len(result.stderr.splitlines()) == 2  # one line per failed job
    assert PASSWORD not in result.stderr + result.stdout
    assert (sweep / "multirun.yaml").is_file()
    assert _with_password(_files(sweep)) == []


def test_the_snapshot_the_job_writes_is_the_one_hydra_writes(tmp_path: Path) -> None:
    """The job writes the ``.hydra`` files Hydra writes when it is left to (a run that sets
    ``hydra.output_subdir`` itself): the same bytes, but for that override in ``hydra.yaml``."""
    run_dir = tmp_path / "run"
    extra = ("provider=openai", "provider.model=tiny", f"provider.base_url={URL}", "stage=batch_export")
    by_the_job = _run(run_dir, *extra)
    assert by_the_job.returncode == 0, by_the_job.stderr
    ours = _files(run_dir / ".hydra")
    for path in sorted(run_dir.rglob("*"), reverse=True):  # the same run directory, emptied
        path.rmdir() if path.is_dir() else path.unlink()
    by_hydra = _run(run_dir, *extra, "hydra.output_subdir=.hydra")
    assert by_hydra.returncode == 0, by_hydra.stderr
    theirs = _files(run_dir / ".hydra")
    assert sorted(ours) == sorted(theirs)
    assert {"config.yaml", "overrides.yaml", "hydra.yaml"} <= set(ours)
    setting = b"\n    - hydra.output_subdir=.hydra"
    assert setting in theirs["hydra.yaml"]
    theirs["hydra.yaml"] = theirs["hydra.yaml"].replace(setting, b"")
    theirs["hydra.committed.yaml"] = theirs["hydra.committed.yaml"].replace(setting, b"")
    assert ours == theirs
    assert _with_password(ours) == []
