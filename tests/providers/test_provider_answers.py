"""What is checked in every answer: which model gave it, and whether the prefill came back in it."""

from __future__ import annotations

import pytest
from provider_support import assert_exactly_once, ollama_cfg, openai_cfg, records, write_prompts

from storyforge.errors import ConfigError, ProviderError
from storyforge.providers import generate_for_job
from storyforge.providers.base import ChatRequest, Completion, same_model, strip_prefill_echo
from tests.support.fake_server import FakeServer

PREFILL = "Once upon a time"


@pytest.mark.parametrize(
    ("requested", "served", "same"),
    [
        ("m", "m", True),
        ("m", None, True),  # a server that names no model is not contradicted
        ("llama3.2", "llama3.2:latest", True),
        ("llama3.2:latest", "llama3.2", True),
        ("gpt-4o", "gpt-4o-2024-08-06", True),  # a dated snapshot of the name asked for
        ("gpt-4o", "gpt-4o-mini", False),
        ("gpt-4o", "gpt-4o-mini-2024-07-18", False),
        ("qwen2.5-7b", "/models/Llama-3-8B.gguf", False),
        ("m", "", False),
    ],
)
def test_same_model(requested: str, served: str | None, same: bool) -> None:
    assert same_model(requested, served) is same


def _request(last: dict[str, object]) -> ChatRequest:
    return ChatRequest(id="p", split="train", sample=0, messages=({"role": "user", "content": "hi"}, last))


@pytest.mark.parametrize(
    ("prefill", "output", "expected", "stripped"),
    [
        ("Iris Calloway:", "Iris Calloway: I run.", " I run.", True),
        ("Iris Calloway: ", "Iris Calloway: I run.", "I run.", True),
        ("Iris Calloway: ", "Iris Calloway:\nI run.", "\nI run.", True),  # trailing space not echoed
        ("Iris Calloway:", " I run.", " I run.", False),  # a server that continues cleanly
        ("Iris Calloway:", "Iris Callow", "Iris Callow", False),  # a shorter answer is not an echo
        ("   ", "   x", "   x", False),  # a blank prefill is never stripped
    ],
)
def test_strip_prefill_echo(prefill: str, output: str, expected: str, stripped: bool) -> None:
    request = _request({"role": "assistant", "content": prefill, "prefix": True})
    done = strip_prefill_echo(Completion(output=output, finish_reason="stop"), request)
    assert (done.output, done.prefill_echo_stripped) == (expected, stripped)


def test_no_prefill_nothing_is_stripped() -> None:
    request = _request({"role": "user", "content": "Iris"})
    done = strip_prefill_echo(Completion(output="Iris says hi", finish_reason="stop"), request)
    assert (done.output, done.prefill_echo_stripped) == ("Iris says hi", False)


@pytest.mark.parametrize("mode", ["continue_final_message", "prefix_field", "trailing_assistant"])
def test_echoed_prefill_is_cut_and_recorded(tmp_path, mode: str) -> None:
    """A server that repeats the prefill in its answer: output holds only the generated text."""
    prompts = write_prompts(tmp_path / "prompts.jsonl", 3, prefill=True)
    with FakeServer(echo_prefill=True) as server:
        path, stats = generate_for_job(openai_cfg(server, prefix_continuation=mode), tmp_path, prompts)
    recs = assert_exactly_once(path, 3, 1)
    assert stats["errors"] == 0
    for rec in recs:
        assert rec["output"] == f"reply to: tell {rec['id']} (continuing)"
        assert rec["prefill_echo_stripped"] is True


def test_clean_continuation_records_no_echo(server, tmp_path) -> None:
    prompts = write_prompts(tmp_path / "prompts.jsonl", 2, prefill=True)
    path, _ = generate_for_job(
        openai_cfg(server, prefix_continuation="trailing_assistant"), tmp_path, prompts
    )
    assert all("prefill_echo_stripped" not in rec for rec in records(path))


def test_prefill_refused_before_sending_when_no_mode_is_set(server, tmp_path) -> None:
    prompts = write_prompts(tmp_path / "prompts.jsonl", 2, prefill=True)
    with pytest.raises(ConfigError, match="provider.prefix_continuation"):
        generate_for_job(openai_cfg(server), tmp_path, prompts)
    assert server.request_count == 0


@pytest.mark.parametrize("backend", ["openai", "ollama"])
def test_another_model_answering_stops_the_run(tmp_path, backend: str) -> None:
    """A single-model server answers any name: the first answer from another model stops the run."""
    prompts = write_prompts(tmp_path / "prompts.jsonl", 4)
    with FakeServer(served_model="other-7b") as server:
        cfg = openai_cfg(server, concurrency=1) if backend == "openai" else ollama_cfg(server, concurrency=1)
        with pytest.raises(ProviderError) as info:
            generate_for_job(cfg, tmp_path, prompts)
        assert server.request_count == 1
    message = str(info.value)
    assert "answered with model 'other-7b'" in message
    assert "provider.on_model_mismatch=warn" in message


@pytest.mark.parametrize("served", ["/root/.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf", "model.GGUF"])
def test_a_server_naming_its_model_file_is_recorded_not_fatal(tmp_path, caplog, served: str) -> None:
    """llama.cpp's server without --alias answers with the path it loaded: every answer is kept,
    each record names that file, and one warning says how to name the model."""
    prompts = write_prompts(tmp_path / "prompts.jsonl", 4)
    with FakeServer(served_model=served) as server:
        path, stats = generate_for_job(openai_cfg(server, concurrency=2), tmp_path, prompts)
    recs = assert_exactly_once(path, 4, 1)
    assert stats["errors"] == 0 and all(rec["output"] for rec in recs)
    assert {rec["served_model"] for rec in recs} == {served}
    warnings = [r.message for r in caplog.records if "names its model by the file it loaded" in r.message]
    assert len(warnings) == 1 and "--alias NAME" in warnings[0]


def test_another_model_is_recorded_with_warn(tmp_path, caplog) -> None:
    prompts = write_prompts(tmp_path / "prompts.jsonl", 4)
    with FakeServer(served_model="other") as server:
        path, stats = generate_for_job(openai_cfg(server, on_model_mismatch="warn"), tmp_path, prompts)
    recs = assert_exactly_once(path, 4, 1)
    assert stats["errors"] == 0
    assert {rec["served_model"] for rec in recs} == {"other"}
    assert sum("answers with model 'other'" in r.message for r in caplog.records) == 1


def test_on_model_mismatch_is_checked(server, tmp_path) -> None:
    prompts = write_prompts(tmp_path / "prompts.jsonl", 1)
    with pytest.raises(ConfigError, match="provider.on_model_mismatch must be one of error, warn"):
        generate_for_job(openai_cfg(server, on_model_mismatch="ignore"), tmp_path, prompts)
