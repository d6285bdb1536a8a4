"""``python run.py``: the config composed once, not twice.

Takes: nothing (:func:`install` patches Hydra's ``Hydra.get_mode`` and its config loader's
``load_configuration``). Gives: a run whose config Hydra composes once. Why: before it runs
anything, Hydra composes the whole config just to read ``hydra.mode`` (run or sweep), throws it
away, and composes it again for the run, with the override ``hydra.mode=RUN`` added; each
composition reads and merges every config file and schema (about 0.15 s of a job's start-up).

How: the first composition is made as the run's would be (run mode, overrides checked), and
kept; when the run then asks for the same config with ``hydra.mode=RUN`` added, it gets the
kept one with that override applied by Hydra's own code, the same config (and the same
``.hydra`` snapshot) as a second composition gives. Anything else (a sweep, other overrides,
a config the run mode refuses, an error) goes through Hydra as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["install"]

_RUN_OVERRIDE = "hydra.mode=RUN"

_kept: tuple[Any, str | None, tuple[str, ...], Any] | None = None
"""The composition ``get_mode`` made: (loader, config name, overrides, config)."""

HYDRAS_OWN: dict[str, Any] = {}
"""Hydra's ``get_mode`` and ``load_configuration``, as they were before :func:`install`."""


def _take(loader: Any, config_name: str | None, overrides: Sequence[str], run_mode: Any, plain: bool) -> Any:
    """The kept config when this call asks for it with ``hydra.mode=RUN`` added, else None."""
    global _kept
    from hydra.types import RunMode

    kept, _kept = _kept, None
    if kept is None or not plain or run_mode != RunMode.RUN:
        return None
    kept_loader, kept_name, kept_overrides, cfg = kept
    if kept_loader is not loader or kept_name != config_name:
        return None
    if tuple(overrides) != (*kept_overrides, _RUN_OVERRIDE) or cfg.hydra.mode is not None:
        return None
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser

    # What composing with the override adds: the value, then the override in the snapshot's list.
    (override,) = OverridesParser.create().parse_overrides([_RUN_OVERRIDE])
    ConfigLoaderImpl._apply_overrides_to_config([override], cfg)
    cfg.hydra.overrides.hydra.append(override.input_line)
    return cfg


def install() -> None:
    """Make ``python run.py`` compose its config once (idempotent; see the module)."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.hydra import Hydra
    from hydra.types import RunMode

    if getattr(Hydra.get_mode, "_composes_once", False):
        return
    hydra_get_mode = HYDRAS_OWN["get_mode"] = Hydra.get_mode
    hydra_load = HYDRAS_OWN["load_configuration"] = ConfigLoaderImpl.load_configuration

    def load_configuration(
        self: Any,
        config_name: str | None,
        overrides: list[str],
        run_mode: Any,
        from_shell: bool = True,
        validate_sweep_overrides: bool = True,
    ) -> Any:
        cfg = _take(self, config_name, overrides, run_mode, from_shell and validate_sweep_overrides)
        if cfg is not None:
            return cfg
        return hydra_load(self, config_name, overrides, run_mode, from_shell, validate_sweep_overrides)

    def get_mode(self: Any, config_name: str | None, overrides: list[str]) -> Any:
        global _kept
        _kept = None
        try:
            cfg = hydra_load(self.config_loader, config_name, overrides, RunMode.RUN)
        except Exception:  # noqa: BLE001 - a sweep, a missing value...: Hydra's own get_mode decides
            return hydra_get_mode(self, config_name, overrides)
        _kept = (self.config_loader, config_name, tuple(overrides), cfg)
        return cfg.hydra.mode

    get_mode._composes_once = True  # type: ignore[attr-defined]
    Hydra.get_mode = get_mode  # type: ignore[method-assign]
    ConfigLoaderImpl.load_configuration = load_configuration  # type: ignore[method-assign]
