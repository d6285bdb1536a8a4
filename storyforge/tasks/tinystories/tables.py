"""Arrow schemas of the TinyStories JSONL files, and their Parquet twins.

Takes: a finished JSONL file written by the job or the completion stage. Gives:
:data:`SCHEMAS` (one explicit :mod:`pyarrow` schema per file name), :func:`write_parquet`
(``name.jsonl`` -> ``name.parquet`` beside it, streamed in batches, written atomically) and
:func:`load_export` (a ``datasets.Dataset`` of either file, empty or not).

Why: ``datasets.load_dataset("json", ...)`` infers columns from the first rows, so an empty
file (``dpo.jsonl`` when every seed has one sample, ``rejected_seeds.jsonl`` on a clean run)
has no columns to infer and fails. The Parquet twin carries the schema itself: it has the same
columns and types whether it holds no rows or millions, a column that happens to be all
``null`` keeps its declared type, and ``load_dataset("parquet", data_files=...,
streaming=True)`` or :func:`load_export` read the empty case as zero rows.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from storyforge.atomic import atomic_file

if TYPE_CHECKING:
    import datasets

__all__ = ["SCHEMAS", "load_export", "parquet_path", "write_parquet"]

_BATCH = 8192

_MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string())])
_MESSAGES = pa.list_(_MESSAGE)
_STRINGS = pa.list_(pa.string())

SCHEMAS: dict[str, pa.Schema] = {
    "prompts_seed.jsonl": pa.schema(
        [
            ("id", pa.string()),
            ("split", pa.string()),
            ("protagonist", pa.string()),
            ("theme", pa.string()),
            ("required", _STRINGS),
            ("banned", _STRINGS),
            ("min_sentences", pa.int64()),
            ("max_sentences", pa.int64()),
            ("instruction", pa.string()),
        ]
    ),
    "prompts.jsonl": pa.schema([("id", pa.string()), ("split", pa.string()), ("messages", _MESSAGES)]),
    "rejected_seeds.jsonl": pa.schema(
        [("line", pa.int64()), ("id", pa.string()), ("rule", pa.string()), ("message", pa.string())]
    ),
    "validated.jsonl": pa.schema(
        [
            ("id", pa.string()),
            ("sample", pa.int64()),
            ("line", pa.int64()),
            ("passed", pa.bool_()),
            ("labels", _STRINGS),
            ("reasons", _STRINGS),
            ("sentence_count", pa.int64()),
            ("chars", pa.int64()),
            ("finish_reason", pa.string()),
            ("output", pa.string()),
            ("error", pa.string()),
        ]
    ),
    "sft.jsonl": pa.schema(
        [("id", pa.string()), ("sample", pa.int64()), ("split", pa.string()), ("messages", _MESSAGES)]
    ),
    "rejects.jsonl": pa.schema(
        [
            ("id", pa.string()),
            ("sample", pa.int64()),
            ("split", pa.string()),
            ("line", pa.int64()),
            ("labels", _STRINGS),
            ("reasons", _STRINGS),
            ("sentence_count", pa.int64()),
            ("output", pa.string()),
            ("error", pa.string()),
        ]
    ),
    "dpo.jsonl": pa.schema(
        [
            ("id", pa.string()),
            ("split", pa.string()),
            ("chosen_sample", pa.int64()),
            ("rejected_sample", pa.int64()),
            ("rejected_labels", _STRINGS),
            ("prompt", _MESSAGES),
            ("chosen", _MESSAGES),
            ("rejected", _MESSAGES),
        ]
    ),
    "completion_errors.jsonl": pa.schema(
        [
            ("line", pa.int64()),
            ("kind", pa.string()),
            ("id", pa.string()),
            ("sample", pa.int64()),
            ("message", pa.string()),
        ]
    ),
}
"""File name -> the Arrow schema of its records (column order = JSON key order)."""


def parquet_path(jsonl: Path) -> Path:
    """``dir/name.jsonl`` -> ``dir/name.parquet``."""
    return jsonl.with_suffix(".parquet")


def write_parquet(jsonl: Path) -> dict[str, Any]:
    """Write ``jsonl``'s Parquet twin with the schema :data:`SCHEMAS` names for it.

    Returns ``{"rows", "bytes", "sha256"}`` of the Parquet file for a manifest. A record
    whose keys differ from the schema's columns raises :class:`ValueError` (a writer and its
    schema drifted apart). An empty JSONL file gives a Parquet file with no row groups.
    """
    schema = SCHEMAS[jsonl.name]
    names = schema.names
    target = parquet_path(jsonl)
    rows = 0
    # No column statistics: the files stay small and their bytes depend only on the records
    # (and the pyarrow version), like the JSONL they mirror.
    with (
        atomic_file(target) as sink,
        pq.ParquetWriter(sink, schema, compression="zstd", write_statistics=False) as writer,
    ):
        batch: list[dict[str, Any]] = []
        with open(jsonl, "rb") as fh:
            for number, raw in enumerate(fh, start=1):
                if not raw.strip():
                    continue
                record = json.loads(raw)
                if list(record) != names:
                    raise ValueError(
                        f"{jsonl}:{number}: columns {list(record)} do not match the schema of "
                        f"{jsonl.name} {names}"
                    )
                batch.append(record)
                if len(batch) == _BATCH:
                    writer.write_batch(pa.RecordBatch.from_pylist(batch, schema=schema))
                    rows += len(batch)
                    batch = []
        if batch:
            writer.write_batch(pa.RecordBatch.from_pylist(batch, schema=schema))
            rows += len(batch)
    data = target.read_bytes()
    return {"rows": rows, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def load_export(path: Path | str) -> datasets.Dataset:
    """``name.jsonl`` or ``name.parquet`` as a ``datasets.Dataset``, read from the Parquet twin.

    Unlike ``load_dataset``, which refuses a split with no rows, an empty export gives a
    dataset with zero rows and the export's columns. Needs the ``datasets`` package.
    """
    import datasets

    target = parquet_path(Path(path))
    return datasets.Dataset(pq.read_table(target))
