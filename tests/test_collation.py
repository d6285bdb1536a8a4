"""String order for `order`: the Unicode Collation Algorithm, as the reference's ICU localeCompare sorts."""

from __future__ import annotations

from typing import Any

import pytest
from pytest import param

from storyforge import SourceRegistry, compile_template, render
from storyforge.engine.collation import BACKEND, collation_key
from storyforge.engine.renderer import order_items

ISSUE = ["-1", "_x", "æ", "b", "ø", "z", "è", "é", "Ü", "u"]

ORDERS = [
    param(ISSUE, "asc", ["_x", "-1", "æ", "b", "é", "è", "ø", "u", "Ü", "z"], id="issue-example-asc"),
    param(ISSUE, "desc", ["z", "Ü", "u", "ø", "è", "é", "b", "æ", "-1", "_x"], id="issue-example-desc"),
    param(
        list("~|>=<+^`%#&\\/*@}{][)(\"'.?!:;,-_"),
        "asc",
        list("_-,;:!?.'\"()[]{}@*/\\&#%`^+<=>|~"),
        id="ascii-punctuation",
    ),
    param(
        ["a", "$", "0", " ", "~"],
        "asc",
        [" ", "~", "$", "0", "a"],
        id="space-punctuation-currency-digit-letter",
    ),
    param(["st", "ß", "ss", "sr"], "asc", ["sr", "ss", "ß", "st"], id="sharp-s-is-ss-then-case"),
    param(["of", "œ", "oe", "od"], "asc", ["od", "oe", "œ", "of"], id="oe-ligature"),
    param(["m", "ł", "l"], "asc", ["l", "ł", "m"], id="l-with-stroke"),
    param(["ac", "a\u200bc", "ab"], "asc", ["ab", "ac", "a\u200bc"], id="zero-width-space-is-ignored"),
    param(["a\u200bc", "ac"], "asc", ["a\u200bc", "ac"], id="ignorable-ties-keep-source-order"),
    param(["a\u200bc", "ac"], "desc", ["a\u200bc", "ac"], id="ignorable-ties-keep-source-order-desc"),
    param(["Apple", "apple", "APPLE"], "asc", ["apple", "Apple", "APPLE"], id="lower-case-first"),
    param(
        ["résumé", "resume", "Resume", "rest"],
        "asc",
        ["rest", "resume", "Resume", "résumé"],
        id="accent-after-case",
    ),
    param(["côté", "côte", "coté", "cote"], "asc", ["cote", "coté", "côte", "côté"], id="accents-forward"),
    param(["b10", "b9", "a"], "asc", ["a", "b10", "b9"], id="digits-are-characters"),
]


@pytest.mark.parametrize(("items", "order", "expected"), ORDERS)
def test_string_order_follows_uca(items: list[str], order: str, expected: list[str]) -> None:
    """`order` sorts strings by the collation library (three levels, stable on ties)."""
    assert order_items(items, order) == expected


def test_order_on_strings_in_a_render() -> None:
    """A forEach with `order: asc` over the issue's strings renders them in ICU order."""
    doc: dict[str, Any] = {
        "id": "t",
        "name": "t",
        "task": "x",
        "version": 1,
        "layout": [{"kind": "slot", "name": "s"}],
        "slots": {
            "s": {
                "priority": 0,
                "plan": [
                    {
                        "kind": "forEach",
                        "source": {"source": "xs"},
                        "order": "asc",
                        "map": [{"kind": "message", "role": "user", "content": "{{item}}"}],
                    }
                ],
            }
        },
    }
    out = render(compile_template(doc), {}, SourceRegistry({"xs": lambda c, a: list(ISSUE)})).messages
    assert out[0]["content"].split("\n") == ["_x", "-1", "æ", "b", "é", "è", "ø", "u", "Ü", "z"]


def test_a_real_collation_library_is_behind_the_key() -> None:
    """The key comes from ICU or pyuca, never a hand-written approximation."""
    assert BACKEND in ("icu", "pyuca")
    assert collation_key("\ud800") is not None  # a lone surrogate still has a key
