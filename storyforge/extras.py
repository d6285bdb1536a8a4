"""Optional dependencies: which extra installs a library, and the one-line error when it is missing.

Takes: a module name, the extra that installs it and what needs it. Gives: the module
(:func:`require`, or :func:`lazy` for a module-level name used only by some functions), or a
:class:`MissingExtra` (a :class:`~storyforge.errors.ConfigError`: exit status 2) whose one line
says what to install::

    provider=openai needs the 'generate' extra: pip install 'storyforge[generate]'

``pip install storyforge`` installs what rendering prompts and writing JSONL and Parquet need;
the rest comes with the extras of ``pyproject.toml`` (``generate``, ``quality``, ``plots``,
``store``, ``studio``, ``drift``, ``ray``, or ``all``). :func:`check_run` names, before a run
writes anything, every extra it will need.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from typing import Any

from storyforge.errors import ConfigError

__all__ = ["MissingExtra", "check_run", "import_part", "missing", "require"]


class MissingExtra(ConfigError):
    """A library of an extra that is not installed; the message names the pip command."""


def _install_line(extras: list[str]) -> str:
    """ "the 'a' extra: pip install ..." or "the 'a', 'b' and 'c' extras: pip install ..."."""
    quoted = [f"'{extra}'" for extra in extras]
    names = quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} and {quoted[-1]}"
    noun = "extra" if len(extras) == 1 else "extras"
    return f"the {names} {noun}: pip install 'storyforge[{','.join(extras)}]'"


def import_part(name: str) -> types.ModuleType:
    """``package.part`` imported without running ``package/__init__.py`` when the package is not
    loaded yet: for a library whose ``__init__`` loads far more than the part used (datasketch's
    loads scipy for its LSH classes, 55 MiB and 0.4 s, where ``datasketch.minhash`` needs numpy
    only). A later ``import package`` runs its ``__init__`` as usual and finds the part loaded."""
    package = name.partition(".")[0]
    if package in sys.modules:
        return importlib.import_module(name)
    spec = importlib.util.find_spec(package)
    if spec is None or spec.submodule_search_locations is None:
        raise ModuleNotFoundError(f"No module named {package!r}", name=package)
    stub = importlib.util.module_from_spec(spec)  # the package's path, its __init__ not run
    sys.modules[package] = stub
    try:
        return importlib.import_module(name)
    finally:
        if sys.modules.get(package) is stub:
            del sys.modules[package]


def missing(module: str) -> bool:
    """True when ``module`` (or a library it needs) cannot be imported; a dotted name is
    imported with :func:`import_part`."""
    try:
        (import_part if "." in module else importlib.import_module)(module)
    except ImportError:
        return True
    return False


def require(module: str, *, extra: str, for_what: str, part: bool = False) -> types.ModuleType:
    """``module`` imported (``part``: with :func:`import_part`), or :class:`MissingExtra`:
    "<for_what> needs the '<extra>' extra: pip install ..."."""
    try:
        return (import_part if part else importlib.import_module)(module)
    except ImportError:
        raise MissingExtra(f"{for_what} needs {_install_line([extra])}") from None


class _LazyModule(types.ModuleType):
    """Stands for a module until an attribute is read; then imports it through :func:`require`."""

    def __init__(self, module: str, extra: str, for_what: str) -> None:
        super().__init__(module)
        self._sf_args = (module, extra, for_what)

    def __getattr__(self, name: str) -> Any:
        module, extra, for_what = self._sf_args
        value = getattr(require(module, extra=extra, for_what=for_what), name)
        setattr(self, name, value)  # read from here on: no import machinery per use
        return value


def lazy(module: str, *, extra: str, for_what: str) -> Any:
    """A stand-in for ``module`` that imports it (or raises :class:`MissingExtra`) on first use.

    For a module-level ``import numpy as np`` in a module whose settings are read by runs that
    never call the functions using it: ``np = lazy("numpy", extra="quality", for_what=...)``.
    """
    return _LazyModule(module, extra, for_what)


# What each check of check_run needs: (extra, modules).
_GENERATE = ("generate", ("aiohttp",))
_QUALITY = ("quality", ("numpy",))
_BLEU = ("quality", ("sacrebleu",))
_DEDUP = ("quality", ("datasketch.minhash", "xxhash"))
_PLOTS = ("plots", ("matplotlib",))
_RAY = ("ray", ("ray",))
_DRIFT = ("drift", ("transformers", "gguf", "aiohttp"))


def check_run(
    *,
    provider: str | None,
    exports: bool,
    dedup: bool,
    plots: bool,
    executor: str,
    stage: str | None,
    diversity: bool = True,
) -> None:
    """Raise :class:`MissingExtra` naming, in one line, every extra this run needs and lacks.

    ``provider``: the provider's name when the run sends requests (needs ``generate``);
    ``exports``: the run checks outputs, generated or given (``quality``, plus ``plots`` when
    ``plots``; MinHash only when ``dedup``, self-BLEU only when ``diversity``); ``executor=ray``
    needs ``ray``; ``stage=drift`` needs ``drift``.
    """
    wanted: list[tuple[str, tuple[str, ...]]] = []
    if provider is not None:
        wanted.append(_GENERATE)
    if exports:
        wanted.append(_QUALITY)
        if diversity:
            wanted.append(_BLEU)
        if dedup:
            wanted.append(_DEDUP)
        if plots:
            wanted.append(_PLOTS)
    if executor == "ray":
        wanted.append(_RAY)
    if stage == "drift":
        wanted.append(_DRIFT)
    lacking: list[str] = []
    for extra, modules in wanted:
        if extra not in lacking and any(missing(m) for m in modules):
            lacking.append(extra)
    if not lacking:
        return
    if provider is not None:
        what = f"provider={provider}"
    elif stage == "drift":
        what = "stage=drift"
    elif exports:
        what = "checking completions (completions=...)"
    else:
        what = "executor=ray"
    hint = " (or export.plots=false)" if lacking == ["plots"] else ""
    raise MissingExtra(f"{what} needs {_install_line(lacking)}{hint}")
