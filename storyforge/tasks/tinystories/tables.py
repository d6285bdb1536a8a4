"""Arrow schemas of the TinyStories JSONL files, for their Parquet twins.

Takes: a finished JSONL file written by the job or the completion stage. Gives:
:data:`SCHEMAS` (one explicit schema per file name), :func:`write_parquet`, which writes
``name.parquet`` beside ``name.jsonl`` with that schema, and :func:`merge_parquet`, which
builds it from the twins of the shard files ``name.jsonl`` was merged from (see
:mod:`storyforge.tables` for why the twins exist and :func:`~storyforge.tables.load_export`
to read one). Why here: the record shapes are this task kind's; a test checks each writer
against its schema.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from storyforge import tables
from storyforge.tables import MESSAGES, STRINGS, load_export, parquet_path

__all__ = [
    "SCHEMAS",
    "data_file",
    "load_export",
    "merge_parquet",
    "parquet_path",
    "parquet_twin",
    "write_parquet",
]

SCHEMAS: dict[str, pa.Schema] = {
    "prompts_seed.jsonl": pa.schema(
        [
            ("id", pa.string()),
            ("split", pa.string()),
            ("protagonist", pa.string()),
            ("theme", pa.string()),
            ("required", STRINGS),
            ("banned", STRINGS),
            ("min_sentences", pa.int64()),
            ("max_sentences", pa.int64()),
            ("instruction", pa.string()),
        ]
    ),
    "prompts.jsonl": pa.schema([("id", pa.string()), ("split", pa.string()), ("messages", MESSAGES)]),
    "rejected_seeds.jsonl": pa.schema(
        [("line", pa.int64()), ("id", pa.string()), ("rule", pa.string()), ("message", pa.string())]
    ),
    "validated.jsonl": pa.schema(
        [
            ("id", pa.string()),
            ("sample", pa.int64()),
            ("line", pa.int64()),
            ("passed", pa.bool_()),
            ("labels", STRINGS),
            ("reasons", STRINGS),
            ("sentence_count", pa.int64()),
            ("chars", pa.int64()),
            ("finish_reason", pa.string()),
            ("output", pa.string()),
            ("error", pa.string()),
        ]
    ),
    "sft.jsonl": pa.schema(
        [("id", pa.string()), ("sample", pa.int64()), ("split", pa.string()), ("messages", MESSAGES)]
    ),
    "rejects.jsonl": pa.schema(
        [
            ("id", pa.string()),
            ("sample", pa.int64()),
            ("split", pa.string()),
            ("line", pa.int64()),
            ("labels", STRINGS),
            ("reasons", STRINGS),
            ("sentence_count", pa.int64()),
            ("output", pa.string()),
            ("error", pa.string()),
            # dedup: ["near_duplicate"] and the cluster of duplicates.jsonl it repeats
            ("data_labels", STRINGS),
            ("cluster", pa.string()),
        ]
    ),
    "dpo.jsonl": pa.schema(
        [
            ("id", pa.string()),
            ("split", pa.string()),
            ("chosen_sample", pa.int64()),
            ("rejected_sample", pa.int64()),
            ("rejected_labels", STRINGS),
            ("prompt", MESSAGES),
            ("chosen", MESSAGES),
            ("rejected", MESSAGES),
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


def parquet_twin(jsonl: Path) -> tables.ParquetTwin:
    """The Parquet twin of the TinyStories file ``jsonl``, written as its records are
    (see :class:`storyforge.tables.ParquetTwin`)."""
    return tables.ParquetTwin(jsonl, SCHEMAS[jsonl.name])


def data_file(jsonl: Path, *, twin: bool = True, inline: bool = False) -> tables.DataFile:
    """The writer of the TinyStories file ``jsonl``, with its Parquet twin unless ``twin`` is
    false (see :class:`storyforge.tables.DataFile`)."""
    return tables.DataFile(jsonl, SCHEMAS[jsonl.name] if twin else None, inline=inline)


def write_parquet(jsonl: Path) -> dict[str, Any]:
    """Write the Parquet twin of the TinyStories file ``jsonl`` (see :func:`storyforge.tables.write_parquet`)."""
    return tables.write_parquet(jsonl, SCHEMAS[jsonl.name])


def merge_parquet(jsonl: Path, sources: Sequence[Path], order: Sequence[int]) -> dict[str, Any]:
    """Write the Parquet twin of ``jsonl``, merged from ``sources`` in ``order``, from their twins
    (see :func:`storyforge.tables.merge_parquet`)."""
    return tables.merge_parquet(jsonl, sources, order, SCHEMAS[jsonl.name])
