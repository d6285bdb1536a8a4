"""``dedup.against`` naming a file that is not what it says: one line naming it, no traceback."""

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
        [sys.executable, str(ROOT / "run.py"), "task.n_seeds=2", *args],
        cwd=cwd,
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("against")
    assert _run(work, "hydra.run.dir=seeds").returncode == 0
    ids = [
        json.loads(line)["id"]
        for line in (work / "seeds" / "prompts_seed.jsonl").read_text("utf-8").splitlines()
    ]
    (work / "c.jsonl").write_text(
        "".join(json.dumps({"id": i, "output": "A ball. It rolled."}) + "\n" for i in ids)
    )
    return work


def _make(work: Path, kind: str) -> Path:
    if kind == "random bytes":
        path = work / "random.parquet"
        path.write_bytes(bytes(range(256)) * 12)
    elif kind == "magic bytes only":
        path = work / "magic.parquet"
        path.write_bytes(b"PAR1garbagePAR1")
    else:
        path = work / "pipe.jsonl"
        if not path.exists():
            os.mkfifo(path)
    return path


@pytest.mark.parametrize(
    ("kind", "status", "says"),
    [
        ("random bytes", 3, "not a Parquet file that can be read"),
        ("magic bytes only", 3, "not a Parquet file that can be read"),
        ("a pipe", 2, "is not a regular file"),
    ],
)
def test_a_file_that_cannot_be_read_is_one_line(finished: Path, kind: str, status: int, says: str) -> None:
    path = _make(finished, kind)
    result = _run(
        finished,
        f"seeds_path={finished / 'seeds' / 'prompts_seed.jsonl'}",
        f"completions={finished / 'c.jsonl'}",
        f"dedup.against=[{path}]",
        f"hydra.run.dir={finished / kind.replace(' ', '_')}",
    )
    assert result.returncode == status, result.stderr[-2000:]
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: ") and str(path) in line and says in line
