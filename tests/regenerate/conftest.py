"""Fixtures for the regeneration tests: Hydra initialised on the repository's conf/."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hydra import initialize_config_dir

from storyforge.config import register_configs

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def hydra_conf() -> Iterator[None]:
    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        yield
