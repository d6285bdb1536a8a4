"""The generations file as a crash-safe journal: repair, reconcile with the current config, append.

Takes: the path of ``generations.jsonl`` and, per ``(id, sample)``, the request hash the
current config produces. Gives: :func:`repair_tail` (cuts a torn last line left by a crash
or ``kill -9``), :func:`reconcile` (which records already count as done, which are stale or
failed and must be moved aside), and :class:`Appender` (appends whole lines, flushes and
fsyncs each batch), and :func:`record_server` / :func:`recorded_server`, the identity of the
server whose answers the journal holds (``<journal>.server.json`` beside it), which a replay in
the same directory answers under.

Why a journal: generation is the slow, costly step. Every finished completion is appended
as one whole line and fsynced within a short window (the runner groups the answers of each
50 ms into one write and one fsync), so a crash loses only requests still in flight or
answered in that last window; a rerun into the same directory repairs the tail, keeps each
record whose ``request_hash`` matches what it would send now, and asks only for the rest, so
every ``(id, sample)`` ends up in the file exactly once.

Records made under another request body (a changed model, temperature, prompt...) are
*stale*. By default (``on_stale: refuse``) the run stops and names them, because mixing two
configs in one dataset is rarely wanted; ``on_stale: redo`` moves them to
``generations.replaced.jsonl`` and generates again. Error records from an earlier run are
moved there too and retried (``retry_errors: true``). Nothing is ever deleted.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from storyforge import jsontext
from storyforge.atomic import fsync_dir, jsonl_line, replace_lines, write_json_atomic
from storyforge.errors import ConfigError, DataError
from storyforge.providers.base import int_or_none
from storyforge.runfiles import GENERATIONS_REPLACED

__all__ = [
    "Appender",
    "Reconciled",
    "read_numbered",
    "read_records",
    "reconcile",
    "record_server",
    "recorded_server",
    "repair_tail",
    "server_path",
]

log = logging.getLogger(__name__)

Key = tuple[str, int]

REPLACED_NAME = GENERATIONS_REPLACED


def repair_tail(path: Path) -> int:
    """Cut an unfinished or unreadable last line from ``path``; return the bytes removed.

    Only the last line can be torn by a crash, because lines are only ever appended. A bad
    line anywhere else is not a crash artefact, so it is reported (file and line number)
    rather than silently dropped.
    """
    if not path.exists():
        return 0
    data = path.read_bytes()
    keep = len(data)
    if data and not data.endswith(b"\n"):
        keep = data.rfind(b"\n") + 1
    else:
        # A complete last line can still be garbage (e.g. zeros after a power loss).
        last_start = data.rfind(b"\n", 0, max(0, keep - 1)) + 1
        if keep and not _parses(data[last_start:keep]):
            keep = last_start
    removed = len(data) - keep
    if removed:
        with path.open("r+b") as fh:
            fh.truncate(keep)
            fh.flush()
            os.fsync(fh.fileno())
        log.warning("%s: cut a torn last line (%d bytes) left by an interrupted run", path, removed)
    return removed


def read_records(path: Path) -> list[dict[str, Any]]:
    """Every record in ``path`` (after :func:`repair_tail`); a bad line is a :class:`DataError`."""
    return [record for _, record in read_numbered(path)]


def read_numbered(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """Every record in ``path`` with its line number; a bad line (not JSON, nested too deeply,
    a number too long to read, not a record) is a :class:`DataError` naming the file and line."""
    if not path.exists():
        return []
    records: list[tuple[int, dict[str, Any]]] = []
    for number, record in jsontext.read_jsonl(path):
        if isinstance(record, jsontext.BadLine):
            raise DataError(f"{record.at(path)}; fix or remove it")
        if (
            not isinstance(record, dict)
            or not isinstance(record.get("id"), str)
            or not isinstance(record.get("sample"), int)
        ):
            raise DataError(f"{path}:{number}: a generation record needs a string id and an int sample")
        records.append((number, record))
    return records


@dataclass(frozen=True, slots=True, kw_only=True)
class Reconciled:
    """What an existing generations file holds, measured against the current requests (the
    defaults: a journal not there)."""

    done: frozenset[Key] = frozenset()
    kept: int = 0
    kept_errors: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


def reconcile(path: Path, expected: Mapping[Key, str], *, on_stale: str, retry_errors: bool) -> Reconciled:
    """Decide which records in ``path`` are done, and move the others aside.

    ``expected`` maps each ``(id, sample)`` of this run to the hash of the body it would send.
    A record counts as done when its key is expected, its ``request_hash`` matches, and it is
    not an error record due for a retry. Stale records (no longer expected, or another hash)
    raise :class:`ConfigError` under ``on_stale='refuse'``.
    """
    repair_tail(path)
    kept: list[dict[str, Any]] = []
    aside: list[dict[str, Any]] = []
    done: dict[Key, tuple[int, dict[str, Any]]] = {}
    stale: list[dict[str, Any]] = []
    errors = duplicates = 0
    conflicts: list[str] = []
    for number, record in read_numbered(path):
        key = (record["id"], record["sample"])
        if expected.get(key) != record.get("request_hash"):
            stale.append(record)
        elif key in done:
            duplicates += 1
            aside.append(record)
            first_number, first = done[key]
            if (first.get("output"), first.get("error")) != (record.get("output"), record.get("error")):
                conflicts.append(f"line {number} repeats line {first_number} (id {key[0]!r} sample {key[1]})")
        elif record.get("error") is not None and retry_errors:
            errors += 1
            aside.append(record)
        else:
            done[key] = (number, record)
            kept.append(record)
    if conflicts:
        log.warning(
            "%s: %d record(s) repeat an earlier one with another answer, e.g. %s; the earlier "
            "one is kept, the others are moved to %s",
            path,
            len(conflicts),
            conflicts[0],
            REPLACED_NAME,
        )
    if stale and on_stale == "refuse":
        first = stale[0]
        why = (
            "is not in this run's prompts"
            if (first["id"], first["sample"]) not in expected
            else ("was made with a different request (model, sampling settings or prompt changed)")
        )
        raise ConfigError(
            f"{path} holds {len(stale)} record(s) that do not match this run's config; e.g. "
            f"id {first['id']!r} sample {first['sample']} {why}. Use a new hydra.run.dir, or set "
            f"provider.on_stale=redo to move them to {REPLACED_NAME} and generate again."
        )
    aside.extend(stale)
    if aside:
        moved = Appender(path.parent / REPLACED_NAME)
        try:
            moved.write([jsonl_line(r) for r in aside])
        finally:
            moved.close()
        replace_lines(path, (jsonl_line(r) for r in kept))
        log.info(
            "%s: moved %d record(s) to %s (%d stale, %d errors to retry, %d duplicates)",
            path,
            len(aside),
            REPLACED_NAME,
            len(stale),
            errors,
            duplicates,
        )
    # a token count that is none or nonsense counts 0 (int_or_none)
    usages = [record.get("usage") or {} for record in kept]
    prompt_tokens = sum(int_or_none(usage.get("prompt_tokens")) or 0 for usage in usages)
    completion_tokens = sum(int_or_none(usage.get("completion_tokens")) or 0 for usage in usages)
    return Reconciled(
        done=frozenset(done),
        kept=len(kept),
        kept_errors=sum(1 for record in kept if record.get("error") is not None),
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
    )


class Appender:
    """Appends batches of whole JSON lines; each batch is flushed and fsynced before returning."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fh = path.open("ab")
        fsync_dir(path.parent)

    def write(self, lines: list[bytes]) -> None:
        self._fh.write(b"".join(lines))
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()


