"""The response cache is on by default: one file per user, shared by runs and sweep jobs.

Every test here runs with ``STORYFORGE_RESPONSE_CACHE_DIR`` pointing at its own empty directory
(tests/conftest.py), so the user's real cache is never read or written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose
from provider_support import REPO, assert_replayed

from storyforge.config.provider import CACHE_DIR_ENV, cache_settings, describe_user_cache, user_cache_path
from storyforge.pipeline import run_in
from tests.support.fake_server import FakeServer

REBUILT = (
    "generations.jsonl",
    "validated.jsonl",
    "sft.jsonl",
    "rejects.jsonl",
    "dpo.jsonl",
    "report/summary.json",
)


def _args(base_url: str, n_seeds: int = 6) -> list[str]:
    return [
        f"task.n_seeds={n_seeds}",
        "provider=openai",
        f"provider.base_url={base_url}",
        "provider.model=fake",
        "provider.seed=3",
        "provider.samples=2",
        "provider.progress=false",
    ]


@pytest.mark.skipif(sys.platform in ("win32", "darwin"), reason="the XDG layout is the Linux/Unix default")
@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"HOME": "/h"}, "/h/.cache/storyforge/responses.sqlite"),
        ({"HOME": "/h", "XDG_CACHE_HOME": "/x/cache"}, "/x/cache/storyforge/responses.sqlite"),
        ({"HOME": "/h", "XDG_CACHE_HOME": ""}, "/h/.cache/storyforge/responses.sqlite"),
        # a relative XDG_CACHE_HOME is invalid by the XDG spec and ignored
        ({"HOME": "/h", "XDG_CACHE_HOME": "rel/cache"}, "/h/.cache/storyforge/responses.sqlite"),
        ({"HOME": "/h", "XDG_CACHE_HOME": "/x", CACHE_DIR_ENV: "/c"}, "/c/responses.sqlite"),
    ],
)
def test_the_user_cache_lives_in_the_platform_cache_directory(environ: dict[str, str], expected: str) -> None:
    assert user_cache_path(environ) == Path(expected)


@pytest.mark.skipif(sys.platform in ("win32", "darwin"), reason="the XDG layout is the Linux/Unix default")
@pytest.mark.parametrize("xdg", [True, False])
def test_the_default_config_uses_the_user_cache(
    hydra_conf: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, xdg: bool
) -> None:
    """`cache.path` defaults to `user`: $XDG_CACHE_HOME/storyforge/..., else ~/.cache/storyforge/..."""
    monkeypatch.delenv(CACHE_DIR_ENV)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    if xdg:
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
        expected = tmp_path / "xdg" / "storyforge" / "responses.sqlite"
    else:
        monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
        expected = tmp_path / "home" / ".cache" / "storyforge" / "responses.sqlite"
    cfg = compose("config")
    assert cfg.cache.path == "user"
    assert cache_settings(cfg).path == expected
    assert cache_settings(compose("config", overrides=["cache.path=null"])).path is None


def test_the_size_shown_counts_the_file_and_its_log(response_cache_dir: Path) -> None:
    path = response_cache_dir / "responses.sqlite"
    assert describe_user_cache() == f"{path}, not created yet"
    path.write_bytes(b"x" * 2_000_000)
    Path(f"{path}-wal").write_bytes(b"x" * 500_000)
    assert describe_user_cache() == f"{path}, 2.5 MB"


def test_help_shows_where_the_user_cache_is_and_its_size(tmp_path: Path) -> None:
    (tmp_path / "responses.sqlite").write_bytes(b"x" * 1_300_000)
    proc = subprocess.run(
        [sys.executable, "run.py", "--help"],
        cwd=REPO,
        env={**os.environ, CACHE_DIR_ENV: str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    line = next(line for line in proc.stdout.splitlines() if "cache.path=" in line)
    assert f"{tmp_path / 'responses.sqlite'}, 1.3 MB" in line
    assert "null" in line


def test_cache_path_null_turns_the_cache_off(
    hydra_conf: None, tmp_path: Path, response_cache_dir: Path
) -> None:
    """With cache.path=null a second identical run asks the server again and no cache file appears."""
    with FakeServer() as server:
        for name in ("a", "b"):
            manifest = run_in(
                compose("config", overrides=[*_args(server.base_url), "cache.path=null"]), tmp_path / name
            )
            assert "cache_hits" not in manifest["generation"]
        assert server.request_count == 2 * 12
    assert list(response_cache_dir.iterdir()) == []


def test_a_second_run_is_answered_from_the_default_cache(
    hydra_conf: None, tmp_path: Path, response_cache_dir: Path
) -> None:
    """No cache.path given: the second run of the same requests sends nothing."""
    with FakeServer() as server:
        run_in(compose("config", overrides=_args(server.base_url)), tmp_path / "a")
        assert server.request_count == 12
        manifest = run_in(compose("config", overrides=_args(server.base_url)), tmp_path / "b")
        assert server.request_count == 12
    assert manifest["generation"]["cache_hits"] == 12
    assert (response_cache_dir / "responses.sqlite").is_file()


def test_a_run_nobody_planned_to_replay_replays_from_the_default_cache_with_the_server_down(
    tmp_path: Path, response_cache_dir: Path
) -> None:
    """A plain run (no cache.path), then its snapshot rerun elsewhere with replay=only and no server:
    the same files, every request answered from the user's cache."""
    first, again = tmp_path / "first", tmp_path / "again"
    with FakeServer(latency_s=0.002) as server:
        subprocess.run(
            [sys.executable, "run.py", *_args(server.base_url), f"hydra.run.dir={first}"],
            cwd=REPO,
            check=True,
            capture_output=True,
        )
    assert server.request_count == 12
    assert (response_cache_dir / "responses.sqlite").is_file()
    assert_replayed(first, again, REBUILT, requests=12)


def test_the_jobs_of_a_sweep_share_the_default_cache(tmp_path: Path, response_cache_dir: Path) -> None:
    """Two sweep jobs that send the same requests: the server answers them once."""
    root = tmp_path / "sweep"
    with FakeServer() as server:
        subprocess.run(
            [
                sys.executable,
                "run.py",
                "-m",
                *_args(server.base_url),
                "export.dpo_pairing=one_per_seed,all_pairs",
                f"hydra.sweep.dir={root}",
            ],
            cwd=REPO,
            check=True,
            capture_output=True,
        )
    assert server.request_count == 12
    hits = [
        json.loads((root / job / "manifest.json").read_text("utf-8"))["generation"]["cache_hits"]
        for job in ("0", "1")
    ]
    assert hits == [0, 12]
    assert (response_cache_dir / "responses.sqlite").is_file()
