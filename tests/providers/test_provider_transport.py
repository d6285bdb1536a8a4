"""The run's HTTP session: N workers reuse N keep-alive connections, and proxies come from the environment."""

from __future__ import annotations

import base64

import pytest
from provider_support import assert_exactly_once, openai_cfg, write_prompts

from storyforge.providers import generate_for_job
from storyforge.providers.transport import environment_proxy
from tests.support.fake_server import FakeServer

_PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


@pytest.fixture
def clean_proxy_env(monkeypatch):
    """No proxy variable from the surrounding environment leaks into the test."""
    for name in _PROXY_VARS:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    return monkeypatch


@pytest.mark.parametrize(("concurrency", "latency_s"), [(1, 0.0), (3, 0.0), (8, 0.005)])
def test_workers_reuse_one_connection_each_for_the_whole_run(tmp_path, concurrency, latency_s):
    """40 requests through N workers open exactly N connections: keep-alive, no per-request handshake
    (and one more before them, where the run reads what serves the model)."""
    prompts = write_prompts(tmp_path / "prompts.jsonl", 40)
    with FakeServer(latency_s=latency_s) as server:
        generate_for_job(openai_cfg(server, concurrency=concurrency), tmp_path, prompts)
        assert server.connection_count == concurrency + 1
        assert server.request_count == 40
    assert_exactly_once(tmp_path / "generations.jsonl", 40, 1)


def test_remote_endpoint_goes_through_the_environment_proxy(clean_proxy_env, tmp_path):
    """With HTTP_PROXY set, a remote endpoint is asked through the proxy, with the proxy's credentials."""
    prompts = write_prompts(tmp_path / "prompts.jsonl", 3)
    with FakeServer() as proxy:
        clean_proxy_env.setenv("HTTP_PROXY", f"http://scott:tiger@127.0.0.1:{proxy.port}")
        cfg = openai_cfg(proxy, base_url="http://models.example/v1")
        _, stats = generate_for_job(cfg, tmp_path, prompts)
        seen = list(proxy.received)
    assert_exactly_once(tmp_path / "generations.jsonl", 3, 1)
    assert stats["errors"] == 0
    assert {r.path for r in seen} == {"http://models.example/v1/chat/completions"}
    token = base64.b64encode(b"scott:tiger").decode()
    assert {r.headers.get("proxy-authorization") for r in seen} == {f"Basic {token}"}


def test_loopback_endpoint_is_never_proxied(clean_proxy_env, tmp_path):
    """A proxy in the environment (here one that does not exist) is not used for a 127.0.0.1 endpoint."""
    prompts = write_prompts(tmp_path / "prompts.jsonl", 3)
    clean_proxy_env.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    clean_proxy_env.setenv("ALL_PROXY", "http://127.0.0.1:9")
    with FakeServer() as server:
        _, stats = generate_for_job(openai_cfg(server, max_retries=0), tmp_path, prompts)
        assert {r.path for r in server.received} == {"/v1/chat/completions"}
    assert stats["errors"] == 0
    assert_exactly_once(tmp_path / "generations.jsonl", 3, 1)


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
def test_environment_proxy(clean_proxy_env, env, url, expected):
    """The endpoint's proxy follows HTTP(S)_PROXY/ALL_PROXY/NO_PROXY, and loopback is never proxied."""
    for name, value in env.items():
        clean_proxy_env.setenv(name, value)
    assert environment_proxy(url) == expected
