"""executor=ray keeps Ray's own messages (its token-authentication notice, start-up lines) out of
the terminal: they go to the run's log file, and only storyforge's lines reach the user."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from run_support import REPO


@pytest.mark.slow
def test_ray_messages_stay_out_of_the_terminal(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HYDRA_", "STORYFORGE_", "RAY_"))}
    env["PYTHONPATH"] = str(REPO)
    env["HOME"] = str(tmp_path)  # no auth token of a cluster this user started: Ray announces token mode
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "run.py"),
            "task.n_seeds=6",
            "executor=ray",
            "executor.shards=2",
            "executor.num_cpus=1",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    terminal = proc.stdout + proc.stderr
    foreign = [line for line in terminal.splitlines() if line.strip() and "storyforge" not in line]
    assert foreign == [], foreign
    log = (run_dir / "run.log").read_text("utf-8")
    assert "Token authentication is enabled for this Ray cluster" in log
