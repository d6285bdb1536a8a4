"""Errors and authoring issues of the template engine.

Takes: nothing. Gives: the exception tree, :class:`Issue` (one authoring problem with its
place), :class:`TemplatePath` (where inside a template document a problem sits), and
:func:`did_you_mean` / :func:`closest`, the one "Did you mean ...?" hint every message uses.

Exception tree::

    StoryforgeError
     ├── TemplateValidationError   authoring problems; ``.issues`` lists every one found
     ├── RenderError               unexpected failure while rendering a compiled template
     │    └── RenderLimitError     a safety limit (output size, items visited, nesting) was hit;
     │                             ``.limit`` names it, ``.path`` the template node
     └── ConfigError               a setting breaks a rule (names the key or file)

The errors of the rest of storyforge (data, store, providers) derive from
:class:`StoryforgeError` in :mod:`storyforge.engine.errors`.

Authoring errors are collected, not raised one at a time: each pass (schema, lint, parse,
structure) appends :class:`Issue` values and the compiler raises one
:class:`TemplateValidationError` with all of them, sorted by path.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Self

__all__ = [
    "ConfigError",
    "Issue",
    "RenderError",
    "RenderLimitError",
    "StoryforgeError",
    "TemplatePath",
    "TemplateValidationError",
    "at_path",
    "closest",
    "did_you_mean",
]

_IDENT = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*\Z")


class TemplatePath(tuple[str | int, ...]):
    """A location inside a template document: a tuple of mapping keys and list indices.

    ``str()`` gives ``slots.history.plan[2].content``: integers in brackets, identifier
    keys dotted, other keys quoted (``slots["my slot"].plan[0]``).
    """

    __slots__ = ()

    def __new__(cls, parts: Iterable[str | int] = ()) -> Self:
        return super().__new__(cls, tuple(parts))

    def __truediv__(self, part: str | int) -> TemplatePath:
        return tuple.__new__(TemplatePath, self + (part,))

    def child(self, *parts: str | int) -> TemplatePath:
        return TemplatePath((*self, *parts))

    def __str__(self) -> str:
        out: list[str] = []
        for part in self:
            if isinstance(part, int):
                out.append(f"[{part}]")
            elif _IDENT.match(part):
                out.append(f".{part}" if out else part)
            else:
                escaped = part.replace("\\", "\\\\").replace('"', '\\"')
                out.append(f'["{escaped}"]')
        return "".join(out) or "<template>"

    def __repr__(self) -> str:
        return f"TemplatePath({str(self)!r})"

    @classmethod
    def parse(cls, text: str) -> TemplatePath:
        """Inverse of ``str()`` for dotted/bracketed paths (used by tests and the CLI)."""
        parts: list[str | int] = []
        for m in re.finditer(r'\[(\d+)\]|\["((?:[^"\\]|\\.)*)"\]|([^.\[\]]+)', text):
            if m.group(1) is not None:
                parts.append(int(m.group(1)))
            elif m.group(2) is not None:
                parts.append(m.group(2).replace('\\"', '"').replace("\\\\", "\\"))
            else:
                parts.append(m.group(3))
        return cls(parts)


@dataclass(frozen=True, slots=True, kw_only=True)
class Issue:
    """One authoring problem.

    ``code`` is a stable machine name (``schema``, ``unknown_source``, ``syntax``,
    ``task_mismatch``, ``missing_slot``, ``prefix_role``, ...); ``message`` is the sentence
    shown to the author; ``line``/``column`` are 1-based positions *inside the string* at
    ``path`` when the problem is inside a leaf or condition string; ``context`` is an
    optional excerpt with a caret line.
    """

    code: str
    path: TemplatePath
    message: str
    line: int | None = None
    column: int | None = None
    context: str | None = field(default=None, compare=False)

    def __str__(self) -> str:
        where = str(self.path)
        if self.line is not None:
            where += f", line {self.line}, column {self.column}"
        text = f"{where}: {self.message}"
        if self.context:
            text += "\n" + "\n".join(f"    | {ln}" for ln in self.context.splitlines())
        return text


class StoryforgeError(Exception):
    """Base of every error storyforge raises on purpose."""


class TemplateValidationError(StoryforgeError):
    """A template failed validation; ``.issues`` lists every problem found, sorted by path."""

    def __init__(
        self,
        issues: Sequence[Issue],
        *,
        template_name: str | None = None,
        source: str | None = None,
    ) -> None:
        self.issues: tuple[Issue, ...] = tuple(
            sorted(issues, key=lambda i: (_path_sort_key(i.path), i.line or 0, i.column or 0))
        )
        self.template_name = template_name
        self.source = source
        super().__init__(self._format())

    def _format(self) -> str:
        n = len(self.issues)
        head = f"{n} problem{'s' if n != 1 else ''}"
        if self.template_name:
            head += f" in template {self.template_name!r}"
        if self.source:
            head += f" ({self.source})"
        return head + "".join("\n  " + str(i).replace("\n", "\n  ") for i in self.issues)

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (_rebuild_validation_error, (self.issues, self.template_name, self.source))

    def with_template(self, name: str | None, source: str | None = None) -> TemplateValidationError:
        """The same issues, labelled with the template's name and where it came from."""
        return TemplateValidationError(self.issues, template_name=name, source=source)


