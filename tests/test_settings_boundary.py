"""The composed config stops at the pipeline: below it, code receives typed, frozen settings.

Read with ``ast``: no module of ``storyforge`` outside ``storyforge/config/``,
``storyforge/pipeline.py`` and ``storyforge/sweep*.py`` (nor ``run.py``, the Hydra entry
point, which is allowed) imports ``omegaconf`` or names ``DictConfig`` / ``ListConfig`` /
``OmegaConf`` anywhere: in an import, a signature, an annotation (quoted or not) or a body.
Then the settings themselves: what :func:`read_settings` returns refuses changes, and each
part has the type its readers expect.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from storyforge.config import register_configs
from storyforge.config.executor import ExecutorConf
from storyforge.config.provider import CacheSettings, OpenAIProviderConf, user_cache_path
from storyforge.config.research_qa import ResearchQASettings
from storyforge.config.settings import RunSettings, read_settings
from storyforge.config.storyforge_tasks import RenderTaskSettings
from storyforge.config.tinystories import TinyStoriesSettings
from storyforge.errors import ConfigError
from storyforge.tasks.tinystories.exports import ExportOptions

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "storyforge"
CONFIG_NAMES = frozenset({"DictConfig", "ListConfig", "OmegaConf"})


def allowed(path: Path) -> bool:
    """Where the composed config may be handled: config/, the pipeline, sweeps, run.py."""
    rel = path.relative_to(ROOT).as_posix()
    return (
        rel == "run.py"
        or rel.startswith("storyforge/config/")
        or rel == "storyforge/pipeline.py"
        or (rel.startswith("storyforge/sweep") and rel.count("/") == 1)
    )


def config_uses(source: str) -> list[tuple[int, str]]:
    """(line, what) for every import of omegaconf and every name of its config types in ``source``."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [
                (node.lineno, f"import {a.name}") for a in node.names if a.name.split(".")[0] == "omegaconf"
            ]
        elif isinstance(node, ast.ImportFrom):
            if (node.module or "").split(".")[0] == "omegaconf":
                found.append((node.lineno, f"from {node.module} import ..."))
            found += [(node.lineno, a.name) for a in node.names if a.name in CONFIG_NAMES]
        elif isinstance(node, ast.Name) and node.id in CONFIG_NAMES:
            found.append((node.lineno, node.id))
        elif isinstance(node, ast.Attribute) and node.attr in CONFIG_NAMES:
            found.append((node.lineno, node.attr))
        elif isinstance(node, (ast.arg, ast.AnnAssign, ast.FunctionDef, ast.AsyncFunctionDef)):
            annotation = (
                node.returns if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else node.annotation
            )
            if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
                found += [(node.lineno, what) for _, what in config_uses(annotation.value)]
    return sorted(found)


def modules() -> Iterator[Path]:
    yield ROOT / "run.py"
    yield from sorted(PACKAGE.rglob("*.py"))


def test_no_config_tree_below_the_pipeline() -> None:
    """Only config/, pipeline.py, sweep*.py and run.py touch DictConfig / OmegaConf."""
    offenders = {
        path.relative_to(ROOT).as_posix(): uses
        for path in modules()
        if not allowed(path) and (uses := config_uses(path.read_text(encoding="utf-8")))
    }
    assert offenders == {}


def test_the_allowed_places_are_the_ones_that_read_the_config() -> None:
    """The allow-list is not wider than it needs to be: each allowed file exists, and the config
    package, the pipeline and the entry point do use the config tree (so the scan sees them)."""
    for rel in ("run.py", "storyforge/pipeline.py", "storyforge/config/settings.py"):
        path = ROOT / rel
        assert allowed(path) and config_uses(path.read_text(encoding="utf-8")), rel
    assert not allowed(PACKAGE / "jobs" / "tinystories.py")
    assert not allowed(PACKAGE / "executors" / "ray_executor.py")
    assert not allowed(PACKAGE / "engine" / "compiler.py")


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from omegaconf import DictConfig\n", [(1, "DictConfig"), (1, "from omegaconf import ...")]),
        ("import omegaconf.errors\n", [(1, "import omegaconf.errors")]),
        ("def f(cfg: DictConfig) -> None: ...\n", [(1, "DictConfig")]),
        ("def f(cfg: 'DictConfig') -> None: ...\n", [(1, "DictConfig")]),
        ("def f() -> 'omegaconf.DictConfig': ...\n", [(1, "DictConfig")]),
        ("x: 'ListConfig | None' = None\n", [(1, "ListConfig")]),
        ("def f(x):\n    return oc.OmegaConf.to_container(x)\n", [(2, "OmegaConf")]),
        ("def f(cfg: Mapping[str, Any]) -> None: ...\n", []),
        ('"""Reads a DictConfig."""\n', []),
    ],
    ids=[
        "from-import",
        "import",
        "signature",
        "quoted",
        "quoted-return",
        "annotated",
        "body",
        "clean",
        "docstring",
    ],
)
def test_the_scan_finds_what_it_must(source: str, expected: list[tuple[int, str]]) -> None:
    """The scan itself: imports, signatures, quoted annotations and bodies count; prose does not."""
    assert config_uses(source) == expected


