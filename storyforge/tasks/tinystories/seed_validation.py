"""Record-level checks on prompt seeds: schema, sentence range, phrase satisfiability.

Takes: one decoded JSON value (a candidate ``prompts_seed.jsonl`` record) and the run's
:class:`~storyforge.tasks.tinystories.spec.SeedConstraints`. Gives: :class:`SeedValidator`,
whose :meth:`~SeedValidator.check` returns ``None`` for a good record or a :class:`Rejection`
naming the rule and the place; :func:`seed_schema` (the packaged JSON Schema narrowed by the
constraints) and :func:`satisfiability_problem` (which the generator obeys too).

Why two validators: jsonschema costs about 80 µs per record, so bulk records go through a
check compiled once from the same schema values (a few µs) and jsonschema runs only on a
record that check refuses, to word the error. The two agree on every value (a Hypothesis
property in ``tests/test_tinystories_seeds.py``); both read integers strictly (``6.0`` is not
an integer here, unlike jsonschema's default).

Rules, in the order they are tried: ``schema``, ``sentence_range`` (min > max),
``duplicate_phrase`` (the same phrase twice, ignoring case), ``unsatisfiable`` (a banned
phrase inside a required phrase or the protagonist, or the reverse). Rules that need more
than one record (``duplicate_id``) or the engine (``instruction_mismatch``) live in
:mod:`storyforge.tasks.tinystories.seeds`.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any

from storyforge.errors import TemplatePath
from storyforge.tasks.tinystories.spec import SEED_FIELDS, SPLITS, THEME_SET, SeedConstraints

if TYPE_CHECKING:
    from jsonschema.exceptions import ValidationError
    from jsonschema.protocols import Validator

__all__ = [
    "Rejection",
    "SeedValidator",
    "packaged_seed_schema",
    "satisfiability_problem",
    "seed_schema",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Rejection:
    """Why one input record was refused: the rule, a sentence, and where it sits."""

    rule: str
    message: str
    id: str | None = None
    line: int | None = None

    def as_record(self) -> dict[str, Any]:
        """The row written to ``rejected_seeds.jsonl``."""
        return {"line": self.line, "id": self.id, "rule": self.rule, "message": self.message}

    def __str__(self) -> str:
        where = f"seed {self.id!r}" if self.id is not None else "record"
        if self.line is not None:
            where += f" (line {self.line})"
        return f"{where}: {self.rule}: {self.message}"


@cache
def packaged_seed_schema() -> dict[str, Any]:
    """``schemas/prompt_seed.v1.json`` as shipped in the package (the specification's bounds)."""
    text = resources.files("storyforge").joinpath("schemas/prompt_seed.v1.json").read_text("utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


def seed_schema(constraints: SeedConstraints) -> dict[str, Any]:
    """The packaged schema with counts and lengths narrowed to ``constraints``."""
    schema = copy.deepcopy(packaged_seed_schema())
    props = schema["properties"]
    for key, count, length in (
        ("required", constraints.required_count, constraints.required_length),
        ("banned", constraints.banned_count, constraints.banned_length),
    ):
        props[key]["minItems"], props[key]["maxItems"] = count.min, count.max
        props[key]["items"]["minLength"], props[key]["items"]["maxLength"] = length.min, length.max
    return schema


def _is_strict_integer(checker: Any, instance: object) -> bool:
    return isinstance(instance, int) and not isinstance(instance, bool)


@cache
def _strict_validator_class() -> type[Validator]:
    """Draft 2020-12 with booleans refused as integers (jsonschema is imported on first use:
    only records the fast check refuses, and tests, need its words)."""
    from jsonschema import Draft202012Validator, validators

    strict: type[Validator] = validators.extend(
        Draft202012Validator,
        type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_strict_integer),
    )
    return strict


_PATTERN_WORDS = {
    "id": "an id of letters, digits, '_', '.', ':' or '-' starting with a letter or digit",
    "phrase": "a phrase without line breaks, sentence punctuation (. ! ?) or surrounding whitespace",
}


def _explain(error: ValidationError) -> str:
    path = TemplatePath(error.absolute_path)
    where = str(path) if path else "record"
    if error.validator == "pattern":
        kind = "id" if tuple(error.absolute_path) == ("id",) else "phrase"
        return f"{where}: {error.instance!r} is not {_PATTERN_WORDS[kind]}"
    return f"{where}: {error.message}"


def satisfiability_problem(
    protagonist: str, required: Sequence[str], banned: Sequence[str]
) -> tuple[str, str] | None:
    """``(rule, message)`` when no story can meet these phrases, else ``None``.

    Comparisons ignore case, as the output checks do. A banned phrase may not be a part of
    a required phrase or of the protagonist, nor contain one; no phrase may appear twice.
    """
    seen: dict[str, str] = {}
    for phrase in (*required, *banned):
        folded = phrase.lower()
        if folded in seen:
            also = "" if seen[folded] == phrase else f" (also as {seen[folded]!r})"
            return "duplicate_phrase", f"phrase {phrase!r} appears twice{also}"
        seen[folded] = phrase
    for b in banned:
        fb = b.lower()
        for r in required:
            fr = r.lower()
            if fb in fr:
                return "unsatisfiable", f"banned phrase {b!r} is part of required phrase {r!r}"
            if fr in fb:
                return "unsatisfiable", f"required phrase {r!r} is part of banned phrase {b!r}"
        fp = protagonist.lower()
        if fb in fp:
            return "unsatisfiable", f"banned phrase {b!r} is part of the protagonist {protagonist!r}"
        if fp in fb:
            return "unsatisfiable", f"the protagonist {protagonist!r} is part of banned phrase {b!r}"
    return None


class SeedValidator:
    """Checks single records against the schema and the satisfiability rules (compiled once)."""

    __slots__ = ("_fast", "_validator", "constraints", "schema")

    def __init__(self, constraints: SeedConstraints) -> None:
        self.constraints = constraints
        self.schema = seed_schema(constraints)
        self._validator: Validator | None = None
        self._fast = _compile_fast_check(self.schema)

    def _jsonschema(self) -> Validator:
        if self._validator is None:
            self._validator = _strict_validator_class()(self.schema)
        return self._validator

    def matches_schema(self, record: object) -> bool:
        """The fast schema check alone (exposed so tests can compare it with jsonschema)."""
        return self._fast(record)

    def schema_errors(self, record: object) -> list[str]:
        """Every jsonschema error for ``record``, worded (slow; for reports and tests)."""
        return [_explain(e) for e in self._jsonschema().iter_errors(record)]

    def check(self, record: object, *, line: int | None = None) -> Rejection | None:
        """``None`` when ``record`` is a good seed, else the first rule it breaks."""
        raw_id = record.get("id") if isinstance(record, dict) else None
        rid = raw_id if isinstance(raw_id, str) else None
        if not self._fast(record):
            from jsonschema.exceptions import best_match

            error = best_match(self._jsonschema().iter_errors(record))
            message = _explain(error) if error is not None else "record does not match the seed schema"
            return Rejection(rule="schema", message=message, id=rid, line=line)
        assert isinstance(record, dict)
        if record["min_sentences"] > record["max_sentences"]:
            return Rejection(
                rule="sentence_range",
                message=(
                    f"min_sentences ({record['min_sentences']}) must be <= "
                    f"max_sentences ({record['max_sentences']})"
                ),
                id=rid,
                line=line,
            )
        problem = satisfiability_problem(record["protagonist"], record["required"], record["banned"])
        if problem is not None:
            return Rejection(rule=problem[0], message=problem[1], id=rid, line=line)
        return None


_PHRASE_MEMO = 1 << 16


def _compile_fast_check(schema: dict[str, Any]) -> Callable[[object], bool]:
    """A plain-Python predicate equivalent to ``schema`` (bounds read from it, not restated)."""
    props = schema["properties"]
    fields = frozenset(schema["required"])
    assert fields == frozenset(SEED_FIELDS) == frozenset(props)
    assert tuple(props["split"]["enum"]) == SPLITS and tuple(props["theme"]["enum"]) == THEME_SET
    splits = frozenset(SPLITS)
    themes = frozenset(THEME_SET)
    id_ok = re.compile(props["id"]["pattern"]).search
    id_len = (props["id"]["minLength"], props["id"]["maxLength"])
    phrase_ok = re.compile(schema["$defs"]["phrase"]["pattern"]).search
    prot_len = (props["protagonist"]["minLength"], props["protagonist"]["maxLength"])
    lists = tuple(
        (
            key,
            props[key]["minItems"],
            props[key]["maxItems"],
            props[key]["items"]["minLength"],
            props[key]["items"]["maxLength"],
        )
        for key in ("required", "banned")
    )
    min_count = props["min_sentences"]["minimum"]
    assert props["max_sentences"]["minimum"] == min_count
    instr_min = props["instruction"]["minLength"]

    def text(value: object, low: int, high: int, pattern: Callable[[str], object]) -> bool:
        return isinstance(value, str) and low <= len(value) <= high and pattern(value) is not None

    # Seeds draw their phrases from small pools, so the pattern's verdict on each distinct
    # phrase is remembered (up to _PHRASE_MEMO of them; past that, phrases are searched).
    # The checks of exact strings are written out in ``check`` (no call per phrase): this
    # runs on every seed a job generates as well as on every record a seeds file gives.
    verdicts: dict[str, bool] = {}

    def verdict(value: str) -> bool:
        ok = phrase_ok(value) is not None
        if len(verdicts) < _PHRASE_MEMO:
            verdicts[value] = ok
        return ok

    def phrase(value: object, low: int, high: int) -> bool:
        if value.__class__ is not str:
            return text(value, low, high, phrase_ok)
        assert isinstance(value, str)
        if not low <= len(value) <= high:
            return False
        ok = verdicts.get(value)
        return verdict(value) if ok is None else ok

    def integer(value: object) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= min_count

    get_verdict = verdicts.get

    def check(record: object) -> bool:
        if not isinstance(record, dict) or record.keys() != fields:
            return False
        split, theme = record["split"], record["theme"]
        if not (isinstance(split, str) and split in splits and isinstance(theme, str) and theme in themes):
            return False
        if not (
            text(record["id"], id_len[0], id_len[1], id_ok)
            and phrase(record["protagonist"], prot_len[0], prot_len[1])
            and integer(record["min_sentences"])
            and integer(record["max_sentences"])
        ):
            return False
        instruction = record["instruction"]
        if not isinstance(instruction, str) or len(instruction) < instr_min:
            return False
        for key, lo_n, hi_n, lo_len, hi_len in lists:
            items = record[key]
            if not isinstance(items, list) or not lo_n <= len(items) <= hi_n:
                return False
            for item in items:
                if item.__class__ is str:  # what ``phrase`` does, written out
                    if not lo_len <= len(item) <= hi_len:
                        return False
                    ok = get_verdict(item)
                    if not (verdict(item) if ok is None else ok):
                        return False
                elif not text(item, lo_len, hi_len, phrase_ok):
                    return False
        return True

    return check
