"""The response cache: shared between runs, and provider.replay=only rebuilding a run with no server."""

from __future__ import annotations

import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from hydra import compose
from provider_support import REPO, assert_replayed

from storyforge.errors import ConfigError, DataError
from storyforge.pipeline import run_in
from storyforge.providers.base import Completion
from storyforge.providers.cache import ResponseCache
from storyforge.providers.retry import Outcome
from tests.support.fake_server import FakeServer

REBUILT = (
    "generations.jsonl",
    "validated.jsonl",
    "sft.jsonl",
    "rejects.jsonl",
    "dpo.jsonl",
    "completion_errors.jsonl",
    "report/summary.json",
    "report/summary.md",
    "report/label_counts.png",
    "report/pass_rate_by_theme.png",
    "report/sentence_counts.png",
)


def _args(base_url: str, cache: Path, n_seeds: int = 12) -> list[str]:
    return [
        f"task.n_seeds={n_seeds}",
        "provider=openai",
        f"provider.base_url={base_url}",
        "provider.model=fake",
        "provider.seed=3",
        "provider.samples=2",
        "provider.progress=false",
        f"cache.path={cache}",
    ]


def test_replay_only_rebuilds_a_run_from_its_snapshot_with_the_server_stopped(tmp_path: Path) -> None:
    """Rerun the .hydra snapshot with replay=only and no server: the same bytes, no request sent."""
    cache, first, again = tmp_path / "cache.sqlite", tmp_path / "first", tmp_path / "again"
    with FakeServer(latency_s=0.002) as server:
        subprocess.run(
            [sys.executable, "run.py", *_args(server.base_url, cache), f"hydra.run.dir={first}"],
            cwd=REPO,
            check=True,
            capture_output=True,
        )
        url = server.base_url
    assert server.request_count == 24
    with pytest.raises(OSError):  # nothing answers there any more
        urllib.request.urlopen(url + "/models", timeout=2)
    assert_replayed(first, again, REBUILT, requests=24)


def test_a_request_missing_from_the_cache_names_its_seed_and_sample(hydra_conf: None, tmp_path: Path) -> None:
    """replay=only with two more seeds than were cached: an error naming them; nothing is generated."""
    cache = tmp_path / "cache.sqlite"
    with FakeServer() as server:
        run_in(compose("config", overrides=_args(server.base_url, cache, n_seeds=3)), tmp_path / "a")
        url = server.base_url
    cfg = compose("config", overrides=[*_args(url, cache, n_seeds=5), "provider.replay=only"])
    expected = (
        f"provider.replay=only: 4 request(s) are not in the response cache {cache}: seed 'ts-000003' "
        "sample 0, seed 'ts-000003' sample 1, seed 'ts-000004' sample 0, seed 'ts-000004' sample 1. "
        "Run them against a server once (provider.replay=off) to fill the cache"
    )
    with pytest.raises(DataError, match=re.escape(expected)):
        run_in(cfg, tmp_path / "b")
    assert (tmp_path / "b" / "generations.jsonl").read_bytes() == b""


def test_a_second_run_sharing_the_cache_sends_nothing(hydra_conf: None, tmp_path: Path) -> None:
    """Another run (another directory, e.g. a sweep job) with the same requests is answered from the cache."""
    cache = tmp_path / "cache.sqlite"
    with FakeServer() as server:
        run_in(compose("config", overrides=_args(server.base_url, cache)), tmp_path / "a")
        sent = server.request_count
        manifest = run_in(
            compose("config", overrides=_args(server.base_url, cache, n_seeds=14)), tmp_path / "b"
        )
        assert server.request_count - sent == 4  # only the two new seeds' samples
    assert manifest["generation"]["cache_hits"] == 24
    first = (tmp_path / "a" / "generations.jsonl").read_bytes()
    assert (tmp_path / "b" / "generations.jsonl").read_bytes().startswith(first)


def test_replay_only_needs_a_cache_path(hydra_conf: None, tmp_path: Path) -> None:
    """replay=only without cache.path is a config error naming the key, found before any file
    (seeds, prompts, manifest) is written."""
    cfg = compose("config", overrides=[*_args("http://127.0.0.1:9/v1", tmp_path / "c"), "cache.path=null"])
    cfg.provider.replay = "only"
    with pytest.raises(ConfigError, match=re.escape("set cache.path=FILE")):
        run_in(cfg, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_errors_are_not_cached_and_answers_survive_reopening(tmp_path: Path) -> None:
    """Only answers are stored; they are there for the next process that opens the file."""
    cache = ResponseCache(tmp_path / "c.sqlite")
    answer = Outcome(
        completion=Completion(output="hi", finish_reason="stop"), error=None, attempts=2, latency_s=0.5
    )
    cache.put("openai/a", answer)
    cache.put("openai/b", Outcome(completion=None, error="HTTP 500", attempts=6, latency_s=0.1))
    cache.close()
    reopened = ResponseCache(tmp_path / "c.sqlite")
    assert reopened.get("openai/a") == answer
    assert reopened.get("openai/b") is None
    assert reopened.missing(["openai/a", "openai/b"]) == {"openai/b"}
    reopened.close()
