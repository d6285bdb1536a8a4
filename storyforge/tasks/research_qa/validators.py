"""Drift checks between training messages, Modelfiles and evaluation prompts.

Takes: strings and paths from artifacts made anywhere (by storyforge or by hand). Gives three
checks with the seed's names, each returning a list of issue strings (empty = pass):

- :func:`validate_modelfile_system_message` -- the SYSTEM Ollama would serve equals the
  training system message, byte for byte;
- :func:`validate_prompt_format_consistency` -- training and Modelfile system messages agree,
  and the evaluation user turn has its mode's markers and no system text;
- :func:`validate_rag_prompt_no_system_text` -- a user turn repeats no system text.

Why: a system message repeated in the user turn, or a Modelfile edited after training, shifts
the input distribution and silently invalidates a comparison between conditions. Messages say
what is wrong in words a user can act on and show both strings.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from storyforge.tasks.research_qa.format import PROMPT_MODES, PromptFormat, default_prompt_format
from storyforge.tasks.research_qa.modelfile import ModelfileError, read_modelfile

__all__ = [
    "SYSTEM_TEXT_PHRASES",
    "find_system_text",
    "markers_for_mode",
    "validate_modelfile_system_message",
    "validate_prompt_format_consistency",
    "validate_rag_prompt_no_system_text",
]

SYSTEM_TEXT_PHRASES: tuple[str, ...] = (
    "you are a research paper assistant",
    "you are a scientific research assistant",
    "you are an assistant",
    "you are a helpful assistant",
)
"""Openings of system messages that never belong in a user turn (matched case-insensitively,
whitespace runs folded). Every configured system message is checked as well."""

_MODE_ALIASES = {"rag": "rag_standard"}
_WS = re.compile(r"\s+")


def _fold(text: str) -> str:
    return _WS.sub(" ", text).strip().casefold()


def _short(text: str, limit: int = 160) -> str:
    return repr(text if len(text) <= limit else text[: limit - 1] + "…")


def _difference(expected: str, actual: str) -> str:
    """One clause saying where two unequal strings part."""
    if expected.strip() == actual.strip():
        return "they differ only in leading or trailing whitespace"
    if _fold(expected) == _fold(actual):
        return "they differ only in case or whitespace"
    at = next(
        (i for i, (a, b) in enumerate(zip(expected, actual)) if a != b), min(len(expected), len(actual))
    )
    return f"they first differ at character {at + 1}"


def find_system_text(text: str, system_messages: Iterable[str] = ()) -> list[str]:
    """System text found in ``text``: whole configured messages first, then known phrases."""
    folded = _fold(text)
    found: list[str] = []
    for message in dict.fromkeys(system_messages):
        if message.strip() and _contains_words(folded, _fold(message)):
            found.append(message)
    for phrase in SYSTEM_TEXT_PHRASES:
        if _contains_words(folded, phrase) and not any(phrase in _fold(m) for m in found):
            found.append(phrase)
    return found


def _contains_words(haystack: str, needle: str) -> bool:
    """``needle`` occurs in ``haystack`` not glued to a word character on either side."""
    return re.search(rf"(?<!\w){re.escape(needle)}(?!\w)", haystack) is not None


def markers_for_mode(mode: str, prompt_format: PromptFormat | None = None) -> tuple[str, ...]:
    """The markers a user turn of ``mode`` must contain, in order (``rag`` = ``rag_standard``)."""
    fmt = prompt_format or default_prompt_format()
    name = _MODE_ALIASES.get(mode, mode)
    if name not in fmt.markers:
        raise ValueError(f"unknown mode {mode!r}; modes: {', '.join(('rag', *PROMPT_MODES))}")
    return fmt.markers[name]


def validate_modelfile_system_message(path: str | Path, expected: str) -> list[str]:
    """Issues with the SYSTEM of the Modelfile at ``path`` versus ``expected`` (the training message)."""
    try:
        modelfile = read_modelfile(path)
    except ModelfileError as exc:
        return [f"Modelfile cannot be read as Ollama reads it: {exc}"]
    actual = modelfile.system
    if actual is None:
        return [
            (
                f"missing SYSTEM directive in {path}: Ollama would serve the base model's own system "
                f'message instead of the training one; add SYSTEM """{expected}""" (or regenerate '
                "the Modelfile with stage=modelfiles)"
            )
        ]
    if actual != expected:
        note = (
            f" ({modelfile.system_count} SYSTEM lines; Ollama uses the last)"
            if modelfile.system_count > 1
            else ""
        )
        return [
            (
                f"system message mismatch in {path}{note}: {_difference(expected, actual)}\n"
                f"  training:  {expected!r}\n"
                f"  Modelfile: {actual!r}\n"
                "  The model would be evaluated under a system message it was not trained with; "
                "regenerate the Modelfile from the prompt format."
            )
        ]
    return []


def validate_prompt_format_consistency(
    training_system_message: str,
    modelfile_system_message: str | None,
    evaluation_prompt: str,
    mode: str = "instruction",
    *,
    prompt_format: PromptFormat | None = None,
) -> list[str]:
    """Issues between the training message, the Modelfile message and an evaluation user turn.

    ``modelfile_system_message=None`` skips the comparison (the system message is sent with the
    request instead of coming from a Modelfile). ``mode`` is a prompt mode (``rag`` is
    ``rag_standard``); its markers come from the prompt format.
    """
    fmt = prompt_format or default_prompt_format()
    issues: list[str] = []
    if modelfile_system_message is not None and modelfile_system_message != training_system_message:
        issues.append(
            f"system message mismatch: {_difference(training_system_message, modelfile_system_message)}\n"
            f"  training:  {training_system_message!r}\n"
            f"  Modelfile: {modelfile_system_message!r}"
        )
    known = [training_system_message, *([modelfile_system_message] if modelfile_system_message else [])]
    duplicated = find_system_text(evaluation_prompt, [*known, *fmt.all_system_messages()])
    if duplicated:
        issues.append(
            f"system text duplication: the evaluation user turn contains {duplicated[0]!r}; the system "
            "message is sent separately (Modelfile or chat template), so the user turn must not repeat it\n"
            f"  user turn: {_short(evaluation_prompt)}"
        )
    issues.extend(_marker_issues(evaluation_prompt, mode, fmt))
    return issues


def validate_rag_prompt_no_system_text(
    prompt: str, *, system_messages: Sequence[str] | None = None
) -> list[str]:
    """Issues when ``prompt`` (a user turn, e.g. a stored ``rag.prompt``) contains system text.

    Checks every configured system message (of the packaged prompt format unless
    ``system_messages`` is given) and the phrases in :data:`SYSTEM_TEXT_PHRASES`.
    """
    messages = default_prompt_format().all_system_messages() if system_messages is None else system_messages
    found = find_system_text(prompt, messages)
    if not found:
        return []
    return [
        (
            f"system text duplication: the RAG prompt contains {found[0]!r}; the system message is "
            "provided separately (Modelfile or chat template), so the prompt must hold user content "
            f"only. Remove it from the prompt.\n  prompt: {_short(prompt)}"
        )
    ]


def _marker_issues(prompt: str, mode: str, fmt: PromptFormat) -> list[str]:
    markers = markers_for_mode(mode, fmt)
    missing = [m for m in markers if m not in prompt]
    if missing:
        return [
            (
                f"missing required markers for mode {_MODE_ALIASES.get(mode, mode)!r}: "
                f"{', '.join(repr(m) for m in missing)} not found (expected, in order: "
                f"{' … '.join(markers)})\n  user turn: {_short(prompt)}"
            )
        ]
    position = 0
    for marker in markers:
        found = prompt.find(marker, position)
        if found < 0:
            return [
                (
                    f"missing required markers for mode {_MODE_ALIASES.get(mode, mode)!r}: they are out of "
                    f"order; expected {' … '.join(markers)}\n  user turn: {_short(prompt)}"
                )
            ]
        position = found + len(marker)
    last = markers[-1]
    if not prompt.endswith(last):
        return [
            (
                f"the user turn must end with {last!r} (the model writes its answer right after it); "
                f"it ends with {_short(prompt[prompt.rfind(last) :])}"
            )
        ]
    return []
