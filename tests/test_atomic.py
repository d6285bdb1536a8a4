"""Atomic, hashed line output: the target is replaced whole or not at all."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from storyforge.atomic import (
    AtomicLines,
    jsonl_line,
    write_bytes_atomic,
    write_json_atomic,
    write_text_atomic,
)


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


def test_records_read_back_by_offset_and_abort_on_error(tmp_path: Path) -> None:
    """AtomicLines replaces its target only on a clean exit, and reads records back by offset."""
    target = tmp_path / "x.jsonl"
    target.write_text("old\n")
    with pytest.raises(RuntimeError), AtomicLines(target) as writer:
        writer.write({"a": 1})
        raise RuntimeError("stop")
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["x.jsonl"]
    with AtomicLines(target) as writer:
        first = writer.write({"a": "é"})
        second = writer.write({"b": 2})
        assert writer.read_at(second) == {"b": 2}
        assert writer.read_at(first) == {"a": "é"}
    assert target.read_text(encoding="utf-8") == '{"a":"é"}\n{"b":2}\n'


def test_whole_file_writers_replace_the_target_and_leave_no_temp_file(tmp_path: Path) -> None:
    """write_bytes_atomic and write_text_atomic replace the file whole and return its sha256."""
    target = tmp_path / "out.md"
    target.write_text("old\n", "utf-8")
    digest = write_text_atomic(target, "é\n")
    assert target.read_bytes() == "é\n".encode() and digest == hashlib.sha256("é\n".encode()).hexdigest()
    assert write_bytes_atomic(target, b"\x89PNG") == hashlib.sha256(b"\x89PNG").hexdigest()
    assert target.read_bytes() == b"\x89PNG"
    assert list(tmp_path.iterdir()) == [target]


def test_a_missing_directory_fails_before_anything_is_written(tmp_path: Path) -> None:
    """A target in a directory that does not exist raises and creates nothing."""
    with pytest.raises(FileNotFoundError):
        write_text_atomic(tmp_path / "nope" / "out.txt", "x")
    assert list(tmp_path.iterdir()) == []
