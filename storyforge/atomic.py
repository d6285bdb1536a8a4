"""Atomic, hashed file output: stream lines to a temp file, move it into place only when done.

Takes: a target path and the lines (or one JSON document) to write. Gives:
:class:`AtomicLines` (a context manager that writes JSONL records or raw lines into a temp
file beside the target, keeps a running sha256, byte and line count, and ``os.replace``-s
the target on :meth:`~AtomicLines.commit` or a clean exit; on an exception or
:meth:`~AtomicLines.abort` the temp file is removed and the target keeps its old content)
and :func:`write_json_atomic`. Why: a run that dies half-way must leave either the old file
or the new one, never a torn one, and the manifest's checksums should cost no second read.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

__all__ = ["AtomicLines", "jsonl_line", "write_json_atomic"]


def jsonl_line(record: Any) -> bytes:
    """One JSONL line: compact separators, UTF-8 kept as is, no NaN, newline-terminated."""
    return (json.dumps(record, ensure_ascii=False, allow_nan=False, separators=(",", ":")) + "\n").encode()


class AtomicLines:
    """Lines written to ``.<name>.<pid>.tmp`` beside ``path``; replaced into ``path`` on commit."""

    __slots__ = ("_fh", "_sha", "bytes", "count", "path", "tmp_path")

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tmp_path = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        self._fh: IO[bytes] | None = self.tmp_path.open("wb")
        self._sha = hashlib.sha256()
        self.count = 0
        self.bytes = 0

    def write_line(self, line: bytes) -> None:
        """Append one already-encoded line (must end with ``\\n``)."""
        assert self._fh is not None, f"{self.path} is already closed"
        self._fh.write(line)
        self._sha.update(line)
        self.count += 1
        self.bytes += len(line)

    def write(self, record: Any) -> None:
        """Append ``record`` as one JSONL line."""
        self.write_line(jsonl_line(record))

    @property
    def sha256(self) -> str:
        return self._sha.hexdigest()

    def summary(self) -> dict[str, Any]:
        """``{"records", "bytes", "sha256"}`` for a manifest."""
        return {"records": self.count, "bytes": self.bytes, "sha256": self.sha256}

    def commit(self) -> None:
        """Flush, fsync and move the temp file over ``path`` (once; later calls do nothing)."""
        if self._fh is None:
            return
        fh, self._fh = self._fh, None
        with fh:
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(self.tmp_path, self.path)

    def abort(self) -> None:
        """Drop everything written; ``path`` is left as it was."""
        if self._fh is None:
            return
        fh, self._fh = self._fh, None
        fh.close()
        self.tmp_path.unlink(missing_ok=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()


def write_json_atomic(path: Path, data: Any) -> str:
    """Write ``data`` as indented JSON to ``path`` atomically; returns its sha256."""
    with AtomicLines(path) as out:
        out.write_line((json.dumps(data, ensure_ascii=False, indent=2, allow_nan=False) + "\n").encode())
    return out.sha256
