"""The research-QA prompt format as data: model types, modes, and which mode each model gets.

Takes: a ``prompt_format`` config node (from Hydra, or read from the packaged
``conf/prompt_format/<name>.yaml`` with the templates its defaults list names). Gives:
:class:`PromptFormat` (frozen: system message per model type, user-turn template per mode,
context separator, numbering rule, required markers per mode, and a sha256 of all of it),
:func:`normalize_model_type`, :func:`resolve_prompt_mode` and the selection table
:data:`MODES_BY_MODEL_TYPE`.

Why: training code, evaluation code and Ollama Modelfiles must use the same system message
and user-turn shapes, so they are one config and everything reads this object. A model type is always stated in config, never guessed
from a file or model name.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from storyforge.engine.model import thaw
from storyforge.errors import ConfigError
from storyforge.ids import sorted_hash

__all__ = [
    "CLOSED_BOOK",
    "MODEL_TYPES",
    "MODES_BY_MODEL_TYPE",
    "PROMPT_MODES",
    "WITH_CONTEXT",
    "PromptFormat",
    "default_prompt_format",
    "load_prompt_format",
    "normalize_model_type",
    "packaged_conf_dir",
    "prompt_format_from_mapping",
    "resolve_prompt_mode",
]

MODEL_TYPES: tuple[str, ...] = ("base", "instruction_only", "rag_trained")
PROMPT_MODES: tuple[str, ...] = (
    "instruction",
    "rag_standard",
    "rag_stored",
    "hybrid",
    "rag_trained_no_context",
)
CONTEXT_MODES: frozenset[str] = frozenset({"rag_standard", "rag_stored", "hybrid"})
CLOSED_BOOK = "closed_book"
WITH_CONTEXT = "with_context"

MODES_BY_MODEL_TYPE: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        # (closed-book mode, with-context mode, alternative with-context mode)
        "base": ("instruction", "rag_standard", "rag_stored"),
        "instruction_only": ("instruction", "hybrid"),
        "rag_trained": ("rag_trained_no_context", "rag_standard", "rag_stored"),
    }
)
"""The six conditions: each model type's closed-book mode first, then its context modes."""

DEFAULT_FORMAT = "research_qa"


def normalize_model_type(value: Any, *, key: str = "model_type") -> str:
    """``value`` trimmed and case-folded; :class:`ConfigError` listing the three otherwise."""
    text = value.strip().casefold() if isinstance(value, str) else None
    if text in MODEL_TYPES:
        return text
    shown = "nothing" if value is None or text == "" else repr(value)
    raise ConfigError(
        f"{key} must be one of {', '.join(MODEL_TYPES)}; got {shown}. "
        "State it in the model config (model.model_type); it is never guessed from names."
    )


def resolve_prompt_mode(model_type: str, prompt_mode: Any, *, rag_source: str = "generated") -> str:
    """The concrete mode for ``(model_type, prompt_mode)``.

    ``prompt_mode`` is a mode name or one of the selectors ``closed_book`` / ``with_context``
    (``rag_source: stored`` makes ``with_context`` pick ``rag_stored`` where the model type
    has it). A mode the model type does not use is a :class:`ConfigError` naming the allowed ones.
    """
    model_type = normalize_model_type(model_type)
    allowed = MODES_BY_MODEL_TYPE[model_type]
    mode = prompt_mode.strip().casefold() if isinstance(prompt_mode, str) else prompt_mode
    if rag_source not in ("generated", "stored"):
        raise ConfigError(f"task.rag_source must be 'generated' or 'stored', got {rag_source!r}")
    if mode == CLOSED_BOOK:
        return allowed[0]
    if mode == WITH_CONTEXT:
        return "rag_stored" if rag_source == "stored" and "rag_stored" in allowed else allowed[1]
    if mode not in PROMPT_MODES:
        raise ConfigError(
            f"task.prompt_mode must be one of {', '.join((CLOSED_BOOK, WITH_CONTEXT, *PROMPT_MODES))}; "
            f"got {prompt_mode!r}"
        )
    if mode not in allowed:
        raise ConfigError(
            f"task.prompt_mode {mode!r} is not a condition of model_type {model_type!r}; "
            f"its modes are {', '.join(allowed)} (or {CLOSED_BOOK} / {WITH_CONTEXT})"
        )
    return str(mode)


@dataclass(frozen=True, slots=True, kw_only=True)
class PromptFormat:
    """One prompt format. ``templates`` maps each mode to its template document (plain data);
    ``markers`` maps each mode to the strings its user turn must contain, in order."""

    name: str
    system_messages: Mapping[str, str]
    context_separator: str
    keep_prenumbered: bool
    markers: Mapping[str, tuple[str, ...]]
    templates: Mapping[str, Mapping[str, Any]]
    sha256: str = field(default="", compare=False)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as plain data and frozen again (a worker process gets an equal format)."""
        return (_unpickle_format, ({f.name: thaw(getattr(self, f.name)) for f in fields(self)},))

    def system_message(self, model_type: str) -> str:
        """The system message of ``model_type`` (the same in every mode of that model)."""
        return self.system_messages[normalize_model_type(model_type)]

    def template(self, mode: str) -> Mapping[str, Any]:
        if mode not in self.templates:
            raise ConfigError(
                f"prompt_format.templates has no template for mode {mode!r}; "
                f"it has {', '.join(sorted(self.templates)) or 'none'}"
            )
        return self.templates[mode]

    def template_sha256(self, mode: str) -> str:
        """The content hash of mode ``mode``'s template, as the template store computes it."""
        from storyforge.ids import content_hash

        return content_hash(thaw(self.template(mode)))

    def all_system_messages(self) -> tuple[str, ...]:
        """Every configured system message, each once, in model-type order."""
        return tuple(dict.fromkeys(self.system_messages[t] for t in MODEL_TYPES))


