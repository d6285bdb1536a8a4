"""Structured config schemas shared by every job: the top-level run keys and ``budget``.

Takes: the composed Hydra config. Gives: :class:`RunConf` (``seed``, ``strict``,
``seeds_path``, ``completions``), :class:`BudgetConf` (stored as ``budget/base_budget``),
:func:`validate_node` (merge one config node onto its schema, turning OmegaConf's errors into
:class:`~storyforge.errors.ConfigError` naming the full key) and :func:`config_sha256` (the
hash a run's manifest records). Why: Hydra checks a group against its schema while composing,
but a run re-launched from its ``.hydra/config.yaml`` snapshot has no defaults list, so jobs
validate their nodes again through :func:`validate_node` and both paths fail the same way.

The root config has no schema of its own: several areas add top-level groups, and Hydra
already refuses unknown top-level keys (``sed=1`` fails; ``+sed=1`` is explicit).
"""

from __future__ import annotations

import dataclasses
import enum
import typing
from dataclasses import dataclass
from typing import Any, TypeVar

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from storyforge.config.hydra_errors import unknown_key_message
from storyforge.errors import ConfigError
from storyforge.ids import sorted_hash
from storyforge.sealed import Sealed

__all__ = [
    "BudgetConf",
    "RunConf",
    "Sealed",
    "config_sha256",
    "data_config_sha256",
    "plain_data",
    "register",
    "validate_node",
    "validate_run",
]

T = TypeVar("T")

# Keys that change how a run executes but not what it produces (the input files' hashes are
# recorded in the manifest on their own; the executor never changes the outputs; the drift
# gate only reads what was exported; wait only decides whether to wait for another run).
_UNHASHED_KEYS = frozenset({"hydra", "resume", "inputs", "allow_changed_inputs", "executor", "drift", "wait"})


@dataclass
class RunConf:
    """Top-level keys of ``conf/config.yaml``."""

    seed: int = 1234
    strict: bool = False
    # Load prompt seeds from this prompts_seed.jsonl instead of generating them.
    seeds_path: str | None = None
    # Check these completions (a JSONL file) instead of asking a provider.
    completions: str | None = None


@dataclass
class BudgetConf:
    """Token budget for rendering a prompt; ``max_tokens: null`` means unlimited."""

    max_tokens: int | None = None


def validate_node(schema: type[T], node: Any, key: str) -> T:
    """``node`` merged onto ``schema`` and converted to a ``schema`` instance.

    Raises :class:`ConfigError` naming ``key.<field>`` (just ``<field>`` when ``key`` is
    empty) for an unknown field, a value of the wrong type or a missing required value.
    """
    try:
        # As plain data: a composed node typed by this schema would carry keys appended with
        # "+key=value" through the merge unchecked.
        plain = plain_data(node)
        obj = _built_directly(schema, plain)
        if obj is None:
            obj = _built_by_merge(schema, plain)
    except OmegaConfBaseException as exc:
        full_key = getattr(exc, "full_key", None)
        where = ".".join(part for part in (key, full_key) if part) or "<root>"
        if isinstance(exc, (ConfigKeyError, ConfigAttributeError)) and full_key:
            raise ConfigError(unknown_key_message(exc, where)) from None
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"{where}: {reason}") from None
    if isinstance(obj, Sealed):
        obj.seal()
    return obj


def plain_data(node: Any) -> Any:
    """A config node as plain data (interpolations resolved); anything else as it is."""
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node


def _built_by_merge(schema: type[T], plain: Any) -> T:
    """OmegaConf's way: ``plain`` merged onto the schema's node, then converted (every check)."""
    obj = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), plain))
    assert isinstance(obj, schema)
    return obj


_SCALARS = (str, int, float, bool)
_FIELD_KINDS: dict[type, dict[str, tuple[Any, bool, bool]] | None] = {}
"""schema -> {field: (kind, a list of it, None allowed)}, or None when a field is of a kind
the direct way does not build (a path, a mapping, a list of schemas...): such schemas always
go through the merge. A kind is ``str``, ``int``, ``float``, ``bool``, an enum, ``Any`` or a
nested schema (one with a default, which a given mapping is laid over, as the merge does)."""


def _field_kinds(schema: type) -> dict[str, tuple[Any, bool, bool]] | None:
    if schema not in _FIELD_KINDS:
        _FIELD_KINDS[schema] = _read_field_kinds(schema)
    return _FIELD_KINDS[schema]


def _read_field_kinds(schema: type) -> dict[str, tuple[Any, bool, bool]] | None:
    if not dataclasses.is_dataclass(schema):
        return None
    try:
        hints = typing.get_type_hints(schema)
    except Exception:  # noqa: BLE001 - an annotation that does not resolve: the merge decides
        return None
    kinds: dict[str, tuple[Any, bool, bool]] = {}
    for f in dataclasses.fields(schema):
        hint, args = hints.get(f.name), typing.get_args(hints.get(f.name))
        optional = len(args) == 2 and type(None) in args
        if optional:
            hint = next(arg for arg in args if arg is not type(None))
        listed = typing.get_origin(hint) is list and len(typing.get_args(hint)) == 1
        kind = typing.get_args(hint)[0] if listed else hint
        plain = kind in _SCALARS or (isinstance(kind, type) and issubclass(kind, enum.Enum))
        nested = (
            isinstance(kind, type)
            and dataclasses.is_dataclass(kind)
            and not (listed or optional)
            and f.default_factory is not dataclasses.MISSING
        )
        if not f.init or not (plain or nested or (kind is Any and not listed)):
            return None
        kinds[f.name] = (kind, listed, optional or kind is Any)
    return kinds


