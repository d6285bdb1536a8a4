"""Hydra's run snapshot held back until the run holds its lock, and written scrubbed.

Takes: Hydra's request to write ``.hydra/config.yaml``, ``overrides.yaml`` and ``hydra.yaml``
(its ``_save_config``). Gives: :func:`install`, which makes Hydra hand each file's text to
:func:`storyforge.snapshot.keep` instead of writing it; the job then writes them with
:func:`storyforge.snapshot.committed_snapshot`, secrets scrubbed, once it holds the run lock
(a refused or failed run never writes into another run's snapshot).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from storyforge.snapshot import keep

__all__ = ["install"]


def _keep(cfg: Any, filename: str, output_dir: Path) -> None:
    """Hydra's ``_save_config``, with the file kept for the run to write."""
    keep(Path(output_dir), filename, OmegaConf.to_yaml(cfg))


def install() -> None:
    """Make Hydra hand its snapshot to :func:`storyforge.snapshot.keep` instead of writing it
    (idempotent)."""
    import hydra.core.utils as hydra_utils

    hydra_utils._save_config = _keep
