"""A content-addressed response cache: request -> the answer it got, in one SQLite file.

Takes: ``cache.path`` (a SQLite file, WAL mode; any number of runs, shards and sweep jobs may
share it) and the encoded request bodies the runner sends. Gives: :class:`ResponseCache` and
:class:`CachedSend`, which answers a request from the cache when it can and otherwise sends it
and stores the answer; with ``provider.replay=only`` it never sends anything.

The key is ``<provider name>/<server identity>/<sha256 of the encoded body>``: the body holds
the model, the messages and every sampling setting (and sample ``k``'s seed), and never a
secret; the identity (:mod:`storyforge.providers.identity`, read once per run) is what the
server reports about the weights behind the model name, so the same request to another
replica of the same model file is a hit and the same model name on another server is not. Only
answers are stored, never errors (a failed request is worth asking again). The value keeps
what a ``generations.jsonl`` record needs, including the try count and latency of the original
answer, so a replay rebuilds the record byte for byte.

Durability: puts are written in batches (one transaction per :data:`BATCH` answers and at
close) with ``synchronous=NORMAL``; a crash loses at most the last batch of the cache, never
the journal, and a lost entry only means asking that request again.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import sqlite3
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import aiohttp

from storyforge.errors import ConfigError, DataError
from storyforge.providers.base import ChatRequest, Completion, Provider, content_hash, cut
from storyforge.providers.choices import MultiCompletion
from storyforge.providers.identity import ServerIdentity
from storyforge.providers.retry import Outcome, RetryPolicy, check_served_model, redact_completion, send
from storyforge.redaction import redact

log = logging.getLogger(__name__)

__all__ = ["BATCH", "CachedSend", "ReplayMiss", "ResponseCache", "cache_key"]

BATCH = 256
_SCHEMA = "CREATE TABLE IF NOT EXISTS responses (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID"
# What each identity digest stands for (written once per run; read to name them in errors).
_SERVERS = (
    "CREATE TABLE IF NOT EXISTS servers (digest TEXT PRIMARY KEY, reported TEXT NOT NULL) WITHOUT ROWID"
)
_COLUMNS = {"responses": ["key", "value"], "servers": ["digest", "reported"]}


def cache_key(provider_name: str, identity: str, request_hash: str) -> str:
    """The cache key of a request: its API, the server identity's digest and the sha256 of its body."""
    return f"{provider_name}/{identity}/{request_hash}"


class ReplayMiss(LookupError):
    """A request ``provider.replay=only`` cannot answer (a defect: the runner checks first)."""


