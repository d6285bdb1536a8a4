"""Atomic file output: every file storyforge writes appears whole or not at all.

Takes: a target path and what to put there: bytes, text, one JSON document, or a stream of
JSONL records or raw lines. Gives: :func:`write_bytes_atomic`, :func:`write_text_atomic` and
:func:`write_json_atomic` for a whole file at once; :class:`AtomicLines`, a context manager
that streams lines into a temp file, keeps a running sha256, byte and line count, can read a
record back by its offset (:meth:`~AtomicLines.read_at`), and replaces the target on
:meth:`~AtomicLines.commit` or a clean exit, while an exception or
:meth:`~AtomicLines.abort` removes the temp file and leaves the target as it was; and
:func:`replace_lines` (a file rewritten from lines, its directory fsynced: the journal's
rewrites); :func:`jsonl_line`, the one JSONL encoding (compact, UTF-8 kept, no NaN); and
:func:`file_sha256`, a file's checksum read in blocks. A data set's JSONL file together with
its Parquet twin is written by :class:`storyforge.tables.DataFile`, built on :class:`AtomicLines`.

Why: a run that dies half-way must leave either the old file or the new one, never a torn
one, and the manifest's checksums should cost no second read. All dataset, report, manifest,
trace and template-export writers go through here.

How: the temp file is created exclusively (``.<name>.<pid>.<random>.tmp``) beside the target,
so it is on the same filesystem and ``os.replace`` is an atomic rename; it takes the umask's
mode, like ``open``. fsync policy: the temp file's data is flushed and fsynced before the
rename, so the target's name can never point at blocks the disk has not written (an empty or
torn file after a power loss on filesystems that delay allocation). The directory is not
fsynced: after a crash right after a commit the rename itself may be undone, which brings
back the old, whole file, and a rerun writes it again. The provider journal
(``storyforge/providers/journal.py``), whose appends are the only copy of paid-for
completions, also fsyncs its directory (:func:`fsync_dir`, :func:`replace_lines`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType, TracebackType
from typing import IO, Any, Self

__all__ = [
    "AtomicLines",
    "atomic_file",
    "clean_stale_temps",
    "file_sha256",
    "fsync_dir",
    "jsonl_line",
    "replace_lines",
    "write_bytes_atomic",
    "write_json_atomic",
    "write_text_atomic",
]


# Built once: json.dumps with options would build a new encoder for every line.
_JSONL = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


_orjson: ModuleType | None
try:  # orjson encodes a line about five times faster; json stays the definition of the bytes
    import orjson as _orjson
except ImportError:  # pragma: no cover - a core dependency, but json alone gives the same bytes
    _orjson = None

_PLAIN_SCALARS = frozenset({str, int, bool, type(None)})


def _plain(value: Any) -> bool:
    """Whether ``value`` holds only exact dicts (string keys), lists, strings, ints, booleans
    and None: the data on which orjson and json write the same bytes. Floats are not (orjson
    writes ``0.00001`` where json writes ``1e-05``), nor tuples, subclasses or other objects.
    Recursive, with a list's scalars checked in place (faster than a work list on the
    shallow records written here); the caller treats a RecursionError as "not plain"."""
    t = type(value)
    if t is dict:
        for k, v in value.items():
            if type(k) is not str:
                return False
            t = type(v)
            if t in _PLAIN_SCALARS:
                continue
            if t is list:
                for item in v:
                    if type(item) not in _PLAIN_SCALARS and not _plain(item):
                        return False
                continue
            if t is dict and _plain(v):
                continue
            return False
        return True
    if t is list:
        for v in value:
            if type(v) not in _PLAIN_SCALARS and not _plain(v):
                return False
        return True
    return t in _PLAIN_SCALARS


def jsonl_line(record: Any) -> bytes:
    """One JSONL line: compact separators, UTF-8 kept as is, no NaN, newline-terminated.

    The bytes are exactly ``json``'s (``_JSONL``); orjson produces them when it certainly
    agrees, and any record it might encode differently is encoded by json instead.
    """
    try:
        plain = _orjson is not None and _plain(record)
    except RecursionError:  # nested too deeply for the check: json decides
        plain = False
    if plain:
        assert _orjson is not None
        try:
            line: bytes = _orjson.dumps(record, option=_orjson.OPT_APPEND_NEWLINE)
        except TypeError:  # an int past 64 bits, a lone surrogate: json encodes (or refuses) it
            pass
        else:
            return line
    return (_JSONL.encode(record) + "\n").encode()


def _create_temp(path: Path) -> tuple[Path, IO[bytes]]:
    """A new, exclusively created temp file beside ``path`` (the caller closes it)."""
    while True:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            return tmp, open(tmp, "xb")  # closed by commit/abort
        except FileExistsError:
            continue


def _install(tmp: Path, fh: IO[bytes], path: Path) -> None:
    """Flush, fsync and close ``fh`` (open on ``tmp``), then move ``tmp`` over ``path``; on any
    failure ``tmp`` is removed and ``path`` is left as it was."""
    try:
        with fh:
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class AtomicLines:
    """Lines written to a temp file beside ``path``; replaced into ``path`` on commit.

    ``write`` and ``write_line`` return the byte offset where the line starts, so a later
    pass can read a record back (:meth:`read_at`) without keeping its text in memory.
    """

    __slots__ = ("_fh", "_reader", "_sha", "bytes", "count", "path", "tmp_path")

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tmp_path, fh = _create_temp(path)
        self._fh: IO[bytes] | None = fh
        self._reader: IO[bytes] | None = None
        self._sha = hashlib.sha256()
        self.count = 0
        self.bytes = 0

    def write_line(self, line: bytes) -> int:
        """Append already-encoded bytes (a JSONL line ends with ``\\n``); returns their offset."""
        return self.write_lines(line, 1)

    def write_lines(self, data: bytes, count: int) -> int:
        """Append ``count`` already-encoded lines at once (``data`` is their concatenation);
        returns the offset of the first."""
        assert self._fh is not None, f"{self.path} is already closed"
        offset = self.bytes
        self._fh.write(data)
        self._sha.update(data)
        self.count += count
        self.bytes += len(data)
        return offset

    def write(self, record: Any) -> int:
        """Append ``record`` as one JSONL line; returns its offset."""
        return self.write_line(jsonl_line(record))

    def read_at(self, offset: int) -> Any:
        """The JSON record written at ``offset`` (pending writes are flushed first)."""
        assert self._fh is not None, f"{self.path} is already closed"
        self._fh.flush()
        if self._reader is None:
            # Lives as long as the writer; closed by commit/abort.
            self._reader = open(self.tmp_path, "rb")  # noqa: SIM115
        self._reader.seek(offset)
        return json.loads(self._reader.readline())

    @property
    def sha256(self) -> str:
        return self._sha.hexdigest()

    def summary(self) -> dict[str, Any]:
        """``{"records", "bytes", "sha256"}`` for a manifest."""
        return {"records": self.count, "bytes": self.bytes, "sha256": self.sha256}

    def _close(self) -> IO[bytes] | None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        fh, self._fh = self._fh, None
        return fh

    def commit(self) -> None:
        """Flush, fsync and move the temp file over ``path`` (once; later calls do nothing)."""
        fh = self._close()
        if fh is not None:
            _install(self.tmp_path, fh, self.path)

    def abort(self) -> None:
        """Drop everything written; ``path`` is left as it was."""
        fh = self._close()
        if fh is None:
            return
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


def write_bytes_atomic(path: Path, data: bytes) -> str:
    """Replace ``path`` with ``data`` atomically; returns its sha256."""
    with AtomicLines(path) as out:
        out.write_line(data)
    return out.sha256


def write_text_atomic(path: Path, text: str) -> str:
    """Replace ``path`` with ``text`` (UTF-8) atomically; returns its sha256."""
    return write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: Path, data: Any) -> str:
    """Write ``data`` as indented JSON to ``path`` atomically; returns its sha256."""
    return write_text_atomic(path, json.dumps(data, ensure_ascii=False, indent=2, allow_nan=False) + "\n")


def replace_lines(path: Path, lines: Iterable[bytes]) -> str:
    """Replace ``path`` with ``lines`` (already encoded) atomically, and make the rename durable
    (the directory is fsynced too, as a journal needs); returns the file's sha256."""
    with AtomicLines(path) as out:
        for line in lines:
            out.write_line(line)
    fsync_dir(path.parent)
    return out.sha256


