"""``provider=llama_cpp``'s settings: the served name, the server's size, and mistakes named by key.

The server itself is started by the real-model tests (tests/integration/test_real_model.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from provider_support import REPO

from storyforge.config import register_configs
from storyforge.config.provider import LlamaCppProviderConf, model_info, provider_conf
from storyforge.errors import ConfigError
from storyforge.providers import build_provider
from storyforge.providers.llama_cpp import LlamaCppProvider, context_per_slot


def _compose(*overrides: str) -> Any:
    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        return compose("config", overrides=["provider=llama_cpp", *overrides])


@pytest.fixture
def gguf(tmp_path: Path) -> Path:
    path = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    path.write_bytes(b"GGUF")
    return path


def test_the_file_name_is_the_served_name_and_the_pricing_key(gguf: Path) -> None:
    cfg = _compose(f"provider.gguf={gguf}")
    conf = provider_conf(cfg)
    assert isinstance(conf, LlamaCppProviderConf)
    assert conf.model == "SmolLM2-135M-Instruct.Q4_1"
    assert (conf.concurrency, conf.threads, conf.context) == (2, 1, None)
    provider = build_provider(conf)
    assert isinstance(provider, LlamaCppProvider) and provider.name == "llama_cpp"
    assert provider.body(_request())["model"] == "SmolLM2-135M-Instruct.Q4_1"
    assert provider.describe()["gguf"] == str(gguf) and "url" not in provider.describe()
    assert model_info(cfg.provider)["name"] == "SmolLM2-135M-Instruct.Q4_1"


def test_a_given_name_is_served_instead(gguf: Path) -> None:
    conf = provider_conf(_compose(f"provider.gguf={gguf}", "provider.model=smollm2"))
    assert conf.model == "smollm2"


def _request() -> Any:
    from storyforge.providers.base import ChatRequest

    return ChatRequest(id="p", split="train", sample=0, messages=({"role": "user", "content": "hi"},))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ((), "provider.gguf is required"),
        (("provider.gguf=/nonexistent/model.gguf",), "provider.gguf: no such file: /nonexistent/model.gguf"),
        (("provider.gguf=GGUF", "provider.base_url=http://localhost:8080/v1"), "use provider=openai"),
        (("provider.gguf=GGUF", "provider.threads=0"), "provider.threads must be >= 1"),
        (("provider.gguf=GGUF", "provider.context=10"), "provider.context must be >= 64"),
        (("provider.gguf=GGUF", "provider.server_bin=/nonexistent/llama-server"), "provider.server_bin"),
        (("provider.gguf=GGUF", "provider.server_args=[-c,4096]"), "provider.server_args may not set -c"),
        (("provider.gguf=GGUF", "provider.server_args=['--port=9']"), "may not set --port"),
        (("provider.gguf=GGUF", "provider.api_key_env=KEY"), "provider.api_key_env"),
    ],
    ids=[
        "no-gguf",
        "missing-file",
        "base-url",
        "threads",
        "context",
        "server-bin",
        "ctx-arg",
        "port-arg",
        "key",
    ],
)
def test_mistakes_name_their_key(gguf: Path, overrides: tuple[str, ...], message: str) -> None:
    cfg = _compose(*(o.replace("GGUF", str(gguf)) for o in overrides))
    with pytest.raises(ConfigError) as info:
        provider_conf(cfg)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("context", "max_tokens", "longest", "expected"),
    [
        (None, 256, 0, 512),  # 0 + 256 + 64, rounded up to 256
        (None, 256, 1200, 768),  # 400 + 256 + 64 = 720
        (None, 12, 3000, 1280),  # 1000 + 12 + 64 = 1076
        (4096, 256, 100_000, 4096),  # a given context is used as it is
    ],
)
def test_the_context_per_slot_covers_the_longest_request_and_its_answer(
    gguf: Path, context: int | None, max_tokens: int, longest: int, expected: int
) -> None:
    conf = LlamaCppProviderConf(gguf=str(gguf), context=context, max_tokens=max_tokens)
    conf.check()
    assert context_per_slot(conf, longest) == expected


def test_a_server_that_does_not_start_fails_the_run_in_one_line(gguf: Path, tmp_path: Path) -> None:
    """A llama-server that exits at start: exit 4, one line with the server's last words and its log."""
    import os
    import subprocess
    import sys

    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\necho 'loading model'\necho 'error: failed to load model' >&2\nexit 1\n")
    binary.chmod(0o755)
    run = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run(
        [
            sys.executable,
            "run.py",
            "task=tinystories",
            "task.n_seeds=2",
            "provider=llama_cpp",
            f"provider.gguf={gguf}",
            f"provider.server_bin={binary}",
            "provider.progress=false",
            "cache.path=null",
            f"hydra.run.dir={run}",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 4, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    expected = (
        f"error: provider=llama_cpp: llama-server exited with 1; its log {run / 'llama-server.log'} "
        "ends with: error: failed to load model"
    )
    assert lines == [expected]
    log = (run / "run.log").read_text("utf-8")
    assert f"llama-server: starting {binary} -m {gguf} --alias SmolLM2-135M-Instruct.Q4_1" in log


@pytest.mark.parametrize(
    ("model", "override"),
    [
        (None, "++pricing.models={SmolLM2-135M-Instruct.Q4_1: {input: 0.01, output: 0.02}}"),
        (
            "Qwen/Qwen2.5-7B-Instruct",
            "++pricing.models={Qwen/Qwen2.5-7B-Instruct: {input: 0.01, output: 0.02}}",
        ),
    ],
    ids=["file-name", "slash"],
)
def test_a_name_with_dots_or_slashes_is_priced_from_the_command_line(
    gguf: Path, model: str | None, override: str
) -> None:
    """The documented quoting prices the served name (the alias), also with `.` and `/` in it."""
    from storyforge.config.pricing import pricing_settings

    cfg = _compose(f"provider.gguf={gguf}", *([f"provider.model={model}"] if model else []), override)
    conf = provider_conf(cfg)
    price = pricing_settings(cfg).price(conf.model)
    assert price is not None and (price.input, price.output) == (0.01, 0.02)
    assert pricing_settings(cfg).price("gpt-4o") is not None  # the shipped prices are kept


class _TwoAttempts:
    """Chains of two attempts that never continue (only their length matters here)."""

    attempts = 2

    def journal(self, attempt: int) -> str:
        return f"attempt{attempt}.jsonl"

    def next_request(self, provider: Any, record: dict[str, Any], attempt: int) -> None:
        return None


def test_chains_of_attempts_are_sent_pass_by_pass(gguf: Path, tmp_path: Path) -> None:
    """The server's context is sized per pass from its longest request, which a chain's later
    attempts (repair conversations) are not known in advance to fit: no server is started."""
    from storyforge.config.provider import GenerationSettings
    from storyforge.providers.runner import generate_chains

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": "p", "split": "train", "messages": [{"role": "user", "content": "hi"}]}\n')
    settings = GenerationSettings(provider=provider_conf(_compose(f"provider.gguf={gguf}")))
    with pytest.raises(ConfigError, match="pass by pass"):
        generate_chains(settings, tmp_path / "run", prompts, _TwoAttempts())
    assert not (tmp_path / "run").exists()
