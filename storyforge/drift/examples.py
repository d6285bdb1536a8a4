"""Exported conversations, read back for the drift gate.

Takes: export files or folders: TinyStories ``sft.jsonl``, research-QA ``train.jsonl`` and
``eval.jsonl`` (a folder is searched recursively for those three names). Gives:
:func:`read_examples` -> :class:`ExampleSet`: every conversation as an :class:`Example` (its
id, its messages, whether it is a training row or an evaluation prompt) plus one
:class:`Unreadable` per line that could not be used, named by file and line.

Why: the gate checks what was exported, not what a config would export now. A training row
ends with the assistant turn and is rendered without a generation prompt (TRL's SFTTrainer);
an evaluation prompt ends with a user turn and is rendered with one.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from storyforge.errors import DataError
from storyforge.jsontext import BadLine, read_jsonl
from storyforge.runfiles import EVAL, SFT, TRAIN

__all__ = ["EXPORT_NAMES", "Example", "ExampleSet", "read_examples"]

#: File names searched for in a folder.
EXPORT_NAMES = (SFT, TRAIN, EVAL)
_ROLES = ("system", "user", "assistant")


@dataclass(frozen=True, slots=True, kw_only=True)
class Message:
    role: str
    content: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Example:
    """One conversation: ``training`` rows end with the assistant's answer; evaluation prompts
    (``training=False``) end with the user turn the model must answer."""

    id: str
    source: str
    line: int
    messages: tuple[Message, ...]
    training: bool

    def as_dicts(self, messages: Iterable[Message] | None = None) -> list[dict[str, str]]:
        return [
            {"role": m.role, "content": m.content} for m in (self.messages if messages is None else messages)
        ]

    @property
    def prompt(self) -> tuple[Message, ...]:
        """The turns the server is sent: everything before a training row's answer."""
        return self.messages[:-1] if self.training else self.messages

    @property
    def answer(self) -> str | None:
        return self.messages[-1].content if self.training else None

    @property
    def where(self) -> str:
        return f"{self.source}:{self.line} ({self.id})"


@dataclass(frozen=True, slots=True, kw_only=True)
class ExampleSet:
    examples: tuple[Example, ...]
    unreadable: tuple[str, ...] = field(default=())
    """``SOURCE, line N: why`` for each line that could not be used."""
    files: tuple[str, ...] = field(default=())


def _files(paths: Iterable[str | Path]) -> Iterator[Path]:
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(p for name in EXPORT_NAMES for p in path.rglob(name))
            if not found:
                raise DataError(f"{path}: no {', '.join(EXPORT_NAMES)} in this folder or below")
            yield from found
        elif path.is_file():
            yield path
        else:
            raise DataError(f"{path}: no such file or folder")


def _messages(value: object) -> tuple[Message, ...]:
    if not isinstance(value, list) or not value:
        raise ValueError("'messages' must be a non-empty list")
    out = []
    for index, item in enumerate(value):
        role = item.get("role") if isinstance(item, Mapping) else None
        content = item.get("content") if isinstance(item, Mapping) else None
        if role not in _ROLES or not isinstance(content, str):
            raise ValueError(f"messages[{index}] needs a role (system, user, assistant) and string content")
        out.append(Message(role=role, content=content))
    return tuple(out)


def read_examples(paths: Iterable[str | Path], *, limit: int | None = None) -> ExampleSet:
    """Every conversation in ``paths``; a line that cannot be used is listed, the rest read."""
    examples: list[Example] = []
    unreadable: list[str] = []
    files: list[str] = []
    for path in _files(paths):
        files.append(str(path))
        for number, record in read_jsonl(path):
            if limit is not None and len(examples) >= limit:
                break
            try:
                if isinstance(record, BadLine):
                    raise ValueError(record.message)  # noqa: TRY004 (a bad line, reported)
                if not isinstance(record, Mapping):
                    raise ValueError("a line must hold a JSON object")  # noqa: TRY004 (a bad line, reported)
                messages = _messages(record.get("messages"))
            except ValueError as exc:
                unreadable.append(f"{path}, line {number}: {exc}")
                continue
            ident = record.get("task_id", record.get("id"))
            sample = record.get("sample")
            name = str(ident) if ident is not None else f"line {number}"
            if isinstance(sample, int) and sample:
                name += f"#{sample}"
            examples.append(
                Example(
                    id=name,
                    source=str(path),
                    line=number,
                    messages=messages,
                    training=messages[-1].role == "assistant",
                )
            )
    return ExampleSet(examples=tuple(examples), unreadable=tuple(unreadable), files=tuple(files))
