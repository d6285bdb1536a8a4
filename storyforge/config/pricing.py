"""Settings of the ``pricing`` group: what a model's tokens cost, and how prompts are counted.

Takes: the composed config's ``pricing`` node (absent: no prices). Gives: :class:`Price`,
:class:`PricingSettings` (frozen, typed; what the cost code takes) and
:func:`pricing_settings`, which checks the node once (errors name the key).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from storyforge.errors import ConfigError

__all__ = ["Price", "PricingSettings", "pricing_settings", "require_price"]

_FIELDS = ("input", "cached_input", "output")


@dataclass(frozen=True, slots=True, kw_only=True)
class Price:
    """USD per million tokens."""

    input: float
    cached_input: float
    output: float

    def cost(self, *, prompt: int, cached: int, completion: int) -> float:
        """USD for these tokens (``cached`` of the ``prompt`` tokens were read from the server's cache)."""
        fresh = max(0, prompt - cached)
        return (fresh * self.input + min(cached, prompt) * self.cached_input + completion * self.output) / 1e6


FREE = Price(input=0.0, cached_input=0.0, output=0.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class PricingSettings:
    """Prices by model name and the prompt-token counter of the estimate."""

    models: Mapping[str, Price] = field(default_factory=dict)
    tokenizer: Path | None = None

    def price(self, model: str) -> Price | None:
        return self.models.get(model)


MAX_PRICE = 1_000_000.0
"""The highest price taken (USD per million tokens): a run's tokens at any price up to it
stay a finite amount, and no model costs nearly that much."""


def require_price(pricing: PricingSettings, model: str, limit: float | None) -> None:
    """Raise :class:`ConfigError` when a cost limit is set for a model with no price."""
    if limit is not None and pricing.price(model) is None:
        raise ConfigError(
            f"provider.max_cost_usd needs the price of provider.model={model!r}; add it: "
            f"'+pricing.models.{model}={{input: USD, cached_input: USD, output: USD}}' (per million tokens)"
        )


def _number(value: Any, key: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 <= value <= MAX_PRICE
    ):
        raise ConfigError(
            f"{key} must be a number from 0 to {MAX_PRICE:,.0f} (USD per million tokens), got {value!r}"
        )
    return float(value)


def pricing_settings(cfg: Any) -> PricingSettings:
    """``cfg.pricing`` checked: each model has ``input``, ``cached_input``, ``output`` >= 0."""
    node = cfg.get("pricing") if hasattr(cfg, "get") else None
    if node is None:
        return PricingSettings()
    unknown = sorted(set(map(str, node)) - {"models", "tokenizer"})
    if unknown:
        raise ConfigError(f"pricing.{unknown[0]}: not a pricing key (models, tokenizer)")
    models: dict[str, Price] = {}
    for name, entry in (node.get("models") or {}).items():
        key = f"pricing.models.{name}"
        if not hasattr(entry, "get"):
            raise ConfigError(f"{key} must be a mapping with {', '.join(_FIELDS)}, got {entry!r}")
        extra = sorted(set(map(str, entry)) - set(_FIELDS))
        if extra:
            raise ConfigError(f"{key}.{extra[0]}: not a price field ({', '.join(_FIELDS)})")
        values = {
            f: _number(entry.get(f, entry.get("input") if f == "cached_input" else None), f"{key}.{f}")
            for f in _FIELDS
        }
        models[str(name)] = Price(**values)
    tokenizer = node.get("tokenizer")
    path = Path(str(tokenizer)).expanduser() if tokenizer else None
    if path is not None and not path.exists():
        raise ConfigError(f"pricing.tokenizer: no such file {str(path)!r}")
    return PricingSettings(models=models, tokenizer=path)
