"""Parquet twins of JSONL exports: the same rows under an explicit Arrow schema.

Takes: a finished JSONL file and the :mod:`pyarrow` schema of its records. Gives:
:func:`write_parquet` (``name.jsonl`` -> ``name.parquet`` beside it, streamed in batches,
written atomically), :func:`merge_parquet` (the same file for a JSONL merged from shards, built
from the shards' twins), :func:`parquet_path` and :func:`load_export` (a ``datasets.Dataset`` of
either file, empty or not), plus the column types the task kinds' schemas share (:data:`MESSAGES`,
:data:`STRINGS`).

Why: ``datasets.load_dataset("json", ...)`` infers columns from the first rows, so an empty
file (``dpo.jsonl`` when every seed has one sample, a clean run's ``rejected_seeds.jsonl``)
has no columns to infer and fails, and ``datasets`` refuses a split with no rows even when the
columns are known. The Parquet twin carries the schema itself: the same columns and types
whether it holds no rows or millions, a column that happens to be all ``null`` keeps its
declared type, and ``load_dataset("parquet", data_files=..., streaming=True)`` or
:func:`load_export` read the empty case as zero rows.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import sys
import threading
from array import array
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import orjson
import pyarrow as pa
import pyarrow.json as pajson
import pyarrow.parquet as pq

from storyforge.atomic import AtomicLines, atomic_file, jsonl_line

if TYPE_CHECKING:
    import datasets

__all__ = [
    "MESSAGES",
    "STRINGS",
    "DataFile",
    "ParquetTwin",
    "TwinnedLines",
    "load_export",
    "merge_parquet",
    "parquet_path",
    "write_parquet",
]

_BATCH = 8192  # rows per row group: the twin's bytes depend on it
_CHUNK = 1024  # lines handed to the twins' worker thread at a time
_PENDING = 2  # batches or chunks of one twin that may wait for the worker thread
_SWITCH_INTERVAL = 0.001
"""While the worker runs: how long a thread that wants the interpreter lock waits at most.
The writing thread runs Python without pause; the worker takes the lock a few times per chunk
(between its calls into Arrow, the file and the hash, which run without it), and at Python's
default 5 ms it fell behind, so the writer waited for it (some 0.2 s of a 100,000-seed job)."""
_MAX_BLOCK = 1 << 30  # Arrow's JSON reader takes one block of at most 2 GiB; larger batches go row by row

# The twins' Arrow buffers come from Arrow's default pool, which run.py makes jemalloc: it
# keeps a written row group's memory for the next group and gives back what stays unused for
# _DECAY_MS. The C library's allocator, mapping each group's buffers afresh (see run.py), spent
# about 2 us of kernel time per seed on page faults; mimalloc kept what each thread used, some
# 40 MiB more at the peak of a 100,000-seed job.
_POOL = pa.default_memory_pool()
_DECAY_MS = 100
"""jemalloc gives back memory unused for this long: a row group is written every 0.1-0.3 s, so
a group's buffers are reused, and the job's peak stays flat (134-142 MiB at 100,000 and
1,000,000 seeds in our runs; without this setting, 148 once at 1,000,000)."""
if _POOL.backend_name == "jemalloc":  # before any twin's buffers: it applies to arenas made later
    pa.jemalloc_set_decay_ms(_DECAY_MS)

MESSAGES = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
"""Chat messages: a list of ``{"role", "content"}``."""
STRINGS = pa.list_(pa.string())
"""A list of strings."""


class _Worker:
    """The one thread that builds every twin open in the process: started for the first,
    joined when the last is done. The row groups of different files (a job writes several at
    once, in step) are converted one after the other, never at the same time, so the rows in
    memory are one group's."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._users = 0
        self._switch = 0.0

    def acquire(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="parquet-twin")
                self._switch = sys.getswitchinterval()
                sys.setswitchinterval(min(self._switch, _SWITCH_INTERVAL))
            self._users += 1
            return self._pool

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users:
                return
            pool, self._pool = self._pool, None
            sys.setswitchinterval(self._switch)
        assert pool is not None
        pool.shutdown(wait=True)


