"""Template files and text -> data plus the position of every key.

Takes: a ``.json`` / ``.yaml`` / ``.yml`` file, or template text. Gives: :class:`LoadedTemplate`
(the plain data, where it came from, and the 1-based line/column of every mapping key and list
item), which :func:`storyforge.engine.compiler.compile_template` accepts in place of a dict so each
issue can name ``file:line``.

Why: a mapping cannot hold duplicate keys, so the duplicate-slot check of the reference can
only work where text is read. This loader rejects duplicate keys at any depth (both PyYAML and
the ``json`` module silently keep the last one) and reports syntax errors with their position.
"""

from __future__ import annotations

import bisect
import json
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

import yaml

from storyforge.engine.errors import Issue, TemplatePath, TemplateValidationError

__all__ = ["MAX_ALIAS_NODES", "LoadedTemplate", "load_template", "load_template_text", "read_template_text"]

_MAX_NODES = 1_000_000
_MAX_NESTING = 200

MAX_ALIAS_NODES = 10_000
"""Most nodes YAML aliases may add to a document (each use of an alias repeats its anchor's
nodes): a few reused blocks stay far below it, an alias bomb (anchors that alias anchors,
doubling at every level) is refused before anything is expanded."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadedTemplate:
    """A template read from text: ``data``, its ``source`` (file path or ``<text>``) and positions."""

    data: Any
    source: str
    positions: Mapping[TemplatePath, tuple[int, int]] = field(
        default_factory=lambda: MappingProxyType({}), repr=False
    )

    def locate(self, path: TemplatePath) -> tuple[int, int] | None:
        """Line and column of ``path``, or of its nearest ancestor that has one."""
        probe = TemplatePath(path)
        while True:
            pos = self.positions.get(probe)
            if pos is not None:
                return pos
            if not probe:
                return None
            probe = TemplatePath(probe[:-1])

    def where(self, path: TemplatePath) -> str:
        """``file:line`` for ``path`` (just the file when nothing closer is known)."""
        pos = self.locate(path)
        return f"{self.source}:{pos[0]}" if pos else self.source


def _file_problem(
    source: str, message: str, line: int | None = None, column: int | None = None
) -> TemplateValidationError:
    issue = Issue(code="file", path=TemplatePath(), message=message, line=line, column=column)
    return TemplateValidationError([issue], source=source)


def read_template_text(path: str | Path) -> str:
    """The text of a template file.

    Raises :class:`TemplateValidationError` (one issue, code ``file``) when the path is not a
    regular file (a FIFO, device or folder is refused before it is opened, so nothing waits
    on it) or when its bytes are not UTF-8 (naming the line and column of the first bad
    byte). A missing or unreadable file raises :class:`OSError` as usual.
    """
    file = Path(path)
    mode = file.stat().st_mode
    if not stat.S_ISREG(mode):
        kind = "a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "not a regular file"
        raise _file_problem(str(path), f"the template path is {kind}; expected a .yaml or .json file")
    data = file.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise _file_problem(
            str(path),
            f"the file is not UTF-8 text: byte 0x{data[exc.start]:02x} cannot start or continue a "
            "UTF-8 character; save it as UTF-8",
            line,
            column,
        ) from None


def load_template(path: str | Path) -> LoadedTemplate:
    """Read a template file; the format follows the suffix (``.json``, else YAML)."""
    file = Path(path)
    text = read_template_text(file)
    fmt: Literal["json", "yaml"] = "json" if file.suffix.lower() == ".json" else "yaml"
    return load_template_text(text, format=fmt, source=str(path))


def load_template_text(
    text: str, *, format: Literal["json", "yaml"] | None = None, source: str = "<text>"
) -> LoadedTemplate:
    """Parse template text. ``format=None`` picks JSON when the text starts with ``{``.

    Raises :class:`TemplateValidationError` for syntax errors and duplicate keys (every
    duplicate in the document, each with its line and the line of the first definition).
    """
    if format is None:
        format = "json" if text.lstrip().startswith("{") else "yaml"
    issues: list[Issue] = []
    positions: dict[TemplatePath, tuple[int, int]] = {}
    data = (
        _JsonReader(text, positions, issues).document()
        if format == "json"
        else _load_yaml(text, positions, issues)
    )
    if issues:
        raise TemplateValidationError(issues, source=source)
    return LoadedTemplate(data=data, source=source, positions=MappingProxyType(positions))


# -- YAML --------------------------------------------------------------------------------------


def _load_yaml(text: str, positions: dict[TemplatePath, tuple[int, int]], issues: list[Issue]) -> Any:
    try:
        loader = yaml.SafeLoader(text)
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow, found before parsing
        start = text.rfind("\n", 0, exc.position) + 1
        issues.append(
            Issue(
                code="syntax",
                path=TemplatePath(),
                message=f"YAML syntax error: the character U+{exc.character:04X} is not allowed in YAML",
                line=text.count("\n", 0, exc.position) + 1,
                column=exc.position - start + 1,
            )
        )
        return None
    try:
        try:
            node = loader.get_single_node()
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            issues.append(
                Issue(
                    code="syntax",
                    path=TemplatePath(),
                    message=f"YAML syntax error: {exc.problem or exc}",
                    line=mark.line + 1 if mark else None,
                    column=mark.column + 1 if mark else None,
                )
            )
            return None
        except yaml.YAMLError as exc:
            issues.append(Issue(code="syntax", path=TemplatePath(), message=f"YAML syntax error: {exc}"))
            return None
        except RecursionError:
            issues.append(
                Issue(code="too_deep", path=TemplatePath(), message="the document is nested too deeply")
            )
            return None
        if node is None:
            return None
        added = _alias_nodes(node)
        if added > MAX_ALIAS_NODES:
            issues.append(
                Issue(
                    code="too_large",
                    path=TemplatePath(),
                    message=(
                        f"YAML aliases would add more than MAX_ALIAS_NODES={MAX_ALIAS_NODES:,} nodes "
                        "to the document (an alias that repeats aliases); write the repeated parts out"
                    ),
                )
            )
            return None
        if not _walk_yaml(loader, node, TemplatePath(), positions, issues):
            return None
        try:
            return loader.construct_document(node)
        except yaml.YAMLError as exc:
            issues.append(Issue(code="syntax", path=TemplatePath(), message=f"YAML error: {exc}"))
            return None
    finally:
        loader.dispose()


def _alias_nodes(root: yaml.Node) -> int:
    """How many nodes aliases add when the document is expanded (its expanded size less its
    distinct nodes), counted over the composed graph without expanding anything; a cycle
    counts once (the walk reports it)."""
    size: dict[int, int] = {}
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            total = 1
            for child in _children(node):
                total += size.get(id(child), 0)
            size[key] = min(total, 1 << 62)
            continue
        if key in size:
            continue
        size[key] = 0  # on the way: a cycle back here counts nothing
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node) if id(child) not in size)
    return size[id(root)] - len(size)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _walk_yaml(
    loader: yaml.SafeLoader,
    root: yaml.Node,
    root_path: TemplatePath,
    positions: dict[TemplatePath, tuple[int, int]],
    issues: list[Issue],
) -> bool:
    """Record key positions and report duplicate keys; False when the document is unusable."""
    stack: list[tuple[yaml.Node, TemplatePath, frozenset[int]]] = [(root, root_path, frozenset())]
    count = 0
    while stack:
        node, path, ancestors = stack.pop()
        count += 1
        if count > _MAX_NODES:
            issues.append(Issue(code="too_large", path=TemplatePath(), message="the document is too large"))
            return False
        if id(node) in ancestors:
            issues.append(Issue(code="schema", path=path, message="a YAML alias refers to itself (cycle)"))
            return False
        if len(path) > _MAX_NESTING:
            issues.append(Issue(code="too_deep", path=path, message="the document is nested too deeply"))
            return False
        inner = ancestors | {id(node)}
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, value_node in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    stack.append((value_node, path, inner))
                    continue
                try:
                    key = loader.construct_object(key_node, deep=True)
                    hash(key)
                except Exception:  # noqa: BLE001, S112 - an unhashable key; construction reports it
                    continue
                line = key_node.start_mark.line + 1
                if key in seen:
                    issues.append(
                        Issue(
                            code="duplicate_key",
                            path=path / key if isinstance(key, str | int) else path,
                            message=f"duplicate key {key!r} (first defined on line {seen[key]})",
                            line=line,
                            column=key_node.start_mark.column + 1,
                        )
                    )
                    continue
                seen[key] = line
                child = path / key if isinstance(key, str | int) else path
                positions.setdefault(child, (line, key_node.start_mark.column + 1))
                stack.append((value_node, child, inner))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                positions.setdefault(path / i, (item.start_mark.line + 1, item.start_mark.column + 1))
                stack.append((item, path / i, inner))
    return True


# -- JSON --------------------------------------------------------------------------------------

_WS = re.compile(r"[ \t\n\r]*")
_NUMBER = re.compile(r"(-?(?:0|[1-9]\d*))(\.\d+)?([eE][-+]?\d+)?")
_CONSTANTS = {
    "true": True,
    "false": False,
    "null": None,
    "NaN": float("nan"),
    "Infinity": float("inf"),
    "-Infinity": float("-inf"),
}


class _SyntaxProblem(Exception):
    def __init__(self, message: str, pos: int) -> None:
        super().__init__(message)
        self.pos = pos


class _JsonReader:
    """A small JSON reader that keeps positions and refuses duplicate keys."""

    def __init__(
        self, text: str, positions: dict[TemplatePath, tuple[int, int]], issues: list[Issue]
    ) -> None:
        self.text = text
        self.positions = positions
        self.issues = issues
        self.line_starts = [0] + [m.end() for m in re.finditer(r"\n", text)]

    def where(self, pos: int) -> tuple[int, int]:
        line = bisect.bisect_right(self.line_starts, pos)
        return line, pos - self.line_starts[line - 1] + 1

    def document(self) -> Any:
        try:
            value, end = self.value(_WS.match(self.text, 0).end(), TemplatePath())  # type: ignore[union-attr]
            end = _WS.match(self.text, end).end()  # type: ignore[union-attr]
            if end != len(self.text):
                raise _SyntaxProblem("extra data after the JSON document", end)
            return value
        except _SyntaxProblem as exc:
            line, column = self.where(exc.pos)
            self.issues.append(
                Issue(
                    code="syntax",
                    path=TemplatePath(),
                    message=f"JSON syntax error: {exc}",
                    line=line,
                    column=column,
                )
            )
            return None

    def value(self, pos: int, path: TemplatePath) -> tuple[Any, int]:
        if len(path) > _MAX_NESTING:
            raise _SyntaxProblem("the document is nested too deeply", pos)
        text = self.text
        if pos >= len(text):
            raise _SyntaxProblem("expected a value, found the end of the text", pos)
        ch = text[pos]
        if ch == "{":
            return self.obj(pos + 1, path)
        if ch == "[":
            return self.arr(pos + 1, path)
        if ch == '"':
            return self.string(pos + 1)
        m = _NUMBER.match(text, pos)
        if m and m.end() > pos:
            integer, frac, exp = m.groups()
            if frac or exp:
                return float(integer + (frac or "") + (exp or "")), m.end()
            return int(integer), m.end()
        for word, val in _CONSTANTS.items():
            if text.startswith(word, pos):
                return val, pos + len(word)
        raise _SyntaxProblem(f"expected a value, found {text[pos]!r}", pos)

    def string(self, pos: int) -> tuple[str, int]:
        try:
            return json.decoder.scanstring(self.text, pos, True)  # type: ignore[attr-defined,no-any-return]
        except json.JSONDecodeError as exc:
            raise _SyntaxProblem(exc.msg, exc.pos) from None

    def obj(self, pos: int, path: TemplatePath) -> tuple[dict[str, Any], int]:
        text = self.text
        out: dict[str, Any] = {}
        seen: dict[str, int] = {}
        pos = _WS.match(text, pos).end()  # type: ignore[union-attr]
        if text.startswith("}", pos):
            return out, pos + 1
        while True:
            if not text.startswith('"', pos):
                raise _SyntaxProblem("expected a key in double quotes", pos)
            key_pos = pos
            key, pos = self.string(pos + 1)
            pos = _WS.match(text, pos).end()  # type: ignore[union-attr]
            if not text.startswith(":", pos):
                raise _SyntaxProblem("expected ':' after the key", pos)
            pos = _WS.match(text, pos + 1).end()  # type: ignore[union-attr]
            line, column = self.where(key_pos)
            value, pos = self.value(pos, path / key)
            if key in seen:
                self.issues.append(
                    Issue(
                        code="duplicate_key",
                        path=path / key,
                        message=f"duplicate key {key!r} (first defined on line {seen[key]})",
                        line=line,
                        column=column,
                    )
                )
            else:
                seen[key] = line
                out[key] = value
                self.positions[path / key] = (line, column)
            pos = _WS.match(text, pos).end()  # type: ignore[union-attr]
            if text.startswith(",", pos):
                pos = _WS.match(text, pos + 1).end()  # type: ignore[union-attr]
                continue
            if text.startswith("}", pos):
                return out, pos + 1
            raise _SyntaxProblem("expected ',' or '}' in a mapping", pos)

    def arr(self, pos: int, path: TemplatePath) -> tuple[list[Any], int]:
        text = self.text
        out: list[Any] = []
        pos = _WS.match(text, pos).end()  # type: ignore[union-attr]
        if text.startswith("]", pos):
            return out, pos + 1
        while True:
            self.positions[path / len(out)] = self.where(pos)
            value, pos = self.value(pos, path / len(out))
            out.append(value)
            pos = _WS.match(text, pos).end()  # type: ignore[union-attr]
            if text.startswith(",", pos):
                pos = _WS.match(text, pos + 1).end()  # type: ignore[union-attr]
                continue
            if text.startswith("]", pos):
                return out, pos + 1
            raise _SyntaxProblem("expected ',' or ']' in a list", pos)
