"""A sweep through hydra-submitit-launcher (submitit_local; submitit_slurm takes the same path on a cluster)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

from run_support import REPO

from tests.support.fake_server import FakeServer


def test_submitit_local_sweep_runs_one_job_per_setting_sharing_the_response_cache(tmp_path: Path) -> None:
    """Two submitit jobs, each with its own seed count, generate over loopback into one shared cache."""
    root, cache = tmp_path / "sweep", tmp_path / "cache.sqlite"
    with FakeServer() as server:
        proc = subprocess.run(
            [
                sys.executable,
                "run.py",
                "-m",
                "hydra/launcher=submitit_local",
                "hydra.launcher.timeout_min=5",
                "task.n_seeds=3,4",
                "provider=openai",
                f"provider.base_url={server.base_url}",
                "provider.model=fake",
                "provider.progress=false",
                f"cache.path={cache}",
                f"hydra.sweep.dir={root}",
            ],
            cwd=REPO,
            check=False,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr
        sent = server.request_count
    for job, n in (("0", 3), ("1", 4)):
        generations = (root / job / "generations.jsonl").read_text("utf-8").splitlines()
        assert [json.loads(line)["id"] for line in generations] == [f"ts-{i:06d}" for i in range(n)]
    summary = json.loads((root / "sweep_summary.json").read_text("utf-8"))
    assert [job["status"] for job in summary["jobs"]] == ["ok", "ok"]
    with sqlite3.connect(cache) as db:
        (stored,) = db.execute("SELECT count(*) FROM responses").fetchone()
    # The jobs ran side by side, so a shared request may have been paid for twice, never more.
    assert stored == 4 and 4 <= sent <= 7
