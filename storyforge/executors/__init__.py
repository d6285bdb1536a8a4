"""Executors: how a job's work is spread over processes and machines.

Takes: the composed run config. Gives: :func:`executor_conf` (``cfg.executor`` checked),
:func:`shard_of` and :func:`sort_generations` (the order every executor writes), and
:func:`run_sharded` (the TinyStories job in shards on Ray; needs the ``ray`` extra).

``executor=local`` is the job itself in one process; ``executor=ray`` renders, generates,
journals and validates each shard on a Ray worker and merges the shards into the same files,
byte for byte.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from storyforge.config.executor import ExecutorConf
from storyforge.errors import ConfigError
from storyforge.executors.order import shard_of, sort_generations

__all__ = ["executor_conf", "executor_name", "run_sharded", "shard_of", "sort_generations"]


def executor_name(cfg: DictConfig) -> str:
    """``cfg.executor.name``, or ``local`` when the config has no executor group."""
    node = cfg.get("executor")
    return "local" if node is None else str(node.get("name", "local"))


def executor_conf(cfg: DictConfig) -> ExecutorConf:
    """``cfg.executor`` as its checked schema object (a bad key or value is a ConfigError)."""
    node = cfg.get("executor")
    if node is None:
        return ExecutorConf()
    try:
        data = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)
        conf = ExecutorConf(**{str(k): v for k, v in dict(data).items()})  # type: ignore[arg-type]
    except (TypeError, OmegaConfBaseException) as exc:
        raise ConfigError(f"executor config is invalid: {exc}") from None
    conf.check()
    return conf


def run_sharded(cfg: DictConfig, out_dir: Any) -> dict[str, Any]:
    """Run the TinyStories job in shards on Ray (see :mod:`storyforge.executors.ray_executor`)."""
    from storyforge.executors.ray_executor import run_sharded as run

    return run(cfg, out_dir)
