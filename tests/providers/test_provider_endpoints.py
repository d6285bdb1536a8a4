"""provider.base_url as a list: spread over endpoints, a dead one taken out and back, stop when all are down."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from provider_support import FAST, assert_exactly_once, write_prompts

from storyforge.config.provider import GenerationSettings, OpenAIProviderConf, generation_settings
from storyforge.errors import ConfigError, ProviderError
from storyforge.providers import generate_for_job
from storyforge.providers.runner import provider_conf
from tests.support.fake_server import FakeServer


def _cfg(urls: list[str], **overrides: object) -> GenerationSettings:
    settings = {"base_url": urls, "model": "m", "concurrency": 2, "timeout_s": 5.0, **FAST, **overrides}
    return generation_settings(
        OmegaConf.create({"provider": OmegaConf.structured(OpenAIProviderConf(**settings))})
    )


def _when(condition: object, then: object, limit_s: float = 30.0) -> threading.Thread:
    """Run ``then()`` on a thread as soon as ``condition()`` holds."""

    def watch() -> None:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            if condition():  # type: ignore[operator]
                then()  # type: ignore[operator]
                return
            time.sleep(0.002)

    thread = threading.Thread(target=watch)
    thread.start()
    return thread


def test_requests_are_spread_over_every_endpoint(tmp_path: Path) -> None:
    """Two healthy endpoints with concurrency 2 each both get a fair share of the work."""
    prompts = write_prompts(tmp_path / "prompts.jsonl", 60)
    with FakeServer(latency_s=0.01) as a, FakeServer(latency_s=0.01) as b:
        _, stats = generate_for_job(_cfg([a.base_url, b.base_url]), tmp_path / "out", prompts)
    assert_exactly_once(tmp_path / "out" / "generations.jsonl", 60, 1)
    assert a.request_count + b.request_count == 60 and min(a.request_count, b.request_count) >= 15
    assert stats["errors"] == 0


def test_an_endpoint_killed_mid_run_is_taken_out_and_brought_back(tmp_path: Path) -> None:
    """Stop one server mid-run: the other carries on; once it is back on its port it gets requests again."""
    n = 200
    prompts = write_prompts(tmp_path / "prompts.jsonl", n)
    with FakeServer(latency_s=0.03) as a, FakeServer(latency_s=0.03) as b:
        port = a.port
        revived: list[FakeServer] = []

        def kill_then_revive() -> None:
            a.stop()
            time.sleep(1.5)
            revived.append(FakeServer(latency_s=0.03, port=port).start())

        watcher = _when(lambda: a.request_count >= 20, kill_then_revive)
        try:
            _, stats = generate_for_job(_cfg([a.base_url, b.base_url]), tmp_path / "out", prompts)
        finally:
            watcher.join()
            for server in revived:
                server.stop()
    records = assert_exactly_once(tmp_path / "out" / "generations.jsonl", n, 1)
    assert all(r["error"] is None for r in records)
    assert stats["errors"] == 0
    assert revived and revived[0].request_count > 0, "the endpoint was never tried again"
    assert 20 <= a.request_count < n - 20 and b.request_count > n // 2


def test_the_run_stops_only_when_every_endpoint_is_down(tmp_path: Path) -> None:
    """Both servers gone: after fail_fast_s a ProviderError names each endpoint; what finished is kept."""
    prompts = write_prompts(tmp_path / "prompts.jsonl", 200)
    out = tmp_path / "out"
    with FakeServer(latency_s=0.02) as a, FakeServer(latency_s=0.02) as b:
        urls = [a.base_url, b.base_url]

        def stop_both() -> None:
            a.stop()
            b.stop()

        watcher = _when(lambda: a.request_count + b.request_count >= 30, stop_both)
        with pytest.raises(ProviderError, match=r"every endpoint has been down for \d+s") as caught:
            generate_for_job(_cfg(urls, fail_fast_s=1.0), out, prompts)
        watcher.join()
    message = str(caught.value)
    for url in urls:
        assert re.search(
            re.escape(url.removesuffix("/v1")) + r"/v1/chat/completions: connection failed", message
        )
    written = (out / "generations.jsonl").read_bytes()
    assert written.endswith(b"\n") and 20 <= written.count(b"\n") < 200


@pytest.mark.parametrize(
    ("base_url", "message"),
    [
        pytest.param([], "provider.base_url must be a URL or a non-empty list of URLs, got []", id="empty"),
        pytest.param(
            ["http://a/v1", "b:1/v1"],
            "provider.base_url[1] must start with http:// or https://",
            id="bad-item",
        ),
        pytest.param(["http://a/v1", "http://a/v1"], "provider.base_url lists an endpoint twice", id="twice"),
    ],
)
def test_bad_endpoint_lists_name_the_key(base_url: list[str], message: str) -> None:
    """A bad list is a ConfigError naming the key (and the item)."""
    cfg = OmegaConf.create({"provider": {"name": "openai", "model": "m", "base_url": base_url}})
    with pytest.raises(ConfigError, match=re.escape(message)):
        provider_conf(cfg)  # type: ignore[arg-type]
