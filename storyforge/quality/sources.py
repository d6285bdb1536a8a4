"""Where the duplicate finder reads texts back: lines of a JSONL file, rows of earlier exports.

Takes: paths. Gives: :class:`LineIndex` (the byte offset of each line of a file, so line ``n``
can be read again without holding the file in memory) and :func:`earlier_texts`, the texts of
earlier exports named by ``dedup.against`` (JSONL or Parquet) as (row description, text):
the text of a row is its ``output`` (validated.jsonl, rejects.jsonl), its ``text``, or the
last assistant turn of its ``messages`` (sft.jsonl) or ``chosen`` (dpo.jsonl). A row with
none of these is skipped; a line that is not JSON raises a :class:`DataError` naming the file
and line.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from storyforge import jsontext
from storyforge.errors import DataError

__all__ = ["LineIndex", "earlier_texts", "row_text"]


class LineIndex:
    """The byte offset of every line of ``path`` (line numbers start at 1): 8 bytes a line."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offsets = array("q")
        position = 0
        with open(path, "rb") as fh:
            for raw in fh:
                self._offsets.append(position)
                position += len(raw)
        self._fh = open(path, "rb")  # noqa: SIM115 - closed by close()

    def line(self, number: int) -> bytes:
        self._fh.seek(self._offsets[number - 1])
        return self._fh.readline()

    def close(self) -> None:
        self._fh.close()


def _last_assistant(turns: object) -> str | None:
    if isinstance(turns, list):
        for turn in reversed(turns):
            if isinstance(turn, Mapping) and turn.get("role") == "assistant":
                content = turn.get("content")
                return content if isinstance(content, str) else None
    return None


def row_text(row: Mapping[str, Any]) -> str | None:
    """The output text a row of an export holds (see the module docstring), or ``None``."""
    for key in ("output", "text"):
        value = row.get(key)
        if isinstance(value, str):
            return value
    return _last_assistant(row.get("messages")) or _last_assistant(row.get("chosen"))


def _rows(path: Path) -> Iterator[tuple[int, Mapping[str, Any]]]:
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        number = 0
        try:
            for batch in pq.ParquetFile(path).iter_batches(batch_size=4096):
                for row in batch.to_pylist():
                    number += 1
                    yield number, row
        except (pa.ArrowException, OSError, ValueError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            where = f"{path} (after row {number})" if number else str(path)
            raise DataError(
                f"{where}: not a Parquet file that can be read ({first}) (dedup.against)"
            ) from None
        return
    for number, row in jsontext.read_jsonl(path):
        if isinstance(row, jsontext.BadLine):
            raise DataError(f"{row.at(path)} (dedup.against)")
        if not isinstance(row, Mapping):
            raise DataError(f"{path}:{number}: expected a JSON object (dedup.against)")
        yield number, row


def earlier_texts(path: Path) -> Iterator[tuple[dict[str, Any], str]]:
    """(``{"source", "row", "id", "sample"}``, text) for each row of ``path`` that holds a text."""
    for number, row in _rows(path):
        text = row_text(row)
        if text is None or not text.strip():
            continue
        seed_id, sample = row.get("id"), row.get("sample")
        yield (
            {
                "source": path.name,
                "row": number,
                "id": seed_id if isinstance(seed_id, str) else None,
                "sample": sample if isinstance(sample, int) and not isinstance(sample, bool) else None,
            },
            text,
        )
