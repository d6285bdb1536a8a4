"""The short Python API: ``storyforge.load_template``, ``storyforge.generate`` and ``storyforge.tinystories``.

Each is checked against the long way it stands for: the five-import engine call, the runner
over real HTTP (the loopback fake server), and ``python run.py task=tinystories``'s files.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import storyforge
from storyforge import compile_template, render
from storyforge.engine.loader import load_template as read_template
from storyforge.errors import ConfigError, DataError, ProviderError, TemplateValidationError
from storyforge.tasks.base import get_task_kind
from tests.support.fake_server import FakeServer, Fault

ROOT = Path(__file__).resolve().parents[1]
TURN_WRITER = ROOT / "conf" / "template" / "turn_writer.yaml"
TURN_CONTEXT = ROOT / "conf" / "context" / "turn_generation.json"


def _context() -> dict[str, Any]:
    return dict(json.loads(TURN_CONTEXT.read_text("utf-8")))


# -- load_template --------------------------------------------------------------------------------


@pytest.mark.parametrize("budget", [None, 2000, 300])
def test_load_template_renders_what_the_engine_calls_render(budget: int | None) -> None:
    kind = get_task_kind("turn_generation")
    compiled = compile_template(
        read_template(TURN_WRITER), task=kind.name, source_specs=kind.sources, check_args=kind.check_args
    )
    ctx = _context()
    expected = render(compiled, ctx, kind.registry(ctx), budget=budget)

    got = storyforge.load_template(TURN_WRITER).render(ctx, budget=budget)

    assert got.messages == expected.messages
    assert got.warnings == expected.warnings
    assert got.trace.format() == expected.trace.format()


def test_load_template_takes_a_dict_and_a_task() -> None:
    document = {
        "id": "hello",
        "name": "Hello",
        "task": "turn_generation",
        "version": 1,
        "layout": [{"kind": "message", "role": "user", "content": "Write as {{actor.name}}."}],
        "slots": {},
    }
    template = storyforge.load_template(document, task="turn_generation")
    assert template.kind.name == "turn_generation"
    assert template.render(_context()).messages == [{"role": "user", "content": "Write as Iris Calloway."}]


def test_load_template_refuses_a_template_of_another_task() -> None:
    with pytest.raises(TemplateValidationError, match="task"):
        storyforge.load_template(TURN_WRITER, task="tinystories")


def test_load_template_names_an_unknown_task() -> None:
    with pytest.raises(ConfigError, match="unknown task kind 'turn_generatoin'.*turn_generation"):
        storyforge.load_template(TURN_WRITER, task="turn_generatoin")


# -- generate -------------------------------------------------------------------------------------

PROMPTS = [
    [{"role": "user", "content": "first"}],
    [{"role": "system", "content": "be brief"}, {"role": "user", "content": "second"}],
    [{"role": "user", "content": "third"}],
]


def _openai(server: FakeServer, **more: Any) -> dict[str, Any]:
    return {"name": "openai", "base_url": server.base_url, "model": "m", "progress": False, **more}


def test_generate_answers_every_prompt_in_order_over_http() -> None:
    with FakeServer() as server:
        answers = storyforge.generate(PROMPTS, provider=_openai(server, samples=2, seed=5))
        sent = len(server.received)
    assert [(a.prompt, a.sample) for a in answers] == [(p, s) for p in range(3) for s in range(2)]
    assert [a.output for a in answers if a.sample == 0] == [
        "reply to: first seed=5",
        "reply to: second seed=5",
        "reply to: third seed=5",
    ]
    assert {a.finish_reason for a in answers} == {"stop"}
    assert all(a.error is None and a.usage is not None for a in answers)
    assert sent == 6


def test_generate_answers_repeats_from_the_cache(tmp_path: Path) -> None:
    cache = tmp_path / "responses.sqlite"
    with FakeServer() as server:
        first = storyforge.generate(PROMPTS, provider=_openai(server), cache=cache)
        again = storyforge.generate(PROMPTS, provider=_openai(server), cache=cache)
        sent = len(server.received)
    assert sent == 3  # the second call was answered by the cache
    assert [a.output for a in again] == [a.output for a in first]


def test_generate_without_a_cache_sends_again() -> None:
    with FakeServer() as server:
        storyforge.generate(PROMPTS[:1], provider=_openai(server))
        storyforge.generate(PROMPTS[:1], provider=_openai(server))
        assert len(server.received) == 2


def test_generate_keeps_a_request_that_failed_every_try_as_an_answer_with_its_error() -> None:
    fault = Fault(kind="status", status=503, body='{"error": "busy"}')
    with FakeServer(faults=[fault]) as server:
        answers = storyforge.generate(PROMPTS, provider=_openai(server, concurrency=1, max_retries=0))
    failed = [a for a in answers if a.error is not None]
    assert len(failed) == 1 and failed[0].output is None and "503" in str(failed[0].error)
    assert sum(a.output is not None for a in answers) == 2


def test_generate_stops_at_an_answer_that_retrying_cannot_fix() -> None:
    fault = Fault(kind="status", status=400, body='{"error": "bad request"}')
    with FakeServer(faults=[fault]) as server, pytest.raises(ProviderError, match="HTTP 400"):
        storyforge.generate(PROMPTS, provider=_openai(server, concurrency=1))


def test_generate_says_when_no_server_answers() -> None:
    with FakeServer() as server:
        url = server.base_url
    with pytest.raises(ProviderError):
        storyforge.generate(
            PROMPTS[:1],
            provider={"name": "openai", "base_url": url, "model": "m", "progress": False, "max_retries": 0},
        )


@pytest.mark.parametrize(
    ("provider", "error", "match"),
    [
        ({"name": "none"}, ConfigError, "sends no requests"),
        ({"name": "openai", "model": "m", "concurrency": 0}, ConfigError, "provider.concurrency"),
        ({"name": "claude", "model": "m"}, ConfigError, "provider.name must be one of"),
    ],
)
def test_generate_checks_the_provider_settings(provider: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        storyforge.generate(PROMPTS, provider=provider)


def test_generate_refuses_a_bad_message_before_sending() -> None:
    with FakeServer() as server:
        with pytest.raises(DataError, match="role"):
            storyforge.generate([[{"role": "narrator", "content": "x"}]], provider=_openai(server))
        assert server.received == []


# -- tinystories ----------------------------------------------------------------------------------


def test_draw_seeds_are_the_records_run_py_writes(tmp_path: Path) -> None:
    out = tmp_path / "run"
    subprocess.run(
        [sys.executable, "run.py", "task=tinystories", "task.n_seeds=30", "seed=7",
         "constraints.min_sentences=4", f"hydra.run.dir={out}"],
        cwd=ROOT, check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    written = [json.loads(line) for line in (out / "prompts_seed.jsonl").read_text("utf-8").splitlines()]

    drawn = storyforge.tinystories.draw_seeds(30, seed=7, overrides=["constraints.min_sentences=4"])

    assert drawn == written


@pytest.mark.parametrize(
    ("override", "line"),
    [
        ("task.n_seeds=abc", "Error merging override task.n_seeds=abc Value 'abc' of type 'str' could not"),
        ("+sed=1", "sed: unknown key. Did you mean seed?"),
        (
            "constraints.min_sentnces=3",
            "constraints.min_sentnces: unknown key. Did you mean constraints.min_sentences?",
        ),
        ("task=nope", "Could not find 'task/nope'. Options of 'task': "),
    ],
)
def test_draw_seeds_names_a_bad_override_as_run_py_does(override: str, line: str) -> None:
    with pytest.raises(ConfigError) as caught:
        storyforge.tinystories.draw_seeds(3, overrides=[override])
    assert str(caught.value).startswith(line)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("text", "passed", "labels"),
    [
        ("A cat sat. It was happy.", False, ("missing_required", "wrong_sentence_count")),
        (None, False, ("other",)),
    ],
)
def test_validate_gives_the_verdict_with_labels(text: object, passed: bool, labels: tuple[str, ...]) -> None:
    seed = storyforge.tinystories.draw_seeds(1)[0]
    verdict = storyforge.tinystories.validate(seed, text)
    assert (verdict.passed, verdict.labels) == (passed, labels)


def test_validate_passes_a_story_that_keeps_every_rule() -> None:
    seed = {"required": ["red ball"], "banned": ["dog"], "min_sentences": 2, "max_sentences": 3}
    verdict = storyforge.tinystories.validate(seed, "Tom found a red ball. He was glad.")
    assert verdict.passed and verdict.labels == () and verdict.sentence_count == 2
    assert storyforge.tinystories.validate(seed, "A dog had a red ball. It ran.").labels == (
        "contains_banned",
    )


def test_run_writes_what_run_py_writes(tmp_path: Path) -> None:
    cli, api = tmp_path / "cli", tmp_path / "api"
    subprocess.run(
        [sys.executable, "run.py", "task=tinystories", "task.n_seeds=12", f"hydra.run.dir={cli}"],
        cwd=ROOT, check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    summary = storyforge.tinystories.run(api, ["task.n_seeds=12"])
    assert summary["counts"]["seeds"] == 12
    for name in ("prompts_seed.jsonl", "prompts.jsonl", "rejected_seeds.jsonl", "prompts.parquet"):
        assert (api / name).read_bytes() == (cli / name).read_bytes(), name


def test_run_takes_typed_settings(tmp_path: Path) -> None:
    settings = storyforge.tinystories.compose_settings(["task.n_seeds=4"])
    settings = replace(settings, task=replace(settings.task, n_seeds=6))
    summary = storyforge.tinystories.run(tmp_path, settings=settings)
    assert summary["counts"]["seeds"] == 6
    assert len((tmp_path / "prompts.jsonl").read_text("utf-8").splitlines()) == 6


def test_run_generates_through_a_provider(tmp_path: Path) -> None:
    with FakeServer(replies="story") as server:
        summary = storyforge.tinystories.run(
            tmp_path,
            ["task.n_seeds=4", "provider=openai", "provider.model=m", f"provider.base_url={server.base_url}",
             "provider.progress=false", "export.plots=false"],
        )  # fmt: skip
    assert (tmp_path / "generations.jsonl").is_file()
    assert len((tmp_path / "generations.jsonl").read_text("utf-8").splitlines()) == 4
    assert summary["counts"]["seeds"] == 4
