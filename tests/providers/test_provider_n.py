"""provider.samples=N with n=N per request: one request per prompt, the same texts, fewer prompt tokens."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from provider_support import assert_exactly_once, ollama_cfg, openai_cfg, records, write_prompts

from storyforge.config.provider import OllamaProviderConf, OpenAIProviderConf, ProviderConf
from storyforge.errors import ConfigError
from storyforge.providers import generate_for_job
from storyforge.providers.choices import use_n
from tests.support.fake_server import FakeServer

N_PROMPTS, SAMPLES = 12, 4


def _outputs(path: Path) -> dict[tuple[str, int], str]:
    return {(r["id"], r["sample"]): r["output"] for r in records(path)}


def test_n_per_request_sends_one_request_per_prompt_with_the_same_answers(tmp_path: Path) -> None:
    """n=4: a quarter of the requests and prompt tokens, every sample once, the texts of per-sample requests."""
    prompts = write_prompts(tmp_path / "prompts.jsonl", N_PROMPTS)
    with FakeServer() as server:
        _, single = generate_for_job(
            openai_cfg(server, samples=SAMPLES, seed=5, n_per_request=False), tmp_path / "single", prompts
        )
        per_sample_requests = server.request_count
        _, batched = generate_for_job(
            openai_cfg(server, samples=SAMPLES, seed=5, n_per_request=True), tmp_path / "n", prompts
        )
        n_requests = server.request_count - per_sample_requests
    assert (per_sample_requests, n_requests) == (N_PROMPTS * SAMPLES, N_PROMPTS)
    assert {r.json["n"] for r in server.received[per_sample_requests:]} == {SAMPLES}
    recs = assert_exactly_once(tmp_path / "n" / "generations.jsonl", N_PROMPTS, SAMPLES)
    assert _outputs(tmp_path / "n" / "generations.jsonl") == _outputs(
        tmp_path / "single" / "generations.jsonl"
    )
    assert len({r["request_hash"] for r in recs if r["id"] == "p000"}) == 1  # one body for the prompt
    assert batched["tokens"]["prompt"] * SAMPLES == single["tokens"]["prompt"]
    assert batched["tokens"]["completion"] == single["tokens"]["completion"]
    usage = [r["usage"]["prompt_tokens"] for r in recs if r["id"] == "p000"]
    assert usage.count(0) == SAMPLES - 1 and sum(usage) > 0  # the request's usage on one sample


def test_a_server_that_ignores_n_leaves_error_records_saying_so(tmp_path: Path) -> None:
    """Only one choice back for n=4: samples 1-3 are errors that name the setting to change."""
    prompts = write_prompts(tmp_path / "prompts.jsonl", 3)
    with FakeServer(supports_n=False) as server:
        generate_for_job(openai_cfg(server, samples=SAMPLES, n_per_request=True), tmp_path / "out", prompts)
    recs = assert_exactly_once(tmp_path / "out" / "generations.jsonl", 3, SAMPLES)
    errors = [r for r in recs if r["error"] is not None]
    assert sorted(r["sample"] for r in errors) == [1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert errors[0]["error"] == (
        "the server answered 1 of the 4 choices asked for with n=4; it ignores n: set provider.n_per_request=false"
    )


def test_a_resumed_run_asks_again_only_for_prompts_with_missing_samples(tmp_path: Path) -> None:
    """Samples lost from the journal are asked for again with one n= request per prompt; the rest stay."""
    prompts = write_prompts(tmp_path / "prompts.jsonl", N_PROMPTS)
    out = tmp_path / "out"
    with FakeServer() as server:
        cfg = openai_cfg(server, samples=SAMPLES, seed=2, n_per_request=True)
        generate_for_job(cfg, out, prompts)
        journal = out / "generations.jsonl"
        full = _outputs(journal)
        kept = [
            line
            for line in journal.read_bytes().splitlines(keepends=True)
            if json.loads(line)["id"] not in ("p003", "p007") or json.loads(line)["sample"] == 0
        ]
        journal.write_bytes(b"".join(kept))
        before = server.request_count
        _, stats = generate_for_job(cfg, out, prompts)
        assert server.request_count - before == 2
    assert_exactly_once(journal, N_PROMPTS, SAMPLES)
    assert _outputs(journal) == full and stats["resumed"] == N_PROMPTS * SAMPLES - 6


def test_n_answers_replay_from_the_cache(tmp_path: Path) -> None:
    """An n= answer is cached whole: replay=only rebuilds the journal byte for byte with no server."""
    prompts = write_prompts(tmp_path / "prompts.jsonl", 5)
    cache = {"cache": {"path": str(tmp_path / "cache.sqlite")}}
    with FakeServer() as server:
        cfg = openai_cfg(server, samples=3, seed=1, n_per_request=True, root=cache)
        replay = openai_cfg(server, samples=3, seed=1, n_per_request=True, replay="only", root=cache)
        first, _ = generate_for_job(cfg, tmp_path / "a", prompts)
    again, stats = generate_for_job(replay, tmp_path / "b", prompts)
    # generate_for_job writes in completion order (the job sorts): the same lines, byte for byte
    assert sorted(again.read_bytes().splitlines()) == sorted(first.read_bytes().splitlines())
    assert stats["cache_hits"] == 5


@pytest.mark.parametrize(
    ("conf", "expected"),
    [
        pytest.param(OpenAIProviderConf(model="m", samples=4, n_per_request="auto"), True, id="auto-openai"),
        pytest.param(OllamaProviderConf(model="m", samples=4, n_per_request="auto"), False, id="auto-ollama"),
        pytest.param(OpenAIProviderConf(model="m", samples=1, n_per_request=True), False, id="one-sample"),
        pytest.param(OpenAIProviderConf(model="m", samples=4), False, id="default-off"),
        pytest.param(
            OpenAIProviderConf(
                model="m", samples=4, n_per_request="auto", prefix_continuation="prefix_field"
            ),
            False,
            id="auto-prefill",
        ),
        pytest.param(
            OllamaProviderConf(model="m", samples=4, n_per_request=True),
            pytest.raises(ConfigError, match=re.escape("Ollama's /api/chat has no n")),
            id="true-ollama",
        ),
        pytest.param(
            OpenAIProviderConf(model="m", samples=4, n_per_request="sometimes"),
            pytest.raises(
                ConfigError, match=re.escape("provider.n_per_request must be one of auto, true, false")
            ),
            id="bad-value",
        ),
    ],
)
def test_when_n_is_used(conf: ProviderConf, expected: object) -> None:
    """auto means n on the OpenAI-compatible API and never on Ollama's; a wrong choice is a ConfigError."""
    if isinstance(expected, bool):
        assert use_n(conf) is expected
    else:
        with expected:  # type: ignore[attr-defined]
            conf.check()
            use_n(conf)


def test_ollama_cfg_is_unchanged_by_default(tmp_path: Path) -> None:
    """The default (n_per_request=false) keeps one request per sample on every provider."""
    prompts = write_prompts(tmp_path / "prompts.jsonl", 2)
    with FakeServer() as server:
        generate_for_job(ollama_cfg(server, samples=2), tmp_path / "out", prompts)
        assert server.request_count == 4
