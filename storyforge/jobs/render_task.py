"""The render job of the StoryForge task kinds: one template, one context, one prompt.

Takes: the composed config (``task`` from ``conf/task/{turn_generation,chapter_summarization,
writing_assistant}.yaml``, ``template``, ``budget``, ``provider``, ``store``) and the run
directory. Gives: the rendered messages printed to stdout, ``messages.json`` (the chat
messages, loadable as they are by TRL and HF ``datasets``) and ``trace.json`` (what every
slot and node did, warnings included) in the run directory, and a summary mapping.

Also gives the pieces ``storyforge render`` shares: :func:`load_context` (a JSON/YAML context
file, or a ``$generate`` file naming a deterministic generator under ``storyforge.tasks.``),
:func:`with_model` (the ``ctx.model`` runner metadata) and :func:`format_messages`.

Why: the StoryForge task kinds produce prompts for interactive apps rather than datasets, so
their job renders one prompt an author can read, diff and replay.
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from storyforge import jsontext
from storyforge.atomic import write_json_atomic
from storyforge.config.provider import model_info
from storyforge.config.settings import RunSettings
from storyforge.config.storyforge_tasks import RenderTaskSettings
from storyforge.errors import ConfigError, DataError, TemplateValidationError
from storyforge.jobs.base import OneUnitJob, Report
from storyforge.tasks.base import TaskKind
from storyforge.template_files import check_template

__all__ = [
    "RenderUnit",
    "conf_dir",
    "format_messages",
    "load_context",
    "model_info",
    "render_unit",
    "run",
    "with_model",
]

log = logging.getLogger(__name__)

_GENERATE = "$generate"
_CONTEXT_SUFFIXES = (".json", ".yaml", ".yml")


def conf_dir() -> Path:
    """The ``conf/`` folder: beside the package in a checkout, ``storyforge/_conf`` in a wheel."""
    here = Path(__file__).resolve().parent.parent
    for candidate in (here.parent / "conf", here / "_conf"):
        if candidate.is_dir():
            return candidate
    raise ConfigError("cannot find the conf/ folder (neither beside the package nor storyforge/_conf)")


def _context_file(name_or_path: str) -> Path:
    path = Path(name_or_path).expanduser()
    if path.suffix.lower() in _CONTEXT_SUFFIXES or path.parent != Path("."):
        if path.is_file():
            return path
        raise ConfigError(f"context file not found: {path}")
    folder = conf_dir() / "context"
    for suffix in _CONTEXT_SUFFIXES:
        candidate = folder / f"{name_or_path}{suffix}"
        if candidate.is_file():
            return candidate
    known = sorted(p.stem for p in folder.glob("*") if p.suffix.lower() in _CONTEXT_SUFFIXES)
    raise ConfigError(
        f"task.context: no context named {name_or_path!r} in {folder}; known: {', '.join(known) or 'none'}"
    )


def load_context(name_or_path: str | Path) -> dict[str, Any]:
    """A render context from a file, or from ``conf/context/<name>.json``.

    A file whose top level is ``{"$generate": "storyforge.tasks.<module>.<function>",
    "args": {...}}`` is produced by calling that generator with ``args`` (only callables
    under ``storyforge.tasks.`` are accepted), so a 200-turn history needs no 200-turn file.
    """
    path = _context_file(str(name_or_path))
    try:
        text = path.read_text(encoding="utf-8")
        # jsontext: a string with an unpaired surrogate (\ud800) is not text and is refused
        data = jsontext.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise DataError(f"context file {path}: cannot be read: {exc}") from None
    if not isinstance(data, dict):
        raise DataError(f"context file {path}: the top level must be a mapping, got {type(data).__name__}")
    if _GENERATE in data:
        return _generate(path, data)
    return data


def _generate(path: Path, data: Mapping[str, Any]) -> dict[str, Any]:
    target = data[_GENERATE]
    args = data.get("args", {})
    if not isinstance(target, str) or not target.startswith("storyforge.tasks."):
        raise DataError(
            f"context file {path}: $generate must name a function under storyforge.tasks., got {target!r}"
        )
    if not isinstance(args, Mapping):
        raise DataError(f"context file {path}: args must be a mapping, got {type(args).__name__}")
    module_name, _, attr = target.rpartition(".")
    try:
        generator = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise DataError(f"context file {path}: $generate {target!r} cannot be imported: {exc}") from None
    try:
        ctx = generator(**args)
    except (TypeError, ValueError) as exc:
        raise DataError(f"context file {path}: {target}(**args) failed: {exc}") from None
    if not isinstance(ctx, dict):
        raise DataError(f"context file {path}: {target} returned {type(ctx).__name__}, not a mapping")
    return ctx


def with_model(ctx: Mapping[str, Any], model: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``ctx`` with ``model`` set (the runner metadata templates branch on)."""
    out = dict(ctx)
    out["model"] = dict(model)
    return out


