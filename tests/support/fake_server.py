"""A loopback model server speaking the OpenAI chat-completions and Ollama chat APIs, with faults.

Takes: settings (per-request latency, an API key to demand, a queue of :class:`Fault` values
and/or a rule choosing a fault per request, which prefill dialects to accept). Gives:
:class:`FakeServer`, a real HTTP/1.1 server on 127.0.0.1 running on its own thread and event
loop, so tests, benchmarks and subprocesses talk to it over real sockets exactly as they
would to vLLM or Ollama. ``python -m tests.support.fake_server --latency 0.05 &``, run from
the checkout's root, serves from a separate process (also in the background) until SIGTERM or
Ctrl-C, and prints its port.

Why here: the provider tests, the benchmarks and the docs' trial runs need the same server.
It uses only the standard library (an asyncio protocol).

Routes: ``POST .../chat/completions`` (OpenAI) and ``POST /api/chat`` (Ollama); with a
``tokenize`` handler, also vLLM's ``POST /tokenize`` and ``POST /detokenize``. Replies are
deterministic. With ``replies="story"`` (the default) a conversation holding a TinyStories
instruction (a first request, or a repair conversation after a failed answer) gets a short
made-up story chosen by a hash of the request (messages, seed, choice): most include every
required phrase and keep to the sentence range, some miss a phrase, use a banned one or run
long, so checks, exports and sweep reports made from it have passing and failing rows; a share
``cut_off`` of them stop at a word with finish reason ``length``. A request asking for JSON
under a schema (OpenAI ``response_format``, llama-server's ``json_schema``, Ollama's ``format``:
a judge's request) gets a value valid under it, with ``verdict`` ``fail`` for a share
``judge_fail`` and, for a share ``judge_broken``, the JSON cut off halfway. Any other request,
and every request with ``replies="echo"``, gets ``reply to: <last user message>`` plus
`` seed=<n>`` when a seed was sent and `` (continuing)`` when the request asked to continue a
prefill (an echo, for the provider tests; never what a model does). Content given as parts
(``[{"type": "text", "text": ...}]``) is read as its text; an empty ``messages`` is a 400.
``script`` decides an answer's text (and finish reason) from the request. A request with ``n`` gets
``n`` choices; choice ``k`` reads as the answer to the same request with ``seed + k`` (or ends
with `` choice=<k>`` when no seed was sent), and ``usage`` counts the prompt once. Faults: an
HTTP status with optional ``Retry-After``, a stall longer than the client's timeout, an answer
trickled out slowly, malformed JSON, a connection cut halfway through the body, and a
connection closed with no answer.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import hashlib
import json
import os
import random
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from http import HTTPStatus
from typing import Any, Self

__all__ = ["FakeServer", "Fault", "Received"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Fault:
    """What to do to one request instead of answering it normally.

    ``kind``: ``status`` (answer ``status`` with ``body`` and ``headers``), ``stall`` (wait
    ``seconds`` before answering), ``malformed`` (200 with ``body`` that is not the API's
    JSON), ``cut`` (send headers and half the body, then close), ``drop`` (close at once),
    ``trickle`` (send the normal answer in 16 pieces spread over ``seconds``, so that no
    single read waits long but the whole answer takes that long).
    """

    kind: str
    status: int = 500
    body: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    seconds: float = 0.0

    @classmethod
    def http(cls, status: int, message: str | None = None, *, retry_after: str | None = None) -> Fault:
        text = message or HTTPStatus(status).phrase
        headers = (("Retry-After", retry_after),) if retry_after is not None else ()
        return cls(
            kind="status", status=status, body=json.dumps({"error": {"message": text}}), headers=headers
        )

    @classmethod
    def rate_limited(cls, retry_after: str = "0") -> Fault:
        return cls.http(429, "Rate limit reached, slow down", retry_after=retry_after)

    @classmethod
    def stall(cls, seconds: float) -> Fault:
        return cls(kind="stall", seconds=seconds)

    @classmethod
    def malformed(cls, body: str = '{"choices": [{"message": ') -> Fault:
        return cls(kind="malformed", body=body)

    @classmethod
    def cut(cls) -> Fault:
        return cls(kind="cut")

    @classmethod
    def drop(cls) -> Fault:
        return cls(kind="drop")

    @classmethod
    def trickle(cls, seconds: float) -> Fault:
        return cls(kind="trickle", seconds=seconds)


@dataclass(frozen=True, slots=True, kw_only=True)
class Received:
    """One request as the server saw it (``json`` is None when the body was not JSON)."""

    method: str
    path: str
    headers: Mapping[str, str]
    json: Any
    fault: Fault | None = field(default=None)


Rule = Callable[[Received], "Fault | None"]
Script = Callable[[Mapping[str, Any]], "str | tuple[str, str] | None"]
"""Decides an OpenAI answer from the request body: its text, or (text, finish reason), or None
for the default reply (a text alone ends with finish reason ``stop``)."""


class FakeServer:
    """Real HTTP on 127.0.0.1; start with ``with FakeServer(...) as server:``."""

    def __init__(
        self,
        *,
        latency_s: float = 0.0,
        api_key: str | None = None,
        faults: Iterable[Fault] = (),
        rule: Rule | None = None,
        prefix_dialects: Iterable[str] = ("continue_final_message", "prefix_field", "trailing_assistant"),
        port: int = 0,
        record: bool = True,
        served_model: str | None = None,
        echo_prefill: bool = False,
        supports_n: bool = True,
        script: Script | None = None,
        replies: str = "story",
        judge_fail: float = 0.1,
        judge_broken: float = 0.0,
        cut_off: float = 0.0,
        tokenize: Callable[[str, dict[str, Any]], tuple[int, Any]] | None = None,
    ) -> None:
        if replies not in REPLIES:
            raise ValueError(f"replies must be one of {', '.join(REPLIES)}, got {replies!r}")
        for name, share in (("judge_fail", judge_fail), ("judge_broken", judge_broken), ("cut_off", cut_off)):
            if not 0.0 <= share <= 1.0:
                raise ValueError(f"{name} must be a share from 0 to 1, got {share!r}")
        self.latency_s = latency_s
        # "story" makes up a TinyStories story per request (and a verdict per judge request);
        # "echo" answers every request "reply to: <prompt>".
        self.replies = replies
        # Story mode: the share of verdicts that fail, of verdicts that are not JSON, and of
        # stories cut off at a word (finish_reason "length").
        self.judge_fail = judge_fail
        self.judge_broken = judge_broken
        self.cut_off = cut_off
        # vLLM's ``POST /tokenize`` and ``/detokenize``: ``tokenize(path, body)`` answers them
        # (the drift gate's tests pass one built on transformers, the renderer vLLM uses)
        self.tokenize = tokenize
        # Answer with this model name whatever was asked for (a single-model server).
        self.served_model = served_model
        # Repeat the prefill at the start of a continued answer, as llama.cpp's server does.
        self.echo_prefill = echo_prefill
        # Answer n choices when a request asks for them; False ignores n, as some servers do.
        self.supports_n = supports_n
        # Scripted answers (e.g. a story that fails its checks on the first attempt).
        self.script = script
        self.api_key = api_key
        self.rule = rule
        self.prefix_dialects = frozenset(prefix_dialects)
        self.received: list[Received] = []
        self.record = record
        self.request_count = 0
        self.connection_count = 0
        self._faults: collections.deque[Fault] = collections.deque(faults)
        self._lock = threading.Lock()
        self._port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._connections: set[_Connection] = set()

    # ---- lifecycle -------------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the server is not running")
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def base_url(self) -> str:
        """OpenAI-style base URL (``provider.base_url``)."""
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def host(self) -> str:
        """Ollama-style host (``provider.host``)."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Self:
        loop = asyncio.new_event_loop()
        self._loop = loop
        ready = threading.Event()
        failed: list[OSError] = []

        def serve() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._open())
            except OSError as exc:  # the port is taken (or not ours to bind)
                failed.append(exc)
                loop.close()
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._close())
            loop.close()

        self._thread = threading.Thread(target=serve, name="storyforge-fake-server", daemon=True)
        self._thread.start()
        ready.wait()
        if failed:
            self._thread.join()
            self._loop = None
            self._thread = None
            raise failed[0]
        return self

    def stop(self) -> None:
        if self._loop is None or self._thread is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop = None
        self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _open(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Connection(self), "127.0.0.1", self._port, backlog=1024
        )

    async def _close(self) -> None:
        assert self._server is not None
        self._server.close()
        for connection in list(self._connections):
            connection.abort()
        await self._server.wait_closed()

    # ---- faults ----------------------------------------------------------------------------

    def queue_faults(self, *faults: Fault) -> None:
        """Apply ``faults`` to the next requests, one each, in arrival order."""
        with self._lock:
            self._faults.extend(faults)

    def _next_fault(self, received: Received) -> Fault | None:
        with self._lock:
            self.request_count += 1
            if self._faults:
                return self._faults.popleft()
        return self.rule(received) if self.rule is not None else None

    # ---- HTTP ------------------------------------------------------------------------------

    def _respond(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> _Reply:
        """Decide the answer to one parsed request (on the server's loop)."""
        try:
            payload = json.loads(body) if body else None
        except ValueError:
            payload = None
        keep_alive = headers.get("connection", "").lower() != "close"
        if method == "GET":  # a client reading what serves the model: no route, not counted, no fault
            data = json.dumps(_error(path.startswith("/api/"), f"no route for GET {path}")).encode()
            return _Reply(delay=0.0, data=_head(404, len(data)) + data, close=not keep_alive)
        received = Received(method=method, path=path, headers=headers, json=payload)
        fault = self._next_fault(received)
        if self.record:
            self.received.append(
                Received(method=method, path=path, headers=headers, json=payload, fault=fault)
            )
        delay = self.latency_s
        if fault is not None and fault.kind == "drop":
            return _Reply(delay=delay, data=b"", close=True)
        if fault is not None and fault.kind == "stall":
            delay += fault.seconds
        if fault is not None and fault.kind == "status":
            data = (fault.body or "").encode()
            return _Reply(
                delay=delay, data=_head(fault.status, len(data), fault.headers) + data, close=not keep_alive
            )
        if fault is not None and fault.kind == "malformed":
            data = (fault.body or "").encode()
            return _Reply(delay=delay, data=_head(200, len(data)) + data, close=not keep_alive)
        status, answer = self._answer(method, path, headers, payload)
        data = json.dumps(answer).encode()
        if fault is not None and fault.kind == "cut":
            return _Reply(delay=delay, data=_head(status, len(data)) + data[: len(data) // 2], close=True)
        drip = fault.seconds / _TRICKLE_PIECES if fault is not None and fault.kind == "trickle" else 0.0
        return _Reply(delay=delay, data=_head(status, len(data)) + data, close=not keep_alive, drip_s=drip)

    def _answer(self, method: str, path: str, headers: Mapping[str, str], body: Any) -> tuple[int, Any]:
        ollama = path.startswith("/api/")
        if self.tokenize is not None and method == "POST" and path in ("/tokenize", "/detokenize"):
            return self.tokenize(path, body)
        if method != "POST" or not (path.endswith("/chat/completions") or path == "/api/chat"):
            return 404, _error(ollama, f"no route for {method} {path}")
        if self.api_key is not None and headers.get("authorization") != f"Bearer {self.api_key}":
            return 401, _error(ollama, "Incorrect API key provided")
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body.get("model"):
            return 400, _error(ollama, "the body must be JSON with model and messages")
        messages = body["messages"]
        if not messages or not all(isinstance(m, dict) for m in messages):
            return 400, _error(ollama, "messages must be a non-empty list of message objects")
        if ollama:
            return self._ollama(body, messages)
        return self._openai(body, messages)

    def _openai(self, body: dict[str, Any], messages: list[Any]) -> tuple[int, Any]:
        continuing = False
        if body.get("continue_final_message"):
            if "continue_final_message" not in self.prefix_dialects:
                return 400, _error(False, "Unrecognized request argument supplied: continue_final_message")
            if body.get("add_generation_prompt", True) or messages[-1].get("role") != "assistant":
                return 400, _error(
                    False,
                    "continue_final_message needs add_generation_prompt=false and a final assistant message",
                )
            continuing = True
        if any("prefix" in m for m in messages):
            if "prefix_field" not in self.prefix_dialects:
                return 400, _error(False, "messages: Extra inputs are not permitted (prefix)")
            if not messages[-1].get("prefix") or messages[-1].get("role") != "assistant":
                return 400, _error(False, "prefix is only allowed on the last, assistant message")
            continuing = True
        if messages[-1].get("role") == "assistant" and "trailing_assistant" in self.prefix_dialects:
            continuing = True
        n = body.get("n", 1) if self.supports_n else 1
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            return 400, _error(False, f"n must be a positive integer, got {n!r}")
        seed = body.get("seed")
        schema = _schema(body)
        # Choice k answers as a request with seed + k would: n=N gives the same texts as N requests.
        scripted = self.script(body) if self.script is not None else None
        answers = [
            (scripted, "stop")
            if isinstance(scripted, str)
            else scripted
            if scripted is not None
            else self._answer_text(
                messages, seed + k if isinstance(seed, int) else seed, continuing, k, schema
            )
            for k in range(n)
        ]
        completion_tokens = sum(len(text) // 4 + 1 for text, _ in answers)
        return 200, {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "model": self.served_model or body["model"],
            "choices": [
                {"index": k, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
                for k, (text, finish) in enumerate(answers)
            ],
            "usage": {
                "prompt_tokens": _tokens(messages),
                "completion_tokens": completion_tokens,
                "total_tokens": _tokens(messages) + completion_tokens,
            },
        }

    def _answer_text(
        self, messages: list[Any], seed: Any, continuing: bool, choice: int, schema: Any
    ) -> tuple[str, str]:
        """The text and finish reason of one choice (``seed`` already advanced by the choice)."""
        if self.replies == "story":
            key = json.dumps([messages, seed, choice], sort_keys=True, ensure_ascii=False)
            rng = random.Random(hashlib.sha256(key.encode("utf-8")).digest())
            if isinstance(schema, dict):
                return _verdict(schema, rng, fail=self.judge_fail, broken=self.judge_broken), "stop"
            story = _story(messages, rng)
            if story is not None:
                if rng.random() < self.cut_off:
                    words = story.split(" ")
                    return " ".join(words[: rng.randint(1, max(1, len(words) - 1))]), "length"
                return self._echo(messages, continuing) + story, "stop"
        text = _reply(messages, seed, continuing) + (
            f" choice={choice}" if choice and not isinstance(seed, int) else ""
        )
        return self._echo(messages, continuing) + text, "stop"

    def _echo(self, messages: list[Any], continuing: bool) -> str:
        return _content(messages[-1]) if continuing and self.echo_prefill else ""

    def _ollama(self, body: dict[str, Any], messages: list[Any]) -> tuple[int, Any]:
        options = body.get("options") or {}
        continuing = messages[-1].get("role") == "assistant" and "trailing_assistant" in self.prefix_dialects
        text, finish = self._answer_text(messages, options.get("seed"), continuing, 0, _schema(body))
        return 200, {
            "model": self.served_model or body["model"],
            "created_at": "2024-01-01T00:00:00Z",
            "message": {"role": "assistant", "content": text},
            "done": True,
            "done_reason": finish,
            "prompt_eval_count": _tokens(messages),
            "eval_count": len(text) // 4 + 1,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class _Reply:
    """What to send for one request, after how long, and whether to close the connection then.

    With ``drip_s`` the data goes out in :data:`_TRICKLE_PIECES` pieces, one every ``drip_s``.
    """

    delay: float
    data: bytes
    close: bool
    drip_s: float = 0.0


_TRICKLE_PIECES = 16


class _Connection(asyncio.Protocol):
    """One client connection: parses HTTP/1.1 requests and answers them in order, one at a time.

    A callback-driven protocol (no task and no stream objects per request) keeps the server's
    own CPU cost per request low, so benchmarks on a shared machine measure the client.
    """

    def __init__(self, server: FakeServer) -> None:
        self._server = server
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._server._connections.add(self)
        with self._server._lock:
            self._server.connection_count += 1

    def connection_lost(self, exc: Exception | None) -> None:
        self._server._connections.discard(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._transport = None

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        self._next()

    def _next(self) -> None:
        """Answer the next complete request in the buffer, unless one is still being answered."""
        if self._busy or self._transport is None:
            return
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        try:
            request_line, *lines = self._buffer[:end].decode("latin-1").split("\r\n")
            method, path, _version = request_line.split(" ", 2)
            headers: dict[str, str] = {}
            for line in lines:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            length = int(headers.get("content-length", "0"))
        except ValueError:
            self._transport.close()  # not HTTP: hang up, as a real server would
            return
        if len(self._buffer) < end + 4 + length:
            return  # the body is still on its way
        body = bytes(self._buffer[end + 4 : end + 4 + length])
        del self._buffer[: end + 4 + length]
        reply = self._server._respond(method, path, headers, body)
        self._busy = True
        loop = asyncio.get_running_loop()
        if reply.delay > 0:
            self._timer = loop.call_later(reply.delay, self._send, reply)
        else:
            self._send(reply)

    def _send(self, reply: _Reply) -> None:
        self._timer = None
        if self._transport is None:
            return
        if reply.drip_s > 0 and reply.data:
            piece = -(-len(reply.data) // _TRICKLE_PIECES)
            self._transport.write(reply.data[:piece])
            rest = replace(reply, data=reply.data[piece:])
            self._timer = asyncio.get_running_loop().call_later(reply.drip_s, self._send, rest)
            return
        self._busy = False
        if reply.data:
            self._transport.write(reply.data)
        if reply.close:
            self._transport.close()
        else:
            self._next()


def _content(message: Mapping[str, Any]) -> str:
    """A message's text: its ``content`` string, or the text parts of a list of parts."""
    content = message.get("content", "")
    if isinstance(content, list):
        return "".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, dict) and part.get("type") == "text"
        )
    return "" if content is None else str(content)


def _schema(body: Mapping[str, Any]) -> Any:
    """The JSON Schema a request asks its answer to follow (OpenAI ``response_format``,
    llama-server's ``json_schema``, Ollama's ``format``), or None."""
    response_format = body.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") == "json_schema":
        inner = response_format.get("json_schema")
        return inner.get("schema") if isinstance(inner, dict) else None
    if isinstance(body.get("json_schema"), dict):
        return body["json_schema"]
    return body.get("format") if isinstance(body.get("format"), dict) else None


def _reply(messages: list[Any], seed: Any, continuing: bool) -> str:
    last_user = next((_content(m) for m in reversed(messages) if m.get("role") == "user"), "")
    text = f"reply to: {last_user}"
    if seed is not None:
        text += f" seed={seed}"
    if continuing:
        text += " (continuing)"
    return text


REPLIES = ("echo", "story")

_FILLER = (
    "The sun was warm and the sky was blue.",
    "A soft wind moved the tall grass.",
    "Everyone smiled and waved hello.",
    "It was a very good morning.",
    "They sang a little song together.",
    "Then it was time to go home.",
    "The stars came out one by one.",
)


def _instruction_parts(text: str) -> tuple[str, list[str], list[str], int, int] | None:
    """(protagonist, required, banned, min, max) of a TinyStories instruction, or None."""
    hero = re.search(r"^- Protagonist: (.+)$", text, re.MULTILINE)
    length = re.search(r"^- Length: (\d+) to (\d+) sentences", text, re.MULTILINE)
    if hero is None or length is None:
        return None
    lists: list[list[str]] = []
    for heading in ("Must include", "Must NOT include"):
        block = re.search(rf"^- {heading}[^\n]*\n((?:  - .*\n?)*)", text, re.MULTILINE)
        lists.append(re.findall(r"^  - (.+)$", block.group(1), re.MULTILINE) if block else [])
    return hero.group(1).strip(), lists[0], lists[1], int(length.group(1)), int(length.group(2))


def _story(messages: list[Any], rng: random.Random) -> str | None:
    """A made-up story for the TinyStories instruction of a conversation (its first user turn
    holding one, so a repair conversation gets a new story too), drawn with ``rng``."""
    users = (_instruction_parts(_content(m)) for m in messages if m.get("role") == "user")
    parts = next((found for found in users if found is not None), None)
    if parts is None:
        return None
    hero, required, banned, low, high = parts
    # Most answers keep the rules; each rule is broken now and then, so every label shows up.
    phrases = [p for p in required if rng.random() < 0.9]
    if banned and rng.random() < 0.1:
        phrases.append(rng.choice(banned))
    count = rng.randint(low, high) if rng.random() < 0.85 else high + rng.randint(1, 3)
    name = hero.rsplit(" named ", 1)[-1]
    sentences = [f"Once upon a time there was {hero}."]
    sentences += [f"{name} found the {phrase} and was glad." for phrase in phrases]
    start = rng.randrange(len(_FILLER))
    while len(sentences) < count:
        sentences.append(_FILLER[(start + len(sentences)) % len(_FILLER)])
    return " ".join(sentences)


_RULE = "no violence or gore"


def _verdict(schema: Mapping[str, Any], rng: random.Random, *, fail: float, broken: float) -> str:
    """A judge's answer under ``schema``: valid JSON failing with share ``fail``, or (share
    ``broken``) a verdict cut off halfway, which is not JSON."""
    failed = rng.random() < fail
    text = json.dumps(_fill(schema, rng, failed, ""), ensure_ascii=False)
    return text[: len(text) // 2] if rng.random() < broken else text


def _fill(schema: Any, rng: random.Random, failed: bool, name: str) -> Any:
    """A value valid under the (simple) JSON Schema ``schema``: objects with their properties,
    enums (``fail``/``pass`` as ``failed`` says), strings, numbers in range, booleans, arrays."""
    if not isinstance(schema, Mapping):
        return None
    if "const" in schema:
        return schema["const"]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        wanted = "fail" if failed else "pass"
        return wanted if wanted in enum else enum[0]
    kind = schema.get("type")
    kind = kind[0] if isinstance(kind, list) and kind else kind
    if kind == "object":
        properties = schema.get("properties") or {}
        return {key: _fill(sub, rng, failed, key) for key, sub in properties.items()}
    if kind == "array":
        return [_fill(schema.get("items"), rng, failed, name) for _ in range(int(schema.get("minItems", 0)))]
    if kind in ("number", "integer"):
        low, high = (
            float(schema.get("minimum", 0)),
            float(schema.get("maximum", 10 if kind == "integer" else 1)),
        )
        value = low + (high - low) * (rng.uniform(0.0, 0.4) if failed else rng.uniform(0.6, 1.0))
        return round(value) if kind == "integer" else round(value, 3)
    if kind == "boolean":
        return not failed
    if kind == "null":
        return None
    if name == "rule":
        return _RULE if failed else "none"
    if name == "reason":
        return "A character hits another one until it bleeds." if failed else "The story is gentle and kind."
    return "fail" if failed else "ok"


def _tokens(messages: list[Any]) -> int:
    return sum(len(_content(m)) // 4 + 1 for m in messages)


def _error(ollama: bool, message: str) -> dict[str, Any]:
    return {"error": message} if ollama else {"error": {"message": message, "type": "invalid_request_error"}}


def _head(status: int, length: int, headers: Iterable[tuple[str, str]] = ()) -> bytes:
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Unknown"
    lines = [f"HTTP/1.1 {status} {phrase}", "Content-Type: application/json", f"Content-Length: {length}"]
    lines += [f"{name}: {value}" for name, value in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def main(argv: list[str] | None = None) -> None:
    """Serve until SIGTERM or Ctrl-C (also in the background, ``&``); prints the port first."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds before each answer")
    parser.add_argument(
        "--served-model", default=None, help="answer with this model name, whatever was asked"
    )
    parser.add_argument(
        "--echo-prefill", action="store_true", help="repeat a continued prefill in the answer"
    )
    parser.add_argument(
        "--replies",
        choices=REPLIES,
        default="story",
        help="story: a made-up story per TinyStories prompt or repair conversation, some passing "
        "the checks and some failing, and a verdict per judge request (default); echo: every "
        "answer is 'reply to: <last user message>'",
    )
    parser.add_argument(
        "--judge-fail", type=float, default=0.1, help="share of judge verdicts that fail (default 0.1)"
    )
    parser.add_argument(
        "--judge-broken",
        type=float,
        default=0.0,
        help="share of judge verdicts cut off halfway, so not JSON (default 0)",
    )
    parser.add_argument(
        "--cut-off",
        type=float,
        default=0.0,
        help="share of stories cut off at a word, with finish_reason 'length' (default 0)",
    )
    args = parser.parse_args(argv)
    for name in ("judge_fail", "judge_broken", "cut_off"):
        if not 0.0 <= getattr(args, name) <= 1.0:
            parser.error(f"--{name.replace('_', '-')} must be a share from 0 to 1")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    server = FakeServer(
        latency_s=args.latency,
        port=args.port,
        record=False,
        served_model=args.served_model,
        echo_prefill=args.echo_prefill,
        replies=args.replies,
        judge_fail=args.judge_fail,
        judge_broken=args.judge_broken,
        cut_off=args.cut_off,
    )
    try:
        server.start()
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        print(f"error: cannot listen on 127.0.0.1:{args.port}: {reason}", file=sys.stderr)
        raise SystemExit(1) from None
    try:
        print(server.port, flush=True)
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


if __name__ == "__main__":
    main()
