"""Provider configs: conf/provider/*.yaml compose against their schemas and bad values name their key."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from provider_support import REPO

from storyforge.config import register_configs
from storyforge.config.provider import OllamaProviderConf, OpenAIProviderConf, ProviderConf
from storyforge.errors import ConfigError
from storyforge.providers import build_provider, provider_conf, provider_enabled
from storyforge.providers.ollama import OllamaProvider
from storyforge.providers.openai import OpenAIProvider

CONF = str(REPO / "conf")


def _compose(overrides: list[str], config_name: str | None = None) -> Any:
    register_configs()
    with initialize_config_dir(config_dir=CONF, version_base=None):
        return compose(config_name=config_name, overrides=overrides)


@pytest.mark.parametrize(
    ("overrides", "schema", "provider_cls"),
    [
        (["+provider=openai", "provider.model=m"], OpenAIProviderConf, OpenAIProvider),
        (["+provider=ollama", "provider.model=llama3"], OllamaProviderConf, OllamaProvider),
    ],
    ids=["openai", "ollama"],
)
def test_provider_options_compose_to_their_schema(overrides, schema, provider_cls):
    """Each model-server option composes, converts to its schema and builds its provider class."""
    cfg = _compose(overrides)
    conf = provider_conf(cfg)
    assert type(conf) is schema
    assert isinstance(build_provider(conf), provider_cls)
    assert provider_enabled(cfg)


def test_root_config_defaults_to_no_provider():
    """The root config selects provider=none: prompts only, and building a provider says so."""
    cfg = _compose([], config_name="config")
    assert cfg.provider.name == "none"
    assert not provider_enabled(cfg)
    with pytest.raises(ConfigError, match=re.escape("provider=none sends no requests")):
        build_provider(provider_conf(cfg))


def test_root_config_accepts_the_documented_command_line():
    """`provider=openai provider.base_url=... provider.model=NAME provider.samples=4` composes."""
    cfg = _compose(
        [
            "provider=openai",
            "provider.base_url=http://localhost:8000/v1",
            "provider.model=NAME",
            "provider.samples=4",
        ],
        config_name="config",
    )
    conf = provider_conf(cfg)
    assert (conf.name, conf.samples, conf.model) == ("openai", 4, "NAME")


def test_ollama_options_accept_new_keys_from_the_command_line():
    """Ollama's free-form options take new keys such as temperature and num_ctx."""
    cfg = _compose(
        [
            "+provider=ollama",
            "provider.model=l",
            "+provider.options.temperature=0.2",
            "+provider.options.num_ctx=4096",
        ]
    )
    assert provider_conf(cfg).options == {"temperature": 0.2, "num_ctx": 4096}


def test_misspelled_key_fails_at_composition():
    """A typo in a provider key is refused by the schema before anything runs."""
    with pytest.raises(ConfigCompositionException, match="temprature"):
        _compose(["+provider=openai", "provider.model=m", "provider.temprature=0.5"])


def test_missing_model_names_the_key():
    """Without provider.model the error says which key to set."""
    cfg = _compose(["+provider=openai"])
    with pytest.raises(ConfigError, match=re.escape("provider.model is required")):
        provider_conf(cfg)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"samples": 0}, "provider.samples must be >= 1, got 0"),
        ({"concurrency": 0}, "provider.concurrency must be >= 1, got 0"),
        ({"max_retries": -1}, "provider.max_retries must be >= 0, got -1"),
        ({"timeout_s": 0.0}, "provider.timeout_s must be > 0, got 0.0"),
        ({"on_stale": "merge"}, "provider.on_stale must be one of refuse, redo; got 'merge'"),
        ({"base_url": "localhost:8000/v1"}, "provider.base_url must start with http:// or https://"),
        (
            {"prefix_continuation": "magic"},
            (
                "provider.prefix_continuation must be one of unsupported, continue_final_message, "
                "prefix_field, trailing_assistant; got 'magic'"
            ),
        ),
        ({"max_tokens": 0}, "provider.max_tokens must be >= 1, got 0"),
        ({"extra_body": {"model": "x", "n": 2}}, "provider.extra_body may not set model, n"),
        ({"_target_": "os.system"}, "provider._target_ must name a class inside storyforge.providers"),
    ],
    ids=lambda v: next(iter(v)) if isinstance(v, dict) else None,
)
def test_openai_check_names_the_bad_key(change, message):
    """check() raises ConfigError naming the key and the rule it breaks."""
    conf = replace(OpenAIProviderConf(model="m"), **change)
    with pytest.raises(ConfigError, match=re.escape(message)):
        conf.check()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"prefix_continuation": "prefix_field"},
            "provider.prefix_continuation must be one of unsupported, trailing_assistant",
        ),
        ({"options": {"seed": "7"}}, "provider.options.seed must be an integer, got '7'"),
        ({"host": "ollama:11434"}, "provider.host must start with http:// or https://"),
    ],
)
def test_ollama_check_names_the_bad_key(change, message):
    """Ollama's schema rejects the OpenAI-only prefix dialects and non-integer seeds."""
    conf = replace(OllamaProviderConf(model="m"), **change)
    with pytest.raises(ConfigError, match=re.escape(message)):
        conf.check()


def test_api_key_env_must_be_set(monkeypatch):
    """Naming an unset environment variable for the key is a clear error, not an unauthenticated run."""
    monkeypatch.delenv("SF_NOT_SET_KEY", raising=False)
    conf = OpenAIProviderConf(model="m", api_key_env="SF_NOT_SET_KEY")
    with pytest.raises(ConfigError, match=re.escape("provider.api_key_env names 'SF_NOT_SET_KEY'")):
        build_provider(conf)


def test_plain_mapping_config_is_checked_against_the_schema_by_name():
    """A provider node without a schema (e.g. loaded from YAML) is matched to its schema by name."""
    cfg = OmegaConf.create(
        {
            "provider": {
                "name": "ollama",
                "_target_": "storyforge.providers.ollama.OllamaProvider",
                "model": "l",
                "samples": 2,
            }
        }
    )
    conf = provider_conf(cfg)
    assert isinstance(conf, OllamaProviderConf) and conf.samples == 2
    bad = OmegaConf.create({"provider": {"name": "ollama", "model": "l", "temprature": 1}})
    with pytest.raises(ConfigError, match=r"provider\.temprature: unknown key"):
        provider_conf(bad)


def test_target_outside_the_package_is_refused():
    """build_provider imports only storyforge.providers classes, whatever the config says."""
    conf = ProviderConf(name="evil")
    conf._target_ = "subprocess.Popen"
    with pytest.raises(
        ConfigError, match=re.escape("must name a class inside storyforge.providers, got 'subprocess.Popen'")
    ):
        build_provider(conf)
