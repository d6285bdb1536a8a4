"""Shard assignment, the canonical generations order, and the executor config (no Ray needed)."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from run_support import run_cfg

from storyforge.config.common import config_sha256
from storyforge.config.executor import ExecutorConf
from storyforge.config.executor import executor_settings as executor_conf
from storyforge.errors import ConfigError
from storyforge.executors import shard_of, sort_generations


def test_shard_of_is_a_fixed_function_of_the_id() -> None:
    """Shards come from sha256 of the id, so every process and machine agrees (golden values)."""
    assert [shard_of(f"ts-{i:06d}", 8) for i in range(10)] == [1, 7, 2, 7, 4, 1, 2, 0, 2, 1]
    assert shard_of("ts-000000", 1) == 0


@given(st.text(max_size=40), st.integers(min_value=1, max_value=1000))
def test_shard_of_is_always_a_valid_shard(seed_id: str, shards: int) -> None:
    """Any id (any Unicode) lands in 0..shards-1."""
    assert 0 <= shard_of(seed_id, shards) < shards


def _write(path: Path, records: list[dict[str, object]]) -> None:
    path.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in records))


def test_sort_generations_orders_by_prompt_then_sample(tmp_path: Path) -> None:
    """Completion order becomes prompt order, then sample; an unknown id keeps its place at the end."""
    prompts = tmp_path / "prompts.jsonl"
    _write(prompts, [{"id": i, "messages": []} for i in ("c", "a", "b")])
    wanted = [{"id": i, "sample": k, "output": f"{i}{k}"} for i in ("c", "a", "b") for k in range(3)]
    shuffled = wanted[:]
    random.Random(3).shuffle(shuffled)
    stray = [{"id": "zz", "sample": 1, "output": "?"}, {"id": "yy", "sample": 0, "output": "?"}]
    path = tmp_path / "generations.jsonl"
    _write(path, shuffled[:4] + stray[:1] + shuffled[4:] + stray[1:])
    sort_generations(path, prompts)
    assert [json.loads(line) for line in path.read_bytes().splitlines()] == wanted + stray


def test_sort_generations_leaves_a_sorted_file_alone(tmp_path: Path) -> None:
    """A file already in order is not rewritten (same inode)."""
    prompts, path = tmp_path / "prompts.jsonl", tmp_path / "generations.jsonl"
    _write(prompts, [{"id": "a"}, {"id": "b"}])
    _write(path, [{"id": "a", "sample": 0}, {"id": "b", "sample": 0}])
    inode = path.stat().st_ino
    sort_generations(path, prompts)
    assert path.stat().st_ino == inode


BAD_EXECUTORS = [
    pytest.param({"name": "dask"}, "executor.name must be one of local, ray; got 'dask'", id="name"),
    pytest.param({"shards": 0}, "executor.shards must be >= 1, got 0", id="shards"),
    pytest.param({"num_cpus": 0}, "executor.num_cpus must be >= 1 or null, got 0", id="num_cpus"),
    pytest.param({"max_retries": -1}, "executor.max_retries must be >= 0, got -1", id="max_retries"),
    pytest.param(
        {"address": "head:6379"},
        "executor.address must be local, auto or ray://HOST:PORT; got 'head:6379'",
        id="address",
    ),
]


@pytest.mark.parametrize(("settings", "message"), BAD_EXECUTORS)
def test_bad_executor_settings_name_their_key(settings: dict[str, object], message: str) -> None:
    """Each broken rule is a ConfigError naming the key and the value."""
    with pytest.raises(ConfigError, match=re.escape(message)):
        ExecutorConf(**settings).check()  # type: ignore[arg-type]


def test_executor_group_composes_and_leaves_the_config_hash_alone(hydra_conf: None) -> None:
    """executor=local is the default; executor=ray composes; both give the same config hash."""
    local = run_cfg()
    remote = run_cfg("executor=ray", "executor.address=ray://head:10001", "executor.shards=16")
    assert executor_conf(local) == ExecutorConf()
    assert executor_conf(remote) == ExecutorConf(name="ray", address="ray://head:10001", shards=16)
    assert config_sha256(local) == config_sha256(remote)