_WORKER = _Worker()


def _keys_of(raw: bytes) -> Any:
    """A JSONL line as Python data, read for its keys: orjson (several times faster), json for
    what orjson refuses (NaN). Not for its values: orjson reads an integer past 64 bits as a
    float; the rows come from the line itself (see :class:`ParquetTwin`)."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)


def parquet_path(jsonl: Path) -> Path:
    """``dir/name.jsonl`` -> ``dir/name.parquet``."""
    return jsonl.with_suffix(".parquet")


def write_parquet(jsonl: Path, schema: pa.Schema) -> dict[str, Any]:
    """Write ``jsonl``'s Parquet twin with ``schema`` (column order = JSON key order).

    Returns ``{"rows", "bytes", "sha256"}`` of the Parquet file for a manifest. A record
    whose keys differ from the schema's columns raises :class:`ValueError` (a writer and its
    schema drifted apart). An empty JSONL file gives a Parquet file with no row groups.
    """
    with ParquetTwin(jsonl, schema) as twin, open(jsonl, "rb") as fh:
        for number, raw in enumerate(fh, start=1):
            if raw.strip():
                twin.add(_keys_of(raw), where=f"{jsonl}:{number}", line=raw)
    return twin.summary()


class ParquetTwin:
    """A JSONL file's Parquet twin written alongside it, from the records as they are written.

    ``with ParquetTwin(path, schema) as twin: twin.add(record)`` for every record written to
    ``path`` (the same dicts, in the same order) gives the file :func:`write_parquet` would
    write from the finished JSONL, byte for byte, without reading the JSON back; the file
    replaces ``path``'s twin when the block ends without an error (nothing is written
    otherwise). :meth:`summary` is its manifest entry.

    ``twin.add(record, line=jsonl_line(record))`` (the record's JSONL line as written) gives
    the same file, built on the worker thread every open twin shares (see :class:`_Worker`):
    the lines go to the worker :data:`_CHUNK` at a time, joined into one buffer, and each row
    group's buffer is parsed by Arrow's JSON reader and compressed there, outside the
    interpreter lock, so on a second core the twin costs the writing thread almost nothing.
    The reader is stricter than ``RecordBatch.from_pylist`` (a value of another type, a
    repeated key, an integer past 64 bits are errors to it); a group it refuses is converted
    from the parsed records instead, so the result, or the error, is always that of the
    records. One twin takes records with lines or without, not both.

    ``rows_from=(source, derive)``: this file's records are, row for row, a function of those
    of another twin's file written in step with it (a prompt per seed): each row group is then
    ``derive`` of the source's row group of the same number, when the worker has converted
    that one already and the rows come out right, instead of parsing this file's lines
    (otherwise, as for the last group when this twin closes first, they are parsed). The
    caller vouches for the function; the lines are still this file's JSONL text.

    Memory is bounded by the row group, not the file: at most :data:`_PENDING` chunks (or,
    without lines, batches of records) wait for the worker, which holds one row group's
    JSON text (the lines as bytes, not as Python objects) and then its Arrow rows, released
    once the group is written. With ``sink`` (the JSONL file's writer), the worker also
    appends each chunk's lines to it as the chunk arrives (see :class:`TwinnedLines`).
    """

    __slots__ = (
        "_batch",
        "_chunk",
        "_derive",
        "_followers",
        "_group",
        "_group_sizes",
        "_groups",
        "_in_group",
        "_inbox",
        "_lines",
        "_names",
        "_pending",
        "_pool",
        "_schema",
        "_sink",
        "_stack",
        "_summary",
        "_writer",
        "rows",
        "target",
    )

    def __init__(
        self,
        jsonl: Path,
        schema: pa.Schema,
        *,
        sink: AtomicLines | None = None,
        rows_from: tuple[ParquetTwin, Callable[[pa.Table], pa.Table]] | None = None,
    ) -> None:
        self.target = parquet_path(jsonl)
        self._schema = schema
        self._sink = sink
        self._names = schema.names
        self._batch: list[Any] = []  # records (without lines) not yet converted
        self._chunk: list[bytes] = []  # lines not yet handed to the worker
        self._in_group = 0  # lines handed over or in the chunk, in the current row group
        self._group = bytearray()  # the worker's: the current row group's lines, joined
        self._group_sizes = array("q")  # ... and each line's length
        self._lines: bool | None = None  # set by the first add: lines given or not
        self._writer: pq.ParquetWriter | None = None
        self._stack: Any = None
        self._summary: dict[str, Any] | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._pending: deque[Future[None]] = deque()
        self.rows = 0
        self._groups = 0  # the worker's: row groups written
        self._followers: list[ParquetTwin] = []
        self._inbox: deque[tuple[int, pa.Table]] | None = None
        self._derive: Callable[[pa.Table], pa.Table] | None = None
        if rows_from is not None:
            source, self._derive = rows_from
            # The source's latest row groups (numbered), kept until this twin's groups take them.
            self._inbox = deque(maxlen=_PENDING + 2)
            source._followers.append(self)

    def __enter__(self) -> Self:
        self._stack = _writer(self.target, self._schema)
        self._writer = self._stack.__enter__()
        return self

    def add(self, record: dict[str, Any], *, where: str | None = None, line: bytes | None = None) -> None:
        """One more row; ``where`` names the record in the error when its keys do not match;
        ``line`` is the record's JSONL line, as written (see the class)."""
        if list(record) != self._names:
            raise ValueError(
                f"{where or self.target}: columns {list(record)} do not match the schema of "
                f"{self.target.stem}.jsonl {self._names}"
            )
        if line is None or not self._lines:  # after the first line, the common case skips these
            if self._lines is None:
                self._lines = line is not None
            elif self._lines is (line is None):
                raise ValueError(f"{self.target}: records were added both with and without their lines")
            if line is None and self._sink is not None:
                raise ValueError(f"{self.target}: a twin that writes its JSONL file needs each record's line")
            if line is None:
                self._batch.append(record)
                if len(self._batch) == _BATCH:
                    self._flush()
                return
        self._chunk.append(line)
        self._in_group += 1
        if self._in_group == _BATCH:
            self._hand_over(end=True)
        elif len(self._chunk) == _CHUNK:
            self._hand_over(end=False)

    def add_lines(self, lines: list[bytes]) -> None:
        """More rows, as their JSONL lines alone: the same as ``add(record, line=line)`` for
        each, for lines whose records the caller knows to have the schema's columns, in order
        (encoded from a fixed shape), so no record is built or read for them."""
        if self._lines is None:
            self._lines = True
        elif not self._lines:
            raise ValueError(f"{self.target}: records were added both with and without their lines")
        start, total = 0, len(lines)
        while start < total:
            room = min(_BATCH - self._in_group, _CHUNK - len(self._chunk))
            part = lines[start : start + room]
            self._chunk += part
            self._in_group += len(part)
            start += len(part)
            if self._in_group == _BATCH:
                self._hand_over(end=True)
            elif len(self._chunk) == _CHUNK:
                self._hand_over(end=False)

    def _flush(self) -> None:
        batch, self._batch = self._batch, []
        self.rows += len(batch)
        # The dicts are read now: the caller may change them once add returns.
        self._submit(self._write, pa.RecordBatch.from_pylist(batch, schema=self._schema))

    def _hand_over(self, *, end: bool) -> None:
        """The chunk's lines to the worker, joined; ``end``: they close the row group."""
        lines, self._chunk = self._chunk, []
        self.rows += len(lines)
        if end:
            self._in_group = 0
        self._submit(self._take_lines, b"".join(lines), array("q", map(len, lines)), end)

    def _submit(self, work: Callable[..., None], *args: Any) -> None:
        if self._pool is None:
            self._pool = _WORKER.acquire()
        while len(self._pending) >= _PENDING:
            self._pending.popleft().result()  # a worker's error is raised here
        self._pending.append(self._pool.submit(work, *args))

    def _write(self, batch: pa.RecordBatch | pa.Table) -> None:
        assert self._writer is not None
        if isinstance(batch, pa.RecordBatch):
            self._writer.write_batch(batch)
        else:
            self._writer.write_table(batch)
        if self._followers:
            group = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
            for follower in self._followers:
                inbox = follower._inbox
                if inbox is not None:  # None once the follower is done
                    inbox.append((self._groups, group))
        self._groups += 1

    def _derived(self, rows: int) -> pa.Table | None:
        """On the worker: this row group's rows made from the source's group of the same number
        (see :class:`ParquetTwin`), or None when that group is not there or does not fit."""
        inbox, number = self._inbox, self._groups
        if inbox is None or self._derive is None:
            return None
        while inbox and inbox[0][0] < number:
            inbox.popleft()
        if not inbox or inbox[0][0] != number:
            return None
        table = self._derive(inbox.popleft()[1])
        if table.num_rows != rows or table.schema != self._schema:
            return None
        return table

    def _take_lines(self, data: bytes, sizes: array[int], end: bool) -> None:
        """On the worker: a chunk of lines (``data``, their ``sizes``) joins the row group."""
        if self._sink is not None and sizes:
            self._sink.write_lines(data, len(sizes))
        self._group += data
        self._group_sizes.extend(sizes)
        del data
        if end:
            self._write_group()

    def _write_group(self) -> None:
        """On the worker: the row group's lines as rows (its text is released first)."""
        data, self._group = self._group, bytearray()
        sizes, self._group_sizes = self._group_sizes, array("q")
        table = self._derived(len(sizes))
        if table is not None:
            del data
            self._write(table.combine_chunks(memory_pool=_POOL))
            return
        if len(data) < _MAX_BLOCK:
            try:
                table = pajson.read_json(
                    pa.BufferReader(pa.py_buffer(data)),
                    # One block, one thread: the rows come in one chunk, as from_pylist makes them.
                    read_options=pajson.ReadOptions(use_threads=False, block_size=max(len(data), 1)),
                    parse_options=pajson.ParseOptions(
                        explicit_schema=self._schema, unexpected_field_behavior="error"
                    ),
                    memory_pool=_POOL,
                )
            except pa.ArrowException:  # whatever the reader refuses, the records decide
                table = None
        if table is not None and table.num_rows == len(sizes) and table.schema == self._schema:
            del data
            self._write(table.combine_chunks(memory_pool=_POOL))
            return
        # json, not orjson: the exact values (an integer past 64 bits stays an integer).
        starts = itertools.accumulate(sizes, initial=0)
        records = [json.loads(data[start : start + size]) for start, size in zip(starts, sizes, strict=False)]
        del data
        self._write(pa.RecordBatch.from_pylist(records, schema=self._schema))

    def _drain(self, *, cancel: bool) -> None:
        """Wait for this twin's work to finish; ``cancel`` (the block is failing) drops the
        batches that have not started and any error of the worker's. After an error nothing
        of this twin's is left running or waiting (its file is closed next)."""
        pool, self._pool = self._pool, None
        pending, self._pending = self._pending, deque()
        if pool is None:
            return
        try:
            if not cancel:
                for future in pending:
                    future.result()
        finally:
            for future in pending:
                future.cancel()
            wait(pending)
            _WORKER.release()

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        try:
            if kind is None and self._batch:
                self._flush()
            if kind is None and self._in_group:
                self._hand_over(end=True)
            self._drain(cancel=kind is not None)
        except BaseException as exc:
            self._stack.__exit__(type(exc), exc, exc.__traceback__)
            raise
        self._stack.__exit__(kind, value, traceback)
        inbox = self._inbox
        if inbox is not None:  # the source's groups are not kept for it any longer
            self._inbox = None
            inbox.clear()
        if kind is None:
            self._summary = _summary(self.target, self.rows)

    def summary(self) -> dict[str, Any]:
        """``{"rows", "bytes", "sha256"}`` of the finished file."""
        assert self._summary is not None, f"{self.target} is not finished"
        return self._summary


class TwinnedLines:
    """A JSONL file and its Parquet twin written together, record by record.

    ``with TwinnedLines(path, schema) as out: out.write(record)`` gives the same two files as
    an :class:`~storyforge.atomic.AtomicLines` of ``path`` beside a :class:`ParquetTwin`: the
    JSONL bytes of :func:`~storyforge.atomic.jsonl_line`, then the twin :func:`write_parquet`
    would write from them. The calling thread only encodes each record and checks its keys;
    every 1,024 lines, the twins' worker thread appends them to the file (and its running
    sha256), and every 8,192 builds their rows, mostly outside the interpreter lock. Both
    files replace their targets when the block ends without an error, and neither is touched
    otherwise. After the block, :attr:`count` and :meth:`summary` describe the JSONL file,
    :meth:`twin_summary` the twin.
    """

    __slots__ = ("_lines", "_twin", "path")

    def __init__(
        self,
        path: Path,
        schema: pa.Schema,
        *,
        rows_from: tuple[ParquetTwin, Callable[[pa.Table], pa.Table]] | None = None,
    ) -> None:
        self.path = path
        self._lines = AtomicLines(path)
        self._twin = ParquetTwin(path, schema, sink=self._lines, rows_from=rows_from)

    def __enter__(self) -> Self:
        try:
            self._twin.__enter__()
        except BaseException:
            self._lines.abort()
            raise
        return self

    def write(self, record: dict[str, Any]) -> None:
        """One more record (its keys must be the schema's columns, in order)."""
        self._twin.add(record, line=jsonl_line(record))

    def write_lines(self, lines: list[bytes]) -> None:
        """More records as their JSONL lines (see :meth:`ParquetTwin.add_lines`)."""
        self._twin.add_lines(lines)

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        try:
            self._twin.__exit__(kind, value, traceback)
        except BaseException:
            self._lines.abort()
            raise
        if kind is None:
            self._lines.commit()
        else:
            self._lines.abort()

    @property
    def count(self) -> int:
        """Records written (all of them once the block has ended)."""
        return self._lines.count

    def summary(self) -> dict[str, Any]:
        """``{"records", "bytes", "sha256"}`` of the JSONL file."""
        return self._lines.summary()

    def twin_summary(self) -> dict[str, Any]:
        """``{"rows", "bytes", "sha256"}`` of the Parquet twin."""
        return self._twin.summary()

    @property
    def twin_target(self) -> Path:
        """Where the twin goes."""
        return self._twin.target


class DataFile:
    """The one writer of a data file: JSONL lines written atomically with their sha256, and the
    file's Parquet twin.

    ``with DataFile(path, schema) as out: out.write(record)`` writes ``path`` (a temp file
    beside it until the block ends without an error, see :class:`~storyforge.atomic.AtomicLines`)
    and then its twin, the file :func:`write_parquet` makes from it, atomically too; after the
    block :meth:`summary` and :meth:`twin_summary` are their manifest entries. How the twin is
    built: by default from the finished file at commit, which keeps :meth:`read_at` (a record
    read back by its offset) and offsets from :meth:`write`; with ``inline`` as the lines go,
    on a worker thread (:class:`TwinnedLines`, for files written once, straight through). With
    no ``schema`` there is no twin (a shard's part of a file whose twin is built when the parts
    are merged, or a file no data set loader reads); a function for ``schema`` is asked for it
    with the finished file (a file whose columns depend on its records; not with ``inline``).
    ``rows_from=(source, derive)`` (with ``inline``, a source written inline in step): the
    twin's rows are made from the source twin's (see :class:`ParquetTwin`); a ``derive`` of
    None: parsed from its lines.
    """

    __slots__ = ("_lines", "_schema", "_twin", "_twinned", "path")

    def __init__(
        self,
        path: Path,
        schema: pa.Schema | Callable[[Path], pa.Schema] | None = None,
        *,
        inline: bool = False,
        rows_from: tuple[DataFile, Callable[[pa.Table], pa.Table] | None] | None = None,
    ) -> None:
        self.path = path
        self._schema = schema
        self._twin: dict[str, Any] | None = None
        if inline and schema is not None:
            assert isinstance(schema, pa.Schema), "an inline twin needs its schema before the first line"
            source, derive = rows_from if rows_from is not None else (None, None)
            twin = source._twinned if source is not None else None
            derived = (twin._twin, derive) if twin is not None and derive is not None else None
            self._twinned: TwinnedLines | None = TwinnedLines(path, schema, rows_from=derived)
        else:
            self._twinned = None
        self._lines = self._twinned._lines if self._twinned is not None else AtomicLines(path)

    def __enter__(self) -> Self:
        if self._twinned is not None:
            self._twinned.__enter__()
        return self

    def write(self, record: Any) -> int:
        """Append ``record`` as one JSONL line; returns its offset (0 when ``inline``: the
        line is written later, on the worker thread)."""
        if self._twinned is not None:
            self._twinned.write(record)
            return 0
        return self._lines.write(record)

    def write_line(self, line: bytes) -> int:
        """Append an already-encoded JSONL line (not with ``inline``); returns its offset."""
        assert self._twinned is None, "an inline twin is built from records"
        return self._lines.write_line(line)

    def write_lines(self, lines: list[bytes]) -> None:
        """Append already-encoded JSONL lines whose records have the schema's columns, in
        order (what :meth:`write` would write for them; with ``inline`` too)."""
        if self._twinned is not None:
            self._twinned.write_lines(lines)
        elif lines:
            self._lines.write_lines(b"".join(lines), len(lines))

    def read_at(self, offset: int) -> Any:
        """The record written at ``offset`` (not with ``inline``)."""
        assert self._twinned is None, "an inline twin's lines are written on its worker thread"
        return self._lines.read_at(offset)

    @property
    def count(self) -> int:
        """Records written."""
        return self._lines.count

    def summary(self) -> dict[str, Any]:
        """``{"records", "bytes", "sha256"}`` of the JSONL file."""
        return self._lines.summary()

    def twin_summary(self) -> dict[str, Any]:
        """``{"rows", "bytes", "sha256"}`` of the Parquet twin (once the block has ended)."""
        if self._twinned is not None:
            return self._twinned.twin_summary()
        assert self._twin is not None, f"{self.path} has no twin yet"
        return self._twin

    @property
    def twin_target(self) -> Path:
        """Where the twin goes."""
        return parquet_path(self.path)

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self._twinned is not None:
            self._twinned.__exit__(kind, value, traceback)
            return
        if kind is not None:
            self._lines.abort()
            return
        self._lines.commit()
        if self._schema is not None:
            schema = self._schema if isinstance(self._schema, pa.Schema) else self._schema(self.path)
            self._twin = write_parquet(self.path, schema)


class _RowCursor:
    """The rows of one Parquet file in order, handed out a few at a time (one row group read
    at a time, so a twin of millions of rows is never in memory whole)."""

    def __init__(self, path: Path, schema: pa.Schema) -> None:
        self._path = path
        self._schema = schema
        self._file = pq.ParquetFile(path)
        self._batches = self._file.iter_batches(batch_size=_BATCH)
        self._held: list[pa.RecordBatch] = []
        self._count = 0

    def take(self, n: int) -> pa.Table:
        """The next ``n`` rows; a file with fewer left is refused (the merge order is wrong)."""
        while self._count < n:
            batch = next(self._batches, None)
            if batch is None:
                raise ValueError(f"{self._path} has fewer rows than the merge order takes from it")
            if batch.num_rows:
                self._held.append(batch)
                self._count += batch.num_rows
        table = pa.Table.from_batches(self._held, schema=self._held[0].schema) if self._held else None
        if table is None:
            return self._schema.empty_table()
        if table.schema != self._schema:
            table = table.cast(self._schema)
        out, rest = table.slice(0, n), table.slice(n)
        self._held = rest.to_batches()
        self._count = rest.num_rows
        return out

    def close(self) -> None:
        self._file.close()


def merge_parquet(
    jsonl: Path, sources: Sequence[Path], order: Sequence[int], schema: pa.Schema
) -> dict[str, Any]:
    """Write ``jsonl``'s Parquet twin from the twins of ``sources``, without reading JSON.

    ``jsonl`` holds the lines of the JSONL files ``sources`` interleaved as ``order`` says
    (the source of each line in turn; each source's lines keep their order), and each source
    has its Parquet twin. The rows are taken from those twins in the same order and written
    in the same batches as :func:`write_parquet` writes them, so the file has the same bytes
    as ``write_parquet(jsonl, schema)``; returns the same summary.
    """
    target = parquet_path(jsonl)
    cursors = [_RowCursor(parquet_path(source), schema) for source in sources]
    rows = 0
    with ExitStack() as stack, _writer(target, schema) as writer:
        for cursor in cursors:
            stack.callback(cursor.close)
        for start in range(0, len(order), _BATCH):
            # One row group at a time, so memory holds one batch per source, not whole twins.
            ks = order[start : start + _BATCH]
            wanted = [0] * len(cursors)
            for k in ks:
                wanted[k] += 1
            parts = [cursor.take(n) for cursor, n in zip(cursors, wanted, strict=True)]
            starts = list(itertools.accumulate((n for n in wanted), initial=0))
            taken = [0] * len(cursors)
            picks = array("q")
            for k in ks:
                picks.append(starts[k] + taken[k])
                taken[k] += 1
            # One contiguous chunk per batch, as RecordBatch.from_pylist makes it.
            batch = pa.concat_tables(parts).take(pa.array(picks, type=pa.int64()))
            writer.write_table(batch.combine_chunks())
            rows += len(ks)
    return _summary(target, rows)


@contextmanager
def _writer(target: Path, schema: pa.Schema) -> Iterator[pq.ParquetWriter]:
    """The one Parquet writer setting, into a temp file that replaces ``target`` on success."""
    # No column statistics: the files stay small and their bytes depend only on the records
    # (and the pyarrow version), like the JSONL they mirror.
    with (
        atomic_file(target) as sink,
        pq.ParquetWriter(
            sink, schema, compression="zstd", write_statistics=False, memory_pool=_POOL
        ) as writer,
    ):
        yield writer


def _summary(target: Path, rows: int) -> dict[str, Any]:
    with open(target, "rb") as fh:  # streamed: a twin of millions of rows is never in memory
        digest = hashlib.file_digest(fh, "sha256")
    return {"rows": rows, "bytes": target.stat().st_size, "sha256": digest.hexdigest()}


def load_export(path: Path | str) -> datasets.Dataset:
    """``name.jsonl`` or ``name.parquet`` as a ``datasets.Dataset``, read from the Parquet twin.

    Unlike ``load_dataset``, which refuses a split with no rows, an empty export gives a
    dataset with zero rows and the export's columns. Needs the ``datasets`` package.
    """
    import datasets

    target = parquet_path(Path(path))
    return datasets.Dataset(pq.read_table(target))