def prompt_format_from_mapping(node: Mapping[str, Any], *, key: str = "prompt_format") -> PromptFormat:
    """Check a ``prompt_format`` node and freeze it; errors name the offending key."""
    data = thaw(node)
    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{key}.name must be a non-empty string")
    systems = data.get("system_messages") or {}
    if not isinstance(systems, Mapping):
        raise ConfigError(f"{key}.system_messages must map each model type to its system message")
    unknown = sorted(set(systems) - set(MODEL_TYPES))
    if unknown:
        raise ConfigError(
            f"{key}.system_messages has unknown model types {', '.join(unknown)}; "
            f"allowed: {', '.join(MODEL_TYPES)}"
        )
    for model_type in MODEL_TYPES:
        message = systems.get(model_type)
        if not isinstance(message, str) or not message.strip():
            raise ConfigError(f"{key}.system_messages.{model_type} must be a non-empty string")
    separator = data.get("context_separator")
    if not isinstance(separator, str) or not separator:
        raise ConfigError(f"{key}.context_separator must be a non-empty string")
    numbering = data.get("numbering") or {}
    keep = numbering.get("keep_prenumbered", True) if isinstance(numbering, Mapping) else None
    if not isinstance(keep, bool):
        raise ConfigError(f"{key}.numbering.keep_prenumbered must be true or false")
    markers_node = data.get("markers") or {}
    markers: dict[str, tuple[str, ...]] = {}
    for mode, values in markers_node.items():
        if mode not in PROMPT_MODES:
            raise ConfigError(f"{key}.markers.{mode}: unknown mode; modes: {', '.join(PROMPT_MODES)}")
        if not isinstance(values, list) or not all(isinstance(v, str) and v for v in values):
            raise ConfigError(f"{key}.markers.{mode} must be a list of non-empty strings")
        markers[mode] = tuple(values)
    templates_node = data.get("templates") or {}
    templates: dict[str, Mapping[str, Any]] = {}
    for mode, template in templates_node.items():
        if mode not in PROMPT_MODES:
            raise ConfigError(f"{key}.templates.{mode}: unknown mode; modes: {', '.join(PROMPT_MODES)}")
        if not isinstance(template, Mapping):
            raise ConfigError(f"{key}.templates.{mode} must be a template document")
        templates[mode] = _freeze(template)
    missing = [m for m in PROMPT_MODES if m not in templates or m not in markers]
    if missing:
        raise ConfigError(f"{key} needs a template and markers for every mode; missing: {', '.join(missing)}")
    canonical = {
        "name": name,
        "system_messages": {t: systems[t] for t in MODEL_TYPES},
        "context_separator": separator,
        "keep_prenumbered": keep,
        "markers": {m: list(markers[m]) for m in PROMPT_MODES},
        "templates": {m: thaw(templates[m]) for m in PROMPT_MODES},
    }
    digest = sorted_hash(canonical)
    return PromptFormat(
        name=name,
        system_messages=MappingProxyType({t: systems[t] for t in MODEL_TYPES}),
        context_separator=separator,
        keep_prenumbered=keep,
        markers=MappingProxyType(markers),
        templates=MappingProxyType(templates),
        sha256=digest,
    )


# -- the packaged YAML, without Hydra -------------------------------------------------------------


def packaged_conf_dir() -> Path:
    """``storyforge/_conf`` in an installed wheel, else the repository's ``conf/``."""
    package = Path(__file__).resolve().parents[2]
    for candidate in (package / "_conf", package.parent / "conf"):
        if (candidate / "prompt_format").is_dir():
            return candidate
    raise ConfigError(
        f"no prompt formats found: looked for {package / '_conf'} and {package.parent / 'conf'}"
    )


def load_prompt_format(name: str = DEFAULT_FORMAT, conf_dir: str | Path | None = None) -> PromptFormat:
    """Read ``conf/prompt_format/<name>.yaml`` and the templates its defaults list names.

    This is the composition Hydra does for ``prompt_format=<name>`` (entries of the form
    ``/template@templates.<mode>: <template>``, then the file's own keys), done with PyYAML so
    the library functions work without a Hydra app; a test keeps the two in agreement.
    """
    root = Path(conf_dir) if conf_dir is not None else packaged_conf_dir()
    path = root / "prompt_format" / f"{name}.yaml"
    data = _read_yaml(path)
    templates: dict[str, Any] = {}
    for entry in data.pop("defaults", []) or []:
        if not isinstance(entry, Mapping):
            continue  # the schema name or _self_
        for group_key, option in entry.items():
            group, _, package = str(group_key).partition("@")
            if group.strip("/") != "template" or not package.startswith("templates."):
                raise ConfigError(f"{path}: unsupported defaults entry {group_key}: {option}")
            mode = package.removeprefix("templates.")
            template = _read_yaml(root / "template" / f"{option}.yaml")
            template.pop("defaults", None)
            templates[mode] = template
    merged = dict(data)
    merged["templates"] = {**templates, **(data.get("templates") or {})}
    return prompt_format_from_mapping(merged, key=f"prompt_format ({path})")


@functools.cache
def default_prompt_format() -> PromptFormat:
    """The packaged ``research_qa`` prompt format (read once)."""
    return load_prompt_format(DEFAULT_FORMAT)


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        with path.open(encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return data


def _unpickle_format(data: dict[str, Any]) -> PromptFormat:
    return PromptFormat(**{key: _freeze(value) for key, value in data.items()})


def _freeze(node: Any) -> Any:
    if isinstance(node, Mapping):
        return MappingProxyType({str(k): _freeze(v) for k, v in node.items()})
    if isinstance(node, (list, tuple)):
        return tuple(_freeze(v) for v in node)
    return node
