"""Prompt seeds in: generated from the word pools, or read from a ``prompts_seed.jsonl``.

Takes: the checked settings (seed, pools, themes, constraints) or a seeds file, plus a
:class:`~storyforge.tasks.tinystories.seed_validation.SeedValidator` and an instruction
renderer. Gives: :class:`SeedGenerator` (record ``i`` depends only on ``(seed, i)``, so
records never depend on each other and growing ``n_seeds`` only appends), :func:`split_for`
(train/val from a hash of the id), :func:`read_seed_lines` and :func:`audit_seeds` (every
loaded line becomes a record or a :class:`Rejection` naming the id or line and the rule).

Why a hash stream instead of ``random.Random``: seeding a Mersenne Twister per record costs
about 11 µs, more than the rest of the record; a BLAKE2b block per record gives the same
independence for well under a microsecond, and its output is fixed by the algorithm, not by
a Python version's ``random`` internals.
"""

from __future__ import annotations

import hashlib
import itertools
import struct
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from storyforge import jsontext
from storyforge.errors import ConfigError, DataError
from storyforge.tasks.tinystories.seed_validation import Rejection, SeedValidator
from storyforge.tasks.tinystories.spec import SEED_FIELDS, SeedConstraints

__all__ = ["SeedGenerator", "audit_seeds", "read_seed_lines", "split_for"]

# Bumping this changes every generated record; it names the drawing scheme below.
_STREAM = "storyforge.tinystories.seeds.v1"
_MAX_ATTEMPTS = 64
_TWO_64 = 1 << 64


_BLOCK_HASH = hashlib.blake2b(digest_size=64)
_SPLIT_HASH = hashlib.blake2b(digest_size=8, person=b"split")


def split_for(record_id: str, val_fraction: float) -> str:
    """``"val"`` for about ``val_fraction`` of all ids, else ``"train"``; fixed per id."""
    return "val" if _split_word(record_id) < int(val_fraction * _TWO_64) else "train"


def _split_word(record_id: str) -> int:
    split_hash = _SPLIT_HASH.copy()  # a copy of a fresh hash: cheaper than making one
    split_hash.update(record_id.encode("utf-8"))
    return int.from_bytes(split_hash.digest(), "big")


def _words(key: bytes) -> Iterator[int]:
    """A deterministic stream of uniform 64-bit integers: BLAKE2b(key, block) cut into words.

    ``next(words) % n`` draws a uniform integer in ``[0, n)`` (modulo bias under n / 2**64,
    i.e. none in practice)."""
    h = _BLOCK_HASH.copy()  # a copy of a fresh hash: cheaper than making one
    h.update(key + _FIRST_BLOCK)  # most records need no more than this block's words
    yield from _unpack_words(h.digest())
    for block in itertools.count(1):
        h = _BLOCK_HASH.copy()
        h.update(key + block.to_bytes(4, "little"))
        yield from _unpack_words(h.digest())


_FIRST_BLOCK = (0).to_bytes(4, "little")
_unpack_words = struct.Struct("<8Q").unpack


