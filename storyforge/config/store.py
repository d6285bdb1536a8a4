"""Structured config schema for the template store (``conf/store/``).

Takes: nothing. Gives: :class:`StoreConf` (stored as ``store/base_store``) and
:func:`register`. Why: ``store.url=postgresql+psycopg://...`` on the command line must be
checked like any other key; the default is the embedded SQLite file ``storyforge.db``.
"""

from __future__ import annotations

from dataclasses import dataclass

from hydra.core.config_store import ConfigStore

__all__ = ["StoreConf", "register"]


@dataclass
class StoreConf:
    """Where templates are stored: any SQLAlchemy URL."""

    url: str = "sqlite:///storyforge.db"


def register(cs: ConfigStore) -> None:
    """Store this area's schemas in the ConfigStore."""
    cs.store(group="store", name="base_store", node=StoreConf)
