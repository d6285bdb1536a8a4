"""The documented command line: run.py renders TinyStories prompts, generates through a server, and resumes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from provider_support import REPO

from tests.support.fake_server import FakeServer, Fault

KEY = "sk-e2e-7d1f0c3a9b5e"


def _run(server: FakeServer, run_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SF_E2E_API_KEY": KEY}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    cmd = [
        sys.executable,
        "run.py",
        "task=tinystories",
        "task.n_seeds=10",
        "provider=openai",
        f"provider.base_url={server.base_url}",
        "provider.model=m",
        "provider.samples=2",
        "provider.api_key_env=SF_E2E_API_KEY",
        "provider.backoff_base_s=0.001",
        f"hydra.run.dir={run_dir}",
    ]
    return subprocess.run(  # noqa: PLW1510 - the exit code is asserted
        cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=240
    )


@pytest.mark.slow
def test_run_py_generates_resumes_and_keeps_the_key_out_of_every_file(tmp_path):
    """Two runs into one directory: 20 completions once each, no second-run requests, no key on disk."""
    run_dir = tmp_path / "run"
    with FakeServer(api_key=KEY) as server:
        server.queue_faults(Fault.http(500), Fault.rate_limited("0"))
        first = _run(server, run_dir)
        assert first.returncode == 0, first.stderr[-3000:]
        sent = server.request_count
        second = _run(server, run_dir)
        assert second.returncode == 0, second.stderr[-3000:]
        assert server.request_count == sent == 22
    lines = (run_dir / "generations.jsonl").read_text().splitlines()
    counts = Counter((r["id"], r["sample"]) for r in map(json.loads, lines))
    assert len(counts) == 20 and set(counts.values()) == {1}
    prompt_ids = {json.loads(line)["id"] for line in (run_dir / "prompts.jsonl").read_text().splitlines()}
    assert {key[0] for key in counts} == prompt_ids and {key[1] for key in counts} == {0, 1}
    generation = json.loads((run_dir / "manifest.json").read_text())["generation"]
    assert (generation["requests"], generation["resumed"], generation["total"]) == (0, 20, 20)
    assert generation["api_key_env"] == "SF_E2E_API_KEY"
    scanned = [f for f in run_dir.rglob("*") if f.is_file()]
    assert any(f.parent.name == ".hydra" for f in scanned)
    for file in scanned:
        assert KEY.encode() not in file.read_bytes(), file
    assert KEY not in first.stdout + first.stderr + second.stdout + second.stderr
