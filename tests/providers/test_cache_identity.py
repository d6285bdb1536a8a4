"""The response cache answers only for the server that gave the answer; queues and timeouts are said.

Every test runs real HTTP on loopback against :class:`Scripted`, a small server whose answers,
``/props`` and ``/v1/models`` each test chooses.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Self

import pytest
from aiohttp import web
from provider_support import REPO, ollama_cfg, openai_cfg, write_prompts

from storyforge.errors import ConfigError, ProviderError
from storyforge.providers.runner import generate_for_job
from tests.support.fake_server import FakeServer

N = 6


class Scripted:
    """A loopback OpenAI-compatible server: answers tagged ``tag``; ``props``/``models`` (None:
    404) are what it reports; the first ``stall`` chat requests wait ``stall_s`` first."""

    def __init__(
        self,
        tag: str,
        *,
        props: dict[str, Any] | None = None,
        models: list[dict[str, Any]] | None = None,
        tags: list[dict[str, Any]] | None = None,
        probe_status: int = 200,
        stall: int = 0,
        stall_s: float = 5.0,
    ) -> None:
        self.tag, self.props, self.models, self.tags = tag, props, models, tags
        self.stall, self.stall_s = stall, stall_s
        self.probe_status = probe_status
        self.chats = 0
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def host(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _ollama_chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.chats += 1
        text = f"{self.tag} answers {body['messages'][-1]['content']}"
        return web.json_response(
            {"model": body["model"], "message": {"role": "assistant", "content": text}, "done": True}
        )

    async def _tags(self, _: web.Request) -> web.Response:
        if self.tags is None:
            return web.json_response({"error": "no route"}, status=404)
        return web.json_response({"models": self.tags})

    async def _chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.chats += 1
        if self.chats <= self.stall:
            await asyncio.sleep(self.stall_s)
        text = f"{self.tag} answers {body['messages'][-1]['content']} with seed {body.get('seed')}"
        return web.json_response(
            {
                "model": body["model"],
                "choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 7},
            }
        )

    async def _props(self, _: web.Request) -> web.Response:
        if self.probe_status != 200:
            return web.json_response({"error": "Loading model"}, status=self.probe_status)
        if self.props is None:
            return web.json_response({"error": "no route"}, status=404)
        return web.json_response(self.props)

    async def _models(self, _: web.Request) -> web.Response:
        if self.models is None:
            return web.json_response({"error": "no route"}, status=404)
        return web.json_response({"object": "list", "data": self.models})

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/props", self._props)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/api/chat", self._ollama_chat)
        app.router.add_get("/api/tags", self._tags)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def __enter__(self) -> Self:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._runner is not None
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


def _cfg(server: Scripted | FakeServer, cache: Path, **more: Any) -> Any:
    return openai_cfg(server, seed=1, fail_fast_s=1.0, root={"cache": {"path": str(cache)}}, **more)  # type: ignore[arg-type]


def _outputs(path: Path) -> list[str]:
    return sorted(json.loads(line)["output"] for line in path.read_text("utf-8").splitlines())


@pytest.fixture
def prompts(tmp_path: Path) -> Path:
    return write_prompts(tmp_path / "prompts.jsonl", N)


LLAMA_A = {"model_path": "/models/a.gguf", "total_slots": 4}
LLAMA_B = {"model_path": "/models/b.gguf", "total_slots": 4}


def _listing(root: str) -> list[dict[str, Any]]:
    return [{"id": "m", "object": "model", "root": root, "owned_by": "vllm", "created": 1}]


@pytest.mark.parametrize(
    ("first", "second"),
    [
        pytest.param({}, {}, id="nothing-reported-so-the-base-url"),
        pytest.param({"props": LLAMA_A}, {"props": LLAMA_B}, id="llama-props-another-file"),
        pytest.param({"models": _listing("org/a")}, {"models": _listing("org/b")}, id="models-another-root"),
    ],
)
def test_the_same_model_name_on_another_server_is_not_answered_from_the_cache(
    tmp_path: Path, prompts: Path, first: dict[str, Any], second: dict[str, Any]
) -> None:
    cache = tmp_path / "cache.sqlite"
    with Scripted("first", **first) as one:
        generate_for_job(_cfg(one, cache), tmp_path / "a", prompts)
    with Scripted("second", **second) as two:
        path, stats = generate_for_job(_cfg(two, cache), tmp_path / "b", prompts)
        assert two.chats == N
    assert all(text.startswith("second answers") for text in _outputs(path))
    assert stats["cache"]["answers_from_server"] == N and stats["cache"]["answers_from_cache"] == 0


@pytest.mark.parametrize(
    "reported",
    [
        pytest.param({"props": LLAMA_A}, id="llama-props"),
        pytest.param({"models": _listing("org/a")}, id="models"),
    ],
)
def test_replicas_that_report_the_same_server_share_answers(
    tmp_path: Path, prompts: Path, reported: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    cache = tmp_path / "cache.sqlite"
    with Scripted("first", **reported) as one:
        first, _ = generate_for_job(_cfg(one, cache), tmp_path / "a", prompts)
    with Scripted("replica", **reported) as two, caplog.at_level(logging.INFO):
        again, stats = generate_for_job(_cfg(two, cache), tmp_path / "b", prompts)
        assert two.chats == 0
    assert _outputs(again) == _outputs(first)
    assert stats["cache"]["answers_from_cache"] == N
    assert f"{N} of {N} answers from the response cache ({cache})" in caplog.text
    assert stats["cache"]["identity"]["source"] == next(iter(reported))


def _tags(digest: str) -> list[dict[str, Any]]:
    return [{"name": "llama3:latest", "model": "llama3:latest", "digest": digest, "size": 1}]


@pytest.mark.parametrize(("second", "shared"), [("d1", True), ("d2", False)])
def test_ollama_servers_share_answers_only_for_the_same_model_digest(
    tmp_path: Path, prompts: Path, second: str, shared: bool
) -> None:
    cache = {"cache": {"path": str(tmp_path / "cache.sqlite")}}
    with Scripted("first", tags=_tags("d1")) as one:
        generate_for_job(ollama_cfg(one, root=cache), tmp_path / "a", prompts)  # type: ignore[arg-type]
    with Scripted("second", tags=_tags(second)) as two:
        path, stats = generate_for_job(ollama_cfg(two, root=cache), tmp_path / "b", prompts)  # type: ignore[arg-type]
        assert two.chats == (0 if shared else N)
    assert all(text.startswith("first" if shared else "second") for text in _outputs(path))
    assert stats["cache"]["identity"]["source"] == "tags"


def test_a_dead_url_with_every_answer_cached_is_not_answered_from_the_cache(
    tmp_path: Path, prompts: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The probe cannot reach the server: the cache is not read, and the run stops as a dead URL does."""
    cache = tmp_path / "cache.sqlite"
    with Scripted("first") as one:
        generate_for_job(_cfg(one, cache), tmp_path / "a", prompts)
        url = one.base_url
    with Scripted("unused") as other:
        settings = _cfg(other, cache, base_url=url)
    with caplog.at_level(logging.WARNING), pytest.raises(ProviderError, match="no answer from"):
        generate_for_job(settings, tmp_path / "b", prompts)
    assert "the response cache is not read in this run" in caplog.text