def _rebuild_validation_error(
    issues: tuple[Issue, ...], name: str | None, source: str | None
) -> TemplateValidationError:
    return TemplateValidationError(issues, template_name=name, source=source)


def _path_sort_key(path: TemplatePath) -> tuple[tuple[int, str | int], ...]:
    return tuple((0, p) if isinstance(p, int) else (1, p) for p in path)


class RenderError(StoryforgeError):
    """Unexpected failure while rendering a compiled template."""


class RenderLimitError(RenderError):
    """A safety limit was hit (output size, items visited, nesting).

    ``limit`` names the limit (``MAX_RENDER_CHARS``, ``MAX_OUTPUT_CHARS``,
    ``MAX_RENDER_ITEMS``, ...) and ``path`` is the template node being rendered when it was
    hit (``None`` when no node was known yet); ``str()`` reads
    ``slots.history.plan[0].map[0]: ... above MAX_RENDER_ITEMS=250,000 ...``.
    """

    def __init__(self, message: str, *, limit: str = "", path: TemplatePath | None = None) -> None:
        self.detail = message
        self.limit = limit
        self.path = path
        super().__init__(f"{path}: {message}" if path is not None else message)

    def at(self, path: TemplatePath) -> RenderLimitError:
        """This error, placed at ``path`` unless a node deeper down already placed it."""
        if self.path is not None:
            return self
        return RenderLimitError(self.detail, limit=self.limit, path=path)

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (_rebuild_limit_error, (self.detail, self.limit, self.path))


def _rebuild_limit_error(detail: str, limit: str, path: TemplatePath | None) -> RenderLimitError:
    return RenderLimitError(detail, limit=limit, path=path)


class ConfigError(StoryforgeError):
    """A composed config breaks a rule; the message names the key."""


@contextmanager
def at_path(issues: list[Issue], prefix: TemplatePath) -> Iterator[list[Issue]]:
    """Collect issues raised in a nested pass and re-root their paths under ``prefix``.

    Usage::

        with at_path(all_issues, TemplatePath(("slots", name))) as sub:
            sub.extend(check_slot(slot))   # paths relative to the slot
    """
    sub: list[Issue] = []
    try:
        yield sub
    finally:
        for issue in sub:
            issues.append(
                Issue(
                    code=issue.code,
                    path=TemplatePath((*prefix, *issue.path)),
                    message=issue.message,
                    line=issue.line,
                    column=issue.column,
                    context=issue.context,
                )
            )


def closest(word: str, options: Iterable[str], *, cutoff: float = 0.6) -> str | None:
    """The option nearest to ``word`` (a :mod:`difflib` ratio of at least ``cutoff``), or None."""
    close = difflib.get_close_matches(word, list(options), n=1, cutoff=cutoff)
    return close[0] if close else None


def did_you_mean(
    word: str, options: Iterable[str], *, cutoff: float = 0.6, show: Callable[[str], str] = repr
) -> str:
    """`` Did you mean 'nearest'?`` (with its leading space) for the option nearest to ``word``,
    or ``""`` when none is near; ``show`` writes the option (quoted by default)."""
    near = closest(word, options, cutoff=cutoff)
    return "" if near is None else f" Did you mean {show(near)}?"