def _kept_as_is(value: Any, kind: Any) -> bool:
    """A value OmegaConf keeps as it is: the exact type, no ``???``, no ``${...}``."""
    if kind is Any:
        if value is None:
            return True
        kind = type(value)
        if kind not in _SCALARS:
            return False
    if type(value) is not kind:
        return False
    return not isinstance(value, str) or (value != "???" and "${" not in value)


def _built_directly(schema: type[T], plain: Any, base: Any = None) -> T | None:
    """The schema instance the merge would give, built without OmegaConf, or None to merge.

    Only for a schema of plain fields (``str``, ``int``, ``float``, ``bool``, an enum, a list
    of one of them, each optionally ``None``; ``Any`` holding one of them; a nested schema of
    such fields) and data whose every value, given or default, already has its field's exact
    type: then the merge checks nothing that could fail and converts nothing, and its result
    is the schema called with those values. Anything else (an unknown key, a value to convert,
    a missing or interpolated value) goes through the merge, which names the key as it always
    has. ``base`` is the default a nested schema's mapping is laid over. The merge of the
    tinystories word pools alone took some 25 ms of every run's start-up.
    """
    kinds = _field_kinds(schema)
    if kinds is None or type(plain) is not dict or not plain.keys() <= kinds.keys():
        return None
    values: dict[str, Any] = {}
    for f in dataclasses.fields(schema):  # type: ignore[arg-type]
        kind, listed, optional = kinds[f.name]
        if base is not None:
            default = getattr(base, f.name)
        elif f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        elif f.name in plain:
            default = dataclasses.MISSING
        else:
            return None
        value = plain.get(f.name, default)
        if dataclasses.is_dataclass(kind):
            if type(default) is not kind or (value is not default and type(value) is not dict):
                return None
            value = _built_directly(kind, {} if value is default else value, default)
            if value is None:
                return None
        elif value is None:
            if not optional:
                return None
        elif listed:
            if type(value) is not list or not all(_kept_as_is(item, kind) for item in value):
                return None
            value = list(value)
        elif not _kept_as_is(value, kind):
            return None
        values[f.name] = value
    try:
        return schema(**values)
    except TypeError:  # OmegaConf words this one its own way
        return None


def validate_run(cfg: DictConfig) -> RunConf:
    """The top-level run keys of ``cfg`` as a :class:`RunConf` (type-checked)."""
    node = {name: cfg[name] for name in ("seed", "strict", "seeds_path", "completions") if name in cfg}
    return validate_node(RunConf, node, "")


def config_sha256(cfg: DictConfig) -> str:
    """sha256 of the resolved config without ``hydra``, ``resume``, ``executor``, ``drift`` and the input pins (canonical JSON)."""
    return sorted_hash(_resolved(cfg, _UNHASHED_KEYS))


def _resolved(cfg: DictConfig, leave_out: frozenset[str]) -> dict[str, Any]:
    """``cfg`` resolved as plain data, without the top-level keys ``leave_out``."""
    data = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    assert isinstance(data, dict)
    return {str(k): v for k, v in data.items() if k not in leave_out}


# Config keys that say where requests go and how they are sent, not what is asked: left out
# of the provenance's config hash (with those config_sha256 leaves out), so a replay or a
# move to another server keeps each row's provenance.
_TRANSPORT_KEYS = frozenset(
    {
        "base_url",
        "host",
        "api_key_env",
        "concurrency",
        "timeout_s",
        "max_retries",
        "backoff_base_s",
        "backoff_max_s",
        "max_retry_after_s",
        "max_response_bytes",
        "fail_fast_s",
        "max_error_rate",
        "on_stale",
        "retry_errors",
        "progress",
        "trust_env",
        "on_model_mismatch",
        "replay",
        "max_cost_usd",
    }
)
_DATA_UNHASHED_KEYS = _UNHASHED_KEYS | {"cache", "pricing", "stage"}


def data_config_sha256(cfg: DictConfig) -> str:
    """sha256 of the config that decides the data (each exported row's provenance): that of
    :func:`config_sha256` without the cache, ``pricing``, ``stage`` and the provider's (and the
    judge's provider's) transport keys, so a replay or another server keeps the rows' bytes."""
    body = _resolved(cfg, _DATA_UNHASHED_KEYS)
    provider = body.get("provider")
    if isinstance(provider, dict):
        body["provider"] = {k: v for k, v in provider.items() if k not in _TRANSPORT_KEYS}
    judge = body.get("judge")
    if isinstance(judge, dict) and isinstance(judge.get("provider"), dict):
        plain = {k: v for k, v in judge["provider"].items() if k not in _TRANSPORT_KEYS}
        body["judge"] = {**judge, "provider": plain}
    return sorted_hash(body)


def register(cs: ConfigStore) -> None:
    """Store this area's schemas in the ConfigStore."""
    cs.store(group="budget", name="base_budget", node=BudgetConf)
