"""Hydra structured configs, one module per area; each module exposes ``register(cs)``.

Takes: nothing. Gives: :func:`register_configs`, which stores every schema dataclass in
Hydra's ConfigStore as ``base_<group>`` so each YAML option can start with
``defaults: [base_<group>]`` and a typo in a key fails at start-up.
"""

from __future__ import annotations

import importlib

from hydra.core.config_store import ConfigStore

# One module per area; each owns its dataclasses and registers them.
_MODULES = (
    "common",
    "tinystories",
    "exports",
    "provider",
    "research_qa",
    "storyforge_tasks",
    "store",
    "executor",
    "dedup",
    "drift",
)

_registered = False


def register_configs() -> None:
    """Register every config schema with Hydra's ConfigStore (idempotent)."""
    global _registered
    if _registered:
        return
    cs = ConfigStore.instance()
    for name in _MODULES:
        module = importlib.import_module(f"{__name__}.{name}")
        module.register(cs)
    _registered = True
