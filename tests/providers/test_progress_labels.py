"""Each pass of a run has a progress bar of its own label: generation, each repair attempt,
each judge attempt and retry."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from storyforge.providers.runner import bar_label
from tests.support.fake_server import FakeServer

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("stage", "journal", "label"),
    [
        ("generation", "generations.jsonl", "generate m"),
        ("regeneration", "generations.attempt2.jsonl", "repair attempt 2 m"),
        ("regeneration", "generations.attempt3.jsonl", "repair attempt 3 m"),
        ("judge", "judgements.jsonl", "judge attempt 1 m"),
        ("judge", "judgements.retry1.jsonl", "judge attempt 1 retry 1 m"),
        ("judge", "judgements.attempt2.retry2.jsonl", "judge attempt 2 retry 2 m"),
    ],
)
def test_each_pass_has_its_label(stage: str, journal: str, label: str) -> None:
    assert bar_label(stage, journal, "m") == label


def test_a_regeneration_run_names_its_bar(tmp_path: Path) -> None:
    """Pipelined chains (no judge) share one bar, named for what it counts."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYDRA_")}
    env["PYTHONPATH"] = str(ROOT)
    with FakeServer() as server:
        proc = subprocess.run(
            [
                sys.executable,
                str(ROOT / "run.py"),
                "task.n_seeds=12",
                "provider=openai",
                f"provider.base_url={server.base_url}",
                "provider.model=fake",
                "provider.progress=true",
                "regenerate.max_attempts=3",
                "export.plots=false",
                f"hydra.run.dir={tmp_path / 'run'}",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    assert proc.returncode == 0, proc.stderr[-2000:]
    attempts = (tmp_path / "run" / "manifest.json").read_text("utf-8")
    assert '"attempt": 2' in attempts  # a second attempt was sent
    assert "generate and repair (up to 3 attempts) fake" in proc.stderr
