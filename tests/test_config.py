"""Hydra configuration of the TinyStories job: schemas, cross-field checks, experiments."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import DictConfig, OmegaConf

from storyforge.config import register_configs
from storyforge.config.common import config_sha256
from storyforge.config.tinystories import check
from storyforge.errors import ConfigError
from storyforge.tasks.tinystories.spec import SPEC_CONSTRAINTS, THEME_SET, IntRange

CONF = Path(__file__).resolve().parents[1] / "conf"
EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
TINYSTORIES_EXPERIMENTS = ("hard_constraints", "short_stories")


@pytest.fixture(scope="module", autouse=True)
def _hydra() -> Iterator[None]:
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        yield


@pytest.fixture(scope="module")
def default_cfg(_hydra: None) -> DictConfig:
    """The default composition, made once (composing costs about half a second)."""
    return compose("config")


def overridden(cfg: DictConfig, overrides: list[str]) -> DictConfig:
    """A copy of ``cfg`` with ``key=value`` overrides applied (values parsed as YAML)."""
    out = copy.deepcopy(cfg)
    for override in overrides:
        key, _, value = override.partition("=")
        OmegaConf.update(out, key, yaml.safe_load(value), merge=False)
    return out


def test_default_config_is_the_seed_specification(default_cfg: DictConfig) -> None:
    """The default composition gives the spec's constraints, all themes, 1000 seeds and no provider."""
    cfg = default_cfg
    settings = check(cfg)
    assert settings.constraints == SPEC_CONSTRAINTS
    assert settings.themes == THEME_SET
    assert (settings.n_seeds, settings.seed, settings.strict) == (1000, 1234, False)
    assert settings.system_message is None and settings.seeds_path is None and settings.completions is None
    assert cfg.provider.name == "none"
    assert len(settings.pools.protagonists) >= 50
    assert len(settings.pools.objects) + len(settings.pools.banned) >= 200
    assert "resume" not in cfg


def test_template_group_precedes_the_task(default_cfg: DictConfig) -> None:
    """cfg.template holds the canonical instruction template of the tinystories task."""
    cfg = default_cfg
    assert cfg.template.id == "tinystories_instruction"
    assert cfg.template.task == "tinystories"


COMPOSE_ERRORS = [
    pytest.param(
        ["constraints.min_sentnces=3"], "Could not override 'constraints.min_sentnces'", id="typo_key"
    ),
    pytest.param(["task.n_sedes=3"], "Could not override 'task.n_sedes'", id="typo_task_key"),
    pytest.param(
        ["constraints.max_chars=lots"], "Error merging override constraints.max_chars=lots", id="bad_type"
    ),
    pytest.param(["sed=1"], "Could not override 'sed'", id="typo_root_key"),
    pytest.param(["themes=al"], "Could not find 'themes/al'", id="unknown_option"),
]


@pytest.mark.parametrize(("overrides", "message"), COMPOSE_ERRORS)
def test_structured_configs_refuse_typos_at_composition(overrides: list[str], message: str) -> None:
    """A key the schema does not have, or a value of the wrong type, fails before the job starts."""
    with pytest.raises(ConfigCompositionException, match=re.escape(message)):
        compose("config", overrides=overrides)


CHECK_ERRORS = [
    pytest.param(
        ["constraints.min_sentences=10"],
        "constraints.min_sentences (10) must be <= constraints.max_sentences (9)",
        id="min_gt_max",
    ),
    pytest.param(["constraints.min_sentences=0"], "constraints.min_sentences must be >= 1, got 0", id="zero"),
    pytest.param(
        ["constraints.banned_count.min=2", "constraints.banned_count.max=1"],
        "constraints.banned_count.min (2) must be <= constraints.banned_count.max (1)",
        id="range_inverted",
    ),
    pytest.param(
        ["constraints.required_length.max=60"],
        "constraints.required_length is 3..60 but the seed specification allows only 3..40; "
        "a configured range may narrow it, not widen it",
        id="range_widened",
    ),
    pytest.param(
        ["constraints.max_chars=5000"],
        "constraints.max_chars must be between 1 and 2000, got 5000",
        id="max_chars",
    ),
    pytest.param(
        ["constraints.max_sentences=100"],
        "constraints.max_sentences (100) does not fit constraints.max_chars (2000): at 40 characters "
        "a sentence, at most 50 sentences fit; lower constraints.max_sentences",
        id="sentences_over_chars",
    ),
    pytest.param(
        ["constraints.max_chars=300"],
        "constraints.max_sentences (9) does not fit constraints.max_chars (300): at 40 characters "
        "a sentence, at most 7 sentences fit; lower constraints.max_sentences",
        id="chars_under_sentences",
    ),
    pytest.param(["task.n_seeds=0"], "task.n_seeds must be >= 1, got 0", id="n_seeds"),
    pytest.param(
        ["task.val_fraction=1.5"], "task.val_fraction must be between 0 and 1, got 1.5", id="val_fraction"
    ),
    pytest.param(
        ["task.system_message=' '"], "task.system_message must be null or non-empty text", id="system"
    ),
    pytest.param(["budget.max_tokens=0"], "budget.max_tokens must be null or >= 1, got 0", id="budget"),
    pytest.param(
        ["themes.names=[kindnes]"],
        "themes.names[0]: unknown theme 'kindnes'. Did you mean 'kindness'? Allowed: " + ", ".join(THEME_SET),
        id="theme_typo",
    ),
    pytest.param(
        ["themes.names=[kindness,kindness]"],
        "themes.names[1]: theme 'kindness' is listed twice",
        id="theme_twice",
    ),
    pytest.param(
        ["pools.objects=[red ball,kite.,toy car,jam jar]"],
        "pools.objects[1]: 'kite.' must be words of letters or digits separated by single spaces (no punctuation)",
        id="pool_punctuation",
    ),
    pytest.param(
        ["pools.objects=[red ball,Red Ball,toy car,jam jar]"],
        "pools.objects[1]: 'Red Ball' repeats pools.objects[0] (case-insensitive)",
        id="pool_duplicate",
    ),
    pytest.param(
        ["pools.objects=[red ball,kite,toy car]"],
        "pools.objects has 3 entries of length 3..40; at least 4 are needed under the configured constraints",
        id="pool_too_small",
    ),
    pytest.param(
        ["seeds_path=/nonexistent/seeds.jsonl"],
        "seeds_path: no such file '/nonexistent/seeds.jsonl'",
        id="seeds",
    ),
    pytest.param(
        ["seed=abc"], "seed: Value 'abc' of type 'str' could not be converted to Integer", id="seed_type"
    ),
]


