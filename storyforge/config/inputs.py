"""Run inputs: file keys made absolute, their sha256 pinned in the snapshot, changes refused.

Takes: the composed config and the run directory, before the job starts. Gives:
:func:`pin_inputs`, which, for each input-file key that is set (``completions``, ``dataset``,
``seeds_path``), resolves the path against the directory Hydra was started in, hashes the
file, writes both into ``cfg`` (the key itself and ``inputs.<key>: {path, sha256}``) and into
the run's ``.hydra/config.yaml``; returns the ``inputs`` mapping for the manifest.

Why: Hydra snapshots overrides as typed, so ``completions=c.jsonl`` reproduced from another
directory names another file (or none), and a file edited since the run would silently give
other results. With the absolute path and the hash in the snapshot, ``python run.py
--config-path RUN/.hydra --config-name config`` reads the same file from anywhere, and stops
with a :class:`~storyforge.errors.ConfigError` if its bytes changed, unless
``allow_changed_inputs=true``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hydra.utils import to_absolute_path
from omegaconf import DictConfig, OmegaConf, open_dict

from storyforge.atomic import file_sha256, write_text_atomic
from storyforge.errors import ConfigError

__all__ = ["INPUT_KEYS", "file_sha256", "inputs_of", "pin_inputs"]

log = logging.getLogger(__name__)

INPUT_KEYS = ("completions", "dataset", "seeds_path")
"""Top-level keys that name an input file."""


def pin_inputs(cfg: DictConfig, snapshot: Path | None) -> dict[str, dict[str, str]]:
    """Resolve, hash and record every input file of ``cfg``; patch ``snapshot`` to match.

    A missing file is left as given, for the job to report in its own words. Raises
    :class:`ConfigError` when ``cfg.inputs`` (the snapshot of an earlier run) recorded another
    sha256 for the same file and ``allow_changed_inputs`` is not true.
    """
    recorded = inputs_of(cfg)
    allow = bool(cfg.get("allow_changed_inputs", False))
    pinned: dict[str, dict[str, str]] = {}
    for key in INPUT_KEYS:
        value = cfg.get(key)
        if value is None or value == "":
            continue
        path = Path(to_absolute_path(str(value)))
        if not path.is_file():
            continue
        sha = file_sha256(path)
        before = recorded.get(key)
        if before is not None and before.get("path") == str(path) and before.get("sha256") != sha:
            message = (
                f"{key}: {path} changed since the run this config reproduces "
                f"(sha256 {before.get('sha256')} recorded, {sha} now)"
            )
            if not allow:
                raise ConfigError(f"{message}; pass allow_changed_inputs=true to run with it anyway")
            log.warning("%s; running anyway (allow_changed_inputs=true)", message)
        pinned[key] = {"path": str(path), "sha256": sha}
    if not pinned:
        return pinned
    with open_dict(cfg):
        for key, entry in pinned.items():
            cfg[key] = entry["path"]
        cfg["inputs"] = {**recorded, **pinned}
    if snapshot is not None and snapshot.is_file():
        saved = OmegaConf.load(snapshot)
        assert isinstance(saved, DictConfig)
        with open_dict(saved):
            for key, entry in pinned.items():
                saved[key] = entry["path"]
            saved["inputs"] = cfg["inputs"]
        write_text_atomic(snapshot, OmegaConf.to_yaml(saved))
    return pinned


def inputs_of(cfg: DictConfig) -> dict[str, Any]:
    """The pinned inputs of ``cfg`` as plain data (``{}`` when none)."""
    node = cfg.get("inputs")
    if not node:
        return {}
    data = OmegaConf.to_container(node, resolve=True)
    assert isinstance(data, dict)
    return {str(k): v for k, v in data.items()}
