"""OpenAI-compatible chat completions: request bodies and answers for ``/v1/chat/completions``.

Takes: an :class:`~storyforge.config.provider.OpenAIProviderConf` (``base_url``, ``model``,
sampling settings, ``api_key_env``, ``prefix_continuation``) and the process environment.
Gives: :class:`OpenAIProvider`, which builds one non-streaming request per sample and parses
``choices[0].message.content``, ``finish_reason`` and ``usage``.

Prefix continuation (a final ``prefix: true`` assistant message) has no standard OpenAI
spelling, so the server's dialect is a config choice (``provider.prefix_continuation``):

- ``continue_final_message``: vLLM, Aphrodite, SGLang. The body gets
  ``continue_final_message: true`` and ``add_generation_prompt: false``, messages plain.
- ``prefix_field``: Mistral, DeepSeek. The last message keeps ``"prefix": true``.
- ``trailing_assistant``: llama.cpp server. A final assistant message is continued as it is.
- ``unsupported`` (default): a prompt with a prefill is refused before anything is sent.

The API key is read once from the variable that ``api_key_env`` names. It only ever goes
into the ``Authorization`` header, never into the body (so never into the request hash), and
:meth:`OpenAIProvider.redact` scrubs it, in every form (:mod:`storyforge.redaction`), from any
server text before that text is cut or kept. The endpoint URL is built with a URL parser, so a
``base_url`` with a query string keeps it after the path.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from storyforge import redaction
from storyforge.config.provider import OpenAIProviderConf
from storyforge.errors import ConfigError
from storyforge.providers.base import (
    ChatProvider,
    ChatRequest,
    Completion,
    MalformedResponse,
    int_or_none,
    json_headers,
    plain_messages,
    split_prefix,
)

__all__ = ["OpenAIProvider"]


class OpenAIProvider(ChatProvider):
    """Builds and parses ``/chat/completions`` requests for one configured model."""

    name = "openai"

    def __init__(self, conf: OpenAIProviderConf, *, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        # With several endpoints this is the first; the runner builds one provider per endpoint.
        super().__init__(conf, conf.base_urls()[0], "chat/completions")
        self._conf = conf
        self._key: str | None = None
        if conf.api_key_env is not None:
            key = env.get(conf.api_key_env)
            if not key:
                raise ConfigError(
                    f"provider.api_key_env names {conf.api_key_env!r}, but that environment variable "
                    "is not set (or is empty); export it, or set provider.api_key_env=null for a "
                    "server that needs no key"
                )
            self._key = key
            redaction.register(key)
            if self._basic is not None:
                raise ConfigError(
                    "provider.base_url carries a user name and password and provider.api_key_env "
                    "names a key: a request sends one Authorization header, so give only one of them"
                )

    def headers(self) -> dict[str, str]:
        return json_headers(f"Bearer {self._key}" if self._key is not None else self._basic)

    def _prefill(self, request: ChatRequest) -> bool:
        return split_prefix(
            request,
            provider="openai",
            mode=self._conf.prefix_continuation,
            config_key="provider.prefix_continuation",
        )

    def check_messages(self, request: ChatRequest) -> None:
        self._prefill(request)

    def body(self, request: ChatRequest) -> dict[str, Any]:
        conf = self._conf
        prefill = self._prefill(request)
        messages: list[dict[str, Any]] = list(plain_messages(request.messages))
        body: dict[str, Any] = dict(conf.extra_body)
        if prefill and conf.prefix_continuation == "prefix_field":
            messages[-1]["prefix"] = True
        elif prefill and conf.prefix_continuation == "continue_final_message":
            body["continue_final_message"] = True
            body["add_generation_prompt"] = False
        body.update(model=self.model, messages=messages, stream=False)
        if conf.temperature is not None:
            body["temperature"] = conf.temperature
        if conf.top_p is not None:
            body["top_p"] = conf.top_p
        if conf.max_tokens is not None:
            body["max_tokens"] = conf.max_tokens
        if conf.seed is not None:
            body["seed"] = conf.seed + request.sample
        return body

    def parse(self, payload: Any) -> Completion:
        try:
            choice = payload["choices"][0]
            content = choice["message"]["content"]
        except (KeyError, IndexError, TypeError) as exc:
            raise MalformedResponse(f"no choices[0].message.content in the answer ({exc!r})") from None
        if content is None:
            content = ""  # a refusal or a tool call carries no text
        if not isinstance(content, str):
            raise MalformedResponse(f"choices[0].message.content is {type(content).__name__}, not text")
        finish = choice.get("finish_reason") if isinstance(choice, Mapping) else None
        served = payload.get("model")
        usage = payload.get("usage") if isinstance(payload, Mapping) else None
        usage = usage if isinstance(usage, Mapping) else {}
        return Completion(
            output=content,
            finish_reason=finish if isinstance(finish, str) else None,
            prompt_tokens=int_or_none(usage.get("prompt_tokens")),
            completion_tokens=int_or_none(usage.get("completion_tokens")),
            raw_usage=usage or None,
            served_model=served if isinstance(served, str) else None,
        )

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "api_key_env": self._conf.api_key_env,
            "prefix_continuation": self._conf.prefix_continuation,
        }
