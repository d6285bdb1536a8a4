"""Hydra entry point: ``python run.py task=tinystories`` (see README.md)."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from storyforge.config import register_configs

register_configs()


@hydra.main(config_path="conf", config_name="config", version_base=None)
def main(cfg: DictConfig) -> object:
    from storyforge.pipeline import run

    return run(cfg)


if __name__ == "__main__":
    main()