def file_sha256(path: Path) -> str:
    """sha256 of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fsync_dir(directory: Path) -> None:
    """fsync a directory, so a rename or a new file in it survives a crash (best effort)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def atomic_file(path: Path) -> Iterator[IO[bytes]]:
    """A binary temp file beside ``path`` for writers that need a file object (Parquet).

    On a clean exit it is fsynced and replaces ``path``; on an exception it is removed and
    ``path`` is left as it was.
    """
    tmp, fh = _create_temp(path)
    try:
        yield fh
    except BaseException:
        fh.close()
        tmp.unlink(missing_ok=True)
        raise
    _install(tmp, fh, path)


_TEMP_NAME = re.compile(r"^\..+\.(?P<pid>\d{1,10})\.[0-9a-f]{8}\.tmp$")


def clean_stale_temps(folder: Path) -> list[Path]:
    """Remove the temp files a killed process left in ``folder`` and its subfolders; return them.

    A temp file is named ``.<name>.<pid>.<8 hex>.tmp`` (:func:`_create_temp`); one whose process
    is gone (or is this process, from before it started writing) can never be committed.
    Files of a process still running (another job sharing the folder) are left alone.
    """
    removed: list[Path] = []
    if not folder.is_dir():
        return removed
    for path in folder.rglob(".*.tmp"):
        match = _TEMP_NAME.match(path.name)
        if match is None or not path.is_file():
            continue
        pid = int(match.group("pid"))
        if pid != os.getpid() and _running(pid):
            continue
        try:
            path.unlink()
        except OSError:
            continue
        removed.append(path)
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True
