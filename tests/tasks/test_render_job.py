"""The render job of the StoryForge task kinds: config, contexts, ctx.model, outputs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from storyforge.config import register_configs
from storyforge.errors import ConfigError, DataError, TemplateValidationError
from storyforge.jobs.render_task import format_messages, load_context, model_info
from storyforge.pipeline import run_in
from storyforge.store import TemplateStore

ROOT = Path(__file__).resolve().parents[2]


def _compose(*overrides: str) -> Any:
    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        return compose("config", overrides=list(overrides))


@pytest.mark.parametrize(
    ("task", "template", "context"),
    [
        ("turn_generation", "turn_writer", "turn_generation"),
        ("chapter_summarization", "chapter_summary", "chapter_summarization"),
        ("writing_assistant", "writing_rewrite", "writing_assistant"),
    ],
)
def test_task_configs_compose(task: str, template: str, context: str) -> None:
    """Each task option selects its default template, sample context, job and the SQLite store."""
    cfg = _compose(f"task={task}")
    assert cfg.task.kind == task
    assert cfg.task.job == "storyforge.jobs.render_task.run"
    assert cfg.task.context == context
    assert cfg.template.id == template
    assert cfg.store.url == "sqlite:///storyforge.db"


def test_command_line_overrides_win() -> None:
    """template=, task.context= and store.url= on the command line replace the defaults."""
    cfg = _compose(
        "task=turn_generation",
        "template=narrator_turn",
        "task.context=turn_generation_long",
        "store.url=sqlite:///x.db",
    )
    assert (cfg.template.id, cfg.task.context, cfg.store.url) == (
        "narrator_turn",
        "turn_generation_long",
        "sqlite:///x.db",
    )


def test_misspelt_task_key_fails_at_composition() -> None:
    """A typo in a task key is refused by the schema, naming the key."""
    with pytest.raises(ConfigCompositionException, match=re.escape("task.contxt")):
        _compose("task=turn_generation", "task.contxt=x")


def test_job_prints_and_writes_messages_and_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The job prints the prompt and writes messages.json and trace.json that agree with it."""
    cfg = _compose("task=turn_generation")
    summary = run_in(cfg, tmp_path)
    out = capsys.readouterr().out
    messages = json.loads((tmp_path / "messages.json").read_text(encoding="utf-8"))
    trace = json.loads((tmp_path / "trace.json").read_text(encoding="utf-8"))
    assert out == format_messages(messages)
    assert messages[-1] == {"role": "assistant", "content": "Iris Calloway:", "prefix": True}
    assert summary == {
        "task": "turn_generation",
        "template": "turn_writer",
        "messages": 3,
        "characters": sum(len(m["content"]) for m in messages),
        "warnings": 0,
    }
    assert trace["model"] == {"provider": "none", "name": None, "prefill": True}
    assert trace["warnings"] == []
    assert trace["budget"] is None
    assert [s["name"] for s in trace["trace"]["slots"]] == [
        "direction",
        "voice",
        "cast",
        "style",
        "history",
        "summaries",
        "prefill",
    ]


