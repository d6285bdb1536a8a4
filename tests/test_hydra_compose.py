"""``python run.py`` composes its config once, and gets the config Hydra composes twice.

Hydra composes the whole config to read ``hydra.mode`` and again for the run, with
``hydra.mode=RUN`` added (storyforge/config/hydra_compose.py keeps the first and applies
that override to it). Compared here in one process with Hydra's own two compositions, as
the YAML of the whole config, Hydra's part (the ``.hydra`` snapshot) included.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hydra._internal.hydra import Hydra
from hydra._internal.utils import create_automatic_config_search_path
from hydra.core.global_hydra import GlobalHydra
from hydra.types import RunMode
from omegaconf import OmegaConf

from storyforge.config import hydra_compose, register_configs

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def hydra() -> Iterator[Any]:
    register_configs()
    hydra_compose.install()
    GlobalHydra.instance().clear()
    search_path = create_automatic_config_search_path(str(ROOT / "run.py"), None, "conf")
    yield Hydra.create_main_hydra2(task_name="run", config_search_path=search_path)
    GlobalHydra.instance().clear()


def _twice(hydra: Any, overrides: list[str]) -> tuple[Any, Any]:
    """Hydra's way: the mode read from a composition in sweep mode, then the run's."""
    mode = hydra_compose.HYDRAS_OWN["get_mode"](hydra, "config", overrides)
    run = hydra_compose.HYDRAS_OWN["load_configuration"](
        hydra.config_loader, "config", [*overrides, "hydra.mode=RUN"], RunMode.RUN
    )
    return mode, run


@pytest.mark.parametrize(
    "overrides",
    [[], ["task.n_seeds=7", "constraints=default", "hydra.job.chdir=false"]],
)
def test_the_run_gets_the_config_hydra_composes_twice(hydra: Any, overrides: list[str]) -> None:
    mode, theirs = _twice(hydra, overrides)
    assert hydra.get_mode("config", overrides) == mode is None
    kept = hydra_compose._kept
    assert kept is not None
    ours = hydra.config_loader.load_configuration("config", [*overrides, "hydra.mode=RUN"], RunMode.RUN)
    assert ours is kept[3]  # composed once
    assert OmegaConf.to_yaml(ours) == OmegaConf.to_yaml(theirs)
    assert ours.hydra.mode == RunMode.RUN
    assert list(ours.hydra.overrides.hydra)[-1] == "hydra.mode=RUN"


def test_a_sweep_or_another_request_is_composed_by_hydra(hydra: Any) -> None:
    # A sweep value is refused in run mode: Hydra's own get_mode answers, nothing is kept.
    assert hydra.get_mode("config", ["task.n_seeds=1,2"]) is None
    assert hydra_compose._kept is None
    # A request that is not the run's (sweep mode here) composes afresh.
    hydra.get_mode("config", [])
    kept = hydra_compose._kept
    assert kept is not None
    fresh = hydra.config_loader.load_configuration("config", ["hydra.mode=MULTIRUN"], RunMode.MULTIRUN)
    assert fresh is not kept[3]
    assert fresh.hydra.mode == RunMode.MULTIRUN
    assert hydra_compose._kept is None
