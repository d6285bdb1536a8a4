"""TinyStories output checks: every rule and label of the seed spec, and the fast sentence count."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storyforge.errors import DataError
from storyforge.tasks.tinystories import ValidationResult, validate_output
from storyforge.tasks.tinystories.validate import LABELS, SeedChecks, count_sentences

SEED: dict[str, Any] = {
    "id": "ts-000001",
    "split": "train",
    "protagonist": "a shy turtle named Tim",
    "theme": "kindness",
    "required": ["red ball", "Old Tree"],
    "banned": ["dragon"],
    "min_sentences": 3,
    "max_sentences": 5,
    "instruction": "Write a children's story.",
}

GOOD = "Tim found a red ball. He rolled it to the old tree. His friend smiled. They played all day."


def seed(**changes: Any) -> dict[str, Any]:
    return {**SEED, **changes}


# ---------------------------------------------------------------------------------------------
# An independent, literal implementation of the seed spec, used as the oracle.


def naive_labels(record: dict[str, Any], text: object, max_chars: int = 2000) -> tuple[tuple[str, ...], int]:
    if not isinstance(text, str) or not text.strip():
        return ("other",), 0
    segments = [s.strip() for s in re.split(r"[.!?]+", text)]
    count = len([s for s in segments if s])
    low = text.lower()
    labels = []
    if not all(r.lower() in low for r in record["required"]):
        labels.append("missing_required")
    if any(b.lower() in low for b in record["banned"]):
        labels.append("contains_banned")
    if not record["min_sentences"] <= count <= record["max_sentences"]:
        labels.append("wrong_sentence_count")
    if len(text) > max_chars:
        labels.append("too_long")
    return tuple(labels), count


# ---------------------------------------------------------------------------------------------
# Rules, one row each.

ROWS = [
    pytest.param(seed(), GOOD, (), 4, id="pass"),
    pytest.param(seed(), GOOD.replace("red ball", "blue ball"), ("missing_required",), 4, id="missing-one"),
    pytest.param(seed(), "One. Two. Three.", ("missing_required",), 3, id="missing-all"),
    pytest.param(seed(), GOOD.upper(), (), 4, id="required-case-insensitive-text"),
    pytest.param(seed(required=["RED BALL", "old TREE"]), GOOD, (), 4, id="required-case-insensitive-phrase"),
    pytest.param(seed(), GOOD + " A dragon came.", ("contains_banned",), 5, id="banned"),
    pytest.param(seed(), GOOD + " A DRAGON came.", ("contains_banned",), 5, id="banned-case-insensitive"),
    pytest.param(
        seed(), GOOD.replace("day.", "day with dragonflies."), ("contains_banned",), 4, id="banned-substring"
    ),
    pytest.param(seed(banned=[]), GOOD + " A dragon came.", (), 5, id="no-banned"),
    pytest.param(seed(), "A red ball. The old tree.", ("wrong_sentence_count",), 2, id="too-few"),
    pytest.param(seed(), "Red ball. Old tree. A. B. C. D.", ("wrong_sentence_count",), 6, id="too-many"),
    pytest.param(seed(), "Red ball. Old tree. Three.", (), 3, id="exactly-min"),
    pytest.param(seed(), "Red ball. Old tree. Three. Four. Five.", (), 5, id="exactly-max"),
    pytest.param(seed(), "Red ball... Old tree?! Three!!!", (), 3, id="punctuation-runs"),
    pytest.param(seed(), "Red ball. . . Old tree. ! ? Three", (), 3, id="blank-segments-dropped"),
    pytest.param(seed(), "Red ball. Old tree. Three and no full stop", (), 3, id="no-final-punctuation"),
    pytest.param(
        seed(), "Red ball Old tree no punctuation at all", ("wrong_sentence_count",), 1, id="one-run"
    ),
    pytest.param(seed(), "...!?", ("missing_required", "wrong_sentence_count"), 0, id="only-punctuation"),
    pytest.param(
        seed(), "Red ball…  Old tree…  Three…", ("wrong_sentence_count",), 1, id="unicode-ellipsis-not-a-stop"
    ),
    pytest.param(
        seed(), "Red ball.\u3000.\u00a0. Old tree.\u2029Three.", (), 3, id="unicode-whitespace-segments"
    ),
    pytest.param(
        seed(required=["árbol", "niña"]), "La NIÑA vio un ÁRBOL. ¡Qué bonito! ¿Sí?", (), 3, id="unicode-case"
    ),
    pytest.param(
        seed(required=["ab"], banned=["dragon"], min_sentences=3, max_sentences=3),
        "ab. A dragon. " + "z" * 2000,
        ("contains_banned", "too_long"),
        3,
        id="two-labels-in-order",
    ),
    pytest.param(
        seed(required=["zebra"], banned=["dragon"], min_sentences=3, max_sentences=3),
        "A dragon. " + "z" * 2000,
        ("missing_required", "contains_banned", "wrong_sentence_count", "too_long"),
        2,
        id="all-four-labels-in-order",
    ),
]


@pytest.mark.parametrize(("record", "text", "labels", "count"), ROWS)
def test_rule_table(record: dict[str, Any], text: str, labels: tuple[str, ...], count: int) -> None:
    """Each rule gives exactly the expected labels and sentence count, agreeing with the literal recipe."""
    result = validate_output(record, text)
    assert result.labels == labels
    assert result.sentence_count == count
    assert result.passed is (labels == ())
    assert naive_labels(record, text) == (labels, count)
    assert SeedChecks.from_seed(record).validate(text) == result


def _of_length(n: int) -> str:
    """A passing story padded with spaces inside a sentence to exactly ``n`` characters."""
    head = "Red ball by the old tree. Two. Three"
    return head + " " * (n - len(head) - 1) + "."


@pytest.mark.parametrize(
    ("length", "labels"),
    [
        pytest.param(2000, (), id="2000-chars-pass"),
        pytest.param(2001, ("too_long",), id="2001-chars-fail"),
    ],
)
def test_length_cap(length: int, labels: tuple[str, ...]) -> None:
    """The 2000-character cap is inclusive: 2000 passes, 2001 is too_long."""
    text = _of_length(length)
    assert len(text) == length
    assert validate_output(SEED, text).labels == labels


def test_length_counts_surrounding_whitespace() -> None:
    """The cap applies to the unstripped output: leading and trailing whitespace counts."""
    text = "\n" + _of_length(1999) + " "
    assert len(text) == 2001
    assert validate_output(SEED, text).labels == ("too_long",)


def test_max_chars_keyword() -> None:
    """max_chars from the config replaces the 2000 default."""
    result = validate_output(SEED, GOOD, max_chars=50)
    assert result.labels == ("too_long",)
    assert result.reasons == (f"{len(GOOD)} characters, over the 50-character cap",)
    assert SeedChecks.from_seed(SEED, max_chars=len(GOOD)).validate(GOOD).passed


@pytest.mark.parametrize(
    ("output", "reason"),
    [
        pytest.param("", "output is empty", id="empty"),
        pytest.param("   ", "output is whitespace only", id="spaces"),
        pytest.param("\n\t \u3000\u00a0", "output is whitespace only", id="unicode-whitespace"),
        pytest.param(None, "output is not a string (got NoneType)", id="none"),
        pytest.param(42, "output is not a string (got int)", id="int"),
        pytest.param(b"Red ball. Old tree. Three.", "output is not a string (got bytes)", id="bytes"),
        pytest.param(["Red ball."], "output is not a string (got list)", id="list"),
        pytest.param(
            {"error": "HTTP 500: overloaded"}, "provider error: HTTP 500: overloaded", id="provider-error"
        ),
        pytest.param({"output": None}, "output is not a string (got dict)", id="dict-without-error"),
    ],
)
def test_other(output: object, reason: str) -> None:
    """Empty, whitespace-only, non-text and provider-error outputs get exactly ('other',)."""
    for result in (validate_output(SEED, output), SeedChecks.from_seed(SEED).validate(output)):
        assert result == ValidationResult(
            passed=False, labels=("other",), sentence_count=0, reasons=(reason,)
        )


def test_reasons_name_phrases_counts_and_bounds() -> None:
    """Reasons name each missing and banned phrase in the seed's spelling, the count and bounds, the length."""
    record = seed(required=["Red Ball", "Old Tree", "kite"], banned=["Dragon", "storm"], max_sentences=3)
    text = "A dragon. A storm. An old tree. Done. " + "z" * 2000
    result = validate_output(record, text)
    assert result.reasons == (
        "missing required phrase 'Red Ball'",
        "missing required phrase 'kite'",
        "contains banned phrase 'Dragon'",
        "contains banned phrase 'storm'",
        "5 sentences, expected 3 to 3",
        f"{len(text)} characters, over the 2000-character cap",
    )
    assert SeedChecks.from_seed(record).validate(text).reasons == result.reasons


