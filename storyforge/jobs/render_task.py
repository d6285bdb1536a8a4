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
import json
import logging
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from storyforge.atomic import write_json_atomic
from storyforge.config.provider import model_info
from storyforge.config.settings import RunSettings
from storyforge.config.storyforge_tasks import RenderTaskSettings
from storyforge.errors import ConfigError, DataError, TemplateValidationError
from storyforge.store import TemplateStore, check_template

__all__ = ["conf_dir", "format_messages", "load_context", "model_info", "run", "with_model"]

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
        data = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
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


def _compile(settings: RenderTaskSettings) -> tuple[str, Any]:
    kind = settings.kind
    if settings.conf.store_template:
        with TemplateStore(settings.store_url) as store:
            loaded = store.load(settings.conf.store_template, task=kind.name)
        return loaded.record.id, loaded.compiled
    data = settings.template
    assert data is not None  # read_settings refuses a run with neither
    choice = settings.template_choice
    try:
        checked = check_template(data, task=kind.name)
    except TemplateValidationError as exc:
        raise exc.with_template(
            exc.template_name, f"conf/template/{choice}.yaml" if choice else None
        ) from None
    return str(data.get("id", choice)), checked.compiled


def run(run_settings: RunSettings, out_dir: Path) -> dict[str, Any]:
    """Render the configured template with the configured context; print and save it."""
    from storyforge import render

    settings = run_settings.task
    assert isinstance(settings, RenderTaskSettings)
    kind, max_tokens = settings.kind, settings.max_tokens
    template_id, compiled = _compile(settings)
    ctx = with_model(load_context(settings.conf.context), settings.model)
    result = render(compiled, ctx, kind.registry(ctx), budget=max_tokens)
    messages = [dict(m) for m in result.messages]
    warnings = list(result.warnings)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out_dir / "messages.json", messages)
    trace = {
        "task": kind.name,
        "template": template_id,
        "budget": max_tokens,
        "model": ctx["model"],
        "warnings": warnings,
        "trace": result.trace.to_dict(),
    }
    write_json_atomic(out_dir / "trace.json", trace)
    for warning in warnings:
        log.warning("%s", warning)
    if settings.conf.print_prompt:
        sys.stdout.write(format_messages(messages))
        sys.stdout.flush()
    log.info("rendered %s with %s: %d messages -> %s", kind.name, template_id, len(messages), out_dir)
    return {
        "task": kind.name,
        "template": template_id,
        "messages": len(messages),
        "characters": sum(len(str(m.get("content", ""))) for m in messages),
        "warnings": len(warnings),
    }