def test_job_uses_budget_and_provider(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """budget.max_tokens caps the render and the provider decides ctx.model (no prefill for openai)."""
    cfg = _compose(
        "task=turn_generation",
        "task.context=turn_generation_long",
        "budget=small_context",
        "provider=openai",
        "provider.model=gpt-test",
        "task.print_prompt=false",
    )
    run_in(cfg, tmp_path)
    assert capsys.readouterr().out == ""
    trace = json.loads((tmp_path / "trace.json").read_text(encoding="utf-8"))
    messages = json.loads((tmp_path / "messages.json").read_text(encoding="utf-8"))
    assert trace["budget"] == 512
    assert trace["trace"]["budget"]["consumed"] <= 512
    assert trace["model"] == {"provider": "openai", "name": "gpt-test", "prefill": False}
    assert messages[-1]["role"] != "assistant"


def test_job_renders_a_stored_template(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """task.store_template renders the template stored under that id instead of cfg.template."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    with TemplateStore(url) as store:
        store.import_paths(ROOT / "conf" / "template" / "narrator_turn.yaml")
    cfg = _compose("task=turn_generation", "task.store_template=narrator_turn", f"store.url={url}")
    summary = run_in(cfg, tmp_path / "run")
    assert summary["template"] == "narrator_turn"
    assert "You are the narrator" in capsys.readouterr().out


def test_job_refuses_a_template_for_another_task(tmp_path: Path) -> None:
    """A template bound to another task kind fails before rendering, naming every problem."""
    cfg = _compose("task=chapter_summarization", "template=turn_writer")
    with pytest.raises(TemplateValidationError) as info:
        run_in(cfg, tmp_path)
    assert any(i.code == "task_mismatch" for i in info.value.issues)
    assert not (tmp_path / "messages.json").exists()


def test_run_py_end_to_end(tmp_path: Path) -> None:
    """`python run.py task=turn_generation` prints the prompt and writes both files in the run dir."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "run.py"), "task=writing_assistant", f"hydra.run.dir={run_dir}"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("=== system ===\nYou are a careful line editor.")
    assert "Request: Tighten this passage" in proc.stdout
    assert (run_dir / "messages.json").is_file()
    assert (run_dir / "trace.json").is_file()


# --- contexts and ctx.model ---------------------------------------------------------------


def test_named_and_generated_contexts() -> None:
    """conf/context names load as files; a $generate file calls its generator with its args."""
    assert load_context("writing_assistant")["userText"].startswith("Tighten")
    long = load_context("turn_generation_long")
    assert len(long["turns"]) == 200
    assert load_context(ROOT / "conf" / "context" / "turn_generation_long.json") == long


@pytest.mark.parametrize(
    ("content", "error", "message"),
    [
        pytest.param(
            '{"$generate": "os.system", "args": {}}',
            DataError,
            "$generate must name a function under storyforge.tasks., got 'os.system'",
            id="outside",
        ),
        pytest.param(
            '{"$generate": "storyforge.tasks.turn_generation.nope"}',
            DataError,
            "cannot be imported",
            id="missing-function",
        ),
        pytest.param(
            '{"$generate": "storyforge.tasks.turn_generation.sample_context", "args": {"turns": -1}}',
            DataError,
            "turns must be >= 0, got -1",
            id="generator-error",
        ),
        pytest.param(
            '{"$generate": "storyforge.tasks.turn_generation.sample_context", "args": [1]}',
            DataError,
            "args must be a mapping, got list",
            id="args-list",
        ),
        pytest.param("[1, 2]", DataError, "the top level must be a mapping, got list", id="not-mapping"),
        pytest.param("{broken", DataError, "cannot be read", id="bad-json"),
    ],
)
def test_bad_context_files(tmp_path: Path, content: str, error: type[Exception], message: str) -> None:
    """A bad context file is a clear error naming the file and the rule; no code outside storyforge runs."""
    path = tmp_path / "ctx.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(error, match=re.escape(message)) as info:
        load_context(path)
    assert str(path) in str(info.value)


def test_unknown_context_name_lists_the_known_ones() -> None:
    """An unknown context name says where it looked and what exists."""
    with pytest.raises(ConfigError, match=r"no context named 'nope' in .*; known: chapter_summarization, "):
        load_context("nope")


@pytest.mark.parametrize(
    ("provider", "expected"),
    [
        pytest.param(None, {"provider": "none", "name": None, "prefill": True}, id="absent"),
        pytest.param({"name": "none"}, {"provider": "none", "name": None, "prefill": True}, id="none"),
        pytest.param(
            {"name": "ollama", "model": "llama3.2", "prefix_continuation": "unsupported"},
            {"provider": "ollama", "name": "llama3.2", "prefill": False},
            id="ollama-no-prefix",
        ),
        pytest.param(
            {"name": "openai", "model": "m", "prefix_continuation": "continue_final_message"},
            {"provider": "openai", "name": "m", "prefill": True},
            id="vllm-prefix",
        ),
        pytest.param(
            {"name": "openai", "model": "???"},
            {"provider": "openai", "name": None, "prefill": False},
            id="model-missing",
        ),
    ],
)
def test_model_info(provider: Any, expected: dict[str, Any]) -> None:
    """ctx.model names the provider and model and says whether a prefill can be continued."""
    node = OmegaConf.create(provider) if provider is not None else None
    assert model_info(node) == expected


def test_format_messages() -> None:
    """Messages print as role rules with their content; a prefill is marked."""
    text = format_messages(
        [{"role": "system", "content": "a\nb"}, {"role": "assistant", "content": "X:", "prefix": True}]
    )
    assert text == "=== system ===\na\nb\n=== assistant (prefill) ===\nX:\n"
    assert format_messages([]) == ""


def test_data_expansion_setting_reaches_the_task_kind() -> None:
    """task.data_expansion=off turns expansion of data off for the render; a bad value names the key."""
    from storyforge.config.storyforge_tasks import check

    assert check(_compose("task=turn_generation")).kind.data_expansion == "paths"
    settings = check(_compose("task=turn_generation", "task.data_expansion=off"))
    assert settings.kind.registry({}).data_expansion == "off"
    with pytest.raises(ConfigError, match="task.data_expansion must be 'paths' or 'off', got 'all'"):
        check(_compose("task=turn_generation", "task.data_expansion=all"))