def test_a_dead_url_run_exits_4_and_says_where_answers_would_have_come_from(tmp_path: Path) -> None:
    """The documented exit-4 row holds with a full cache: the terminal and run.log say why."""
    cache = tmp_path / "cache.sqlite"
    args = [
        "task.n_seeds=2",
        "provider=openai",
        "provider.model=m",
        "provider.progress=false",
        f"cache.path={cache}",
    ]
    with FakeServer() as server:
        proc = subprocess.run(
            [
                sys.executable,
                "run.py",
                *args,
                f"provider.base_url={server.base_url}",
                f"hydra.run.dir={tmp_path / 'a'}",
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        line = f"0 of 2 answers from the response cache ({cache})"
        assert line in proc.stdout + proc.stderr
        assert line in (tmp_path / "a" / "run.log").read_text("utf-8")
        url = server.base_url
    proc = subprocess.run(
        [
            sys.executable,
            "run.py",
            *args,
            f"provider.base_url={url}",
            "provider.fail_fast_s=1",
            f"hydra.run.dir={tmp_path / 'b'}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 4, proc.stderr
    said = proc.stdout + proc.stderr
    assert f"no answer from {url}/chat/completions" in said
    assert "the response cache is not read in this run" in said
    assert "the response cache is not read in this run" in (tmp_path / "b" / "run.log").read_text("utf-8")


def test_a_server_that_cannot_tell_what_it_serves_yet_is_not_answered_from_the_cache(
    tmp_path: Path, prompts: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """llama.cpp answers 503 while it loads: the run asks it, says why, and caches nothing."""
    cache = tmp_path / "cache.sqlite"
    with Scripted("first", props=LLAMA_A) as one:
        generate_for_job(_cfg(one, cache), tmp_path / "a", prompts)
    with Scripted("loading", probe_status=503) as two, caplog.at_level(logging.INFO):
        path, stats = generate_for_job(_cfg(two, cache), tmp_path / "b", prompts)
        assert two.chats == N
    assert all(text.startswith("loading answers") for text in _outputs(path))
    assert "HTTP 503 from /props" in caplog.text
    assert f"0 of {N} answers from the response cache (not read: " in caplog.text
    assert stats["cache"]["identity"] is None


def test_a_pinned_identity_shares_answers_on_purpose_and_replays_with_no_server(
    tmp_path: Path, prompts: Path
) -> None:
    cache = tmp_path / "cache.sqlite"
    with Scripted("first") as one:
        first, stats = generate_for_job(_cfg(one, cache, cache_identity="shared"), tmp_path / "a", prompts)
    with Scripted("second") as two:
        again, _ = generate_for_job(_cfg(two, cache, cache_identity="shared"), tmp_path / "b", prompts)
        assert two.chats == 0
        url = two.base_url
    assert _outputs(again) == _outputs(first)
    assert stats["cache"]["identity"]["source"] == "pinned"
    with Scripted("unused") as other:
        settings = _cfg(other, cache, base_url=url, cache_identity="shared")
    replayed, stats = generate_for_job(settings, tmp_path / "c", prompts)  # nothing listens at url
    assert _outputs(replayed) == _outputs(first) and stats["cache"]["answers_from_cache"] == N


def test_a_replay_uses_the_server_its_journal_recorded(tmp_path: Path, prompts: Path) -> None:
    """Two servers answered the same requests: a replay in a run's directory takes that run's
    answers; elsewhere it must be told which (the digest its manifest recorded)."""
    cache = tmp_path / "cache.sqlite"
    with Scripted("first") as one:
        generate_for_job(_cfg(one, cache), tmp_path / "a", prompts)
    with Scripted("second") as two:
        second, stats = generate_for_job(_cfg(two, cache), tmp_path / "b", prompts)
        url = two.base_url
    digest = stats["cache"]["identity"]["digest"]
    with Scripted("unused") as other:
        replay = _cfg(other, cache, base_url=url, replay="only")
        pinned = _cfg(other, cache, base_url=url, replay="only", cache_identity=digest)
    full = second.read_bytes()
    second.write_bytes(b"".join(full.splitlines(keepends=True)[:2]))  # a copied run, partly done
    generate_for_job(replay, tmp_path / "b", prompts)
    assert sorted(second.read_bytes().splitlines()) == sorted(full.splitlines())
    with pytest.raises(ConfigError, match=f"from 2 servers: .*{digest}.*provider.cache_identity=DIGEST"):
        generate_for_job(replay, tmp_path / "c", prompts)
    elsewhere, _ = generate_for_job(pinned, tmp_path / "d", prompts)
    assert sorted(elsewhere.read_bytes().splitlines()) == sorted(full.splitlines())


def test_concurrency_above_the_servers_slots_is_warned_with_the_numbers(
    tmp_path: Path, prompts: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with Scripted("slots", props={"model_path": "/m.gguf", "total_slots": 2}) as server:
        with caplog.at_level(logging.WARNING):
            generate_for_job(_cfg(server, tmp_path / "c.sqlite", concurrency=8), tmp_path / "a", prompts)
        expected = (
            f"provider.concurrency=8 is above the 2 slot(s) {server.base_url} reports (/props total_slots): "
            "6 request(s) at a time wait in the server's queue, and that wait counts against "
            "provider.timeout_s=5"
        )
    assert [r.getMessage() for r in caplog.records].count(expected) == 1


def test_timeouts_are_counted_shown_and_logged_once_per_kind(
    tmp_path: Path, prompts: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    with Scripted("slow", stall=3, stall_s=3.0) as server:
        settings = _cfg(server, tmp_path / "c.sqlite", concurrency=1, timeout_s=0.2, progress=True)
        with caplog.at_level(logging.WARNING):
            path, stats = generate_for_job(settings, tmp_path / "a", prompts)
    assert stats["timeouts"] == 3 and stats["retries"] == 3 and stats["errors"] == 0
    assert len(_outputs(path)) == N
    lines = [r.getMessage() for r in caplog.records if "were retried" in r.getMessage()]
    assert lines == [
        (
            "3 request(s) timed out and were retried (no complete answer within provider.timeout_s=0.2, "
            "which counts the wait in the server's queue)"
        )
    ]
    assert "timeouts=3" in capsys.readouterr().err


def _put(cache: Path, value: str) -> None:
    con = sqlite3.connect(cache)
    with con:
        con.execute("UPDATE responses SET value = ? WHERE key = (SELECT min(key) FROM responses)", (value,))
    con.close()


GOOD = {
    "output": "x",
    "finish_reason": "stop",
    "prompt_tokens": 1,
    "completion_tokens": 1,
    "served_model": None,
    "prefill_echo_stripped": False,
    "attempts": 1,
    "latency_s": 0.1,
}


@pytest.mark.parametrize(
    "change",
    [
        {"prompt_tokens": "12"},
        {"completion_tokens": [1]},
        {"finish_reason": 3},
        {"served_model": {"a": 1}},
        {"prefill_echo_stripped": "yes"},
        {"attempts": True},
        {"latency_s": "slow"},
        {"choices": "many"},
        {"choices": [{"output": 1}]},
    ],
    ids=lambda change: next(iter(change)),
)
def test_a_cache_entry_with_wrong_typed_fields_is_a_miss_said_once(
    tmp_path: Path, prompts: Path, change: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    cache = tmp_path / "cache.sqlite"
    with Scripted("first") as server:
        first, _ = generate_for_job(_cfg(server, cache), tmp_path / "a", prompts)
        _put(cache, json.dumps({**GOOD, **change}))
        with caplog.at_level(logging.WARNING):
            again, stats = generate_for_job(_cfg(server, cache), tmp_path / "b", prompts)
        assert server.chats == N + 1
    assert _outputs(again) == _outputs(first)
    assert stats["cache"]["answers_from_cache"] == N - 1
    assert len([r for r in caplog.records if "does not read back" in r.getMessage()]) == 1


def test_a_cache_file_whose_table_has_other_columns_is_not_used_said_once(
    tmp_path: Path, prompts: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = tmp_path / "cache.sqlite"
    con = sqlite3.connect(cache)
    with con:
        con.execute("CREATE TABLE responses (key TEXT PRIMARY KEY, answer TEXT)")
    con.close()
    with Scripted("first") as server:
        for run in ("a", "b"):
            caplog.clear()
            with caplog.at_level(logging.WARNING):
                path, stats = generate_for_job(_cfg(server, cache), tmp_path / run, prompts)
            said = [r.getMessage() for r in caplog.records if "is not read or written" in r.getMessage()]
            assert said == [
                (
                    f"the response cache {cache} has a table responses with the columns (key, answer), not "
                    "(key, value); it is not read or written in this run (delete the file, or set cache.path "
                    "to another one)"
                )
            ]
            assert len(_outputs(path)) == N and stats["cache"]["answers_from_server"] == N
        assert server.chats == 2 * N
    shutil.rmtree(tmp_path / "a")