def test_one_sentence_reason_is_singular() -> None:
    """A single sentence is reported as '1 sentence'."""
    assert validate_output(SEED, "Red ball and old tree.").reasons == ("1 sentence, expected 3 to 5",)


def test_result_is_frozen_and_serialisable() -> None:
    """ValidationResult cannot be changed and turns into JSON-ready columns."""
    result = validate_output(SEED, "Red ball by the old tree.")
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.passed = True  # type: ignore[misc]
    assert result.as_record() == {
        "passed": False,
        "labels": ["wrong_sentence_count"],
        "reasons": ["1 sentence, expected 3 to 5"],
        "sentence_count": 1,
    }


def test_labels_constant_order() -> None:
    """LABELS lists the seed spec's five labels in reporting order."""
    assert LABELS == ("missing_required", "contains_banned", "wrong_sentence_count", "too_long", "other")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        pytest.param(
            {"required": None},
            "seed 'ts-000001': 'required' must be a list of strings, got None",
            id="required-none",
        ),
        pytest.param(
            {"required": "red ball"},
            "'required' must be a list of strings, got 'red ball'",
            id="required-str",
        ),
        pytest.param({"banned": [1]}, "'banned' must be a list of strings, got [1]", id="banned-int"),
        pytest.param(
            {"min_sentences": "3"}, "'min_sentences' must be a non-negative integer, got '3'", id="min-str"
        ),
        pytest.param(
            {"max_sentences": True}, "'max_sentences' must be a non-negative integer, got True", id="max-bool"
        ),
        pytest.param(
            {"min_sentences": 6, "max_sentences": 5},
            "seed 'ts-000001': min_sentences 6 is greater than max_sentences 5",
            id="min-over-max",
        ),
    ],
)
def test_bad_seed_is_a_data_error(changes: dict[str, Any], message: str) -> None:
    """A seed the checks cannot read raises DataError naming the seed and the key."""
    record = seed(**changes)
    with pytest.raises(DataError, match=re.escape(message)):
        SeedChecks.from_seed(record)
    with pytest.raises(DataError, match=re.escape(message)):
        validate_output(record, GOOD)