class SeedGenerator:
    """Builds seed ``i`` (without ``instruction``) from ``(seed, i)`` and the pools.

    A banned phrase is never drawn when it is part of a chosen required phrase or of the
    protagonist, or contains one; when the drawn required phrases leave too few banned
    phrases, the required phrases are drawn again (a bounded number of times).
    """

    __slots__ = (
        "_banned",
        "_clashes",
        "_constraints",
        "_counts",
        "_key",
        "_objects",
        "_prefix",
        "_protagonists",
        "_themes",
        "_val_cut",
    )

    def __init__(
        self,
        *,
        seed: int,
        themes: Iterable[str],
        constraints: SeedConstraints,
        protagonists: Iterable[str],
        objects: Iterable[str],
        banned: Iterable[str],
        id_prefix: str = "ts",
        val_fraction: float = 0.1,
    ) -> None:
        self._themes = tuple(themes)
        self._constraints = constraints
        self._protagonists = tuple(protagonists)
        self._objects = tuple(objects)
        self._banned = tuple(banned)
        # (least, number of choices) of the required and of the banned phrases' counts
        required, banned_count = constraints.required_count, constraints.banned_count
        self._counts = (
            required.min,
            required.max - required.min + 1,
            banned_count.min,
            banned_count.max - banned_count.min + 1,
        )
        self._clashes = _clashes(self._banned, self._objects, self._protagonists)
        self._key = f"{_STREAM}:{seed}:"
        self._val_cut = int(val_fraction * _TWO_64)  # split_for's threshold
        self._prefix = id_prefix
        if not (self._themes and self._protagonists):
            raise ConfigError("seed generation needs at least one theme and one protagonist")
        if len(self._objects) < constraints.required_count.max:
            raise ConfigError(
                f"pools.objects has {len(self._objects)} usable entries; "
                f"constraints.required_count.max is {constraints.required_count.max}"
            )

    def record_id(self, index: int) -> str:
        return f"{self._prefix}-{index:06d}"

    def always_valid(self, validator: SeedValidator, count: int) -> bool:
        """Whether every record ``0..count-1``, given an instruction the schema accepts, passes
        ``validator.check``, whatever its draws; decided once, from the pools (about a
        millisecond), so a job need not check each generated record again.

        What depends on the draws is valid by construction once the pools are: every
        protagonist, theme and phrase (each pool entry probed in its field, with the list
        lengths the constraints allow, against the validator's schema), the ids (the last one
        is the longest), the sentence range (a whole record is checked), and the phrase rules:
        required phrases come from distinct entries and banned ones are drawn only when they
        fit (:meth:`_draw_banned`), so no phrase repeats when no two entries of a pool are the
        same ignoring case. False when any of that fails: then each record is checked.
        """
        if count <= 0:
            return True
        try:
            base = self.record(0)
        except ConfigError:  # the pools cannot meet the constraints: the draw itself says so
            return False
        base["instruction"] = "x" * int(validator.schema["properties"]["instruction"]["minLength"])
        if validator.check(base) is not None:
            return False
        c = self._constraints
        probes: list[tuple[str, object]] = [("id", self.record_id(count - 1))]
        probes += [("theme", theme) for theme in self._themes]
        probes += [("protagonist", protagonist) for protagonist in self._protagonists]
        probes += [("required", [phrase] * c.required_count.min) for phrase in self._objects]
        probes.append(("required", [self._objects[0]] * c.required_count.max))
        if c.banned_count.max:
            probes += [("banned", [phrase] * max(c.banned_count.min, 1)) for phrase in self._banned]
            probes.append(("banned", [self._banned[0]] * c.banned_count.max))
        probes.append(("banned", [self._banned[0]] * c.banned_count.min if self._banned else []))
        if not all(validator.matches_schema({**base, key: value}) for key, value in probes):
            return False
        return all(len({p.lower() for p in pool}) == len(pool) for pool in (self._objects, self._banned))

    def record(self, index: int) -> dict[str, Any]:
        """Seed number ``index``: every field of the schema except ``instruction``."""
        c = self._constraints
        required_min, required_span, banned_min, banned_span = self._counts
        words = _words(f"{self._key}{index}".encode())
        p = next(words) % len(self._protagonists)
        theme = self._themes[next(words) % len(self._themes)]
        n_required = required_min + next(words) % required_span
        n_banned = banned_min + next(words) % banned_span
        objects, n_objects = self._objects, len(self._objects)
        for _ in range(_MAX_ATTEMPTS):
            chosen: list[int] = []
            required: list[str] = []
            while len(chosen) < n_required:  # distinct objects
                i = next(words) % n_objects
                if i not in chosen:
                    chosen.append(i)
                    required.append(objects[i])
            banned = self._draw_banned(words, n_banned, p, chosen) if n_banned else []
            if banned is not None:
                break
        else:
            raise ConfigError(
                f"seed {self.record_id(index)}: pools.banned has no {c.banned_count.min} phrases "
                f"compatible with protagonist {self._protagonists[p]!r} after {_MAX_ATTEMPTS} draws of "
                "required phrases; add banned phrases or lower constraints.banned_count.min"
            )
        record_id = f"{self._prefix}-{index:06d}"
        return {
            "id": record_id,
            "split": "val" if _split_word(record_id) < self._val_cut else "train",  # split_for
            "protagonist": self._protagonists[p],
            "theme": theme,
            "required": required,
            "banned": banned,
            "min_sentences": c.min_sentences,
            "max_sentences": c.max_sentences,
        }

    def _draw_banned(self, words: Iterator[int], k: int, p: int, required: list[int]) -> list[str] | None:
        """``k`` banned phrases (or fewer, down to the minimum; else None) that neither are part
        of the protagonist ``p`` or a required phrase nor contain one, ignoring case."""
        clashes = self._clashes
        taken = [*required, ~p]
        chosen: list[int] = []
        for i in _banned_candidates(words, len(clashes), k):
            if i in chosen:
                continue
            clash = clashes[i]
            if clash and not clash.isdisjoint(taken):
                continue
            chosen.append(i)
            if len(chosen) == k:
                break
        if len(chosen) < self._constraints.banned_count.min:
            return None
        return [self._banned[j] for j in chosen]


