"""One shard's work without Ray: its seeds are those whose id hashes to it; its journal has one writer."""

from __future__ import annotations

import fcntl
import json
import threading
from pathlib import Path

from omegaconf import OmegaConf
from run_support import provider_overrides, run_cfg

from storyforge.executors import shard_of
from storyforge.executors.shard import LOCK_FILE, generate_shard, render_shard
from storyforge.testing.fake_server import FakeServer


def test_render_shard_keeps_the_seeds_that_hash_to_it_in_order(hydra_conf: None, tmp_path: Path) -> None:
    """Shard 1 of 3 holds exactly the seeds whose id hashes to 1, with their indexes as positions."""
    plain = OmegaConf.to_container(run_cfg("task.n_seeds=30"), resolve=True)
    rendered = render_shard(plain, str(tmp_path), 1, 3)  # type: ignore[arg-type]
    ids = [
        json.loads(line)["id"] for line in (tmp_path / "prompts_seed.jsonl").read_text("utf-8").splitlines()
    ]
    assert ids == [f"ts-{i:06d}" for i in range(30) if shard_of(f"ts-{i:06d}", 3) == 1]
    assert rendered.seeds == [(int(i.removeprefix("ts-")), i) for i in ids]


def test_a_shard_journal_waits_for_the_process_holding_its_lock(hydra_conf: None, tmp_path: Path) -> None:
    """While another process (here: this test) holds the shard lock, generation does not start."""
    with FakeServer() as server:
        plain = OmegaConf.to_container(
            run_cfg("task.n_seeds=6", *provider_overrides(server.base_url)), resolve=True
        )
        render_shard(plain, str(tmp_path), 0, 1)  # type: ignore[arg-type]
        result: dict[str, object] = {}
        with (tmp_path / LOCK_FILE).open("wb") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            worker = threading.Thread(target=lambda: result.update(generate_shard(plain, str(tmp_path))))  # type: ignore[arg-type]
            worker.start()
            worker.join(timeout=1.0)
            assert worker.is_alive() and server.request_count == 0
            assert not (tmp_path / "generations.jsonl").exists()
        worker.join(timeout=60)
    assert not worker.is_alive() and result["total"] == 6 and server.request_count == 6
