"""The run's HTTP client: one reused connection per worker, and proxies taken from the environment."""

from __future__ import annotations

import pytest
from provider_support import assert_exactly_once, openai_cfg, write_prompts

from storyforge.providers import generate_for_job
from storyforge.providers.transport import environment_proxy

_PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


@pytest.mark.parametrize("concurrency", [1, 3])
def test_each_worker_keeps_one_connection_for_the_whole_run(server, tmp_path, concurrency):
    """30 requests through N workers open exactly N connections: keep-alive, no per-request handshake."""
    prompts = write_prompts(tmp_path / "prompts.jsonl", 30)
    generate_for_job(openai_cfg(server, concurrency=concurrency), tmp_path, prompts)
    assert_exactly_once(tmp_path / "generations.jsonl", 30, 1)
    assert server.connection_count == concurrency


@pytest.mark.parametrize(
    ("env", "url", "expected"),
    [
        (
            {"HTTP_PROXY": "http://proxy:3128"},
            "http://models.example/v1/chat/completions",
            "http://proxy:3128",
        ),
        ({"HTTPS_PROXY": "proxy:8443"}, "https://api.example/v1/chat/completions", "http://proxy:8443"),
        ({"ALL_PROXY": "http://all:1"}, "https://api.example/v1", "http://all:1"),
        ({"HTTP_PROXY": "http://proxy:3128", "NO_PROXY": "models.example"}, "http://models.example/v1", None),
        ({"HTTP_PROXY": "http://proxy:3128"}, "http://127.0.0.1:8000/v1", None),
        ({"HTTP_PROXY": "http://proxy:3128"}, "http://localhost:11434/api/chat", None),
        ({}, "http://models.example/v1", None),
    ],
    ids=["http", "https-bare", "all", "no-proxy", "loopback-ip", "localhost", "none"],
)
def test_environment_proxy(monkeypatch, env, url, expected):
    """The endpoint's proxy follows HTTP(S)_PROXY/ALL_PROXY/NO_PROXY, and loopback is never proxied."""
    for name in _PROXY_VARS:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert environment_proxy(url) == expected