@pytest.mark.parametrize(("overrides", "message"), CHECK_ERRORS)
def test_check_names_the_key_of_a_cross_field_error(
    default_cfg: DictConfig, overrides: list[str], message: str
) -> None:
    """check() right after composition refuses bad combinations with a message naming the key."""
    cfg = overridden(default_cfg, overrides)
    with pytest.raises(ConfigError) as info:
        check(cfg)
    assert str(info.value).startswith(message)


def test_check_revalidates_a_snapshot_without_schemas(default_cfg: DictConfig) -> None:
    """A composed config saved and reloaded (no defaults list) still gets its typos caught."""
    snapshot = OmegaConf.create(OmegaConf.to_yaml(default_cfg))
    assert check(snapshot).constraints == SPEC_CONSTRAINTS
    OmegaConf.set_struct(snapshot, False)
    snapshot.constraints.min_sentnces = 3
    with pytest.raises(
        ConfigError,
        match=r"^constraints\.min_sentnces: unknown key\. Did you mean constraints\.min_sentences\?",
    ):
        check(snapshot)


def test_narrower_constraints_filter_pools_instead_of_failing(default_cfg: DictConfig) -> None:
    """A shorter phrase-length range keeps only the pool entries that fit it."""
    settings = check(overridden(default_cfg, ["constraints.required_length.max=8"]))
    assert settings.constraints.required_length == IntRange(min=3, max=8)
    assert settings.pools.objects and all(3 <= len(o) <= 8 for o in settings.pools.objects)


def test_config_hash_ignores_hydra_and_resume(default_cfg: DictConfig) -> None:
    """The manifest's config hash changes with content, not with +resume or the hydra node."""
    base = config_sha256(default_cfg)
    resumed = copy.deepcopy(default_cfg)
    OmegaConf.set_struct(resumed, False)
    resumed.resume = True
    resumed.hydra = {"run": {"dir": "elsewhere"}}
    assert config_sha256(resumed) == base
    assert config_sha256(overridden(default_cfg, ["seed=7"])) != base


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_composes(name: str) -> None:
    """Each conf/experiment/*.yaml composes; a tinystories one passes check() and changes the seeds."""
    cfg = compose("config", overrides=[f"+experiment={name}"])
    if name in TINYSTORIES_EXPERIMENTS:
        assert cfg.task.kind == "tinystories"
    if cfg.task.kind == "tinystories":
        settings = check(cfg)
        assert settings.n_seeds >= 1
        assert (settings.constraints, settings.n_seeds) != (SPEC_CONSTRAINTS, 1000)


GROUP_OPTIONS = [
    (group, p.stem)
    for group in ("themes", "constraints", "pools", "budget")
    for p in sorted((CONF / group).glob("*.yaml"))
]


@pytest.mark.parametrize(("group", "option"), GROUP_OPTIONS)
def test_every_group_option_passes_its_schema_and_check(
    default_cfg: DictConfig, group: str, option: str
) -> None:
    """Every option of the groups this job owns is valid against its schema and check()."""
    node = yaml.safe_load((CONF / group / f"{option}.yaml").read_text("utf-8"))
    assert node.pop("defaults") == [f"base_{group}", "_self_"]
    cfg = copy.deepcopy(default_cfg)
    OmegaConf.update(cfg, group, node, merge=False)
    check(cfg)
