"""Structured config schema for the ``executor`` group (``conf/executor/``).

Takes: nothing. Gives: :class:`ExecutorConf` (stored as ``executor/base_executor``) and
:func:`register`. Why: how a run is spread over processes and machines is a setting like any
other; ``executor=local`` (one process, the default) and ``executor=ray`` must give the same
files, so the executor is left out of the run's config hash (see ``config_sha256``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from storyforge.config.common import Sealed
from storyforge.errors import ConfigError

__all__ = ["EXECUTORS", "ExecutorConf", "executor_settings", "register"]

EXECUTORS = ("local", "ray")


@dataclass
class ExecutorConf(Sealed):
    """Where the job runs: in this process (``local``) or in shards on a Ray cluster (``ray``)."""

    name: str = "local"
    # ray: ``local`` starts a private Ray instance for this run, ``auto`` joins the cluster this
    # machine belongs to, ``ray://head:10001`` joins a remote cluster through Ray Client.
    address: str = "local"
    # ray: seeds are split into this many shards by a stable hash of the seed id.
    shards: int = 8
    # ray, address=local: CPUs the private instance offers (null: every core).
    num_cpus: int | None = None
    # ray: times a shard is started again after its worker process died.
    max_retries: int = 3

    def check(self) -> None:
        """Raise :class:`ConfigError` naming the first key that breaks a rule."""
        if self.name not in EXECUTORS:
            raise ConfigError(f"executor.name must be one of {', '.join(EXECUTORS)}; got {self.name!r}")
        if self.shards < 1:
            raise ConfigError(f"executor.shards must be >= 1, got {self.shards!r}")
        if self.num_cpus is not None and self.num_cpus < 1:
            raise ConfigError(f"executor.num_cpus must be >= 1 or null, got {self.num_cpus!r}")
        if self.max_retries < 0:
            raise ConfigError(f"executor.max_retries must be >= 0, got {self.max_retries!r}")
        if self.address not in ("local", "auto") and not self.address.startswith("ray://"):
            raise ConfigError(
                f"executor.address must be local, auto or ray://HOST:PORT; got {self.address!r}"
            )


def executor_settings(cfg: DictConfig | Mapping[str, Any]) -> ExecutorConf:
    """``cfg.executor`` as its checked, sealed schema object (a bad key or value is a ConfigError)."""
    node = cfg.get("executor")
    if node is None:
        return ExecutorConf().seal()
    try:
        data = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)
        conf = ExecutorConf(**{str(k): v for k, v in dict(data).items()})  # type: ignore[arg-type]
    except (TypeError, OmegaConfBaseException) as exc:
        raise ConfigError(f"executor config is invalid: {exc}") from None
    conf.check()
    return conf.seal()


def register(cs: ConfigStore) -> None:
    """Store this area's schemas in the ConfigStore."""
    cs.store(group="executor", name="base_executor", node=ExecutorConf)