def format_messages(messages: Sequence[Mapping[str, Any]]) -> str:
    """Messages as text an author reads: a ``=== role ===`` rule, then the content."""
    parts: list[str] = []
    for message in messages:
        label = str(message.get("role"))
        if message.get("prefix"):
            label += " (prefill)"
        parts.append(f"=== {label} ===\n{message.get('content', '')}")
    return "\n".join(parts) + ("\n" if parts else "")


def _template_data(settings: RenderTaskSettings) -> tuple[str, dict[str, Any]]:
    """The template's id and document, checked (a stored one is read, re-hashed and checked)."""
    kind = settings.kind
    if settings.conf.store_template:
        from storyforge.store import TemplateStore  # the store extra (SQLAlchemy)

        with TemplateStore(settings.store_url) as store:
            loaded = store.load(settings.conf.store_template, task=kind.name)
        data = jsontext.loads(loaded.record.raw)
        return loaded.record.id, data
    data = settings.template
    assert data is not None  # read_settings refuses a run with neither
    choice = settings.template_choice
    try:
        check_template(data, task=kind.name)
    except TemplateValidationError as exc:
        raise exc.with_template(
            exc.template_name, f"conf/template/{choice}.yaml" if choice else None
        ) from None
    return str(data.get("id", choice)), data


def run(run_settings: RunSettings, out_dir: Path) -> OneUnitJob[RenderUnit, dict[str, Any]]:
    """The render job: the template and context are read and checked here, on the driver; its
    one unit renders them and writes ``messages.json`` and ``trace.json``; printing and logging
    happen on the driver again."""
    settings = run_settings.task
    assert isinstance(settings, RenderTaskSettings)
    template_id, data = _template_data(settings)
    ctx = with_model(load_context(settings.conf.context), settings.model)
    unit = RenderUnit(
        kind=settings.kind,
        template_id=template_id,
        template=data,
        ctx=ctx,
        max_tokens=settings.max_tokens,
        out_dir=Path(out_dir),
    )

    def done(result: dict[str, Any]) -> dict[str, Any]:
        messages = result.pop("_messages")
        for warning in result.pop("_warnings"):
            log.warning("%s", warning)
        if settings.conf.print_prompt:
            sys.stdout.write(format_messages(messages))
            sys.stdout.flush()
        log.info(
            "rendered %s with %s: %d messages -> %s", unit.kind.name, template_id, len(messages), out_dir
        )
        return result

    return OneUnitJob(name="render", unit=unit, run=render_unit, done=done)


@dataclass(frozen=True, slots=True, kw_only=True)
class RenderUnit:
    """One prompt to render: a checked template document, its context and the budget."""

    kind: TaskKind
    template_id: str
    template: dict[str, Any]
    ctx: dict[str, Any]
    max_tokens: int | None
    out_dir: Path


def render_unit(unit: RenderUnit, report: Report | None) -> dict[str, Any]:
    """Render ``unit`` and write its ``messages.json`` and ``trace.json``; returns the summary
    (with the messages and warnings for the driver under ``_messages`` and ``_warnings``)."""
    from storyforge import render

    kind, ctx = unit.kind, unit.ctx
    compiled = check_template(unit.template, task=kind.name).compiled
    result = render(compiled, ctx, kind.registry(ctx), budget=unit.max_tokens)
    messages = [dict(m) for m in result.messages]
    warnings = list(result.warnings)
    unit.out_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(unit.out_dir / "messages.json", messages)
    trace = {
        "task": kind.name,
        "template": unit.template_id,
        "budget": unit.max_tokens,
        "model": ctx["model"],
        "warnings": warnings,
        "trace": result.trace.to_dict(),
    }
    write_json_atomic(unit.out_dir / "trace.json", trace)
    return {
        "task": kind.name,
        "template": unit.template_id,
        "messages": len(messages),
        "characters": sum(len(str(m.get("content", ""))) for m in messages),
        "warnings": len(warnings),
        "_messages": messages,
        "_warnings": warnings,
    }