class ResponseCache:
    """Answers by request key in a SQLite file (WAL, safe to share between processes)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, timeout=60.0, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute(_SCHEMA)
            self._db.execute(_SERVERS)
            #: Why the file's tables cannot be used (then every lookup is a miss, nothing is stored).
            self.unusable = _other_columns(self._db)
        except sqlite3.Error as exc:
            raise ConfigError(
                f"cache.path {str(self.path)!r} cannot be opened as a response cache: {exc}"
            ) from None
        if self.unusable:
            log.warning(
                "the response cache %s has %s; it is not read or written in this run (delete the "
                "file, or set cache.path to another one)",
                self.path,
                self.unusable,
            )
        self._pending: list[tuple[str, str]] = []
        #: Keys whose stored entry did not read back, with why (asked again, then replaced).
        self.corrupt: dict[str, str] = {}
        self.hits = 0

    def get(self, key: str) -> Outcome | None:
        """The stored answer, or None; an entry that does not read back is a miss (said once)."""
        if self.unusable:
            return None
        row = self._db.execute("SELECT value FROM responses WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        try:
            outcome = _outcome(json.loads(row[0]))
        except (ValueError, TypeError, KeyError, RecursionError) as exc:
            self.corrupt[key] = f"{type(exc).__name__}: {str(exc)[:120]}"
            if len(self.corrupt) == 1:
                log.warning(
                    "the response cache %s holds an entry that does not read back (%s); such entries "
                    "are asked again and replaced",
                    self.path,
                    self.corrupt[key],
                )
            return None
        self.hits += 1
        return outcome

    def remember(self, identity: ServerIdentity) -> None:
        """Note what an identity digest stands for (so errors and people can name it)."""
        if self.unusable or identity.text == identity.digest:  # a digest pinned: nothing to add
            return
        with self._db:
            self._db.execute(
                "INSERT OR IGNORE INTO servers (digest, reported) VALUES (?, ?)",
                (identity.digest, redact(identity.text)),
            )

    def holdings(self, provider_name: str, request_hashes: Iterable[str]) -> dict[str, tuple[int, str]]:
        """For each server identity digest the file knows, how many of ``request_hashes`` it holds
        an answer for, and what the digest stands for: the candidates for a replay whose identity
        is not recorded."""
        if self.unusable:
            return {}
        hashes = sorted(set(request_hashes))
        names = dict(self._db.execute("SELECT digest, reported FROM servers ORDER BY digest"))
        held = {
            digest: len(hashes) - len(self.missing(cache_key(provider_name, digest, h) for h in hashes))
            for digest in names
        }
        return {digest: (n, names[digest]) for digest, n in held.items() if n}

    def put(self, key: str, outcome: Outcome) -> None:
        """Remember a successful answer (written with the next batch)."""
        if outcome.completion is None or self.unusable:
            return
        self._pending.append((key, redact(json.dumps(_value(outcome), ensure_ascii=False, sort_keys=True))))
        if len(self._pending) >= BATCH:
            self.flush()

    def missing(self, keys: Iterable[str]) -> set[str]:
        """The keys of ``keys`` that have no answer stored."""
        wanted = set(keys)
        if self.unusable:
            return wanted
        found: set[str] = set()
        pending = sorted(wanted)
        for start in range(0, len(pending), 500):
            chunk = pending[start : start + 500]
            marks = ",".join("?" * len(chunk))
            rows = self._db.execute(f"SELECT key FROM responses WHERE key IN ({marks})", chunk)
            found.update(row[0] for row in rows)
        return wanted - found

    def flush(self) -> None:
        if not self._pending:
            return
        batch, self._pending = self._pending, []
        with self._db:
            self._db.execute("BEGIN")
            self._db.executemany(
                "INSERT OR IGNORE INTO responses (key, value) VALUES (?, ?)",
                [item for item in batch if item[0] not in self.corrupt],
            )
            self._db.executemany(
                "UPDATE responses SET value = ? WHERE key = ?",
                [(value, key) for key, value in batch if key in self.corrupt],
            )

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self._db.close()


def _value(outcome: Outcome) -> dict[str, Any]:
    completion = outcome.completion
    assert completion is not None
    value = {**_fields(completion), "attempts": outcome.attempts, "latency_s": outcome.latency_s}
    if isinstance(completion, MultiCompletion):
        value["choices"] = [_fields(choice) for choice in completion.choices]
    return value


def _fields(completion: Completion) -> dict[str, Any]:
    return {key: getattr(completion, key) for key in _TYPES}


_TYPES: dict[str, Callable[[Any], bool]] = {
    "output": lambda v: type(v) is str,
    "finish_reason": lambda v: v is None or type(v) is str,
    "prompt_tokens": lambda v: v is None or (type(v) is int and v >= 0),
    "completion_tokens": lambda v: v is None or (type(v) is int and v >= 0),
    "served_model": lambda v: v is None or type(v) is str,
    "prefill_echo_stripped": lambda v: type(v) is bool,
}
"""Each stored field of an answer and its check (``type(x) is int`` on purpose: a bool is not a
token count)."""


def _fields_of(value: Any) -> dict[str, Any]:
    """The stored fields of one answer, each of its type; else TypeError or ValueError (a miss)."""
    if type(value) is not dict:
        raise TypeError(f"a stored answer is an object, not {type(value).__name__}")
    fields = {key: value[key] for key in _TYPES}
    for key, valid in _TYPES.items():
        if not valid(fields[key]):
            raise TypeError(f"the stored field {key!r} is {type(fields[key]).__name__} {fields[key]!r:.40}")
    return fields


def _outcome(value: Any) -> Outcome:
    fields = _fields_of(value)
    attempts, latency = value["attempts"], value["latency_s"]
    if type(attempts) is not int or attempts < 1:
        raise TypeError(f"the stored try count is {attempts!r:.40}")
    if (type(latency) is not float and type(latency) is not int) or not 0 <= latency < _INF:
        raise TypeError(f"the stored latency is {latency!r:.40}")
    completion: Completion
    if "choices" in value:
        choices = value["choices"]
        if type(choices) is not list or not choices:
            raise TypeError("the stored answer's choices are not a list")
        completion = MultiCompletion(**fields, choices=tuple(Completion(**_fields_of(c)) for c in choices))
    else:
        completion = Completion(**fields)
    return Outcome(completion=completion, error=None, attempts=attempts, latency_s=latency)


_INF = float("inf")


def _other_columns(db: sqlite3.Connection) -> str:
    """Why the file's tables are not the cache's (a table with other columns), or ''."""
    for table, columns in _COLUMNS.items():
        found = [row[1] for row in db.execute(f"PRAGMA table_info({table})")]
        if found != columns:
            return f"a table {table} with the columns ({', '.join(found)}), not ({', '.join(columns)})"
    return ""


class CachedSend:
    """:func:`~storyforge.providers.retry.send` behind the cache (same signature), for the answers
    of the server ``identity`` names (its digest is in every key)."""

    def __init__(self, cache: ResponseCache, *, identity: str, replay_only: bool, inner: Any = send) -> None:
        self.cache = cache
        self.identity = identity
        self.replay_only = replay_only
        self.inner = inner

    async def __call__(
        self,
        session: aiohttp.ClientSession,
        provider: Provider,
        request: ChatRequest,
        content: bytes,
        policy: RetryPolicy,
        *,
        rng: random.Random,
        on_retry: Callable[[str], None],
    ) -> Outcome:
        key = cache_key(provider.name, self.identity, content_hash(content))
        hit = self.cache.get(key)
        if hit is not None and hit.completion is not None:
            # The same rule as a live answer: an answer from another model, kept once under
            # on_model_mismatch=warn, is refused here under error (also with replay=only).
            check_served_model(provider, hit.completion, policy, cached=str(self.cache.path))
            completion = redact_completion(provider, hit.completion)
            return dataclasses.replace(hit, completion=completion, cached=True)
        if self.replay_only and key in self.cache.corrupt:
            raise DataError(
                f"provider.replay=only: the response cache {self.cache.path} entry for seed "
                f"{request.id!r} sample {request.sample} does not read back "
                f"({self.cache.corrupt[key]}); run once with provider.replay=off to ask it again"
            )
        if self.replay_only:
            raise ReplayMiss(f"seed {request.id!r} sample {request.sample} is not in {self.cache.path}")
        outcome: Outcome = await self.inner(
            session, provider, request, content, policy, rng=rng, on_retry=on_retry
        )
        self.cache.put(key, outcome)
        return outcome


def check_replay(
    cache: ResponseCache,
    provider_name: str,
    identity: str,
    expected: dict[tuple[str, int], str],
    done: Iterable[tuple[str, int]],
) -> None:
    """Raise :class:`DataError` naming seeds and samples the cache cannot answer: the cache is
    the run's input here, and no model server was asked (exit 3, not 4)."""
    finished = set(done)
    todo = {
        key: cache_key(provider_name, identity, digest)
        for key, digest in expected.items()
        if key not in finished
    }
    missing = cache.missing(todo.values())
    if not missing:
        return
    keys = sorted(key for key, value in todo.items() if value in missing)
    listed = ", ".join(f"seed {seed!r} sample {sample}" for seed, sample in keys[:5])
    more = f" and {len(keys) - 5} more" if len(keys) > 5 else ""
    raise DataError(
        f"provider.replay=only: {len(keys)} request(s) are not in the response cache {cache.path}: "
        f"{listed}{more}. Run them against a server once (provider.replay=off) to fill the cache"
    )


