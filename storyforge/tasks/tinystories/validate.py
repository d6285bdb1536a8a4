"""TinyStories output checks, exactly as the seed spec (000) states them.

Takes: a prompt seed (a ``prompts_seed.jsonl`` record: ``required``, ``banned``,
``min_sentences``, ``max_sentences``) and a model output. Gives: a frozen
:class:`ValidationResult` with ``passed``, the failure ``labels`` (in the fixed order
``missing_required``, ``contains_banned``, ``wrong_sentence_count``, ``too_long``; an empty,
whitespace-only or non-text output gets exactly ``("other",)``), the ``sentence_count`` and
human-readable ``reasons``.

The rules: the output must be non-empty after ``strip()``; sentences are the segments of
``re.split(r"[.!?]+", text)`` that are non-empty after ``strip()``, and their number must lie
within ``[min_sentences, max_sentences]``; every ``required`` phrase must occur in the output
and no ``banned`` phrase may, comparing ``lower()`` of both; ``len(text) <= max_chars`` (2000).

It runs on every output of every run, so the sentence count avoids the literal recipe's
allocations: ``!`` and ``?`` are mapped to ``.``, the text is split on that one character and
blank pieces are counted in C (``list.count('')``, ``str.isspace``); the pieces between
delimiters are the same, and ``tests/test_validate.py`` checks the count against the literal
recipe with Hypothesis. Passing results carry no per-output data but the count, so one frozen instance per count is
shared. :class:`SeedChecks` keeps a seed's lowered phrases for the many samples of one seed.

:func:`check_answer` adds what the specification leaves out, for answers from a model: a text
answer whose ``finish_reason`` is not a normal stop (:data:`NORMAL_FINISH`; ``length``: cut off
at the completion cap) or that repeats ``echo_words`` consecutive words of its prompt
(:mod:`storyforge.tasks.tinystories.echo`) fails with label ``other`` and a reason in words,
whatever the specification's checks said. Every stage that decides whether an answer passed
(the completion stage, regeneration, the judge's selection, the studio) calls it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from storyforge.errors import DataError
from storyforge.tasks.tinystories.echo import ECHO_WORDS, find_echo

__all__ = [
    "ECHO_WORDS",
    "LABELS",
    "MAX_CHARS",
    "NORMAL_FINISH",
    "SeedChecks",
    "ValidationResult",
    "check_answer",
    "count_sentences",
    "finish_problem",
    "prompt_texts",
    "validate_output",
]

#: Every failure label, in the order ``labels`` lists them.
LABELS: Final = ("missing_required", "contains_banned", "wrong_sentence_count", "too_long", "other")

#: The seed spec's anti-ramble cap, in characters of the unstripped output.
MAX_CHARS: Final = 2000

_isspace = str.isspace


@dataclass(frozen=True, slots=True, kw_only=True)
class ValidationResult:
    """The verdict on one output: pass/fail, failure labels, sentence count, reasons."""

    passed: bool
    labels: tuple[str, ...]
    sentence_count: int
    reasons: tuple[str, ...]

    def as_record(self) -> dict[str, Any]:
        """The result as JSON-ready columns."""
        return {
            "passed": self.passed,
            "labels": list(self.labels),
            "reasons": list(self.reasons),
            "sentence_count": self.sentence_count,
        }


# Passing results differ only in their sentence count and are immutable, so one instance
# per count is shared instead of building a dataclass per output.
_PASSED: dict[int, ValidationResult] = {}


def _passed(count: int) -> ValidationResult:
    result = _PASSED.get(count)
    if result is None:
        result = _PASSED.setdefault(
            count, ValidationResult(passed=True, labels=(), sentence_count=count, reasons=())
        )
    return result


def count_sentences(text: str) -> int:
    """Number of segments of ``re.split(r"[.!?]+", text)`` that are non-empty after strip."""
    if "!" in text or "?" in text:
        text = text.replace("!", ".").replace("?", ".")
    pieces = text.split(".")
    return len(pieces) - pieces.count("") - sum(map(_isspace, pieces))


def _other(reason: str) -> ValidationResult:
    return ValidationResult(passed=False, labels=("other",), sentence_count=0, reasons=(reason,))


def _not_text(output: object) -> ValidationResult:
    if isinstance(output, Mapping) and output.get("error") is not None:
        return _other(f"provider error: {output['error']}")
    return _other(f"output is not a string (got {type(output).__name__})")


def _evaluate(
    text: str,
    required: Sequence[str],
    banned: Sequence[str],
    low_bound: int,
    high_bound: int,
    max_chars: int,
    required_lower: Sequence[str] | None = None,
    banned_lower: Sequence[str] | None = None,
) -> ValidationResult:
    """The checks on a text output; ``*_lower`` are the phrases already lowered, if known."""
    count = count_sentences(text)
    if count == 0 and not text.strip():
        return _other("output is empty" if not text else "output is whitespace only")
    low = text.lower()
    if low_bound <= count <= high_bound and len(text) <= max_chars:
        if required_lower is None:
            required_lower = [phrase.lower() for phrase in required]
        if banned_lower is None:
            banned_lower = [phrase.lower() for phrase in banned]
        for phrase in required_lower:
            if phrase not in low:
                break
        else:
            for phrase in banned_lower:
                if phrase in low:
                    break
            else:
                return _passed(count)
    return _failure(text, low, count, required, banned, low_bound, high_bound, max_chars)


def _failure(
    text: str,
    low: str,
    count: int,
    required: Sequence[str],
    banned: Sequence[str],
    low_bound: int,
    high_bound: int,
    max_chars: int,
) -> ValidationResult:
    """The full verdict for a failing text: every failing check, with reasons."""
    labels: list[str] = []
    reasons: list[str] = []
    missing = [phrase for phrase in required if phrase.lower() not in low]
    if missing:
        labels.append("missing_required")
        reasons.extend(f"missing required phrase {phrase!r}" for phrase in missing)
    present = [phrase for phrase in banned if phrase.lower() in low]
    if present:
        labels.append("contains_banned")
        reasons.extend(f"contains banned phrase {phrase!r}" for phrase in present)
    if not low_bound <= count <= high_bound:
        labels.append("wrong_sentence_count")
        noun = "sentence" if count == 1 else "sentences"
        reasons.append(f"{count} {noun}, expected {low_bound} to {high_bound}")
    if len(text) > max_chars:
        labels.append("too_long")
        reasons.append(f"{len(text)} characters, over the {max_chars}-character cap")
    return ValidationResult(passed=False, labels=tuple(labels), sentence_count=count, reasons=tuple(reasons))


@dataclass(frozen=True, slots=True, kw_only=True)
class SeedChecks:
    """One seed's checks, prepared once and applied to each of its samples.

    ``required``/``banned`` keep the seed's spelling (used in reasons); the lowered copies
    are what the substring checks compare.
    """

    seed_id: str
    required: tuple[str, ...]
    banned: tuple[str, ...]
    required_lower: tuple[str, ...]
    banned_lower: tuple[str, ...]
    min_sentences: int
    max_sentences: int
    max_chars: int = MAX_CHARS

    @classmethod
    def from_seed(cls, seed: Mapping[str, Any], *, max_chars: int = MAX_CHARS) -> SeedChecks:
        """Check the fields the validator reads; a :class:`DataError` names the seed and key."""
        seed_id = seed.get("id", "<no id>") if isinstance(seed, Mapping) else "<not a mapping>"
        if not isinstance(seed, Mapping):
            raise DataError(f"seed {seed_id}: expected a JSON object, got {type(seed).__name__}")
        phrases: dict[str, tuple[str, ...]] = {}
        for key in ("required", "banned"):
            value = seed.get(key)
            if not isinstance(value, list | tuple) or not all(isinstance(p, str) for p in value):
                raise DataError(f"seed {seed_id!r}: {key!r} must be a list of strings, got {value!r}")
            phrases[key] = tuple(value)
        bounds: dict[str, int] = {}
        for key in ("min_sentences", "max_sentences"):
            value = seed.get(key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise DataError(f"seed {seed_id!r}: {key!r} must be a non-negative integer, got {value!r}")
            bounds[key] = value
        if bounds["min_sentences"] > bounds["max_sentences"]:
            raise DataError(
                f"seed {seed_id!r}: min_sentences {bounds['min_sentences']} is greater than "
                f"max_sentences {bounds['max_sentences']}"
            )
        return cls(
            seed_id=str(seed_id),
            required=phrases["required"],
            banned=phrases["banned"],
            required_lower=tuple(p.lower() for p in phrases["required"]),
            banned_lower=tuple(p.lower() for p in phrases["banned"]),
            min_sentences=bounds["min_sentences"],
            max_sentences=bounds["max_sentences"],
            max_chars=max_chars,
        )

    def validate(self, output: object) -> ValidationResult:
        """The verdict on one output of this seed."""
        if not isinstance(output, str):
            return _not_text(output)
        return _evaluate(
            output,
            self.required,
            self.banned,
            self.min_sentences,
            self.max_sentences,
            self.max_chars,
            self.required_lower,
            self.banned_lower,
        )


def validate_output(
    seed: Mapping[str, Any] | SeedChecks, text: object, *, max_chars: int = MAX_CHARS
) -> ValidationResult:
    """Apply the seed spec's output checks to ``text`` (see the module docstring).

    ``seed`` is a ``prompts_seed.jsonl`` record or a prepared :class:`SeedChecks` (whose own
    ``max_chars`` then applies). A seed without usable ``required``/``banned``/bounds raises
    :class:`DataError` naming the seed and key.
    """
    if isinstance(seed, SeedChecks):
        return seed.validate(text)
    if not isinstance(text, str):
        return _not_text(text)
    try:
        required = seed["required"]
        banned = seed["banned"]
        low_bound = seed["min_sentences"]
        high_bound = seed["max_sentences"]
        # Cheap guards for what would otherwise pass silently (phrases that are one string,
        # bools or floats as bounds, crossed bounds); the rest fails on use below.
        if (
            isinstance(required, str)
            or isinstance(banned, str)
            or type(low_bound) is not int
            or type(high_bound) is not int
            or not 0 <= low_bound <= high_bound
        ):
            raise TypeError("seed fields")
        return _evaluate(text, required, banned, low_bound, high_bound, max_chars)
    except (KeyError, TypeError, AttributeError):
        # Re-check the seed field by field: a DataError names the key; a seed that is valid
        # after all (say, an int subclass as a bound) is validated the careful way.
        return SeedChecks.from_seed(seed, max_chars=max_chars).validate(text)


#: ``finish_reason`` values of an answer that ended on its own (unknown, None, is not a failure).
NORMAL_FINISH: Final = frozenset({"stop", "eos", "end_turn", "stop_sequence"})


def finish_problem(finish_reason: str | None, *, max_tokens: int | None = None) -> str | None:
    """Why an answer that ended with ``finish_reason`` is not whole, in words (None: it is)."""
    if finish_reason is None or finish_reason in NORMAL_FINISH:
        return None
    if finish_reason == "length":
        if max_tokens is not None:
            return f"cut off at max_tokens={max_tokens}"
        return "cut off at the token limit (finish_reason 'length')"
    return f"ended with finish_reason {finish_reason!r}, not a normal stop"


def prompt_texts(
    messages: Sequence[Mapping[str, Any]], repair_turn: str | None = None
) -> tuple[tuple[str, str], ...]:
    """The texts an answer was prompted with, named for the echo check's reasons: the system
    message, the instruction (the user turns) and, in a repair conversation, the repair turn."""
    texts: list[tuple[str, str]] = []
    for message in messages:
        content, role = message.get("content"), message.get("role")
        if isinstance(content, str) and role in ("system", "user"):
            texts.append(("the system message" if role == "system" else "the instruction", content))
    if repair_turn:
        texts.append(("the repair turn", repair_turn))
    return tuple(texts)


def check_answer(
    checks: SeedChecks,
    output: object,
    *,
    finish_reason: str | None = None,
    prompts: Sequence[tuple[str, str]] = (),
    echo_words: int = ECHO_WORDS,
    max_tokens: int | None = None,
) -> ValidationResult:
    """The seed's checks (:meth:`SeedChecks.validate`) and the answer's own: a text answer cut
    off (``finish_reason`` other than a normal stop, :func:`finish_problem`) or repeating
    ``echo_words`` consecutive words of its ``prompts`` (:func:`prompt_texts`;
    :func:`~storyforge.tasks.tinystories.echo.find_echo`) fails with label ``other`` and a
    reason, whatever the seed's checks said."""
    result = checks.validate(output)
    if not isinstance(output, str) or not output.strip():
        return result
    reasons = []
    cut = finish_problem(finish_reason, max_tokens=max_tokens)
    if cut is not None:
        reasons.append(cut)
    echo = find_echo(output, prompts, words=echo_words, phrases=checks.required)
    if echo is not None:
        reasons.append(echo.reason(output))
    if not reasons:
        return result
    labels = result.labels if "other" in result.labels else (*result.labels, "other")
    return ValidationResult(
        passed=False,
        labels=labels,
        sentence_count=result.sentence_count,
        reasons=(*result.reasons, *reasons),
    )
