"""The cost of a job's generation: the estimate before the first request and the meter after it.

Takes: the checked provider settings, the :class:`~storyforge.config.pricing.PricingSettings`,
the job's ``prompts.jsonl`` and how many attempts (and judge calls) each sample may take.
Gives: :func:`open_meter`, which logs the estimate, refuses a run whose lower bound is above
``provider.max_cost_usd`` (:class:`~storyforge.errors.BudgetExceeded`, exit status 5) and
returns the :class:`~storyforge.providers.cost.CostMeter` every generation pass of the job
shares, with the estimate for the manifest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from storyforge.config.pricing import FREE, PricingSettings, require_price
from storyforge.config.provider import ProviderConf, max_completion_tokens
from storyforge.engine.budget import Estimator, default_estimator, hf_tokenizer_estimator, tiktoken_estimator
from storyforge.providers.cost import CostEstimate, CostMeter, check_estimate, estimate_cost

__all__ = ["estimate_record", "estimator_for", "max_completion_tokens", "open_meter", "plain_meter"]


def estimator_for(tokenizer: Path | None, *, default: str = "ceil(chars / 4)") -> tuple[Estimator, str]:
    """The token counter and its name: ceil(chars / 4) (named ``default``), or a local
    tokenizer file (``.tiktoken``, else a Hugging Face ``tokenizer.json``)."""
    if tokenizer is None:
        return default_estimator, default
    if tokenizer.suffix == ".tiktoken":
        return tiktoken_estimator(tokenizer), f"tiktoken {tokenizer.name}"
    return hf_tokenizer_estimator(tokenizer), f"tokenizer {tokenizer.name}"


def open_meter(
    provider: ProviderConf,
    pricing: PricingSettings,
    prompts_path: Path,
    *,
    attempts: int = 1,
    judged: bool = False,
) -> tuple[CostMeter, CostEstimate]:
    """Price the run before anything is sent; the meter the job's passes share."""
    meter = plain_meter(provider, pricing)
    estimate = estimate_cost(
        prompts_path,
        meter.estimator,
        meter.price,
        samples=provider.samples,
        max_tokens=max_completion_tokens(provider),
        attempts=attempts,
        judged=judged,
    )
    check_estimate(estimate, provider.max_cost_usd, priced=meter.priced)
    return meter, estimate


def plain_meter(provider: ProviderConf, pricing: PricingSettings) -> CostMeter:
    """The meter of ``provider.model`` at its listed price (an unlisted model costs nothing,
    unless ``provider.max_cost_usd`` is set: then its price is asked for), with no estimate;
    token counts a server leaves out are estimated with ``pricing.tokenizer``."""
    model = str(getattr(provider, "model", ""))
    price = pricing.price(model)
    if price is None:
        require_price(pricing, model, provider.max_cost_usd)
        price = FREE
    count, name = estimator_for(pricing.tokenizer)
    return CostMeter(
        price=price,
        model=model,
        limit=provider.max_cost_usd,
        priced=pricing.price(model) is not None,
        estimator=count,
        estimator_name=name,
    )


def estimate_record(estimate: CostEstimate) -> dict[str, Any]:
    """The estimate as the manifest records it."""
    return {
        "prompts": estimate.prompts,
        "prompt_tokens": estimate.prompt_tokens,
        "low_usd": round(estimate.low, 6),
        "high_usd": None if estimate.high is None else round(estimate.high, 6),
    }