encode_record = jsonl_line
"""One record as one UTF-8 JSON line (:func:`storyforge.atomic.jsonl_line`)."""


def _parses(line: bytes) -> bool:
    try:
        return isinstance(jsontext.loads(line), dict)
    except ValueError:
        return False


def server_path(path: Path) -> Path:
    """Where the identity of the server behind the journal ``path`` is kept."""
    return path.with_name(path.stem + ".server.json")


def record_server(path: Path, identity: Mapping[str, Any]) -> None:
    """Keep ``identity`` (digest, source, reported) beside the journal ``path``; say so when it
    replaces another one (the journal then holds answers from both servers)."""
    before = recorded_server(path)
    if before is not None and before.get("digest") != identity.get("digest"):
        log.warning(
            "%s holds answers from server %s (%s); the answers of this run come from %s (%s)",
            path,
            before.get("digest"),
            before.get("reported"),
            identity.get("digest"),
            identity.get("reported"),
        )
    if before != dict(identity):
        write_json_atomic(server_path(path), dict(identity))


def recorded_server(path: Path) -> dict[str, Any] | None:
    """The identity kept beside the journal ``path``, or None (none kept, or not readable: said)."""
    where = server_path(path)
    try:
        value = json.loads(where.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as exc:
        log.warning("%s cannot be read (%s); the server of the journal is not known", where, exc)
        return None
    if not isinstance(value, dict) or not isinstance(value.get("digest"), str) or not value["digest"]:
        log.warning("%s holds no server digest; the server of the journal is not known", where)
        return None
    return value
