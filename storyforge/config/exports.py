"""The ``export`` group after composition (registered by storyforge.config).

Takes: the composed config. Gives: :func:`register`, which stores the task's schema of the
group (:class:`~storyforge.tasks.tinystories.exports.ExportConf`) as ``export/base_export``,
and :func:`export_options`, which checks it with the answer checks' rules read from
``constraints`` and returns the completion stage's options. Why: a typo in a key, or a
pairing policy that does not exist, fails when the config is composed, naming the key and
the allowed values, not halfway through a run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hydra.core.config_store import ConfigStore

from storyforge.config.common import validate_node
from storyforge.errors import ConfigError
from storyforge.tasks.tinystories.exports import DpoPairing, ExportConf, ExportOptions
from storyforge.tasks.tinystories.validate import ECHO_WORDS, MAX_CHARS

# The longest echo rule: past this, an answer could copy whole sentences of its prompt and pass.
MAX_ECHO = 64

__all__ = ["DpoPairing", "ExportConf", "export_options", "register"]


def export_options(cfg: Mapping[str, Any] | None, *, max_tokens: int | None = None) -> ExportOptions:
    """Read ``cfg.export``, ``cfg.constraints.max_chars`` and ``.echo_words``, and ``cfg.strict``
    (``max_tokens``: the provider's completion cap, named when an answer is cut off).

    A missing node means its defaults; a bad value raises :class:`ConfigError` naming the key.
    """
    cfg = cfg if cfg is not None else {}
    export = cfg.get("export")
    conf = validate_node(ExportConf, export, "export") if export is not None else ExportConf().seal()
    conf.check()
    constraints = cfg.get("constraints") or {}
    max_chars = constraints.get("max_chars", MAX_CHARS)
    if not isinstance(max_chars, int) or isinstance(max_chars, bool) or max_chars < 1:
        raise ConfigError(f"constraints.max_chars must be a positive integer, got {max_chars!r}")
    echo_words = constraints.get("echo_words", ECHO_WORDS)
    if not isinstance(echo_words, int) or isinstance(echo_words, bool) or not 0 <= echo_words <= MAX_ECHO:
        raise ConfigError(
            f"constraints.echo_words must be an integer from 0 (off) to {MAX_ECHO}, got {echo_words!r}"
        )
    return ExportOptions(
        conf=conf,
        max_chars=max_chars,
        echo_words=echo_words,
        max_tokens=max_tokens,
        strict=bool(cfg.get("strict", False)),
    )


def register(cs: ConfigStore) -> None:
    """Store this area's schemas in the ConfigStore."""
    cs.store(group="export", name="base_export", node=ExportConf)
