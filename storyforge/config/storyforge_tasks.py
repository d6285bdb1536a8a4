"""Structured config schema for the StoryForge task kinds' render job.

Takes: nothing. Gives: :class:`StoryforgeTaskConf`, the schema behind
``conf/task/{turn_generation,chapter_summarization,writing_assistant}.yaml``, stored as
``task/base_storyforge_task``, and :func:`register`.

Why: the three StoryForge task kinds share one job (:mod:`storyforge.jobs.render_task`): pick
a template (the composed ``template`` group, or a stored one by id), load a sample context,
render it under the ``budget`` group's ceiling, print and save it. A typo in one of these keys
must fail at start-up, naming the key.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from storyforge.config.common import Sealed, validate_node
from storyforge.config.provider import model_info
from storyforge.errors import ConfigError
from storyforge.tasks.base import TaskKind, get_task_kind

__all__ = ["RenderTaskSettings", "StoryforgeTaskConf", "check", "register"]


@dataclass
class StoryforgeTaskConf(Sealed):
    """``task:`` for ``turn_generation``, ``chapter_summarization`` and ``writing_assistant``."""

    kind: str = MISSING
    job: str = "storyforge.jobs.render_task.run"
    # A name in conf/context/ (``turn_generation`` -> conf/context/turn_generation.json) or a path.
    context: str = MISSING
    # Render this template from the store (``store.url``) instead of the composed ``template``.
    store_template: str | None = None
    # Print the rendered messages to stdout (they are always written to messages.json).
    print_prompt: bool = True
    # How {{path}} typed inside a string of the context renders: "paths" expands it to a
    # string, number or boolean (a mapping or list renders empty with a warning), "off"
    # inserts such strings as they are. null: the task kind's own setting.
    data_expansion: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RenderTaskSettings:
    """Everything the render job reads from the config, checked."""

    conf: StoryforgeTaskConf
    kind: TaskKind
    max_tokens: int | None
    template: dict[str, Any] | None
    """The composed ``template`` group as plain data (unresolved), or None with ``store_template``."""
    template_choice: str | None
    """The ``template=`` option it came from (``conf/template/<choice>.yaml``), when known."""
    store_url: str | None
    model: dict[str, Any] = field(default_factory=dict)
    """``ctx.model``: see :func:`storyforge.config.provider.model_info`."""


def check(cfg: DictConfig) -> RenderTaskSettings:
    """Validate the render task's parts of ``cfg``; :class:`ConfigError` names the key at fault."""
    conf = validate_node(StoryforgeTaskConf, cfg.task, "task")
    try:
        kind = get_task_kind(conf.kind)
    except KeyError as exc:
        raise ConfigError(f"task.kind: {exc.args[0]}") from None
    if conf.data_expansion is not None:
        if conf.data_expansion not in ("paths", "off"):
            raise ConfigError(f"task.data_expansion must be 'paths' or 'off', got {conf.data_expansion!r}")
        kind = dataclasses.replace(kind, data_expansion=conf.data_expansion)  # type: ignore[arg-type]
    max_tokens = OmegaConf.select(cfg, "budget.max_tokens", default=None)
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)):
        raise ConfigError(f"budget.max_tokens must be an integer or null, got {max_tokens!r}")
    template: dict[str, Any] | None = None
    url = None
    if conf.store_template:
        url = OmegaConf.select(cfg, "store.url", default=None)
    else:
        node = cfg.get("template")
        if node is None:
            raise ConfigError("no template in the config; choose one with template=<name>")
        data: Any = OmegaConf.to_container(node, resolve=False) if isinstance(node, DictConfig) else node
        if not isinstance(data, dict):
            raise ConfigError(f"template must be a mapping, got {type(data).__name__}")
        template = data
    return RenderTaskSettings(
        conf=conf,
        kind=kind,
        max_tokens=max_tokens,
        template=template,
        template_choice=_template_choice(),
        store_url=None if url is None else str(url),
        model=model_info(cfg.get("provider")),
    )


def _template_choice() -> str | None:
    try:
        from hydra.core.hydra_config import HydraConfig

        choice = HydraConfig.get().runtime.choices.get("template")
    except ValueError:  # not inside a Hydra run (a test calling the job directly)
        return None
    return str(choice) if choice is not None else None


def register(cs: ConfigStore) -> None:
    """Store this area's schemas in the ConfigStore."""
    cs.store(group="task", name="base_storyforge_task", node=StoryforgeTaskConf)
