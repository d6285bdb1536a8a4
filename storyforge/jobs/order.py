"""Record order that does not depend on who ran what: shard assignment and the canonical sort.

Takes: seed ids, a shard count, a ``generations.jsonl`` and the ``prompts.jsonl`` it answers.
Gives: :func:`shard_of` (a seed's shard, from sha256 of its id, so it is the same in every
process, on every machine and in every Python version, unlike ``hash()``) and
:func:`sort_generations`, which rewrites a generations file in prompt order, then sample.

Why: requests finish in whatever order the servers answer, so a journal is in completion
order. Sorting it once generation is complete gives every executor the same file (and the same
line numbers in ``validated.jsonl``), which is what makes ``executor=ray`` reproduce an
``executor=local`` run byte for byte. Only keys and offsets are held in memory; each line is
copied from the journal once.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

from storyforge import jsontext
from storyforge.atomic import replace_lines

__all__ = ["prompt_positions", "shard_of", "sort_generations"]


def shard_of(seed_id: str, shards: int) -> int:
    """The shard (``0 .. shards-1``) that owns ``seed_id``: the first 8 bytes of its sha256."""
    digest = hashlib.sha256(seed_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % shards


def prompt_positions(prompts_path: Path) -> dict[str, int]:
    """Each prompt id's position in ``prompts.jsonl`` (the first occurrence wins)."""
    positions: dict[str, int] = {}
    for number, record in jsontext.read_jsonl(prompts_path):  # a BadLine has no id
        rid = record.get("id") if isinstance(record, dict) else None
        if isinstance(rid, str):
            positions.setdefault(rid, number - 1)
    return positions


def sort_generations(path: Path, prompts_path: Path) -> None:
    """Rewrite ``path`` (atomically) in the order of ``prompts_path``, then by sample.

    A record whose id is not a prompt keeps its relative place after all the others.
    """
    positions = prompt_positions(prompts_path)
    unknown = len(positions)
    keys: list[tuple[int, int, int, int, int]] = []
    with path.open("rb") as fh:
        offset = 0
        for number, line in enumerate(fh):
            record = json.loads(line)
            position = positions.get(record.get("id"), unknown)
            sample = record.get("sample", 0)
            keys.append((position, sample if position != unknown else 0, number, offset, len(line)))
            offset += len(line)
    if all(keys[i] <= keys[i + 1] for i in range(len(keys) - 1)):
        return
    keys.sort()

    def lines() -> Iterator[bytes]:
        with path.open("rb") as fh:
            for *_, start, size in keys:
                fh.seek(start)
                yield fh.read(size)

    replace_lines(path, lines())
