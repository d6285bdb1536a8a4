"""The cost cap does not trust the server's token counts: a negative, huge, non-integer or
missing count is estimated with the run's estimator (and counted as estimated), over real HTTP."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hydra import compose

from storyforge.errors import BudgetExceeded, ConfigError
from storyforge.pipeline import run_in
from tests.support.fake_server import FakeServer, Fault, Received

STORY = "Mia found a red ball. She kicked it to her dog. They played all day. Then they slept."
USAGES: dict[str, Any] = {
    "negative": {"prompt_tokens": -100_000_000, "completion_tokens": -5},
    "missing": None,
    "not integers": {"prompt_tokens": "12", "completion_tokens": 1.5},
    "past any context": {"prompt_tokens": 10**12, "completion_tokens": 10**12},
}


def _answer(usage: Any) -> Fault:
    body: dict[str, Any] = {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "model": "fake",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": STORY}, "finish_reason": "stop"}
        ],
    }
    if usage is not None:
        body["usage"] = usage
    return Fault.malformed(json.dumps(body))


def _cfg(url: str, tmp: Path, limit: float) -> Any:
    return compose(
        "config",
        overrides=[
            "task=tinystories",
            "task.n_seeds=8",
            "provider=openai",
            f"provider.base_url={url}",
            "provider.model=fake",
            "provider.concurrency=1",
            "provider.progress=false",
            "cache.path=null",
            "export.plots=false",
            "dedup=none",
            "+pricing.models.fake={input: 1000.0, cached_input: 500.0, output: 20000.0}",
            f"provider.max_cost_usd={limit}",
        ],
    )


@pytest.mark.parametrize("usage", sorted(USAGES))
def test_counts_the_server_gets_wrong_are_estimated_and_the_cap_holds(
    hydra_conf: None, tmp_path: Path, usage: str
) -> None:
    answer = _answer(USAGES[usage])

    def every(_: Received) -> Fault:
        return answer

    with FakeServer(rule=every) as server:
        with pytest.raises(BudgetExceeded, match=r"provider.max_cost_usd=2 reached"):
            run_in(_cfg(server.base_url, tmp_path, 2.0), tmp_path / "capped")
        assert 1 <= server.request_count < 8  # each estimated request costs about $0.5
        manifest = run_in(_cfg(server.base_url, tmp_path, 1000.0), tmp_path / "whole")
    spent = manifest["cost"]["this_run"]
    assert (
        spent["stages"]["generation"]["estimated_requests"] == spent["stages"]["generation"]["requests"] == 8
    )
    assert 0 < spent["spent_usd"] < 1000


@pytest.mark.parametrize("price", ["1e308", "1000001"])
def test_a_price_past_any_real_one_is_refused_before_anything_is_sent(
    hydra_conf: None, tmp_path: Path, price: str
) -> None:
    with FakeServer() as server:
        cfg = _cfg(server.base_url, tmp_path, 1000.0)
        cfg.pricing.models.fake.output = float(price)
        with pytest.raises(
            ConfigError, match=r"pricing.models.fake.output must be a number from 0 to 1,000,000"
        ):
            run_in(cfg, tmp_path / "run")
        assert server.request_count == 0
