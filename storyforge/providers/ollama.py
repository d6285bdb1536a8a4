"""Ollama's native chat API: request bodies and answers for ``POST {host}/api/chat``.

Takes: an :class:`~storyforge.config.provider.OllamaProviderConf` (``host``, ``model``,
``options``, ``keep_alive``, ``prefix_continuation``). Gives: :class:`OllamaProvider`, which
sends non-streaming requests (``stream: false``) and reads ``message.content``,
``done_reason`` and the ``prompt_eval_count`` / ``eval_count`` token counts.

Sampling settings go in Ollama's own ``options`` object (``temperature``, ``top_p``,
``num_predict``, ``seed``, ``num_ctx``…) exactly as configured; with ``options.seed`` set,
sample k is requested with ``seed + k`` so the samples of one prompt differ.

Prefix continuation: ``/api/chat`` has no flag for it. Ollama continues a final assistant
message only when the model's chat template ends the prompt inside that message, and a
request gives no sign of whether it did: the answer looks the same either way. So a prompt
with a prefill is refused with a :class:`~storyforge.errors.ConfigError` by default, and
``prefix_continuation: trailing_assistant`` sends it as a plain trailing assistant message for
users who have checked their model's template.
"""

from __future__ import annotations

from typing import Any

from storyforge.config.provider import OllamaProviderConf
from storyforge.providers.base import (
    ChatProvider,
    ChatRequest,
    Completion,
    MalformedResponse,
    int_or_none,
    plain_messages,
    split_prefix,
)

__all__ = ["OllamaProvider"]


class OllamaProvider(ChatProvider):
    """Builds and parses ``/api/chat`` requests for one configured model."""

    name = "ollama"

    def __init__(self, conf: OllamaProviderConf) -> None:
        super().__init__(conf, conf.host, "api/chat")
        self._conf = conf

    def check_messages(self, request: ChatRequest) -> None:
        split_prefix(
            request,
            provider="ollama",
            mode=self._conf.prefix_continuation,
            config_key="provider.prefix_continuation (Ollama's /api/chat has no prefill flag)",
        )

    def body(self, request: ChatRequest) -> dict[str, Any]:
        self.check_messages(request)
        options = dict(self._conf.options)
        if options.get("seed") is not None:
            options["seed"] = int(options["seed"]) + request.sample
        body: dict[str, Any] = {
            "model": self.model,
            "messages": plain_messages(request.messages),
            "stream": False,
        }
        if options:
            body["options"] = options
        if self._conf.keep_alive is not None:
            body["keep_alive"] = self._conf.keep_alive
        return body

    def parse(self, payload: Any) -> Completion:
        try:
            content = payload["message"]["content"]
        except (KeyError, TypeError) as exc:
            raise MalformedResponse(f"no message.content in the answer ({exc!r})") from None
        if not isinstance(content, str):
            raise MalformedResponse(f"message.content is {type(content).__name__}, not text")
        if payload.get("done") is False:
            raise MalformedResponse("the answer says done: false (a partial, streamed reply)")
        reason = payload.get("done_reason")
        served = payload.get("model")
        return Completion(
            output=content,
            finish_reason=reason if isinstance(reason, str) else None,
            prompt_tokens=int_or_none(payload.get("prompt_eval_count")),
            completion_tokens=int_or_none(payload.get("eval_count")),
            raw_usage={k: payload[k] for k in ("prompt_eval_count", "eval_count") if k in payload} or None,
            served_model=served if isinstance(served, str) else None,
        )

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "prefix_continuation": self._conf.prefix_continuation}
