"""The echo check: does an answer repeat its prompt instead of answering it?

Takes: an answer, the texts it was prompted with, each named for what it is (``"the
instruction"``, ``"the system message"``, ``"the repair turn"``), the phrases the answer is
asked to contain, and the rule's length ``words``. Gives: :func:`find_echo`, the longest run of
at least ``words`` consecutive words the answer shares with one prompt text, as an
:class:`Echo` (where it is in the answer, how many words, which text), or None.

The rule: both sides are split into words (runs of letters and digits, lowered, so
punctuation, case and spacing do not matter). Every run of ``words`` consecutive words of a
prompt text is hashed into a set; a required phrase's words in the prompt break those runs, so
an answer is never an echo for containing the phrases it was asked for. The answer's runs of
``words`` words are looked up in that set, and overlapping hits grow into one repeated span.
A story shares a protagonist or a phrase with its instruction, rarely eight words in a row;
an answer that parrots the instruction or the repair turn shares dozens.

Why hashing: the work is linear in the words of both sides (each window is hashed once, and
an answer's windows only inside stretches of words the prompt's runs use), and both sides are
capped at :data:`MAX_WORDS` words (read from at most :data:`MAX_CHARS` characters), so no answer
or prompt makes it unbounded. The prompt side is kept for the last few prompts
(:func:`_prompt_grams`), since an answer's samples and attempts share their prompt.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

__all__ = ["ECHO_WORDS", "MAX_CHARS", "MAX_WORDS", "REASON_PREFIX", "Echo", "find_echo"]

#: The default rule length: an answer sharing this many consecutive words with its prompt echoes it.
ECHO_WORDS: Final = 8

#: Words read of each side (an answer past the length cap fails anyway).
MAX_WORDS: Final = 20_000

#: Characters read of each side before its words are counted (far above MAX_WORDS words).
MAX_CHARS: Final = 400_000

#: How an echo's failure reason begins (``repeats 11 words of the repair turn: "..."``).
REASON_PREFIX: Final = "repeats "

#: The quoted span is cut in the middle past this many characters.
QUOTE_CHARS: Final = 160

_WORD = re.compile(r"[^\W_]+")
_BREAK = "\x00"  # never a word of an answer
# Every ASCII character that is not a letter or digit, as a space (what _WORD splits on).
_ASCII_GAPS = str.maketrans({chr(c): " " for c in range(128) if not chr(c).isalnum()})


@dataclass(frozen=True, slots=True, kw_only=True)
class Echo:
    """A repeated span: ``answer[start:end]``, ``words`` long, found in ``source``."""

    start: int
    end: int
    words: int
    source: str

    def reason(self, answer: str) -> str:
        """The failure reason, quoting the span (cut in the middle when long)."""
        span = " ".join(answer[self.start : self.end].split())
        if len(span) > QUOTE_CHARS:
            half = QUOTE_CHARS // 2
            head, tail = span[:half].rsplit(" ", 1)[0], span[-half:].split(" ", 1)[-1]
            span = f"{head} ... {tail}"
        return f'{REASON_PREFIX}{self.words} words of {self.source}: "{span}"'


def _words(text: str) -> list[str]:
    """The words of ``text``, lowered, up to :data:`MAX_WORDS` (the text is read up to
    :data:`MAX_CHARS`); one for one with ``_WORD.finditer(text)``."""
    text = text[:MAX_CHARS]
    if text.isascii():  # the usual case: C-level translate and split, 3-4x the regex's speed
        return text.lower().translate(_ASCII_GAPS).split()[:MAX_WORDS]
    found = _WORD.findall(text)[:MAX_WORDS]
    # Lowering a word never makes a space, so lowering them joined keeps them one for one.
    return " ".join(found).lower().split(" ") if found else []


@dataclass(slots=True)
class _Grams:
    """The prompt side: every word in a run of ``words`` prompt words (an answer's run can
    only match inside words of this set), and, built on first use (few answers have such a
    stretch), the hash of each run -> the first text holding it."""

    vocabulary: frozenset[str]
    stretches: list[tuple[int, list[str]]]
    """(prompt index, words) of each unbroken stretch of ``words`` or more, last prompt first."""
    words: int
    _runs: dict[int, int] | None = None

    @property
    def runs(self) -> dict[int, int]:
        if self._runs is None:
            self._runs = {}
            for index, part in self.stretches:  # the first prompt's index is written last
                windows = zip(*(part[i:] for i in range(self.words)), strict=False)
                self._runs.update(dict.fromkeys(map(hash, windows), index))
        return self._runs


@functools.lru_cache(maxsize=64)
def _prompt_grams(prompts: tuple[tuple[str, str], ...], phrases: tuple[str, ...], words: int) -> _Grams:
    stretches: list[tuple[int, list[str]]] = []
    vocabulary: set[str] = set()
    masks = [mask for mask in (_words(phrase) for phrase in phrases) if mask]
    # Last prompt first, so a run held by several prompts ends up naming the first of them.
    for index in range(len(prompts) - 1, -1, -1):
        tokens = _words(prompts[index][1])
        for mask in masks:  # a required phrase's words break the runs they sit in
            size, start = len(mask), -1
            while mask[0] in tokens[start + 1 :]:  # from each place its first word is, in order
                start = tokens.index(mask[0], start + 1)
                if tokens[start : start + size] == mask:
                    tokens[start : start + size] = [_BREAK] * size
        # Runs never cross a break: each stretch between breaks, if ``words`` long, holds some.
        for part in [part.split() for part in " ".join(tokens).split(_BREAK)] if masks else [tokens]:
            if len(part) >= words:
                stretches.append((index, part))
                vocabulary.update(part)
    return _Grams(vocabulary=frozenset(vocabulary), stretches=stretches, words=words)


def find_echo(
    answer: str,
    prompts: Sequence[tuple[str, str]],
    *,
    words: int = ECHO_WORDS,
    phrases: Sequence[str] = (),
) -> Echo | None:
    """The longest span of ``answer`` repeating ``words`` or more consecutive words of one of
    ``prompts`` (``(name, text)`` pairs), or None; ``words`` < 1 turns the check off.

    ``phrases``: what the answer is asked to contain; their words never make an echo."""
    if words < 1 or not prompts:
        return None
    grams = _prompt_grams(tuple(prompts), tuple(phrases), words)
    if not grams.vocabulary:  # no run of ``words`` prompt words
        return None
    tokens = _words(answer)
    vocabulary = grams.vocabulary
    best: tuple[int, int, int] | None = None  # (first word, last word, prompt index)
    # Only stretches of ``words`` or more prompt words can hold a shared run: few in a story.
    stretch = 0
    for end, token in enumerate([*tokens, _BREAK]):
        if token in vocabulary:
            stretch += 1
            continue
        if stretch >= words:
            found = _longest(tokens, end - stretch, end, words, grams.runs)
            if found is not None and (best is None or found[1] - found[0] > best[1] - best[0]):
                best = found
        stretch = 0
    if best is None:
        return None
    first, last, source_index = best
    matches = list(itertools.islice(_WORD.finditer(answer[:MAX_CHARS]), last + 1))
    return Echo(
        start=matches[first].start(),
        end=matches[last].end(),
        words=last - first + 1,
        source=prompts[source_index][0],
    )


def _longest(
    tokens: list[str], begin: int, end: int, words: int, runs: dict[int, int]
) -> tuple[int, int, int] | None:
    """The longest span of ``tokens[begin:end]`` whose every ``words``-word window is a
    prompt run: (first word, last word, prompt index), or None."""
    best: tuple[int, int, int] | None = None
    run_start = run_end = run_source = 0
    last_hit = -2
    for start in range(begin, end - words + 1):
        source = runs.get(hash(tuple(tokens[start : start + words])))
        if source is None:
            continue
        if start == last_hit + 1:  # overlaps the window before: the same span grows
            run_end = start + words - 1
        else:
            run_start, run_end, run_source = start, start + words - 1, source
        last_hit = start
        if best is None or run_end - run_start > best[1] - best[0]:
            best = (run_start, run_end, run_source)
    return best
