"""The response cache keeps the rules of a live answer: the model check, and entries that do not read back."""

from __future__ import annotations

import json
import logging
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from provider_support import REPO

from storyforge.config import register_configs
from storyforge.errors import DataError, ProviderError
from storyforge.pipeline import run_in
from tests.support.fake_server import FakeServer


@pytest.fixture(scope="module")
def hydra_conf() -> Iterator[None]:
    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        yield


def _args(base_url: str, cache: Path, *more: str) -> list[str]:
    return [
        "task.n_seeds=3",
        "provider=openai",
        f"provider.base_url={base_url}",
        "provider.model=wanted",
        "provider.seed=3",
        "provider.progress=false",
        f"cache.path={cache}",
        *more,
    ]


@pytest.mark.parametrize("replay", ["off", "only"])
def test_a_cached_answer_from_another_model_is_refused_under_error(
    hydra_conf: None, tmp_path: Path, replay: str
) -> None:
    """Kept once under on_model_mismatch=warn, an answer from another model stops a later run under error."""
    cache = tmp_path / "cache.sqlite"
    with FakeServer(served_model="other-model") as server:
        run_in(
            compose("config", overrides=_args(server.base_url, cache, "provider.on_model_mismatch=warn")),
            tmp_path / "a",
        )
        sent = server.request_count
        cfg = compose("config", overrides=_args(server.base_url, cache, f"provider.replay={replay}"))
        expected = f"the response cache {cache} holds an answer from model 'other-model', but provider.model is 'wanted'"
        with pytest.raises(ProviderError, match=re.escape(expected)):
            run_in(cfg, tmp_path / "b")
        assert server.request_count == sent  # nothing was asked again
        # Under warn it is still replayed, with the served model on the record.
        manifest = run_in(
            compose("config", overrides=_args(server.base_url, cache, "provider.on_model_mismatch=warn")),
            tmp_path / "c",
        )
        assert server.request_count == sent
    assert manifest["generation"]["cache_hits"] == 3


def _corrupt(cache: Path, value: str) -> None:
    con = sqlite3.connect(cache)
    try:
        with con:
            con.execute(
                "UPDATE responses SET value = ? WHERE key = (SELECT min(key) FROM responses)",
                (value,),
            )
    finally:
        con.close()


@pytest.mark.parametrize("value", ["{not json", '{"output": 3}', "[]", '{"attempts": 1}'])
def test_a_corrupt_entry_is_a_miss_said_once_and_replaced(
    hydra_conf: None, tmp_path: Path, value: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An entry that does not read back is asked again (one warning), and the new answer replaces it."""
    cache = tmp_path / "cache.sqlite"
    with FakeServer() as server:
        run_in(
            compose("config", overrides=_args(server.base_url, cache, "provider.model=fake")), tmp_path / "a"
        )
        _corrupt(cache, value)
        sent = server.request_count
        with caplog.at_level(logging.WARNING):
            manifest = run_in(
                compose("config", overrides=_args(server.base_url, cache, "provider.model=fake")),
                tmp_path / "b",
            )
        assert server.request_count == sent + 1
        assert manifest["generation"]["cache_hits"] == 2
        warned = [r for r in caplog.records if "does not read back" in r.getMessage()]
        assert len(warned) == 1
        again = run_in(
            compose("config", overrides=_args(server.base_url, cache, "provider.model=fake")), tmp_path / "c"
        )
        assert server.request_count == sent + 1  # the replaced entry reads back
    assert again["generation"]["cache_hits"] == 3
    outputs = [
        [
            json.loads(line)["output"]
            for line in (tmp_path / run / "generations.jsonl").read_text("utf-8").splitlines()
        ]
        for run in ("a", "b", "c")
    ]
    assert outputs[0] == outputs[1] == outputs[2]


def test_a_corrupt_entry_under_replay_only_is_one_error(hydra_conf: None, tmp_path: Path) -> None:
    """replay=only cannot ask again: the run stops with one line naming the cache, seed and sample."""
    cache = tmp_path / "cache.sqlite"
    with FakeServer() as server:
        run_in(
            compose("config", overrides=_args(server.base_url, cache, "provider.model=fake")), tmp_path / "a"
        )
        url = server.base_url
    _corrupt(cache, "{not json")
    cfg = compose("config", overrides=_args(url, cache, "provider.model=fake", "provider.replay=only"))
    with pytest.raises(
        DataError,
        match=r"provider.replay=only: the response cache .* entry for seed 'ts-00000\d' sample 0 does not read back \(JSONDecodeError",
    ) as info:
        run_in(cfg, tmp_path / "b")
    assert "\n" not in str(info.value)