def replay_identity(
    cache: ResponseCache,
    provider_name: str,
    expected: dict[tuple[str, int], str],
    done: Iterable[tuple[str, int]],
) -> ServerIdentity:
    """The identity a replay answers under when neither the setting nor the run's journal names
    one: the server whose answers the cache holds for the most requests left. Several such
    servers are a :class:`ConfigError` naming them (pin one with ``provider.cache_identity``)."""
    finished = set(done)
    left = [digest for key, digest in expected.items() if key not in finished]
    holdings = cache.holdings(provider_name, left)
    if not holdings:
        # Nothing is held: check_replay names every missing request (exit 3).
        return ServerIdentity(text="", digest="-", source="cache")
    most = max(n for n, _ in holdings.values())
    best = {digest: reported for digest, (n, reported) in holdings.items() if n == most}
    if len(best) == 1:
        digest, reported = next(iter(best.items()))
        return ServerIdentity(text=reported or digest, digest=digest, source="cache")
    listed = "; ".join(f"{digest} ({cut(reported, 120)})" for digest, reported in best.items())
    raise ConfigError(
        f"provider.replay=only: the response cache {cache.path} holds these requests' answers from "
        f"{len(best)} servers: {listed}; choose one with provider.cache_identity=DIGEST (a run's "
        "manifest records its digest under generation.cache.identity)"
    )