@pytest.fixture(scope="module")
def hydra_conf() -> Iterator[None]:
    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        yield


@pytest.mark.parametrize(
    ("overrides", "task_type"),
    [
        (["task.n_seeds=3"], TinyStoriesSettings),
        (["task=research_qa"], ResearchQASettings),
        (["task=turn_generation"], RenderTaskSettings),
        (["task=chapter_summarization"], RenderTaskSettings),
        (["task=writing_assistant"], RenderTaskSettings),
    ],
    ids=["tinystories", "research_qa", "turn_generation", "chapter_summarization", "writing_assistant"],
)
def test_every_task_reads_into_frozen_settings(
    hydra_conf: None, overrides: list[str], task_type: type
) -> None:
    """Each task kind's config becomes RunSettings with its own task part; nothing can be changed."""
    settings = read_settings(compose("config", overrides=overrides))
    assert isinstance(settings, RunSettings) and isinstance(settings.task, task_type)
    assert isinstance(settings.executor, ExecutorConf) and isinstance(settings.export, ExportOptions)
    # the response cache is on by default: the user's file (a per-test folder in the suite)
    assert settings.cache == CacheSettings(path=user_cache_path()) and settings.provider is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.strict = True  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.executor.shards = 2
    first = dataclasses.fields(settings.task)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(settings.task, first, getattr(settings.task, first))
    schema = getattr(settings.task, "conf", None) or getattr(settings.task, "model", None)
    if schema is not None:  # the checked schema objects a task part holds are sealed too
        field = dataclasses.fields(schema)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(schema, field, getattr(schema, field))


def test_run_settings_hold_checked_absolute_parts(hydra_conf: None, tmp_path: Path) -> None:
    """Provider, executor, cache and export come checked; the cache path is absolute; the
    provider is sealed (a Ray worker gets exactly what the driver checked)."""
    cfg = compose(
        "config",
        overrides=[
            "provider=openai",
            "provider.model=m",
            "provider.samples=3",
            "executor=ray",
            "executor.shards=4",
            "cache.path=relative/cache.sqlite",
            "export.dpo_pairing=all_pairs",
            "strict=true",
            "+resume=true",
        ],
    )
    settings = read_settings(cfg)
    assert isinstance(settings.provider, OpenAIProviderConf) and settings.provider.samples == 3
    assert (settings.executor.name, settings.executor.shards) == ("ray", 4)
    assert settings.cache.path == Path.cwd() / "relative" / "cache.sqlite"
    assert (settings.export.conf.dpo_pairing.value, settings.export.strict) == ("all_pairs", True)
    assert (settings.strict, settings.resume) == (True, True)
    assert settings.generation.provider is settings.provider and settings.generation.cache == settings.cache
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.provider.samples = 1
    assert dataclasses.replace(settings.provider, samples=1).samples == 1  # a new, unsealed object


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["task.n_seeds=0"], "task.n_seeds must be >= 1, got 0"),
        (["provider=openai"], "provider.model is required; set it on the command line (provider.model=...)"),
        (["executor.shards=0"], "executor.shards must be >= 1, got 0"),
        (["export.max_listed_lines=-1"], "export.max_listed_lines must be >= 0, got -1"),
        (
            ["constraints.echo_words=-1"],
            "constraints.echo_words must be an integer from 0 (off) to 64, got -1",
        ),
        (["task=research_qa", "stage=nope"], "stage must be one of export, modelfiles, check, drift, all"),
        (["task=turn_generation", "task.kind=nope"], "task.kind: "),
        (["task.job=storyforge.pipeline.run"], "task.job 'storyforge.pipeline.run' is not a storyforge job"),
        (["drift.allow=-1"], "drift.allow must be >= 0, got -1"),
        (["drift.server_prompts=txt"], "drift.server_prompts must be chat or text, got 'txt'"),
    ],
    ids=["task", "provider", "executor", "export", "echo", "stage", "render-kind", "job", "allow", "prompts"],
)
def test_settings_errors_name_the_key(hydra_conf: None, overrides: list[str], message: str) -> None:
    """A bad value stops the read with one line naming the key (the messages the checks always gave)."""
    with pytest.raises(ConfigError) as caught:
        read_settings(compose("config", overrides=overrides))
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_the_answer_checks_read_the_echo_rule_and_the_completion_cap(hydra_conf: None) -> None:
    """constraints.echo_words and the provider's max_tokens (Ollama: options.num_predict) reach
    the checks' options; without a provider the cap is unknown."""
    openai = ["provider=openai", "provider.model=m", "provider.max_tokens=300", "constraints.echo_words=12"]
    ollama = ["provider=ollama", "provider.model=m", "+provider.options.num_predict=99"]
    assert read_settings(compose("config", overrides=openai)).export.echo_words == 12
    assert read_settings(compose("config", overrides=openai)).export.max_tokens == 300
    assert read_settings(compose("config", overrides=ollama)).export.max_tokens == 99
    plain = read_settings(compose("config", overrides=["task.n_seeds=3"])).export
    assert (plain.echo_words, plain.max_tokens) == (8, None)
