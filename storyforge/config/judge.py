"""Settings of the ``judge`` group: a second model checks what the seed's rules cannot.

Takes: the composed config's ``judge`` node (``judge=none`` or absent: no judge). Gives:
:class:`JudgeSettings` (frozen, typed; what the judge code takes) and :func:`judge_settings`,
which checks the node once (errors name ``judge.<key>``), including that ``schema`` is a valid
JSON Schema.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from storyforge.errors import ConfigError

__all__ = ["STRUCTURED_OUTPUT", "JudgeSettings", "judge_settings"]

STRUCTURED_OUTPUT = ("auto", "openai", "llama_cpp", "ollama")
_KEYS = frozenset(
    {"name", "template", "provider", "structured_output", "max_tokens", "seed", "retries", "schema"}
)


@dataclass(frozen=True, slots=True, kw_only=True)
class JudgeSettings:
    """The judge: its template, provider overrides, verdict schema and retry rule."""

    name: str = "none"
    template: Path | None = None
    provider: Mapping[str, Any] = field(default_factory=dict)
    structured_output: str = "auto"
    max_tokens: int | None = 256
    seed: int = 0
    retries: int = 2
    schema_json: str = "{}"
    """The verdict's JSON Schema as canonical JSON (frozen; :attr:`schema` parses it)."""

    @property
    def enabled(self) -> bool:
        return self.name != "none"

    @property
    def schema(self) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(self.schema_json)
        return value


def _plain(value: Any) -> Any:
    if hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple) or (hasattr(value, "__iter__") and not isinstance(value, str | bytes)):
        return [_plain(v) for v in value]
    return value


def judge_settings(cfg: Any) -> JudgeSettings:
    """``cfg.judge`` checked; defaults (no judge) when the node is absent."""
    node = cfg.get("judge") if hasattr(cfg, "get") else None
    if node is None or str(node.get("name", "none")) == "none":
        return JudgeSettings()
    unknown = sorted(set(map(str, node)) - _KEYS)
    if unknown:
        raise ConfigError(f"judge.{unknown[0]}: not a judge key ({', '.join(sorted(_KEYS))})")
    structured = str(node.get("structured_output", "auto"))
    if structured not in STRUCTURED_OUTPUT:
        raise ConfigError(
            f"judge.structured_output must be one of {', '.join(STRUCTURED_OUTPUT)}, got {structured!r}"
        )
    retries = node.get("retries", 2)
    if not isinstance(retries, int) or isinstance(retries, bool) or not 0 <= retries <= 10:
        raise ConfigError(f"judge.retries must be 0..10, got {retries!r}")
    max_tokens = node.get("max_tokens", 256)
    if max_tokens is not None and (
        not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1
    ):
        raise ConfigError(f"judge.max_tokens must be null or >= 1, got {max_tokens!r}")
    seed = node.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ConfigError(f"judge.seed must be an integer, got {seed!r}")
    schema = _plain(node.get("schema"))
    if not isinstance(schema, dict) or not schema:
        raise ConfigError("judge.schema must be a JSON Schema object (the verdict's shape)")
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise ConfigError(f"judge.schema is not a valid JSON Schema: {exc.message}") from None
    props = schema.get("properties") or {}
    if "verdict" not in props:
        raise ConfigError("judge.schema must have a 'verdict' property ('pass' or 'fail')")
    provider = _plain(node.get("provider") or {})
    if not isinstance(provider, dict):
        raise ConfigError(f"judge.provider must be a mapping of provider settings, got {provider!r}")
    template = node.get("template")
    path = Path(str(template)).expanduser() if template else None
    if path is not None and not path.is_file():
        raise ConfigError(f"judge.template: no such file {str(path)!r}")
    return JudgeSettings(
        name=str(node.get("name")),
        template=path,
        provider=provider,
        structured_output=structured,
        max_tokens=max_tokens,
        seed=seed,
        retries=retries,
        schema_json=json.dumps(schema, sort_keys=True, separators=(",", ":")),
    )
