"""Parquet twins of JSONL exports: the same rows under an explicit Arrow schema.

Takes: a finished JSONL file and the :mod:`pyarrow` schema of its records. Gives:
:func:`write_parquet` (``name.jsonl`` -> ``name.parquet`` beside it, read back in batches,
written atomically), :class:`DataFile` (the one writer of a data file and its twin),
:func:`parquet_path` and :func:`load_export` (a ``datasets.Dataset`` of either file, empty or
not), plus the column types the task kinds' schemas share (:data:`MESSAGES`, :data:`STRINGS`).

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
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any, Self

import pyarrow as pa
import pyarrow.json as pajson
import pyarrow.parquet as pq

from storyforge.atomic import AtomicLines, atomic_file

if TYPE_CHECKING:
    import datasets

__all__ = ["MESSAGES", "STRINGS", "DataFile", "load_export", "parquet_path", "write_parquet"]

_BATCH = 2048  # rows per row group (the twin's bytes depend on it): the writer's peak memory follows it
_MAX_BLOCK = 1 << 30  # Arrow's JSON reader takes one block of at most 2 GiB; larger batches go row by row
# The C library's allocator: it gives a written row group's buffers back, where Arrow's default
# pool keeps about 30 MiB more at the peak of a 100,000-seed run (bench/RESULTS.md).
_POOL = pa.system_memory_pool()

MESSAGES = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
"""Chat messages: a list of ``{"role", "content"}``."""
STRINGS = pa.list_(pa.string())
"""A list of strings."""


def parquet_path(jsonl: Path) -> Path:
    """``dir/name.jsonl`` -> ``dir/name.parquet``."""
    return jsonl.with_suffix(".parquet")


def write_parquet(jsonl: Path, schema: pa.Schema) -> dict[str, Any]:
    """Write ``jsonl``'s Parquet twin with ``schema`` (column order = JSON key order).

    The file is read back :data:`_BATCH` lines at a time, each batch one row group; returns
    ``{"rows", "bytes", "sha256"}`` of the Parquet file for a manifest. A record with a key the
    schema lacks, or (checked on each batch's first record) whose keys are not the schema's
    columns in order, raises :class:`ValueError` naming its line (a writer and its schema drifted
    apart); a value of the wrong type raises Arrow's error. An empty JSONL file gives a Parquet
    file with no row groups.
    """
    target = parquet_path(jsonl)
    rows = 0
    # No column statistics: the files stay small and their bytes depend only on the records
    # (and the pyarrow version), like the JSONL they mirror.
    with (
        open(jsonl, "rb") as lines,
        atomic_file(target) as sink,
        pq.ParquetWriter(
            sink, schema, compression="zstd", write_statistics=False, memory_pool=_POOL
        ) as writer,
    ):
        for batch in _batches(lines):
            writer.write_table(_rows(batch, schema, jsonl))
            rows += len(batch)
    _release_arrow_memory()
    with open(target, "rb") as fh:  # streamed: a twin of millions of rows is never in memory
        digest = hashlib.file_digest(fh, "sha256")
    return {"rows": rows, "bytes": target.stat().st_size, "sha256": digest.hexdigest()}


def _release_arrow_memory() -> None:
    """Give the memory Arrow freed back to the system once a twin is written. The Parquet writer
    takes its page and encoder buffers from Arrow's default pool whatever pool it is given, and
    that pool (mimalloc) keeps some 15 MiB it committed for a 2,000-row group until told to let
    it go: the run would carry it to its end (bench/RESULTS.md)."""
    pa.default_memory_pool().release_unused()
    _POOL.release_unused()


def _batches(lines: IO[bytes]) -> Iterator[list[tuple[int, bytes]]]:
    """The file's non-blank lines with their line numbers, :data:`_BATCH` at a time."""
    batch: list[tuple[int, bytes]] = []
    for number, raw in enumerate(lines, start=1):
        if raw.strip():
            batch.append((number, raw))
            if len(batch) == _BATCH:
                yield batch
                batch = []
    if batch:
        yield batch


def _rows(batch: list[tuple[int, bytes]], schema: pa.Schema, jsonl: Path) -> pa.Table:
    """One row group: the lines parsed by Arrow's JSON reader under ``schema``; a batch the
    reader refuses is converted from its records, so the rows, or the error, are theirs."""
    _check_keys(*batch[0], schema, jsonl)
    data = b"".join(raw for _, raw in batch)
    if len(data) < _MAX_BLOCK:
        try:
            table = pajson.read_json(
                pa.BufferReader(data),
                # One block, one thread: the rows come in one chunk, as from_pylist makes them.
                read_options=pajson.ReadOptions(use_threads=False, block_size=max(len(data), 1)),
                parse_options=pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="error"),
                memory_pool=_POOL,
            )
        except pa.ArrowException:
            pass
        else:
            if table.num_rows == len(batch) and table.schema == schema:
                return table.combine_chunks(memory_pool=_POOL)
    del data
    for number, raw in batch:
        _check_keys(number, raw, schema, jsonl)
    # json, not orjson: the exact values (an integer past 64 bits stays an integer).
    return pa.Table.from_pylist([json.loads(raw) for _, raw in batch], schema=schema)


