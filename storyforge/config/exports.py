"""Structured config schemas for the 'exports' area (registered by storyforge.config)."""

from __future__ import annotations

from hydra.core.config_store import ConfigStore


def register(cs: ConfigStore) -> None:
    """Store this area's schemas in the ConfigStore."""
