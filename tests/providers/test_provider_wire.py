"""Request bodies and answer parsing for the OpenAI-compatible and Ollama backends (no sockets)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from storyforge.config.provider import OllamaProviderConf, OpenAIProviderConf
from storyforge.errors import ConfigError, DataError
from storyforge.providers.base import ChatRequest, MalformedResponse, request_hash, server_error_text
from storyforge.providers.ollama import OllamaProvider
from storyforge.providers.openai import OpenAIProvider

USER = {"role": "user", "content": "Tell a story."}
SYSTEM = {"role": "system", "content": "Be kind."}
PREFILL = {"role": "assistant", "content": "Once upon", "prefix": True}


def _request(*messages: dict[str, Any], sample: int = 0) -> ChatRequest:
    return ChatRequest(id="p1", split="train", sample=sample, messages=messages)


def _openai(**settings: Any) -> OpenAIProvider:
    return OpenAIProvider(OpenAIProviderConf(base_url="http://h:1/v1/", model="m", **settings))


@pytest.mark.parametrize(
    ("settings", "messages", "sample", "expected"),
    [
        pytest.param(
            {},
            (SYSTEM, USER),
            0,
            {
                "model": "m",
                "messages": [SYSTEM, USER],
                "stream": False,
                "temperature": 1.0,
                "top_p": 1.0,
                "max_tokens": 512,
            },
            id="defaults",
        ),
        pytest.param(
            {"seed": 10, "temperature": None, "top_p": None, "max_tokens": None},
            (USER,),
            3,
            {"model": "m", "messages": [USER], "stream": False, "seed": 13},
            id="seed-plus-sample",
        ),
        pytest.param(
            {
                "prefix_continuation": "continue_final_message",
                "max_tokens": None,
                "temperature": None,
                "top_p": None,
            },
            (USER, PREFILL),
            0,
            {
                "model": "m",
                "stream": False,
                "continue_final_message": True,
                "add_generation_prompt": False,
                "messages": [USER, {"role": "assistant", "content": "Once upon"}],
            },
            id="prefill-vllm",
        ),
        pytest.param(
            {"prefix_continuation": "prefix_field", "max_tokens": None, "temperature": None, "top_p": None},
            (USER, PREFILL),
            0,
            {
                "model": "m",
                "stream": False,
                "messages": [USER, {"role": "assistant", "content": "Once upon", "prefix": True}],
            },
            id="prefill-prefix-field",
        ),
        pytest.param(
            {
                "prefix_continuation": "trailing_assistant",
                "max_tokens": None,
                "temperature": None,
                "top_p": None,
            },
            (USER, PREFILL),
            0,
            {
                "model": "m",
                "stream": False,
                "messages": [USER, {"role": "assistant", "content": "Once upon"}],
            },
            id="prefill-trailing",
        ),
        pytest.param(
            {"extra_body": {"min_p": 0.05}, "max_tokens": 64, "temperature": 0.7, "top_p": None},
            (USER,),
            0,
            {
                "model": "m",
                "messages": [USER],
                "stream": False,
                "temperature": 0.7,
                "max_tokens": 64,
                "min_p": 0.05,
            },
            id="extra-body",
        ),
    ],
)
def test_openai_body(settings, messages, sample, expected):
    """The OpenAI body carries the configured settings, the per-sample seed and the prefill dialect."""
    provider = _openai(**settings)
    assert provider.url == "http://h:1/v1/chat/completions"
    assert provider.body(_request(*messages, sample=sample)) == expected


def test_openai_key_goes_only_into_the_authorization_header():
    """The API key is sent as a bearer token and is absent from the body and its hash."""
    provider = OpenAIProvider(
        OpenAIProviderConf(model="m", api_key_env="SF_KEY"), environ={"SF_KEY": "sk-very-secret"}
    )
    assert provider.headers()["Authorization"] == "Bearer sk-very-secret"
    body = provider.body(_request(USER))
    assert "sk-very-secret" not in repr(body)
    assert provider.redact("bad key sk-very-secret given") == "bad key *** given"
    assert "sk-very-secret" not in repr(provider.describe())


def test_unsupported_prefill_is_refused_with_the_key_to_change():
    """With prefix_continuation=unsupported a prefill prompt is a ConfigError naming prompt and key."""
    with pytest.raises(ConfigError) as err:
        _openai().body(_request(USER, PREFILL))
    assert str(err.value) == (
        "prompt 'p1' ends with an assistant prefill (prefix: true), which provider=openai is not "
        "configured to continue. Set provider.prefix_continuation to a mode your server supports, "
        "or render prompts without a prefill."
    )


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        ((PREFILL, USER), "messages[0] has prefix: true, but only the last message may be a prefill"),
        ((USER, {"role": "user", "content": "x", "prefix": True}), "messages[1] has prefix: true"),
        ((), "messages is empty"),
        (
            ({"role": "tool", "content": "x"},),
            "messages[0].role must be system, user or assistant, got 'tool'",
        ),
        (({"role": "user", "content": 3},), "messages[0].content must be a string"),
    ],
)
def test_malformed_messages_are_data_errors_naming_the_prompt(messages, message):
    """Message shape errors name the prompt id and the message index."""
    with pytest.raises(DataError, match=re.escape(f"prompt 'p1': {message}")):
        _openai(prefix_continuation="prefix_field").body(_request(*messages))


def test_ollama_body_uses_native_options_and_seed_per_sample():
    """Ollama gets stream=false, its options as configured, seed + sample, and keep_alive."""
    provider = OllamaProvider(
        OllamaProviderConf(
            host="http://h:11434/", model="llama3", options={"temperature": 0.5, "seed": 7}, keep_alive="5m"
        )
    )
    assert provider.url == "http://h:11434/api/chat"
    assert provider.body(_request(SYSTEM, USER, sample=2)) == {
        "model": "llama3",
        "messages": [SYSTEM, USER],
        "stream": False,
        "options": {"temperature": 0.5, "seed": 9},
        "keep_alive": "5m",
    }


def test_ollama_refuses_prefill_unless_told_the_template_supports_it():
    """/api/chat has no prefill flag: refused by default, sent as a trailing assistant message on request."""
    with pytest.raises(ConfigError, match=re.escape("provider=ollama is not configured to continue")):
        OllamaProvider(OllamaProviderConf(model="l")).body(_request(USER, PREFILL))
    body = OllamaProvider(OllamaProviderConf(model="l", prefix_continuation="trailing_assistant")).body(
        _request(USER, PREFILL)
    )
    assert body["messages"][-1] == {"role": "assistant", "content": "Once upon"}


@pytest.mark.parametrize(
    ("payload", "output", "finish", "usage"),
    [
        (
            {
                "choices": [{"message": {"content": "Hi."}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 2},
            },
            "Hi.",
            "stop",
            {"prompt_tokens": 5, "completion_tokens": 2},
        ),
        (
            {"choices": [{"message": {"content": None}, "finish_reason": "length"}]},
            "",
            "length",
            {"prompt_tokens": None, "completion_tokens": None},
        ),
    ],
)
def test_openai_parse(payload, output, finish, usage):
    """A chat completion gives its text, finish reason and token counts."""
    completion = _openai().parse(payload)
    assert (completion.output, completion.finish_reason, completion.usage()) == (output, finish, usage)


@pytest.mark.parametrize(
    "payload",
    [{"choices": []}, {"id": "x"}, [1, 2], {"choices": [{"message": {"content": 5}}]}],
)
def test_openai_parse_rejects_the_wrong_shape(payload):
    """An answer without choices[0].message.content text is malformed (and so retried)."""
    with pytest.raises(MalformedResponse):
        _openai().parse(payload)


def test_ollama_parse():
    """An Ollama answer gives message.content, done_reason and prompt_eval_count/eval_count."""
    provider = OllamaProvider(OllamaProviderConf(model="l"))
    completion = provider.parse(
        {
            "message": {"role": "assistant", "content": "Hi."},
            "done": True,
            "done_reason": "stop",
            "prompt_eval_count": 9,
            "eval_count": 3,
        }
    )
    assert (completion.output, completion.finish_reason, completion.usage()) == (
        "Hi.",
        "stop",
        {"prompt_tokens": 9, "completion_tokens": 3},
    )
    with pytest.raises(MalformedResponse, match="done: false"):
        provider.parse({"message": {"content": "Hi"}, "done": False})
    with pytest.raises(MalformedResponse):
        provider.parse({"error": "boom"})


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        ({"error": {"message": "Invalid model", "type": "x"}}, "Invalid model"),
        ({"error": "model 'l' not found"}, "model 'l' not found"),
        ({"detail": "Not Found"}, "Not Found"),
        ({"message": "nope"}, "nope"),
        (None, "raw   text\nhere"),
        ({"error": {"code": 3}}, "raw   text\nhere"),
    ],
)
def test_server_error_text(payload, expected):
    """The server's own words are found in OpenAI, Ollama and FastAPI error shapes, else the raw text."""
    assert server_error_text(payload, "raw   text\nhere") == " ".join(expected.split())


def test_request_hash_is_canonical():
    """Equal bodies hash equal whatever their key order; any setting change changes the hash."""
    a = {"model": "m", "messages": [USER], "temperature": 1.0}
    b = {"temperature": 1.0, "messages": [USER], "model": "m"}
    assert request_hash(a) == request_hash(b)
    assert request_hash(a) != request_hash({**a, "temperature": 0.9})
    assert re.fullmatch(r"[0-9a-f]{64}", request_hash(a))


def test_public_names_of_the_providers_package():
    """The package's public API is exactly what __all__ lists, and every name resolves."""
    from storyforge import providers

    assert set(providers.__all__) == {
        "GENERATIONS_NAME", "Capabilities", "ChatRequest", "Completion", "MalformedResponse", "Provider",
        "build_provider", "generate_for_job", "provider_conf", "provider_enabled", "request_hash",
    }  # fmt: skip
    assert all(hasattr(providers, name) for name in providers.__all__)
