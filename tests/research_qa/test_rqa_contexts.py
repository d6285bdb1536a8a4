"""Context numbering: None dropped, trimmed, pre-numbered kept, anything else renumbered."""

from __future__ import annotations

import re
from contextlib import nullcontext as does_not_raise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from storyforge.errors import DataError
from storyforge.tasks.research_qa.contexts import (
    CONTEXT_SEPARATOR,
    join_contexts,
    normalize_contexts,
    prepare_contexts,
)

param = pytest.param


@pytest.mark.parametrize(
    ("contexts", "expected"),
    [
        param(["a", "b"], ["[1] a", "[2] b"], id="plain"),
        param(None, [], id="none"),
        param([], [], id="empty-list"),
        param([None, "  a  ", None, "\tb\n"], ["[1] a", "[2] b"], id="none-dropped-trimmed"),
        param(["", "   ", "a"], ["[1] a"], id="blank-dropped"),
        param(["[1] a", "[2] b", "[3] c"], ["[1] a", "[2] b", "[3] c"], id="prenumbered-kept"),
        param(["[1]a", "[2]  b"], ["[1]a", "[2]  b"], id="prenumbered-kept-as-is"),
        param(["[1] a", None, "[2] b"], ["[1] a", "[2] b"], id="prenumbered-with-none"),
        param(["[1] a", "[1] b"], ["[1] a", "[2] b"], id="repeated-number"),
        param(["[2] a", "[1] b"], ["[1] a", "[2] b"], id="out-of-order"),
        param(["[7] a", "[8] b"], ["[1] a", "[2] b"], id="not-starting-at-1"),
        param(["[1] a", "b", "[3] c"], ["[1] a", "[2] b", "[3] c"], id="mixed"),
        param(["[2] a", "plain", "[2] c"], ["[1] a", "[2] plain", "[3] c"], id="mixed-duplicates"),
        param(["[1]", "a"], ["[1] a"], id="marker-only-dropped"),
        param(["See [3] for details"], ["[1] See [3] for details"], id="marker-inside-kept"),
        param(
            [{"text": "t", "section": "Results", "page": 7}],
            ["[1] Section: Results | Page 7\nt"],
            id="chunk-section-page",
        ),
        param([{"text": "t", "section": "Methods"}], ["[1] Section: Methods\nt"], id="chunk-section-only"),
        param([{"text": "t", "page": "iv"}], ["[1] Page iv\nt"], id="chunk-page-only"),
        param([{"text": " t "}], ["[1] t"], id="chunk-no-metadata"),
        param([{"text": "t", "section": "  ", "page": None}], ["[1] t"], id="chunk-blank-metadata"),
        param([{"text": "t", "page": 3.0}], ["[1] Page 3\nt"], id="chunk-integral-float-page"),
        param([{"text": "   "}, "a"], ["[1] a"], id="chunk-empty-dropped"),
        param(
            ["[1] a", {"text": "b", "page": 2}],
            ["[1] a", "[2] Page 2\nb"],
            id="string-and-chunk",
        ),
        param(["[1] x", {"text": "[2] y", "page": 2}], ["[1] x", "[2] Page 2\ny"], id="numbered-chunk"),
    ],
)
def test_normalize_contexts(contexts, expected):
    """Each input list is shown exactly as expected."""
    assert normalize_contexts(contexts) == expected


@pytest.mark.parametrize(
    ("contexts", "message"),
    [
        param("a string", "contexts must be a list", id="bare-string"),
        param([1], "contexts[0] must be a string, null or a mapping with 'text', got int", id="number"),
        param(
            [{"section": "S"}],
            "contexts[0] is a chunk mapping without a 'text' string (keys: section)",
            id="no-text",
        ),
        param(
            ["a", {"text": "t", "page": True}],
            "contexts[1].page must be a string or a number",
            id="bool-page",
        ),
        param(
            [{"text": "t", "section": ["x"]}],
            "contexts[0].section must be a string or a number",
            id="list-section",
        ),
    ],
)
def test_bad_contexts_name_the_entry(contexts, message):
    """A malformed entry is a DataError naming its index."""
    with pytest.raises(DataError, match=re.escape(message)):
        prepare_contexts(contexts)


def test_prepared_context_keeps_position_and_metadata():
    """Each Context carries its number, its original index and its metadata."""
    first, second = prepare_contexts([None, {"text": "t", "section": "S", "page": 4}, "[9] u"])
    assert (first.number, first.index, first.section, first.page) == (1, 1, "S", "4")
    assert first.body == "Section: S | Page 4\nt"
    assert (second.number, second.index, second.shown, second.body) == (2, 2, "[2] u", "u")


def test_separator_is_one_newline_and_join_uses_it():
    """The documented separator is one newline (the seed's format)."""
    assert CONTEXT_SEPARATOR == "\n"
    assert join_contexts(prepare_contexts(["a", "b"])) == "[1] a\n[2] b"
    assert join_contexts(["[1] a", "[2] b"], separator="\n\n") == "[1] a\n\n[2] b"


snippet = st.one_of(
    st.none(),
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=12),
    st.builds(lambda n, t: f"[{n}] {t}", st.integers(0, 12), st.text(max_size=8)),
    st.fixed_dictionaries(
        {"text": st.text(max_size=8)}, optional={"page": st.integers(1, 99), "section": st.text(max_size=5)}
    ),
)


@given(st.lists(snippet, max_size=8))
def test_numbers_are_always_one_to_n_by_position(contexts):
    """Whatever the input, shown numbers are 1..n in order: never a repeat, never a gap."""
    shown = prepare_contexts(contexts)
    assert [c.number for c in shown] == list(range(1, len(shown) + 1))
    for c in shown:
        assert c.shown.startswith(f"[{c.number}]")
        assert c.shown == c.shown.strip()
    with does_not_raise():
        normalize_contexts(contexts)
