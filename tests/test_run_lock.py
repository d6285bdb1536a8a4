"""One run per run directory: a second run into a locked directory names the holder and stops
(or waits with wait=true); the lock is the kernel's, so a holder killed with -9 leaves none."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HOLD = """
import sys, time
from pathlib import Path
from storyforge.run_lock import hold_run_dir
with hold_run_dir(Path(sys.argv[1]), lock_name=".hydra/run.lock"):  # as run.py locks it
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
"""
HOLD_UNTIL_TOLD = """
import sys
from pathlib import Path
from storyforge.run_lock import hold_run_dir
with hold_run_dir(Path(sys.argv[1]), lock_name=".hydra/run.lock"):
    print("held", flush=True)
    sys.stdin.readline()
"""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HYDRA_", "STORYFORGE_"))}
    # the test's own response cache (tests/conftest.py), never the user's
    cache_dir = os.environ["STORYFORGE_RESPONSE_CACHE_DIR"]
    return {**env, "PYTHONPATH": str(ROOT), "STORYFORGE_RESPONSE_CACHE_DIR": cache_dir}


def _holder(run_dir: Path, seconds: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(run_dir), str(seconds), "holder-of-the-lock"],
        stdout=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    return proc


def _run(run_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "run.py"), "task.n_seeds=2", f"hydra.run.dir={run_dir}", *extra],
        cwd=run_dir.parent,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_second_run_names_the_holder_and_a_kill_9_releases_the_lock(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    holder = _holder(run_dir, 120)
    try:
        refused = _run(run_dir)
        assert refused.returncode == 2
        [line] = refused.stderr.splitlines()
        assert line.startswith(f"error: run directory {run_dir} is in use by pid {holder.pid} on ")
        assert line.endswith(
            "(-c); wait for that run (add wait=true to wait for it) or choose another hydra.run.dir"
        )
        assert "holder-of-the-lock" not in line  # arguments are never recorded
        assert not (run_dir / "prompts_seed.jsonl").exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    after = _run(run_dir)
    assert after.returncode == 0, after.stderr
    assert (run_dir / "prompts_seed.jsonl").is_file()


def test_wait_true_waits_for_the_holder(tmp_path: Path) -> None:
    """The waiting run says whom it waits for, and runs once the holder lets go (the holder
    holds until the run has said so, whatever the time either takes)."""
    run_dir = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_UNTIL_TOLD, str(run_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    assert holder.stdin is not None and holder.stdout is not None
    waiting: subprocess.Popen[str] | None = None
    try:
        assert holder.stdout.readline() == "held\n"
        waiting = subprocess.Popen(
            [sys.executable, str(ROOT / "run.py"), "task.n_seeds=2", f"hydra.run.dir={run_dir}", "wait=true"],
            cwd=tmp_path,
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert waiting.stdout is not None
        said = next((line for line in waiting.stdout if "waiting for it to finish" in line), "")
        assert f"is in use by pid {holder.pid}" in said
        assert not (run_dir / "prompts_seed.jsonl").exists()
        holder.stdin.write("release\n")
        holder.stdin.flush()
        _, err = waiting.communicate(timeout=120)
        assert waiting.returncode == 0, err
        assert (run_dir / "prompts_seed.jsonl").is_file()
    finally:
        for proc in (holder, waiting):
            if proc is not None:
                proc.kill()
                proc.wait()


@pytest.mark.parametrize("wait", [False, True])
def test_the_lock_records_nothing_once_released(tmp_path: Path, wait: bool) -> None:
    """The lock file is emptied when the run ends, so no run directory's files depend on who ran."""
    from storyforge.run_lock import LOCK_NAME, hold_run_dir

    with hold_run_dir(tmp_path, wait=wait):
        assert str(os.getpid()) in (tmp_path / LOCK_NAME).read_text("utf-8")
    assert (tmp_path / LOCK_NAME).read_bytes() == b""
