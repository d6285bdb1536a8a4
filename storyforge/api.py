"""The package's short Python API: a template ready to render, and answers from a model server.

Takes: a template file or dict and its task kind; lists of chat messages and provider settings.
Gives: :func:`load_template` (a :class:`TaskTemplate`: the compiled template with its task
kind's sources, so ``render(ctx, budget=...)`` needs nothing else) and :func:`generate` (one
:class:`Answer` per prompt and sample, sent by the same runner as ``python run.py`` with a
provider: retries, concurrency, the optional response cache).

Both are thin: the work is :func:`~storyforge.engine.compiler.compile_template`,
:func:`~storyforge.engine.renderer.render`, the task-kind registry (:mod:`storyforge.tasks`)
and :func:`~storyforge.providers.runner.generate_for_job`.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from storyforge.engine import CompiledTemplate, RenderResult, compile_template, render
from storyforge.engine.loader import LoadedTemplate
from storyforge.engine.loader import load_template as _read_template
from storyforge.errors import ConfigError
from storyforge.runfiles import PROMPTS

if TYPE_CHECKING:
    from storyforge.config.provider import ProviderConf
    from storyforge.engine.budget import Estimator
    from storyforge.tasks.base import TaskKind

__all__ = ["Answer", "TaskTemplate", "generate", "load_template"]


@dataclass(frozen=True, slots=True)
class TaskTemplate:
    """A compiled template and its task kind: render it against a context of that kind."""

    compiled: CompiledTemplate
    kind: TaskKind

    def render(
        self, ctx: Mapping[str, Any], *, budget: int | None = None, estimator: Estimator | None = None
    ) -> RenderResult:
        """``messages``, ``warnings`` and ``trace`` of one render (``budget=None``: unlimited)."""
        return render(self.compiled, ctx, self.kind.registry(ctx), budget=budget, estimator=estimator)


def load_template(template: str | Path | Mapping[str, Any], *, task: str | None = None) -> TaskTemplate:
    """Read (a path: JSON or YAML by suffix) or take (a dict) a template and compile it for ``task``.

    ``task``: the task kind whose sources the template reads (``storyforge tasks`` lists them);
    by default the template's own ``task``. Raises :class:`~storyforge.errors.TemplateValidationError`
    listing every problem, or :class:`~storyforge.errors.ConfigError` for an unknown task kind.
    """
    from storyforge.tasks.base import get_task_kind

    document: Mapping[str, Any] | LoadedTemplate = (
        template if isinstance(template, Mapping) else _read_template(template)
    )
    if task is None:
        data = document.data if isinstance(document, LoadedTemplate) else document
        named = data.get("task") if isinstance(data, Mapping) else None
        if not isinstance(named, str):
            raise ConfigError("the template names no task; pass task=... (storyforge tasks lists them)")
        task = named
    try:
        kind = get_task_kind(task)
    except KeyError as exc:
        raise ConfigError(str(exc.args[0])) from None
    compiled = compile_template(
        document, task=kind.name, source_specs=kind.sources, check_args=kind.check_args
    )
    return TaskTemplate(compiled=compiled, kind=kind)


@dataclass(frozen=True, slots=True, kw_only=True)
class Answer:
    """One answer: which prompt (its index in the list) and sample, the text and why it stopped.

    ``error`` is set (and ``output`` is ``None``) when the request still failed after the
    provider's retries; ``usage`` holds ``prompt_tokens`` and ``completion_tokens``.
    """

    prompt: int
    sample: int
    output: str | None
    finish_reason: str | None
    usage: Mapping[str, int | None] | None
    error: str | None


def generate(
    prompts: Sequence[Sequence[Mapping[str, Any]]],
    *,
    provider: ProviderConf | Mapping[str, Any],
    cache: str | Path | None = None,
) -> list[Answer]:
    """Send each list of chat messages to the model server ``provider`` names; one answer per
    prompt and sample (``provider.samples``), in prompt order.

    ``provider``: settings as the ``provider`` config group holds them, e.g. ``{"name":
    "openai", "base_url": "http://localhost:8000/v1", "model": "m"}``, or a checked
    :class:`~storyforge.config.provider.ProviderConf`. ``cache``: a response cache file
    (SQLite) to answer repeated requests from; ``None`` (the default) sends every request.
    Needs the ``generate`` extra. A bad message is a :class:`~storyforge.errors.DataError`
    before anything is sent; a server that refuses every request a
    :class:`~storyforge.errors.ProviderError`.
    """
    from storyforge.atomic import jsonl_line
    from storyforge.config.provider import CacheSettings, GenerationSettings, provider_conf
    from storyforge.extras import require
    from storyforge.providers.journal import read_records

    conf = provider_conf({"provider": provider})
    if conf._target_ is None:
        raise ConfigError(
            f"provider={conf.name} sends no requests; choose provider=openai or provider=ollama"
        )
    require("aiohttp", extra="generate", for_what=f"provider={conf.name}")
    from storyforge.providers.runner import generate_for_job

    settings = GenerationSettings(
        provider=conf,
        cache=CacheSettings(path=None if cache is None else Path(cache).absolute()),
        strict=True,
    )
    with tempfile.TemporaryDirectory(prefix="storyforge-generate-") as tmp:
        work = Path(tmp)
        prompts_path = work / PROMPTS
        with prompts_path.open("wb") as fh:
            for index, messages in enumerate(prompts):
                fh.write(jsonl_line({"id": str(index), "messages": [dict(m) for m in messages]}))
        journal, _stats = generate_for_job(settings, work, prompts_path)
        records = read_records(journal)
    answers = [
        Answer(
            prompt=int(record["id"]),
            sample=int(record["sample"]),
            output=record.get("output"),
            finish_reason=record.get("finish_reason"),
            usage=record.get("usage"),
            error=record.get("error"),
        )
        for record in records
    ]
    return sorted(answers, key=lambda a: (a.prompt, a.sample))
