"""Pricing, the estimate before a run, provider.max_cost_usd, and the cost figures."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from hydra import compose
from omegaconf import OmegaConf

from storyforge.config.pricing import Price, pricing_settings
from storyforge.errors import BudgetExceeded, ConfigError, exit_code
from storyforge.pipeline import run_in
from tests.support.fake_server import FakeServer
from tests.support.scripted_stories import FIRST_SEED, script

PRICE = Price(input=1000.0, cached_input=500.0, output=20000.0)
PRICED = "+pricing.models.fake={input: 1000.0, cached_input: 500.0, output: 20000.0}"


def _cfg(url: str, tmp: Path, *extra: str) -> Any:
    return compose(
        "config",
        overrides=[
            "task=tinystories",
            "task.n_seeds=8",
            "provider=openai",
            f"provider.base_url={url}",
            "provider.model=fake",
            f"provider.seed={FIRST_SEED}",
            "provider.samples=2",
            "provider.concurrency=1",
            "provider.progress=false",
            f"cache.path={tmp / 'cache.sqlite'}",
            "export.plots=false",
            "dedup=none",  # the scripted stories of one seed are the same text
            PRICED,
            *extra,
        ],
    )


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text("utf-8").splitlines() if line.strip()]


def _paid(records: list[dict[str, Any]]) -> float:
    return sum(
        PRICE.cost(prompt=r["usage"]["prompt_tokens"], cached=0, completion=r["usage"]["completion_tokens"])
        for r in records
    )


def test_cost_per_stage_and_per_passing_sample(hydra_conf, tmp_path):
    run = tmp_path / "run"
    with FakeServer(script=script) as server:
        manifest = run_in(_cfg(server.base_url, tmp_path, "regenerate.max_attempts=2"), run)
    cost = manifest["cost"]
    first = _paid(_lines(run / "generations.jsonl"))
    second = _paid(_lines(run / "generations.attempt2.jsonl"))
    assert cost["stages"]["generation"]["cost_usd"] == pytest.approx(first, abs=1e-6)
    assert cost["stages"]["regeneration"]["cost_usd"] == pytest.approx(second, abs=1e-6)
    assert cost["total_usd"] == pytest.approx(first + second, abs=1e-6)
    assert cost["passed"] == 16
    assert cost["per_passing_sample_usd"] == pytest.approx((first + second) / 16, abs=1e-6)
    spent = cost["this_run"]
    assert (
        spent["stages"]["generation"]["requests"] == 16 and spent["stages"]["regeneration"]["requests"] == 8
    )
    assert spent["spent_usd"] == pytest.approx(first + second, abs=1e-6)
    assert cost["estimate"]["low_usd"] <= first  # the lower bound never exceeds what the first pass paid
    assert cost["estimate"]["high_usd"] >= first + second
    report = json.loads((run / "report" / "summary.json").read_text("utf-8"))
    assert report["cost"] == {k: v for k, v in cost.items() if k not in ("this_run", "estimate")}
    assert "## Cost" in (run / "report" / "summary.md").read_text("utf-8")


def test_cache_hits_cost_nothing_and_the_report_prices_the_data_the_same(hydra_conf, tmp_path):
    with FakeServer(script=script) as server:
        paid = run_in(_cfg(server.base_url, tmp_path), tmp_path / "a")
        again = run_in(_cfg(server.base_url, tmp_path), tmp_path / "b")
    stage = again["cost"]["this_run"]["stages"]["generation"]
    assert (stage["requests"], stage["cache_hits"], again["cost"]["this_run"]["spent_usd"]) == (0, 16, 0.0)
    assert again["cost"]["total_usd"] == paid["cost"]["total_usd"] > 0
    assert (tmp_path / "a" / "report" / "summary.json").read_bytes() == (
        tmp_path / "b" / "report" / "summary.json"
    ).read_bytes()


def test_max_cost_stops_at_the_crossing_request_and_a_higher_limit_finishes_without_resending(
    hydra_conf, tmp_path
):
    run = tmp_path / "run"
    with FakeServer(script=script) as server:
        cfg = _cfg(server.base_url, tmp_path, "provider.max_cost_usd=5.0", "cache.path=null")
        with pytest.raises(BudgetExceeded, match=r"provider.max_cost_usd=5 reached") as caught:
            run_in(cfg, run)
        assert exit_code(caught.value) == 5
        journal = _lines(run / "generations.jsonl")
        assert server.request_count == len(journal)  # concurrency 1: nothing in flight was lost
        assert _paid(journal[:-1]) < 5.0 <= _paid(journal)  # stopped at the request that crossed it
        assert not (run / "validated.jsonl").exists()

        sent = server.request_count
        with pytest.raises(BudgetExceeded):  # the same limit: nothing more is sent
            run_in(cfg, run)
        assert server.request_count == sent

        higher = _cfg(server.base_url, tmp_path, "provider.max_cost_usd=100", "cache.path=null")
        manifest = run_in(higher, run)
        assert server.request_count - sent == 16 - len(journal)
    assert manifest["generation"]["resumed"] == len(journal)
    assert len(_lines(run / "generations.jsonl")) == 16
    assert manifest["cost"]["total_usd"] == pytest.approx(_paid(_lines(run / "generations.jsonl")), abs=1e-6)
    assert manifest["cost"]["this_run"]["spent_usd"] == manifest["cost"]["total_usd"]


def test_a_cost_stop_says_what_its_journal_holds_with_requests_in_flight(hydra_conf, tmp_path):
    """Requests in flight when the limit is reached are paid for: they finish and are journaled,
    and the stop says the journal's total as spent (a rerun with the same limit says the same)."""
    run = tmp_path / "run"
    with FakeServer(script=script, latency_s=0.05) as server:
        cfg = _cfg(
            server.base_url,
            tmp_path,
            "provider.max_cost_usd=5.0",
            "provider.concurrency=4",
            "cache.path=null",
        )
        with pytest.raises(BudgetExceeded) as caught:
            run_in(cfg, run)
        journal = _lines(run / "generations.jsonl")
        assert server.request_count == len(journal) < 16  # nothing paid for is lost
        with pytest.raises(BudgetExceeded) as again:
            run_in(cfg, run)
        assert server.request_count == len(journal)
    paid = f"${_paid(journal):.4f} spent on fake"
    assert paid in str(caught.value)
    assert paid in str(again.value)


