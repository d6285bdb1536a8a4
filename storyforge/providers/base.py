"""The provider contract: what a model-server backend must supply to the generation runner.

Takes: nothing. Gives: :class:`ChatRequest` (one prompt's messages and its sample index),
:class:`Completion` (one parsed answer), :class:`Capabilities`, the :class:`Provider`
protocol, :class:`MalformedResponse`, and the helpers every backend shares
(:func:`canonical_json`, :func:`encode_body`, :func:`content_hash`, :func:`request_hash`,
:func:`split_prefix`, :func:`server_error_text`).

A provider is deliberately thin and synchronous: it turns a request into a URL, headers and a
JSON body, and turns a decoded JSON answer into a :class:`Completion`. Transport, pooling,
retries, timeouts and bookkeeping live once in :mod:`storyforge.providers.transport`,
:mod:`storyforge.providers.retry` and :mod:`storyforge.providers.runner`, so a new backend is
two pure functions and a table of capabilities, each testable without a socket, and no backend
depends on a vendor SDK.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlsplit, urlunsplit

from storyforge.errors import ConfigError, DataError

__all__ = [
    "MAX_TOKEN_COUNT",
    "Capabilities",
    "ChatProvider",
    "ChatRequest",
    "Completion",
    "MalformedResponse",
    "Message",
    "Provider",
    "Wrapper",
    "canonical_json",
    "content_hash",
    "cut",
    "encode_body",
    "int_or_none",
    "join_url",
    "json_headers",
    "request_hash",
    "server_error_text",
    "split_prefix",
    "split_userinfo",
]

Message = Mapping[str, Any]
"""One chat message as the renderer emits it: ``role``, ``content`` and maybe ``prefix: True``."""

_ROLES = frozenset({"system", "user", "assistant"})


@dataclass(frozen=True, slots=True, kw_only=True)
class Capabilities:
    """What a configured provider can do; ``prefix_mode`` says how a prefill is sent, if at all."""

    prefix_continuation: bool
    prefix_mode: str
    seeds: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class ChatRequest:
    """One request: prompt ``id`` and ``split`` from prompts.jsonl, its messages, and which sample."""

    id: str
    split: str | None
    sample: int
    messages: tuple[Message, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Completion:
    """One parsed answer. ``output`` is only the generated text (a prefill is not repeated)."""

    output: str
    finish_reason: str | None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    raw_usage: Mapping[str, Any] | None = field(default=None, compare=False)
    # The ``model`` the server says answered (None when it says nothing).
    served_model: str | None = None
    # The server repeated the assistant prefill at the start of its answer and it was cut off.
    prefill_echo_stripped: bool = False

    def usage(self) -> dict[str, int | None]:
        """The usage record written to generations.jsonl."""
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens}


class MalformedResponse(ValueError):
    """A 2xx answer whose JSON lacks what the API promises; the runner retries it."""


@runtime_checkable
class Provider(Protocol):
    """A model-server backend.

    ``url`` is the absolute endpoint; ``headers()`` may carry a secret and is never logged or
    hashed; ``body(request)`` is the full JSON body (no secrets) and the input of the request
    hash; ``parse(payload)`` decodes a 2xx answer or raises :class:`MalformedResponse`;
    ``check_messages(request)`` raises a clear error before anything is sent when the
    messages ask for something the provider cannot do; ``redact(text)`` removes secrets from
    text (such as a server's error message) before it is written anywhere; ``describe()``
    is what the run manifest records about the provider (never a secret).
    """

    name: str
    model: str
    url: str
    capabilities: Capabilities

    def headers(self) -> dict[str, str]: ...

    def body(self, request: ChatRequest) -> dict[str, Any]: ...

    def parse(self, payload: Any) -> Completion: ...

    def check_messages(self, request: ChatRequest) -> None: ...

    def redact(self, text: str) -> str: ...

    def describe(self) -> dict[str, Any]: ...


class Wrapper:
    """A provider that is ``inner`` (same name, URL and capabilities) but for what a subclass overrides."""

    def __init__(self, inner: Provider) -> None:
        self.inner = inner
        self.name = inner.name
        self.model = inner.model
        self.url = inner.url
        self.capabilities = inner.capabilities

    def headers(self) -> dict[str, str]:
        return self.inner.headers()

    def body(self, request: ChatRequest) -> dict[str, Any]:
        return self.inner.body(request)

    def parse(self, payload: Any) -> Completion:
        return self.inner.parse(payload)

    def check_messages(self, request: ChatRequest) -> None:
        self.inner.check_messages(request)

    def redact(self, text: str) -> str:
        return self.inner.redact(text)

    def describe(self) -> dict[str, Any]:
        return self.inner.describe()


class ChatProvider:
    """What the chat APIs share: the model, the endpoint (credentials in its URL become a Basic
    ``Authorization`` header), the capabilities the prefill setting gives, redaction, and the
    start of the manifest's description."""

    name = ""

    def __init__(self, conf: Any, base_url: str, path: str) -> None:
        from storyforge.redaction import redact  # loaded by a run that sends, not by every job

        self._redact = redact
        self.model = require_nonempty_model(conf.model, "provider.model")
        self.url, self._basic = split_userinfo(join_url(base_url, path))
        self.capabilities = Capabilities(
            prefix_continuation=conf.prefix_continuation != "unsupported",
            prefix_mode=conf.prefix_continuation,
            seeds=True,
        )

    def headers(self) -> dict[str, str]:
        return json_headers(self._basic)

    def redact(self, text: str) -> str:
        return self._redact(text)

    def describe(self) -> dict[str, Any]:
        """What the manifest records about this provider (never a secret)."""
        return {"provider": self.name, "model": self.model, "url": public_url(self.url)}


def json_headers(authorization: str | None) -> dict[str, str]:
    """The headers of a JSON request, with ``Authorization`` when one is given."""
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if authorization is not None:
        headers["Authorization"] = authorization
    return headers


# One encoder for every call: json.dumps with options builds a new encoder each time, which
# costs as much as the encoding itself for a request-sized body.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, UTF-8 kept: equal bodies give equal strings."""
    return _CANONICAL.encode(value)


def encode_body(body: Mapping[str, Any]) -> bytes:
    """The bytes sent for ``body``: its canonical JSON in UTF-8."""
    return _CANONICAL.encode(body).encode("utf-8")


def content_hash(content: bytes) -> str:
    """sha256 (hex) of encoded request bytes, as :func:`encode_body` gives them."""
    return hashlib.sha256(content).hexdigest()


def request_hash(body: Mapping[str, Any]) -> str:
    """sha256 (hex) of the canonical request body; bodies never carry secrets."""
    return content_hash(encode_body(body))


def split_prefix(request: ChatRequest, *, provider: str, mode: str, config_key: str) -> bool:
    """Check the messages' shape and say whether the last one is a prefill to continue.

    A ``prefix: true`` message must be the last one and an assistant message. When the
    provider is configured with ``mode == "unsupported"``, a prefill is a :class:`ConfigError`
    that names the prompt and the key that would enable it.
    """
    if not request.messages:
        raise DataError(f"prompt {request.id!r}: messages is empty")
    last = len(request.messages) - 1
    for index, message in enumerate(request.messages):
        role = message.get("role")
        if role not in _ROLES:
            raise DataError(
                f"prompt {request.id!r}: messages[{index}].role must be system, user or assistant, "
                f"got {role!r}"
            )
        if not isinstance(message.get("content"), str):
            raise DataError(f"prompt {request.id!r}: messages[{index}].content must be a string")
        if message.get("prefix") and (index != last or role != "assistant"):
            raise DataError(
                f"prompt {request.id!r}: messages[{index}] has prefix: true, but only the last "
                "message may be a prefill and it must be an assistant message"
            )
    is_prefill = bool(request.messages[last].get("prefix"))
    if is_prefill and mode == "unsupported":
        raise ConfigError(
            f"prompt {request.id!r} ends with an assistant prefill (prefix: true), which "
            f"provider={provider} is not configured to continue. Set {config_key} to a mode your "
            "server supports, or render prompts without a prefill."
        )
    return is_prefill


def strip_prefill_echo(completion: Completion, request: ChatRequest) -> Completion:
    """``completion`` without a repeated prefill at the start of its text.

    Some servers continue a prefill but return it inside the answer (llama.cpp's
    ``llama-server`` does, in every prefix mode). ``output`` is only ever the generated text,
    so an answer that starts with the prefill (ignoring the prefill's trailing white space,
    which tokenisers may drop) has it cut off, and the record says so.
    """
    last = request.messages[-1] if request.messages else None
    if last is None or not last.get("prefix") or last.get("role") != "assistant":
        return completion
    prefill = str(last.get("content", ""))
    if not prefill.strip():
        return completion
    for head in (prefill, prefill.rstrip()):
        if completion.output.startswith(head):
            return replace(completion, output=completion.output[len(head) :], prefill_echo_stripped=True)
    return completion


def same_model(requested: str, served: str | None) -> bool:
    """Whether the answer's ``model`` names the model asked for.

    Equal names match, and so do the spellings servers use for the same model: Ollama's
    ``:latest`` tag, and a dated snapshot of the name asked for (``gpt-4o`` answered by
    ``gpt-4o-2024-08-06``). A server that names no model is not contradicted.
    """
    if served is None or served == requested:
        return True

    def bare(name: str) -> str:
        return name.removesuffix(":latest")

    if bare(served) == bare(requested):
        return True
    rest = served.removeprefix(requested + "-")
    return rest != served and rest[:1].isdigit()


#: File endings of model files a single-model server may give as the model's name.
MODEL_FILE_SUFFIXES = (".gguf", ".bin", ".safetensors")


def names_a_model_file(served: str) -> bool:
    """Whether a served model name is the path of a model file (llama.cpp's server without
    ``--alias`` answers with the ``-m`` path it loaded)."""
    return served.lower().endswith(MODEL_FILE_SUFFIXES)


def plain_messages(messages: Sequence[Message]) -> list[dict[str, str]]:
    """Messages as ``{role, content}`` only (drops storyforge's ``prefix`` flag)."""
    return [{"role": str(m["role"]), "content": str(m["content"])} for m in messages]


def server_error_text(
    payload: Any, fallback: str, limit: int = 500, *, redact: Callable[[str], str] = lambda text: text
) -> str:
    """The server's own words from an error body: OpenAI ``error.message``, Ollama ``error``,
    FastAPI ``detail``, or the raw text, redacted and only then cut to ``limit`` characters."""
    text: Any = None
    if isinstance(payload, Mapping):
        err = payload.get("error")
        if isinstance(err, Mapping):
            text = err.get("message") or err.get("type")
        elif err:
            text = err
        if text is None:
            text = payload.get("detail") or payload.get("message")
    if text is None or text == "":
        text = fallback
    words: str = text if isinstance(text, str) else canonical_json(text)
    return cut(redact(" ".join(words.split())), limit)


def cut(text: str, limit: int) -> str:
    """``text`` if it has at most ``limit`` characters, else its start with ``…`` as the last one."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def join_url(base: str, path: str) -> str:
    """``base`` with ``path`` appended to its path; its query string and fragment stay where they are.

    ``http://h/v1?api-version=2`` joined with ``chat/completions`` is
    ``http://h/v1/chat/completions?api-version=2`` (string concatenation would put the path
    inside the query).
    """
    parts = urlsplit(base)
    joined = parts.path.rstrip("/") + "/" + path.lstrip("/")
    return urlunsplit((parts.scheme, parts.netloc, joined, parts.query, parts.fragment))


def split_userinfo(url: str) -> tuple[str, str | None]:
    """``url`` without ``user:pass@``, and the ``Authorization: Basic`` value those credentials make.

    The credentials are registered as secrets (:mod:`storyforge.redaction`); the URL that is
    kept, sent to and shown never carries them.
    """
    import base64
    from urllib.parse import unquote

    from storyforge import redaction

    redaction.register_url(url)
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    token = base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode("ascii")
    redaction.register(token)
    return urlunsplit((parts.scheme, hostport, parts.path, parts.query, parts.fragment)), f"Basic {token}"


def public_url(url: str) -> str:
    """``url`` without user info or query string, which could carry credentials."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


MAX_TOKEN_COUNT = 100_000_000
"""The most tokens one request can count; a server's count above it (or below 0) is nonsense."""


def int_or_none(value: Any) -> int | None:
    """A token count (an integer from 0 to :data:`MAX_TOKEN_COUNT`), or None when the server
    sent none or nonsense: a negative count would lower what a run has spent, a huge one
    would stop it. The cost meter estimates a missing count (storyforge/providers/cost.py)."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TOKEN_COUNT:
        return value
    return None


def require_nonempty_model(model: str, key: str) -> str:
    """The configured model name, or a :class:`ConfigError` naming the key."""
    if not model or not model.strip():
        raise ConfigError(f"{key} must name a model, got {model!r}")
    return model
