"""One bad record is that record's rejection: duplicate keys, numbers too long to read, huge sample numbers;
stale temp files of a killed run; the .hydra snapshot kept true to the outputs beside it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from storyforge import jsontext
from storyforge.atomic import clean_stale_temps
from storyforge.snapshot import committed_snapshot
from storyforge.tasks.tinystories.completions import LineProblem, parse_completion_line
from storyforge.tasks.tinystories.seeds import read_seed_lines

HUGE = "9" * 5000


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"id": "a", "id": "b"}', 'duplicate key "id"'),
        ('{"x": {"k": 1, "k": 2}}', 'duplicate key "k"'),
        ('{"n": ' + HUGE + "}", "a number too long to read"),
    ],
)
def test_unique_keys_and_long_numbers_are_json_errors(text: str, message: str) -> None:
    """Both are a JSONDecodeError (a malformed line), never another exception or a silent last-wins."""
    with pytest.raises(json.JSONDecodeError, match=message):
        jsontext.loads(text, unique_keys=True)


def test_without_unique_keys_a_server_answer_keeps_json_semantics() -> None:
    assert jsontext.loads('{"a": 1, "a": 2}') == {"a": 2}


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"id": "ts-1", "output": "a", "output": "b"}', 'duplicate key "output"'),
        (
            '{"id": "ts-1", "output": "a", "sample": ' + str(10**30) + "}",
            "'sample' must be an integer from 0 to 2147483647, got 'a 31-digit number'",
        ),
        ('{"id": "ts-1", "output": "a", "sample": 2147483648}', "got 2147483648"),
        ('{"id": "ts-1", "output": "a", "n": ' + HUGE + "}", "a number too long to read"),
    ],
)
def test_a_bad_completion_line_is_a_malformed_line(line: str, message: str) -> None:
    """Each is that line's problem (kind malformed) with its reason, not a crash of the run."""
    problem = parse_completion_line(line.encode(), 3)
    assert isinstance(problem, LineProblem)
    assert problem.kind == "malformed" and problem.line == 3
    assert message in problem.message


def test_bad_seed_lines_are_rejected_by_line_and_the_rest_is_read(tmp_path: Path) -> None:
    """A duplicate key or a 5,000-digit number rejects its line (invalid_json); later lines are read."""
    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text(
        '{"id": "s-1", "theme": "a", "theme": "b"}\n{"id": "s-2", "n": ' + HUGE + '}\n{"id": "s-3"}\n',
        encoding="utf-8",
    )
    read = list(read_seed_lines(seeds))
    assert [n for n, _ in read] == [1, 2, 3]
    first, second, third = (value for _, value in read)
    assert getattr(first, "rule", None) == "invalid_json" and 'duplicate key "theme"' in first.message
    assert getattr(second, "rule", None) == "invalid_json" and "too long" in second.message
    assert third == {"id": "s-3"}


def _dead_pid() -> int:
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    return int(proc.stdout)


def test_temp_files_of_a_killed_run_are_removed_and_a_live_one_is_kept(tmp_path: Path) -> None:
    """Temp files whose writer is gone are removed at the next start; another live process's stay."""
    dead = tmp_path / "report" / f".summary.json.{_dead_pid()}.0123abcd.tmp"
    dead.parent.mkdir()
    dead.write_bytes(b"x" * 1000)
    live = tmp_path / f".generations.jsonl.{os.getppid()}.89abcdef.tmp"
    live.write_bytes(b"y")
    mine = tmp_path / "notes.tmp"
    mine.write_text("a user's file")
    assert clean_stale_temps(tmp_path) == [dead]
    assert not dead.exists() and live.exists() and mine.exists()


def _snapshot(folder: Path, text: str) -> None:
    folder.mkdir(exist_ok=True)
    for name in ("config.yaml", "overrides.yaml"):
        (folder / name).write_text(f"{name}: {text}\n")


def test_a_failed_rerun_leaves_the_snapshot_of_the_outputs(tmp_path: Path) -> None:
    """First run commits its snapshot; a rerun that fails (or is killed inside) leaves the first one in place."""
    hydra = tmp_path / ".hydra"
    _snapshot(hydra, "first")
    with committed_snapshot(hydra) as attempt:
        assert attempt == hydra / "config.yaml"
    assert (hydra / "config.committed.yaml").read_text() == "config.yaml: first\n"
    _snapshot(hydra, "second")  # what Hydra writes when the rerun starts
    with pytest.raises(OSError), committed_snapshot(hydra) as attempt:
        # While the rerun works (and if it is killed now), the snapshot describes the outputs.
        assert (hydra / "config.yaml").read_text() == "config.yaml: first\n"
        assert attempt is not None and attempt.read_text() == "config.yaml: second\n"
        raise OSError("No space left on device")
    assert (hydra / "config.yaml").read_text() == "config.yaml: first\n"
    assert (hydra / "overrides.yaml").read_text() == "overrides.yaml: first\n"
    _snapshot(hydra, "third")
    with committed_snapshot(hydra):
        pass
    assert (hydra / "config.yaml").read_text() == "config.yaml: third\n"
    assert not (hydra / "config.attempt.yaml").exists()


def test_the_snapshot_holds_no_url_credentials(tmp_path: Path) -> None:
    hydra = tmp_path / ".hydra"
    hydra.mkdir()
    (hydra / "overrides.yaml").write_text("- provider.base_url=http://bob:pw-long-secret@host:1/v1\n")
    with committed_snapshot(hydra):
        pass
    assert (hydra / "overrides.yaml").read_text() == "- provider.base_url=http://***@host:1/v1\n"
