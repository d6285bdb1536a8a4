"""Atomic, hashed line output: the target is replaced whole or not at all."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from storyforge.atomic import AtomicLines, jsonl_line, write_json_atomic


def test_clean_exit_replaces_the_target_and_reports_its_hash(tmp_path: Path) -> None:
    """Lines land in the target on a clean exit; the summary matches the bytes on disk."""
    target = tmp_path / "out.jsonl"
    target.write_text("old\n", "utf-8")
    with AtomicLines(target) as out:
        out.write({"id": "a", "text": "é"})
        out.write({"id": "b"})
        assert target.read_text("utf-8") == "old\n"
    data = target.read_bytes()
    assert data == '{"id":"a","text":"é"}\n{"id":"b"}\n'.encode()
    assert out.summary() == {"records": 2, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert list(tmp_path.iterdir()) == [target]


def test_an_exception_leaves_the_old_file_and_no_temp_file(tmp_path: Path) -> None:
    """A failure while writing keeps the previous content and removes the temp file."""
    target = tmp_path / "out.jsonl"
    target.write_text("old\n", "utf-8")
    with pytest.raises(RuntimeError), AtomicLines(target) as out:
        out.write({"id": "a"})
        raise RuntimeError("disk on fire")
    assert target.read_text("utf-8") == "old\n"
    assert list(tmp_path.iterdir()) == [target]


def test_json_lines_refuse_nan() -> None:
    """A record that is not strict JSON is refused rather than written as NaN."""
    with pytest.raises(ValueError):
        jsonl_line({"x": float("nan")})


def test_write_json_atomic_returns_the_file_hash(tmp_path: Path) -> None:
    """write_json_atomic writes indented JSON and returns its sha256."""
    digest = write_json_atomic(tmp_path / "m.json", {"a": 1})
    data = (tmp_path / "m.json").read_bytes()
    assert data == b'{\n  "a": 1\n}\n' and digest == hashlib.sha256(data).hexdigest()
