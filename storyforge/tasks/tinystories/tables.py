"""Arrow schemas of the TinyStories JSONL files, for their Parquet twins.

Takes: a finished JSONL file written by the job or the completion stage. Gives:
:data:`SCHEMAS` (one explicit schema per file name), :func:`write_parquet`, which writes
``name.parquet`` beside ``name.jsonl`` with that schema, and :func:`data_file`, the writer of
a file and its twin (see :mod:`storyforge.tables` for why the twins exist and
:func:`~storyforge.tables.load_export` to read one). Why here: the record shapes are this
task kind's; a test checks each writer against its schema.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from storyforge import jsontext, tables
from storyforge.runfiles import (
    COMPLETION_ERRORS,
    DPO,
    PROMPTS,
    REJECTED_SEEDS,
    REJECTS,
    SEEDS,
    SFT,
    VALIDATED,
)
from storyforge.tables import MESSAGES, STRINGS, load_export, parquet_path
from storyforge.tasks.tinystories.provenance import PAIR_PROVENANCE, PROVENANCE

__all__ = [
    "CHAIN_SCHEMAS",
    "SCHEMAS",
    "data_file",
    "load_export",
    "parquet_path",
    "schema_of",
    "write_parquet",
]

_PLAIN: dict[str, pa.Schema] = {
    SEEDS: pa.schema(
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
    PROMPTS: pa.schema([("id", pa.string()), ("split", pa.string()), ("messages", MESSAGES)]),
    REJECTED_SEEDS: pa.schema(
        [("line", pa.int64()), ("id", pa.string()), ("rule", pa.string()), ("message", pa.string())]
    ),
    VALIDATED: pa.schema(
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
    SFT: pa.schema(
        [
            ("id", pa.string()),
            ("sample", pa.int64()),
            ("split", pa.string()),
            ("messages", MESSAGES),
            ("finish_reason", pa.string()),
        ]
    ),
    REJECTS: pa.schema(
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
            ("finish_reason", pa.string()),
            # dedup: ["near_duplicate"] and the cluster of duplicates.jsonl it repeats
            ("data_labels", STRINGS),
            ("cluster", pa.string()),
        ]
    ),
    DPO: pa.schema(
        [
            ("id", pa.string()),
            ("split", pa.string()),
            ("chosen_sample", pa.int64()),
            ("rejected_sample", pa.int64()),
            ("rejected_labels", STRINGS),
            ("prompt", MESSAGES),
            ("chosen", MESSAGES),
            ("rejected", MESSAGES),
            ("chosen_finish_reason", pa.string()),
            ("rejected_finish_reason", pa.string()),
        ]
    ),
    COMPLETION_ERRORS: pa.schema(
        [
            ("line", pa.int64()),
            ("kind", pa.string()),
            ("id", pa.string()),
            ("sample", pa.int64()),
            ("message", pa.string()),
        ]
    ),
}
_PROVENANCE_OF = {
    VALIDATED: PROVENANCE,
    SFT: PROVENANCE,
    REJECTS: PROVENANCE,
    DPO: PAIR_PROVENANCE,
}
"""The data sets whose rows end with a ``provenance`` column (:mod:`.provenance`)."""


def _with_provenance(name: str, schema: pa.Schema) -> pa.Schema:
    kind = _PROVENANCE_OF.get(name)
    return schema if kind is None else schema.append(pa.field("provenance", kind))


SCHEMAS: dict[str, pa.Schema] = {name: _with_provenance(name, schema) for name, schema in _PLAIN.items()}
"""File name -> the Arrow schema of its records (column order = JSON key order)."""


def _insert(schema: pa.Schema, after: str | None, fields: list[tuple[str, pa.DataType]]) -> pa.Schema:
    index = len(schema) if after is None else schema.get_field_index(after) + 1
    for offset, (name, kind) in enumerate(fields):
        schema = schema.insert(index + offset, pa.field(name, kind))
    return schema


_CHAIN: dict[str, pa.Schema] = {
    VALIDATED: _insert(
        _PLAIN[VALIDATED],
        "sample",
        [("attempt", pa.int64()), ("chain", pa.string()), ("request_hash", pa.string())],
    ),
    SFT: _insert(_PLAIN[SFT], None, [("attempt", pa.int64())]),
    REJECTS: _insert(_PLAIN[REJECTS], None, [("attempt", pa.int64())]),
    DPO: _insert(_PLAIN[DPO], None, [("chosen_attempt", pa.int64()), ("rejected_attempt", pa.int64())]),
}
CHAIN_SCHEMAS = {name: _with_provenance(name, schema) for name, schema in _CHAIN.items()}
"""The same files written from regeneration chains (``attempts.jsonl``): their rows also say
which attempt of which chain they are (see :mod:`storyforge.jobs.regenerate`)."""

MARGIN_SCHEMA = _with_provenance(DPO, _insert(_PLAIN[DPO], None, [("margin", pa.float64())]))
"""``dpo.jsonl`` under ``export.dpo_pairing=judge_margin``: each pair's judge score margin."""


def schema_of(jsonl: Path) -> pa.Schema:
    """The schema of ``jsonl``: its chain variant when its first record carries attempt columns."""
    chained = CHAIN_SCHEMAS.get(jsonl.name)
    if chained is None or not jsonl.is_file():
        return SCHEMAS[jsonl.name]
    with jsonl.open("rb") as fh:
        first = next((raw for raw in fh if raw.strip()), b"")
    if not first:
        return SCHEMAS[jsonl.name]
    keys = set(jsontext.loads(first))  # the top-level keys (provenance holds an "attempt" too)
    if jsonl.name == DPO and "margin" in keys:
        return MARGIN_SCHEMA
    if keys & (set(chained.names) - set(SCHEMAS[jsonl.name].names)):
        return chained
    return SCHEMAS[jsonl.name]


def data_file(jsonl: Path, *, twin: bool = True) -> tables.DataFile:
    """The writer of the TinyStories file ``jsonl``, with its Parquet twin unless ``twin`` is
    false (see :class:`storyforge.tables.DataFile`). A file that regeneration chains may write
    (``validated``, ``sft``, ``rejects``, ``dpo``) gets the schema its records have, read from
    the finished file (:func:`schema_of`)."""
    if not twin:
        return tables.DataFile(jsonl, None)
    if jsonl.name in CHAIN_SCHEMAS:
        return tables.DataFile(jsonl, schema_of)
    return tables.DataFile(jsonl, SCHEMAS[jsonl.name])


def write_parquet(jsonl: Path) -> dict[str, Any]:
    """Write the Parquet twin of the TinyStories file ``jsonl`` (see :func:`storyforge.tables.write_parquet`)."""
    return tables.write_parquet(jsonl, schema_of(jsonl))
