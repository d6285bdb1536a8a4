"""The TinyStories rules between config groups, in one place (:mod:`storyforge.config.settings`):
each combination a run cannot do is refused with one line naming the keys, before any file
is written; the combinations it can do pass."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hydra import compose

from storyforge.config.settings import check_tinystories_run, read_settings
from storyforge.errors import ConfigError

OPENAI = ["provider=openai", "provider.base_url=http://127.0.0.1:9/v1", "provider.model=fake"]


@pytest.mark.parametrize(
    ("overrides", "journal", "refused"),
    [
        (["regenerate.max_attempts=2"], False, "regenerate.max_attempts > 1 asks a model again; choose"),
        (["judge=content_safety"], False, "judge=... asks a judge model"),
        ([*OPENAI, "completions={completions}"], False, "would generate new ones"),
        (
            [*OPENAI, "judge=content_safety", "regenerate.max_attempts=2", "completions={completions}"],
            False,
            "which a completions file cannot be",
        ),
        ([*OPENAI, "stage=judge"], False, "stage=judge adds a judge to a finished run"),
        ([*OPENAI, "provider.replay=only", "cache.path=null"], False, "there is no generations.jsonl"),
        ([*OPENAI, "provider.replay=only", "cache.path=null"], True, None),
        ([*OPENAI, "provider.replay=only"], False, None),
        ([*OPENAI, "judge=content_safety", "regenerate.max_attempts=3"], False, None),
        ([*OPENAI, "judge=content_safety", "completions={completions}"], False, None),
        (["completions={completions}"], False, None),
    ],
)
def test_run_rules(
    hydra_conf: None, tmp_path: Path, overrides: list[str], journal: bool, refused: str | None
) -> None:
    completions = tmp_path / "answers.jsonl"
    completions.write_text("")
    if journal:
        (tmp_path / "generations.jsonl").write_text("")
    settings = read_settings(
        compose(
            "config",
            overrides=["task=tinystories", *(o.format(completions=completions) for o in overrides)],
        )
    )
    if refused is None:
        check_tinystories_run(settings, tmp_path / "generations.jsonl")
        return
    with pytest.raises(ConfigError, match=r"^[^\n]*" + re.escape(refused)):
        check_tinystories_run(settings, tmp_path / "generations.jsonl")
