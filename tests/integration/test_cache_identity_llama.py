"""The response cache against real llama.cpp servers: the same alias over other weights is not
answered from the cache, a replica of the same file is, and a concurrency above the server's
slots is warned about (``/props`` as llama-server really reports it)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from storyforge.config.provider import OpenAIProviderConf, generation_settings
from storyforge.providers.runner import generate_for_job
from tests.support.llama_server import LlamaServer
from tests.support.tiny_gguf import write_tiny_llama

pytestmark = pytest.mark.integration

N = 3


def _run(server: LlamaServer, cache: Path, out: Path, prompts: Path, concurrency: int = 2) -> dict:
    conf = OpenAIProviderConf(
        base_url=server.base_url,
        model="tiny",
        max_tokens=8,
        seed=1,
        temperature=1.0,
        concurrency=concurrency,
        progress=False,
    )
    root = {"provider": OmegaConf.structured(conf), "cache": {"path": str(cache)}}
    _, stats = generate_for_job(generation_settings(OmegaConf.create(root)), out, prompts)
    return stats


def test_llama_servers_share_cached_answers_only_for_the_same_model_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    one = write_tiny_llama(tmp_path / "one.gguf", seed=3)
    other = write_tiny_llama(tmp_path / "other.gguf", seed=4)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": f"Tell story {i}."}]}) + "\n"
            for i in range(N)
        )
    )
    cache = tmp_path / "cache.sqlite"
    with LlamaServer(one, alias="tiny", parallel=2) as server, caplog.at_level(logging.WARNING):
        first = _run(server, cache, tmp_path / "a", prompts, concurrency=8)
    assert first["cache"]["identity"]["source"] == "props"
    assert str(one) in first["cache"]["identity"]["reported"]
    slots = [r.getMessage() for r in caplog.records if "slot(s)" in r.getMessage()]
    assert len(slots) == 1 and slots[0].startswith("provider.concurrency=8 is above the 2 slot(s) ")
    with LlamaServer(one, alias="tiny", parallel=2) as replica:
        shared = _run(replica, cache, tmp_path / "b", prompts)
    assert shared["cache"]["answers_from_cache"] == N
    with LlamaServer(other, alias="tiny", parallel=2) as swapped:
        fresh = _run(swapped, cache, tmp_path / "c", prompts)
    assert fresh["cache"]["answers_from_cache"] == 0 and fresh["cache"]["answers_from_server"] == N
    assert fresh["cache"]["identity"]["digest"] != first["cache"]["identity"]["digest"]
