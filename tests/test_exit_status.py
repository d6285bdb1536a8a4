"""docs/running.md's table of failing commands, run one test per row: the status, one line on
stderr saying what the last column says, and no traceback."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ROW = re.compile(r"^\| `(?P<command>[^`]+)` \| (?P<status>\d+) \| `(?P<says>[^`]+)` \|$", re.MULTILINE)


def _rows() -> list[tuple[str, int, str]]:
    text = (ROOT / "docs" / "running.md").read_text("utf-8")
    table = text.split("| command | status | the error line says |", 1)[1]
    rows = [(m["command"], int(m["status"]), m["says"]) for m in ROW.finditer(table)]
    assert len(rows) >= 15
    return rows


def _is_log_line(line: str) -> bool:
    """A log record or a progress bar, not an error line."""
    return bool(re.match(r"^\[\d{4}-\d\d-\d\d [\d:,]+\]\[", line) or re.search(r"\d+%\|", line))


@pytest.mark.parametrize(("command", "status", "says"), _rows(), ids=[r[0] for r in _rows()])
def test_documented_exit_status(command: str, status: int, says: str, tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_bytes(b"")
    (tmp_path / "bad_seeds.jsonl").write_text("{not json\n", "utf-8")
    argv = shlex.split(command.replace("$PWD", str(tmp_path)))
    if argv[0] == "storyforge":
        argv = [sys.executable, "-m", "storyforge.cli", *argv[1:]]
    else:
        assert argv[:2] == ["python", "run.py"]
        argv = [sys.executable, str(ROOT / "run.py"), *argv[2:]]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HYDRA_", "STORYFORGE_"))}
    env["PYTHONPATH"] = str(ROOT)
    # the test's own response cache (tests/conftest.py), never the user's
    env["STORYFORGE_RESPONSE_CACHE_DIR"] = os.environ["STORYFORGE_RESPONSE_CACHE_DIR"]
    proc = subprocess.run(
        argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    lines = [line for line in proc.stderr.splitlines() if line.strip() and not _is_log_line(line)]
    assert proc.returncode == status, proc.stderr[-2000:]
    assert len(lines) == 1, proc.stderr[-2000:]
    assert says in lines[0]
    assert "Traceback" not in proc.stderr + proc.stdout
