"""Crash safety: a generation process killed with SIGKILL or interrupted with SIGINT resumes exactly once."""

from __future__ import annotations

import itertools
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from provider_support import REPO, assert_exactly_once, openai_cfg, write_prompts

from storyforge.providers import generate_for_job
from tests.support.fake_server import FakeServer, Fault, Received

SCRIPT = """
import pickle
import sys
from pathlib import Path
from storyforge.providers import generate_for_job
generate_for_job(pickle.loads(Path(sys.argv[1]).read_bytes()), Path(sys.argv[2]), Path(sys.argv[3]))
"""

N_PROMPTS, SAMPLES = 40, 2
HELD_AFTER = 12


def _start(tmp_path: Path, server: FakeServer) -> tuple[subprocess.Popen[bytes], Path, Path]:
    prompts = write_prompts(tmp_path / "prompts.jsonl", N_PROMPTS)
    cfg_path = tmp_path / "settings.pickle"
    cfg_path.write_bytes(pickle.dumps(openai_cfg(server, samples=SAMPLES, concurrency=4, seed=1)))
    out = tmp_path / "run"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(cfg_path), str(out), str(prompts)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    return proc, out, prompts


def _wait_for_lines(path: Path, n: int, proc: subprocess.Popen[bytes], limit_s: float = 60.0) -> int:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if path.exists():
            count = path.read_bytes().count(b"\n")
            if count >= n:
                return count
        if proc.poll() is not None:
            pytest.fail(
                f"generation ended before {n} records: {proc.stderr.read().decode() if proc.stderr else ''}"
            )
        time.sleep(0.005)
    pytest.fail(f"no {n} records within {limit_s}s")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["kill-9", "ctrl-c"])
def test_killed_run_resumes_without_duplicates_or_gaps(tmp_path, sig):
    """Stop a generating subprocess mid-way, rerun into the same directory: every (id, sample) once."""
    # The server answers the first HELD_AFTER requests and holds every later one until the
    # signal was sent, so the run is surely mid-way when it is stopped, however slow the machine.
    sent = itertools.count(1)
    holding = threading.Event()
    holding.set()

    def hold(_request: Received) -> Fault | None:
        return Fault.stall(600.0) if next(sent) > HELD_AFTER and holding.is_set() else None

    with FakeServer(latency_s=0.01, rule=hold) as server:
        proc, out, prompts = _start(tmp_path, server)
        path = out / "generations.jsonl"
        _wait_for_lines(path, 10, proc)
        proc.send_signal(sig)
        holding.clear()
        proc.wait(timeout=30)
        stderr = proc.stderr.read().decode() if proc.stderr else ""
        assert proc.returncode != 0
        written = path.read_bytes()
        finished = written.count(b"\n")
        assert 10 <= finished < N_PROMPTS * SAMPLES, "the run was not stopped mid-way"
        if sig == signal.SIGINT:
            assert "KeyboardInterrupt" in stderr and written.endswith(b"\n")
        sent_before = server.request_count
        _, stats = generate_for_job(openai_cfg(server, samples=SAMPLES, seed=1), out, prompts)
    assert_exactly_once(path, N_PROMPTS, SAMPLES)
    assert stats["resumed"] == finished
    assert stats["requests"] == N_PROMPTS * SAMPLES - finished
    assert server.request_count - sent_before == N_PROMPTS * SAMPLES - finished