def _banned_candidates(words: Iterator[int], n: int, k: int) -> Iterator[int]:
    """Random draws first (the common case), then a full pass from a random start so a
    sparse set of compatible phrases is still found (its start drawn only if needed)."""
    for _ in range(4 * k + 8):
        yield next(words) % n
    start = next(words) % n
    for step in range(n):
        yield (start + step) % n


def _clashes(
    banned: tuple[str, ...], objects: tuple[str, ...], protagonists: tuple[str, ...]
) -> tuple[frozenset[int], ...]:
    """Per banned phrase, what it may not be drawn with: the objects (by index) and the
    protagonists (``~index``) it is part of or contains, ignoring case."""
    objects_low = [o.lower() for o in objects]
    protagonists_low = [(~i, q.lower()) for i, q in enumerate(protagonists)]
    out = []
    for phrase in banned:
        low = phrase.lower()
        out.append(
            frozenset(
                [i for i, t in enumerate(objects_low) if low in t or t in low]
                + [i for i, t in protagonists_low if low in t or t in low]
            )
        )
    return tuple(out)


def read_seed_lines(path: Path) -> Iterator[tuple[int, object]]:
    """``(line number, decoded value)`` per non-blank line; a bad line gives a Rejection.

    Lines are split on newlines only and decoded one by one, so a line that is not UTF-8
    or not JSON is reported (rule ``invalid_json``) without losing the lines after it.
    """
    for line_no, value in jsontext.read_jsonl(path, unique_keys=True):
        if isinstance(value, jsontext.BadLine):
            value = Rejection(rule="invalid_json", message=value.message, line=line_no)
        yield line_no, value


def audit_seeds(
    lines: Iterable[tuple[int, object]],
    validator: SeedValidator,
    render: Callable[[dict[str, Any]], str],
) -> Iterator[dict[str, Any] | Rejection]:
    """Each loaded line as a clean record (fields in schema order) or the rule it breaks.

    Rules beyond :meth:`SeedValidator.check`: ``duplicate_id`` (the first record with an id
    wins) and ``instruction_mismatch`` (``instruction`` must equal the configured template's
    rendering of the record). ``render`` may raise :class:`DataError` (rule ``render``).
    """
    seen: set[str] = set()
    for line_no, value in lines:
        if isinstance(value, Rejection):
            yield value
            continue
        rejection = validator.check(value, line=line_no)
        if rejection is not None:
            yield rejection
            continue
        assert isinstance(value, dict)
        record = {key: value[key] for key in SEED_FIELDS}
        rid = record["id"]
        if rid in seen:
            yield Rejection(
                rule="duplicate_id", message=f"id {rid!r} was used by an earlier record", id=rid, line=line_no
            )
            continue
        seen.add(rid)
        try:
            expected = render(record)
        except DataError as exc:
            yield Rejection(rule="render", message=str(exc), id=rid, line=line_no)
            continue
        if record["instruction"] != expected:
            yield Rejection(
                rule="instruction_mismatch",
                message=_first_difference(expected, record["instruction"]),
                id=rid,
                line=line_no,
            )
            continue
        yield record


def _first_difference(expected: str, got: str) -> str:
    want, have = expected.split("\n"), got.split("\n")
    for n, (a, b) in enumerate(zip(want, have), start=1):
        if a != b:
            return f"instruction differs from the canonical rendering at line {n}: expected {a!r}, got {b!r}"
    if len(want) != len(have):
        return (
            f"instruction has {len(have)} lines; the canonical rendering has {len(want)} "
            f"(first {min(len(want), len(have))} agree)"
        )
    return "instruction differs from the canonical rendering"
