"""Shared pieces of the provider tests: prompt files, configs, record checks, the server fixture."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from storyforge.config.provider import (
    GenerationSettings,
    OllamaProviderConf,
    OpenAIProviderConf,
    generation_settings,
)
from tests.support.fake_server import FakeServer

REPO = Path(__file__).resolve().parents[2]

# Tiny waits everywhere: the suite exercises retries, not patience.
FAST = {"backoff_base_s": 0.001, "backoff_max_s": 0.01, "max_retry_after_s": 0.05, "progress": False}


@pytest.fixture
def server() -> Iterator[FakeServer]:
    """A loopback server speaking both APIs, stopped after the test."""
    with FakeServer() as srv:
        yield srv


def write_prompts(path: Path, n: int, *, prefill: bool = False) -> Path:
    """``n`` prompts p000..; each user message names its id so replies can be matched."""
    with path.open("w", encoding="utf-8") as fh:
        for i in range(n):
            messages: list[dict[str, Any]] = [
                {"role": "system", "content": "You write stories."},
                {"role": "user", "content": f"tell p{i:03d}"},
            ]
            if prefill:
                messages.append({"role": "assistant", "content": "Once upon a time", "prefix": True})
            fh.write(
                json.dumps({"id": f"p{i:03d}", "split": "train" if i % 5 else "val", "messages": messages})
                + "\n"
            )
    return path


def _settings(conf: Any, root: dict[str, Any]) -> GenerationSettings:
    """Generation settings read, as a run reads them, from a root config holding ``conf``."""
    return generation_settings(OmegaConf.create({"provider": OmegaConf.structured(conf), **root}))


def openai_cfg(
    server: FakeServer, *, root: dict[str, Any] | None = None, **overrides: Any
) -> GenerationSettings:
    """Generation settings whose provider is the OpenAI-compatible backend at ``server``.

    ``root`` holds top-level keys (``strict``, ``resume``, ``cache``)."""
    settings = {
        "base_url": server.base_url,
        "model": "m",
        "concurrency": 4,
        "timeout_s": 5.0,
        **FAST,
        **overrides,
    }
    return _settings(OpenAIProviderConf(**settings), root or {})


def ollama_cfg(
    server: FakeServer, *, root: dict[str, Any] | None = None, **overrides: Any
) -> GenerationSettings:
    """Generation settings whose provider is the Ollama backend at ``server``."""
    settings = {
        "host": server.host,
        "model": "llama3",
        "concurrency": 4,
        "timeout_s": 5.0,
        **FAST,
        **overrides,
    }
    return _settings(OllamaProviderConf(**settings), root or {})


def records(path: Path) -> list[dict[str, Any]]:
    """Every generation record in ``path``."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def assert_exactly_once(path: Path, n_prompts: int, samples: int) -> list[dict[str, Any]]:
    """Each (id, sample) appears once, every line is whole JSON, and each output answers its prompt."""
    text = path.read_text(encoding="utf-8")
    assert text.endswith("\n")
    recs = records(path)
    counts = Counter((r["id"], r["sample"]) for r in recs)
    expected = {(f"p{i:03d}", k) for i in range(n_prompts) for k in range(samples)}
    assert set(counts) == expected
    assert all(c == 1 for c in counts.values()), [k for k, c in counts.items() if c > 1]
    for r in recs:
        if r["error"] is None:
            assert r["output"].startswith(f"reply to: tell {r['id']}"), r
    return recs


def replay_snapshot(run_dir: Path, into: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    """Rerun ``run_dir``'s ``.hydra`` snapshot into ``into`` with ``provider.replay=only``."""
    return subprocess.run(
        [
            sys.executable,
            "run.py",
            "--config-path",
            str(run_dir / ".hydra"),
            "--config-name",
            "config",
            "provider.replay=only",
            f"hydra.run.dir={into}",
            *overrides,
        ],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
    )


@pytest.fixture(scope="module")
def hydra_conf() -> Iterator[None]:
    """Hydra initialised on the repository's conf/ for ``compose`` in a test module."""
    from hydra import initialize_config_dir

    from storyforge.config import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        yield


def assert_replayed(run_dir: Path, into: Path, files: tuple[str, ...], requests: int) -> None:
    """``run_dir``'s snapshot replayed into ``into`` rebuilds ``files`` byte for byte, every one
    of its ``requests`` answered from the cache."""
    proc = replay_snapshot(run_dir, into)
    assert proc.returncode == 0, proc.stderr
    for name in files:
        assert (into / name).read_bytes() == (run_dir / name).read_bytes(), name
    manifest = json.loads((into / "manifest.json").read_text("utf-8"))
    assert manifest["generation"]["cache_hits"] == requests and manifest["generation"]["requests"] == requests
