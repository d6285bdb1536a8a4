"""Executors: how a job's work is spread over processes and machines.

Takes: the run's settings (:class:`~storyforge.config.settings.RunSettings`). Gives:
:func:`shard_of` and :func:`sort_generations` (the order every executor writes), and
:func:`run_sharded` (the TinyStories job in shards on Ray; needs the ``ray`` extra).

``executor=local`` is the job itself in one process; ``executor=ray`` renders, generates,
journals and validates each shard on a Ray worker and merges the shards into the same files,
byte for byte.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from storyforge.config.settings import RunSettings
from storyforge.executors.order import shard_of, sort_generations

__all__ = ["run_sharded", "shard_of", "sort_generations"]


def run_sharded(settings: RunSettings, out_dir: Path) -> dict[str, Any]:
    """Run the TinyStories job in shards on Ray (see :mod:`storyforge.executors.ray_executor`)."""
    from storyforge.executors.ray_executor import run_sharded as run

    return run(settings, out_dir)
