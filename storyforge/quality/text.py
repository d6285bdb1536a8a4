"""Text normalisation shared by the duplicate finder and the diversity figures.

Takes: output text. Gives: :func:`normalise` (NFKC, case-folded, whitespace collapsed: the
text whose hash defines an exact duplicate), :func:`words` (the word tokens of the
normalised text: runs of letters, digits and inner apostrophes) and :func:`shingles` (the
``k``-word windows over them, in text order, each once).
"""

from __future__ import annotations

import re
import unicodedata

__all__ = ["OPENING_WORD", "cut", "normalise", "opening", "shingles", "words"]

_SPACE = re.compile(r"\s+")
_WORD = re.compile(r"\w+(?:['\u2019]\w+)*")


def normalise(text: str) -> str:
    """``text`` in NFKC, case-folded, with every run of whitespace one space and no ends."""
    return _SPACE.sub(" ", unicodedata.normalize("NFKC", text).casefold()).strip()


def words(text: str, *, normalised: bool = False) -> list[str]:
    """The word tokens of ``normalise(text)`` (punctuation dropped); ``normalised``: ``text``
    already is that form."""
    return _WORD.findall(text if normalised else normalise(text))


def shingles(tokens: list[str], k: int) -> list[str]:
    """The distinct ``k``-word windows of ``tokens`` in order of first occurrence.

    A text shorter than ``k`` words has one shingle, all its words (none when it has none).
    """
    if len(tokens) < k:
        return [" ".join(tokens)] if tokens else []
    return list(dict.fromkeys(map(" ".join, zip(*(tokens[i:] for i in range(k)), strict=False))))


#: Longest word of an opening; a longer one is cut and ends with an ellipsis.
OPENING_WORD = 24


def cut(text: str, limit: int) -> str:
    """``text``, or its first ``limit - 1`` characters and ``…`` when it is longer."""
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def opening(tokens: list[str], n: int = 5) -> str:
    """The first ``n`` words (fewer when the text is shorter), each cut to :data:`OPENING_WORD`
    characters: a label to count, print and draw, whatever a model wrote."""
    return " ".join(cut(token, OPENING_WORD) for token in tokens[:n])