def _check_keys(number: int, raw: bytes, schema: pa.Schema, jsonl: Path) -> None:
    """Refuse line ``number`` of ``jsonl`` unless its keys are the schema's columns, in order."""
    keys = list(json.loads(raw))
    if keys != schema.names:
        raise ValueError(
            f"{jsonl}:{number}: columns {keys} do not match the schema of {jsonl.name} {schema.names}"
        )


class DataFile:
    """The one writer of a data file: JSONL lines written atomically with their sha256, and the
    file's Parquet twin.

    ``with DataFile(path, schema) as out: out.write(record)`` writes ``path`` (a temp file
    beside it until the block ends without an error, see :class:`~storyforge.atomic.AtomicLines`)
    and then its twin from the finished file (:func:`write_parquet`), atomically too; after the
    block :meth:`summary` and :meth:`twin_summary` are their manifest entries. With no
    ``schema`` there is no twin (a shard's part of a file whose twin is written once the parts
    are merged, or a file no data set loader reads); a function for ``schema`` is asked for it
    with the finished file (a file whose columns depend on its records).
    """

    __slots__ = ("_lines", "_schema", "_twin", "path")

    def __init__(self, path: Path, schema: pa.Schema | Callable[[Path], pa.Schema] | None = None) -> None:
        self.path = path
        self._schema = schema
        self._twin: dict[str, Any] | None = None
        self._lines = AtomicLines(path)

    def __enter__(self) -> Self:
        return self

    def write(self, record: Any) -> int:
        """Append ``record`` as one JSONL line; returns its offset."""
        return self._lines.write(record)

    def write_line(self, line: bytes) -> int:
        """Append an already-encoded JSONL line; returns its offset."""
        return self._lines.write_line(line)

    def write_lines(self, lines: list[bytes]) -> None:
        """Append already-encoded JSONL lines (what :meth:`write` would write for their records)."""
        if lines:
            self._lines.write_lines(b"".join(lines), len(lines))

    def read_at(self, offset: int) -> Any:
        """The record written at ``offset``."""
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
        assert self._twin is not None, f"{self.path} has no twin yet"
        return self._twin

    @property
    def twin_target(self) -> Path:
        """Where the twin goes."""
        return parquet_path(self.path)

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if kind is not None:
            self._lines.abort()
            return
        self._lines.commit()
        if self._schema is not None:
            schema = self._schema if isinstance(self._schema, pa.Schema) else self._schema(self.path)
            self._twin = write_parquet(self.path, schema)


def load_export(path: Path | str) -> datasets.Dataset:
    """``name.jsonl`` or ``name.parquet`` as a ``datasets.Dataset``, read from the Parquet twin.

    Unlike ``load_dataset``, which refuses a split with no rows, an empty export gives a
    dataset with zero rows and the export's columns. Needs the ``datasets`` package.
    """
    import datasets

    target = parquet_path(Path(path))
    return datasets.Dataset(pq.read_table(target))
