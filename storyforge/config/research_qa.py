"""Structured config schemas for research QA: ``task=research_qa``, ``prompt_format``, ``model``.

Takes: nothing; after composition, the composed config. Gives: the schema of
``conf/prompt_format/*.yaml`` (:class:`PromptFormatConf`); :func:`register`, which stores it
and the task's own schemas of ``conf/task/research_qa.yaml`` and ``conf/model/*.yaml``
(:mod:`storyforge.tasks.research_qa.settings`) as ``prompt_format/base_prompt_format``,
``task/base_research_qa`` and ``model/base_model``; and :func:`check`, which turns the
composed config into :class:`ResearchQASettings` (the schemas checked and sealed, used as they are). Why: a typo in a key fails when Hydra composes the config instead of
surfacing as a silently ignored setting halfway through an export.

Rules that span fields (a known model type, a mode that model type uses) are checked by
:mod:`storyforge.tasks.research_qa.format` right after composition, with messages naming the key.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.utils import to_absolute_path
from omegaconf import MISSING, DictConfig

from storyforge.config.common import plain_data
from storyforge.engine.budget import Estimator
from storyforge.errors import ConfigError
from storyforge.tasks.research_qa.contexts import CONTEXT_SEPARATOR
from storyforge.tasks.research_qa.format import (
    PromptFormat,
    normalize_model_type,
    prompt_format_from_mapping,
    resolve_prompt_mode,
)
from storyforge.tasks.research_qa.settings import (
    ModelConf,
    ModelParametersConf,
    ResearchQACheckConf,
    ResearchQASettings,
    ResearchQATaskConf,
)

__all__ = [
    "ModelConf",
    "ModelParametersConf",
    "NumberingConf",
    "PromptFormatConf",
    "ResearchQACheckConf",
    "ResearchQASettings",
    "ResearchQATaskConf",
    "check",
    "packaged_dataset",
    "register",
]


@dataclass
class NumberingConf:
    """Contexts are numbered ``[1]``, ``[2]``, … by position; with ``keep_prenumbered`` a list
    already numbered 1..n in order is shown exactly as given."""

    keep_prenumbered: bool = True


@dataclass
class PromptFormatConf:
    """One prompt format: system message per model type, template and markers per mode."""

    name: str = MISSING
    # base / instruction_only / rag_trained -> the system message used in training, evaluation
    # and the Modelfile of that model type
    system_messages: dict[str, str] = field(default_factory=dict)
    # joins numbered contexts in every mode
    context_separator: str = CONTEXT_SEPARATOR
    numbering: NumberingConf = field(default_factory=NumberingConf)
    # mode -> strings the user turn must contain, in this order (the validators' contract)
    markers: dict[str, list[str]] = field(default_factory=dict)
    # mode -> template document (filled from conf/template/rqa_*.yaml by the defaults list)
    templates: dict[str, Any] = field(default_factory=dict)


def register(cs: ConfigStore) -> None:
    """Store this area's schemas in the ConfigStore."""
    cs.store(group="task", name="base_research_qa", node=ResearchQATaskConf)
    cs.store(group="prompt_format", name="base_prompt_format", node=PromptFormatConf)
    cs.store(group="model", name="base_model", node=ModelConf)


# -- after composition ----------------------------------------------------------------------------


STAGES = ("export", "modelfiles", "check", "drift", "all")


def check(cfg: DictConfig) -> ResearchQASettings:
    """Validate ``cfg`` for ``task=research_qa``; :class:`ConfigError` names the key at fault."""
    from storyforge.config.common import config_sha256, validate_node
    from storyforge.config.inputs import inputs_of

    task = validate_node(ResearchQATaskConf, cfg.task, "task")
    if "model" not in cfg or cfg.model is None:
        raise ConfigError("model is not set: choose one with model=base|instruction_only|rag_trained")
    model = validate_node(ModelConf, cfg.model, "model")
    model_type = normalize_model_type(model.model_type, key="model.model_type")
    if "prompt_format" not in cfg or cfg.prompt_format is None:
        raise ConfigError("prompt_format is not set: choose one with prompt_format=research_qa")
    validate_node(PromptFormatConf, cfg.prompt_format, "prompt_format")
    prompt_format = prompt_format_from_mapping(plain_data(cfg.prompt_format))
    mode = resolve_prompt_mode(model_type, task.prompt_mode, rag_source=task.rag_source)
    stage = cfg.get("stage") or "export"
    if stage not in STAGES:
        raise ConfigError(f"stage must be one of {', '.join(STAGES)} for task=research_qa; got {stage!r}")
    budget_node = cfg.get("budget")
    budget = budget_node.get("max_tokens") if budget_node is not None else None
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
        raise ConfigError(f"budget.max_tokens must be a positive integer or null; got {budget!r}")
    if task.limit is not None and task.limit < 0:
        raise ConfigError(f"task.limit must be >= 0 or null; got {task.limit}")
    estimator, estimator_name = _estimator(cfg.task.get("estimator"))
    dataset = cfg.get("dataset")
    return ResearchQASettings(
        prompt_format=prompt_format,
        model=model,
        model_type=model_type,
        requested_mode=task.prompt_mode,
        prompt_mode=mode,
        task=task,
        budget=budget,
        estimator=estimator,
        estimator_name=estimator_name,
        dataset=Path(to_absolute_path(str(dataset))) if dataset else packaged_dataset(),
        stage=stage,
        strict=bool(cfg.get("strict", False)),
        config_sha256=config_sha256(cfg),
        inputs=inputs_of(cfg),
    )


def compose_prompt_format(overrides: Sequence[str], conf_dir: str | Path | None = None) -> PromptFormat:
    """Compose ``task=research_qa`` with ``overrides`` and return its checked prompt format."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from storyforge.config import register_configs
    from storyforge.tasks.research_qa.format import packaged_conf_dir

    register_configs()
    root = Path(conf_dir).resolve() if conf_dir is not None else packaged_conf_dir()
    if GlobalHydra.instance().is_initialized():
        raise ConfigError(
            "storyforge check cannot compose a config inside a running Hydra app; use stage=check"
        )
    try:
        with initialize_config_dir(config_dir=str(root), version_base=None):
            cfg = compose("config", overrides=["task=research_qa", *overrides])
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(f"cannot compose the config from {root}: {exc}") from None
    return prompt_format_from_mapping(plain_data(cfg.prompt_format))


def packaged_dataset() -> Path:
    """The small offline dataset shipped with storyforge (the default ``dataset``)."""
    return Path(__file__).resolve().parents[1] / "tasks" / "research_qa" / "data" / "offline_dataset.jsonl"


def _estimator(node: Any) -> tuple[Estimator | None, str]:
    """``task.estimator``: null (the default estimator) or a ``_target_`` inside storyforge."""
    if node is None:
        return None, "default"
    target = node.get("_target_") if isinstance(node, (dict, DictConfig)) else None
    if not isinstance(target, str) or not target.startswith("storyforge."):
        raise ConfigError(
            "task.estimator must be null or a mapping whose _target_ names a callable inside storyforge "
            f"(e.g. storyforge.engine.budget.tiktoken_estimator); got {node!r}"
        )
    from hydra.utils import instantiate

    try:
        estimator = instantiate(node)
    except Exception as exc:  # instantiate wraps the callable's own error
        raise ConfigError(f"task.estimator could not be built from {target}: {exc}") from exc
    if not callable(estimator):
        raise ConfigError(f"task.estimator: {target} did not return a callable estimator")
    return estimator, target
