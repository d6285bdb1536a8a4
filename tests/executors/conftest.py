"""Fixtures for the executor tests (helpers live in run_support.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hydra import initialize_config_dir
from run_support import REPO

from storyforge.config import register_configs


@pytest.fixture(scope="module")
def hydra_conf() -> Iterator[None]:
    """Hydra initialised on the repository's conf/ for compose()."""
    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        yield


@pytest.fixture(scope="session")
def local_ray() -> Iterator[None]:
    """One private Ray instance with 2 CPUs for every executor test that runs on Ray."""
    import ray

    from storyforge.executors.ray_executor import start_local_ray

    start_local_ray(2)
    yield
    ray.shutdown()
