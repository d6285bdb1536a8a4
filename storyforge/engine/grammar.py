"""Loads the template grammars (``grammar/*.lark``) once per process; nothing else.

Takes: a grammar name (``"interpolation"`` or ``"condition"``). Gives: a cached LALR
:class:`lark.Lark` parser built with ``propagate_positions`` and ``strict`` (strict mode makes
Lark reject terminal collisions at load time, using ``interegular``).

Why it exists: this is the only code that knows where the ``.lark`` files live. An installed
wheel ships them as ``storyforge/_grammar``; a source checkout keeps them in ``<repo>/grammar``.
Loading from a file lets ``%import .expr`` resolve next to the importing grammar. The built
tables are cached in a temp file named by a hash of *every* grammar file and the Lark version
(Lark's own key covers only the file it opens, not the ones it imports), so later processes
load in ~20 ms and an edit to ``common.lark`` is never served stale tables.
"""

from __future__ import annotations

import hashlib
import tempfile
from functools import cache
from pathlib import Path

import lark
from lark import Lark

__all__ = ["GRAMMAR_NAMES", "grammar_dir", "load_parser"]

GRAMMAR_NAMES = ("common", "expr", "interpolation", "condition")

_PACKAGE_DIR = Path(__file__).resolve().parent.parent  # the storyforge package


@cache
def grammar_dir() -> Path:
    """The folder holding the ``.lark`` files: ``storyforge/_grammar`` first, then ``<repo>/grammar``."""
    for candidate in (_PACKAGE_DIR / "_grammar", _PACKAGE_DIR.parent / "grammar"):
        if (candidate / "expr.lark").is_file():
            return candidate
    raise FileNotFoundError(
        f"storyforge grammar files not found in {_PACKAGE_DIR / '_grammar'} or {_PACKAGE_DIR.parent / 'grammar'}"
    )


@cache
def load_parser(name: str) -> Lark:
    """The LALR parser for ``grammar/<name>.lark`` (built once, then shared; Lark parsers are
    stateless between ``parse`` calls)."""
    if name not in ("interpolation", "condition", "expr"):
        raise ValueError(f"unknown grammar {name!r}; expected 'interpolation', 'condition' or 'expr'")
    start = "pipeline" if name == "expr" else "start"
    return Lark.open(
        str(grammar_dir() / f"{name}.lark"),
        parser="lalr",
        start=start,
        propagate_positions=True,
        strict=True,
        maybe_placeholders=False,
        # Building the LALR tables (and the strict collision check) takes about a second;
        # Lark keeps the result in this temp file and reuses it.
        cache=str(Path(tempfile.gettempdir()) / f"storyforge-{name}-{_grammar_hash()}.lark-cache"),
    )


@cache
def _grammar_hash() -> str:
    """A hash of every grammar file and the Lark version: the tables' cache key."""
    digest = hashlib.sha256(lark.__version__.encode())
    for name in GRAMMAR_NAMES:
        digest.update((grammar_dir() / f"{name}.lark").read_bytes())
    return digest.hexdigest()[:20]
