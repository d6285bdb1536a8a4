"""Regeneration chains on a real llama.cpp ``llama-server``: the server is SIGKILLed mid-chain and
a rerun finishes every chain with each attempt journaled exactly once.

The tiny random model's stories never pass their checks, so every chain runs to
``regenerate.max_attempts``, each attempt a repair conversation the real server continues.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.llama_server import LlamaServer
from tests.support.tiny_gguf import write_tiny_llama

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
N_SEEDS = 16
ATTEMPTS = 3


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    model = write_tiny_llama(tmp_path_factory.mktemp("model") / "tiny.gguf", seed=3)
    with LlamaServer(model, alias="tiny", context=8192, parallel=1) as server:
        yield server


def _lines(path: Path) -> list[dict]:  # type: ignore[type-arg]
    return (
        [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    )


def test_a_server_killed_mid_chain_resumes_every_chain_exactly_once(tmp_path, llama):
    run = tmp_path / "run"
    cmd = [
        sys.executable,
        "run.py",
        "task=tinystories",
        f"task.n_seeds={N_SEEDS}",
        "provider=openai",
        "provider.model=tiny",
        f"provider.base_url={llama.base_url}",
        "provider.max_tokens=300",
        "provider.seed=5",
        "provider.concurrency=1",
        "provider.max_retries=1",
        "provider.backoff_base_s=0.01",
        "provider.backoff_max_s=0.02",
        "provider.progress=false",
        "cache.path=null",
        "export.plots=false",
        f"regenerate.max_attempts={ATTEMPTS}",
        f"hydra.run.dir={run}",
    ]
    env = {key: value for key, value in os.environ.items() if key != "HYDRA_FULL_ERROR"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    journal = run / "generations.attempt2.jsonl"
    try:
        deadline = time.monotonic() + 240
        while len(_lines(journal)) < 2:
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:] if proc.stderr else ""
            assert time.monotonic() < deadline, "attempt 2 did not start within 240 s"
            time.sleep(0.002)
        llama.stop()  # SIGKILL, mid-way through attempt 2
        proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
        llama.start()
    answered_before = [r for r in _lines(journal) if r.get("error") is None]
    assert 2 <= len(answered_before) < N_SEEDS, "the server was not killed mid-attempt"

    again = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert again.returncode == 0, again.stderr[-3000:]
    for attempt in range(2, ATTEMPTS + 1):
        records = _lines(run / f"generations.attempt{attempt}.jsonl")
        keys = Counter((r["id"], r["sample"]) for r in records)
        assert len(keys) == N_SEEDS and set(keys.values()) == {1}, attempt
        assert all(r["error"] is None for r in records), attempt
    # The answers journaled before the kill were kept, not asked again.
    kept = {(r["id"], r["sample"]): r["request_hash"] for r in _lines(journal)}
    assert all(kept[(r["id"], r["sample"])] == r["request_hash"] for r in answered_before)
    chains = Counter(r["chain"] for r in _lines(run / "attempts.jsonl"))
    assert len(chains) == N_SEEDS and set(chains.values()) == {ATTEMPTS}
    manifest = json.loads((run / "manifest.json").read_text())
    resumed = manifest["regeneration"]["attempts"][0]["resumed"]
    assert resumed >= len(answered_before)
