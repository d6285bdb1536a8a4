"""A YAML syntax error in a user's own config file, and a sweep with a failing job: one line per
error naming where it is, and the documented exit status 2 (docs/running.md), not a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    return subprocess.run(
        [sys.executable, str(ROOT / "run.py"), *args],
        cwd=cwd,
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.parametrize(
    ("text", "where", "problem"),
    [
        ("task:\n  n_seeds: [1, 2\n", "3:1", "expected ',' or ']'"),
        ("task:\n  n_seeds: 3\n bad: 1\n", "3:2", "expected <block end>"),
        ("task:\n\tn_seeds: 3\n", "2:1", "found character '\\t'"),
    ],
)
def test_a_yaml_syntax_error_in_a_users_config_file_is_one_line(
    tmp_path: Path, text: str, where: str, problem: str
) -> None:
    experiment = tmp_path / "myconf" / "experiment" / "mine.yaml"
    experiment.parent.mkdir(parents=True)
    experiment.write_text(text, "utf-8")
    result = _run(tmp_path, "--config-dir", "myconf", "+experiment=mine", f"hydra.run.dir={tmp_path / 'run'}")
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert line.startswith(f"error: {experiment}:{where}: not valid YAML: ") and problem in line, line


def test_a_sweep_with_a_failing_job_says_one_line_per_failure_and_exits_2(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    result = _run(
        tmp_path, "-m", "task.n_seeds=2", "constraints.min_sentences=10,4", f"hydra.sweep.dir={sweep}"
    )
    assert result.returncode == 2
    expected = (
        "error: job 0 (task.n_seeds=2 constraints.min_sentences=10): constraints.min_sentences (10) "
        "must be <= constraints.max_sentences (9)"
    )
    assert result.stderr.splitlines() == [expected]
    assert (sweep / "1" / "prompts_seed.jsonl").is_file()  # the other job ran
    status = json.loads((sweep / "0" / "job_status.json").read_text("utf-8"))
    assert status["status"] == "failed" and "constraints.min_sentences (10)" in status["error"]
    summary = json.loads((sweep / "sweep_summary.json").read_text("utf-8"))
    assert [job["status"] for job in summary["jobs"]] != ["ok", "ok"]
    assert "Traceback" in (sweep / "0" / "run.log").read_text("utf-8")  # kept in the job's log