def test_a_limit_below_the_lower_bound_refuses_before_sending(hydra_conf, tmp_path):
    with FakeServer(script=script) as server:
        cfg = _cfg(server.base_url, tmp_path, "provider.max_cost_usd=0.0001")
        with pytest.raises(BudgetExceeded, match="below the lower bound"):
            run_in(cfg, tmp_path / "run")
        assert server.request_count == 0


def test_a_limit_needs_the_models_price(hydra_conf, tmp_path):
    with FakeServer(script=script) as server:
        cfg = _cfg(server.base_url, tmp_path, "provider.max_cost_usd=5", "provider.model=unpriced")
        with pytest.raises(ConfigError, match="pricing.models.unpriced"):
            run_in(cfg, tmp_path / "run")
        assert server.request_count == 0


@pytest.mark.parametrize(
    ("node", "message"),
    [
        ({"models": {"m": {"input": -1, "output": 1}}}, "pricing.models.m.input must be a number from 0 to"),
        ({"models": {"m": {"input": 1, "output": "cheap"}}}, "pricing.models.m.output must be a number"),
        (
            {"models": {"m": {"input": 1, "output": 1, "outptu": 2}}},
            "pricing.models.m.outptu: not a price field",
        ),
        ({"models": {"m": 3}}, "pricing.models.m must be a mapping"),
        ({"modles": {}}, "pricing.modles: not a pricing key"),
        ({"tokenizer": "/nonexistent/tok.json"}, "pricing.tokenizer: no such file"),
    ],
)
def test_bad_pricing_is_a_config_error_naming_the_key(node, message):
    with pytest.raises(ConfigError, match=message):
        pricing_settings(OmegaConf.create({"pricing": node}))


def test_cached_input_defaults_to_the_input_price():
    settings = pricing_settings(OmegaConf.create({"pricing": {"models": {"m": {"input": 2, "output": 3}}}}))
    assert settings.price("m") == Price(input=2.0, cached_input=2.0, output=3.0)
    assert Price(input=1.0, cached_input=0.5, output=2.0).cost(prompt=1000, cached=400, completion=10) == (
        pytest.approx((600 * 1.0 + 400 * 0.5 + 10 * 2.0) / 1e6)
    )


def test_an_unpriced_model_adds_no_cost_section(hydra_conf, tmp_path):
    """A model without a price (a local server) writes the files it always wrote."""
    with FakeServer(script=script) as server:
        manifest = run_in(_cfg(server.base_url, tmp_path, "provider.model=local"), tmp_path / "run")
    assert "cost" not in manifest and "cost" not in manifest["completions"]


@pytest.mark.parametrize(
    ("pricing", "says"),
    [
        pytest.param(PRICED, "cost estimate: $", id="priced"),
        pytest.param("pricing=default", "cost estimate: not priced", id="unpriced"),
    ],
)
def test_the_estimate_line_says_not_priced_for_a_model_without_a_price(
    hydra_conf, tmp_path, caplog, pricing, says
):
    """An unpriced model's estimate is "not priced", never "$0.0000 to $0.0000"."""
    run = tmp_path / "run"
    with FakeServer(script=script) as server:
        cfg = compose(
            "config",
            overrides=[
                "task=tinystories",
                "task.n_seeds=2",
                "provider=openai",
                f"provider.base_url={server.base_url}",
                "provider.model=fake",
                "provider.progress=false",
                f"cache.path={tmp_path / 'cache.sqlite'}",
                "export.plots=false",
                "dedup=none",
                pricing,
            ],
        )
        with caplog.at_level(logging.INFO, logger="storyforge"):
            run_in(cfg, run)
    log = caplog.text
    estimate = [line for line in log.splitlines() if "cost estimate:" in line]
    assert len(estimate) == 1 and says in estimate[0]
    assert "$0.0000 to $0.0000" not in log
