"""Template files and the validation gate, without a database.

Takes: template files (JSON or YAML, read by :mod:`storyforge.engine.loader`) and documents.
Gives: :func:`check_template` (the gate the template store, the ``storyforge`` command and the
render jobs share: schema, task binding, sources, argument values, the store's column rules),
:func:`read_template_file`, :func:`template_files`, :func:`dump_template`, and the store's
default address (:func:`default_url`). The store itself (:mod:`storyforge.store`) needs
SQLAlchemy, the ``store`` extra; nothing here does.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from storyforge.engine.loader import LoadedTemplate, load_template
from storyforge.errors import Issue, StoreError, TemplatePath, TemplateValidationError
from storyforge.ids import id_problem, normal_id
from storyforge.tasks.base import TaskKind, get_task_kind

if TYPE_CHECKING:
    from storyforge.engine.compiler import CompiledTemplate

__all__ = [
    "DEFAULT_URL",
    "MAX_LENGTHS",
    "TEMPLATE_SUFFIXES",
    "CheckedTemplate",
    "check_template",
    "default_url",
    "dump_template",
    "read_template_file",
    "template_files",
    "with_normal_id",
]

DEFAULT_URL = "sqlite:///storyforge.db"
TEMPLATE_SUFFIXES = (".json", ".yaml", ".yml")
"""File name endings read as template files when a folder is given."""

#: Longest value each indexed column holds; longer ones are refused by :func:`check_template`
#: with the template path, on every database (SQLite would keep them, PostgreSQL would not).
MAX_LENGTHS = {"id": 200, "name": 500, "task": 100}


def default_url() -> str:
    """``$STORYFORGE_STORE`` when set, else :data:`DEFAULT_URL`."""
    return os.environ.get("STORYFORGE_STORE") or DEFAULT_URL


# --- validation gate ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckedTemplate:
    """A template that passed every check: its plain data, the compiled form and its task kind."""

    data: Mapping[str, Any]
    compiled: CompiledTemplate
    kind: TaskKind | None


def check_template(
    template: Mapping[str, Any] | LoadedTemplate,
    *,
    task: str | None = None,
    require_known_task: bool = True,
) -> CheckedTemplate:
    """Validate and compile ``template`` against its task kind; raise every problem at once.

    The task kind is ``task`` when given (the template must then declare exactly that
    task), else the one the template declares. With a known kind, sources are linted
    against its allowed sources and argument values against ``TaskKind.check_args``. An
    unknown kind is a problem when ``task`` is given or ``require_known_task`` is true;
    otherwise the template is checked without source lint.
    """
    from storyforge import compile_template  # the engine loads lazily: the CLI starts fast

    data: Any = template.data if isinstance(template, LoadedTemplate) else template
    issues: list[Issue] = []
    kind: TaskKind | None = None
    name = task if task is not None else data.get("task") if isinstance(data, Mapping) else None
    if isinstance(name, str):
        try:
            kind = get_task_kind(name)
        except KeyError as exc:
            if task is not None or require_known_task:
                issues.append(Issue(code="unknown_task", path=TemplatePath(("task",)), message=exc.args[0]))
    compiled: CompiledTemplate | None = None
    try:
        compiled = compile_template(
            template,
            task=task if task is not None else (kind.name if kind else None),
            allowed_sources=kind.allowed_sources if kind else None,
            source_specs=kind.sources if kind else None,
            check_args=kind.check_args if kind else None,
        )
    except TemplateValidationError as exc:
        issues.extend(exc.issues)
    issues.extend(_length_issues(data))
    issues.extend(_column_text_issues(data))
    if issues or compiled is None:
        source = template.source if isinstance(template, LoadedTemplate) else None
        label = data.get("id") or data.get("name") if isinstance(data, Mapping) else None
        raise TemplateValidationError(
            issues, template_name=label if isinstance(label, str) else None, source=source
        )
    return CheckedTemplate(data=data, compiled=compiled, kind=kind)


def _length_issues(data: Any) -> list[Issue]:
    if not isinstance(data, Mapping):
        return []
    return [
        Issue(
            code="too_long",
            path=TemplatePath((key,)),
            message=f"{key} has {len(value)} characters; the template store keeps at most {limit}",
        )
        for key, limit in MAX_LENGTHS.items()
        if isinstance(value := data.get(key), str) and len(value) > limit
    ]


def _column_text_issues(data: Any) -> list[Issue]:
    """The id rule (:func:`storyforge.ids.id_problem`, on the NFC form) and no NUL in name or task.

    PostgreSQL refuses NUL in text where SQLite keeps it; refusing it here gives both the same rule.
    """
    if not isinstance(data, Mapping):
        return []
    issues: list[Issue] = []
    if isinstance(value := data.get("id"), str) and (problem := id_problem(normal_id(value))):
        issues.append(Issue(code="unsafe_id", path=TemplatePath(("id",)), message=problem))
    for key in ("name", "task"):
        if isinstance(value := data.get(key), str) and "\x00" in value:
            issues.append(
                Issue(code="nul", path=TemplatePath((key,)), message=f"{key} holds a NUL character")
            )
    return issues


def with_normal_id(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """``data`` with its id in NFC: one template however the id's accents were typed."""
    template_id = data.get("id")
    if isinstance(template_id, str) and normal_id(template_id) != template_id:
        return {key: normal_id(template_id) if key == "id" else value for key, value in data.items()}
    return data


def template_files(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.suffix.lower() in TEMPLATE_SUFFIXES and p.is_file())
    if not path.exists():
        raise StoreError(f"no such file or folder: {path}")
    return [path]


def read_template_file(path: str | Path) -> LoadedTemplate:
    """Read a template file; a top-level Hydra ``defaults`` list in YAML is dropped."""
    loaded = load_template(path)
    data = loaded.data
    if isinstance(data, dict) and "defaults" in data and "layout" in data:
        data = {k: v for k, v in data.items() if k != "defaults"}
        return LoadedTemplate(data=data, source=loaded.source, positions=loaded.positions)
    return loaded


class _BlockDumper(yaml.SafeDumper):
    """YAML that reads like ``conf/template``: indented lists, multi-line strings as ``|`` blocks."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _represent_str)


def dump_template(data: Any, fmt: str) -> str:
    """A template as StoryForge JSON (``fmt="json"``) or as ``conf/template`` YAML."""
    if fmt == "yaml":
        return yaml.dump(data, Dumper=_BlockDumper, sort_keys=False, allow_unicode=True, width=100)
    return json.dumps(data, ensure_ascii=False, indent=2) + "\n"