def test_missing_seed_key_is_a_data_error() -> None:
    """A seed without 'banned' is reported by name, not as a KeyError."""
    record = {k: v for k, v in SEED.items() if k != "banned"}
    with pytest.raises(
        DataError, match=re.escape("seed 'ts-000001': 'banned' must be a list of strings, got None")
    ):
        validate_output(record, GOOD)


# ---------------------------------------------------------------------------------------------
# Properties against the literal recipe.

WHITESPACE = "".join(c for c in map(chr, range(0x110000)) if c.isspace())
ALPHABET = st.sampled_from(list(".!?" + WHITESPACE + "abAB dRgoéÉİß…\u0307x"))
PHRASES = st.sampled_from(["ab", "AB", "dog", "a b", "éx", "İ", "ss", "go!", "x.x"])


@settings(max_examples=400, deadline=None)
@given(st.text())
def test_count_matches_re_split_any_text(text: str) -> None:
    """The fast count equals re.split + strip + drop-empty for any Unicode text."""
    assert count_sentences(text) == len([s for s in (p.strip() for p in re.split(r"[.!?]+", text)) if s])


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=ALPHABET, max_size=80))
def test_count_matches_re_split_dense_text(text: str) -> None:
    """Delimiter runs and every Unicode whitespace character split and strip exactly like the recipe."""
    assert count_sentences(text) == len([s for s in (p.strip() for p in re.split(r"[.!?]+", text)) if s])


@settings(max_examples=400, deadline=None)
@given(
    text=st.one_of(st.text(alphabet=ALPHABET, max_size=60), st.none(), st.integers()),
    required=st.lists(PHRASES, min_size=0, max_size=4),
    banned=st.lists(PHRASES, min_size=0, max_size=2),
    low=st.integers(0, 4),
    span=st.integers(0, 3),
    max_chars=st.integers(1, 70),
)
def test_validate_matches_literal_recipe(
    text: object, required: list[str], banned: list[str], low: int, span: int, max_chars: int
) -> None:
    """validate_output and SeedChecks agree with the literal recipe on labels, count and passed."""
    record = seed(required=required, banned=banned, min_sentences=low, max_sentences=low + span)
    labels, count = naive_labels(record, text, max_chars)
    for result in (
        validate_output(record, text, max_chars=max_chars),
        SeedChecks.from_seed(record, max_chars=max_chars).validate(text),
    ):
        assert result.labels == labels
        assert result.sentence_count == count
        assert result.passed is (labels == ())
        assert bool(result.reasons) is (labels != ())
