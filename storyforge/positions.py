"""Where an authoring issue sits in template text: file line and column.

Takes: template text (YAML or JSON), an :class:`~storyforge.errors.Issue` and the loader's
``locate`` function. Gives: :func:`compose` (the PyYAML node tree of the text, or ``None``),
:func:`issue_position` (the 1-based file line/column of the issue) and :func:`file_position`
(that of an issue the loader reports, already counted in the file).

Why: the engine reports positions inside the string at a template path (``line 1, column 24``
of a ``content`` value); an editor needs them in the file. Shared by ``storyforge lint`` and the
template studio.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from storyforge.errors import Issue, TemplatePath

__all__ = ["compose", "file_position", "issue_position"]


def compose(text: str) -> Any:
    """The YAML node tree of ``text`` (JSON is YAML too), or ``None`` when it does not parse."""
    import yaml

    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None


def _node_at(root: Any, path: TemplatePath) -> Any:
    import yaml

    node = root
    for part in path:
        if isinstance(node, yaml.MappingNode) and isinstance(part, str):
            node = next((v for k, v in node.value if getattr(k, "value", None) == part), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            node = node.value[part]
        else:
            return None
        if node is None:
            return None
    return node


def _string_position(text: str, node: Any, line: int, column: int) -> tuple[int, int] | None:
    """File line/column of a position inside a scalar, when it can be known exactly."""
    import yaml

    if not isinstance(node, yaml.ScalarNode):
        return None
    lines = text.splitlines()
    if node.style == "|":
        first = node.start_mark.line + 1  # 0-based: the indicator line, then the content
        file_line = first + line - 1
        if file_line >= len(lines):
            return None
        head = lines[first]  # the block's indentation is its first content line's
        return file_line + 1, len(head) - len(head.lstrip(" ")) + column
    if node.start_mark.line != node.end_mark.line or line != 1:
        return None
    quote = 1 if node.style in ('"', "'") else 0
    start = node.start_mark.index + quote
    if text[start : start + len(node.value)] != node.value:
        return None  # escapes change the columns; fall back to the key's position
    return node.start_mark.line + 1, node.start_mark.column + quote + column


def issue_position(
    issue: Issue, text: str, root: Any, locate: Callable[[TemplatePath], tuple[int, int] | None]
) -> tuple[int, int] | None:
    """Where an authoring issue sits in the file: exactly inside a string when known, else its key.

    ``root`` is :func:`compose` of ``text``; ``locate`` maps a template path to the line and
    column of its key (:meth:`storyforge.engine.loader.LoadedTemplate.locate`).
    """
    if issue.line is not None and issue.column is not None and root is not None:
        exact = _string_position(text, _node_at(root, issue.path), issue.line, issue.column)
        if exact is not None:
            return exact
    return locate(issue.path)


def file_position(issue: Issue) -> tuple[int, int] | None:
    """The line and column of an issue the loader reports (syntax, duplicate keys), whose
    position already counts in the file; a missing column is the line's first."""
    return (issue.line, issue.column or 1) if issue.line is not None else None
