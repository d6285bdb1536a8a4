"""Hydra's own errors (composing the config, creating the run directory) as storyforge reports errors.

Takes: an exception raised by Hydra before or around the job: an unknown key or option, a value
of the wrong type, an override that does not parse, a run directory that cannot be created.
Gives: :func:`report` (the one line to print, and the exit status), which ``run.py`` says
instead of Hydra's report (it has Hydra raise its errors, see there). Why: Hydra prints several
lines, a hint that ``+key=value`` would be accepted, sometimes a traceback, and exits 1;
docs/running.md promises one line and the status 2 for every config error, wherever it is
found. ``HYDRA_FULL_ERROR=1`` still gives the traceback.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from hydra.experimental.callback import Callback
from omegaconf import DictConfig
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from storyforge.errors import EXIT_CODES, ConfigError, closest, did_you_mean
from storyforge.redaction import redact

__all__ = [
    "JobErrors",
    "is_internal_option",
    "mark_reported",
    "nearest_key_hint",
    "refuse_internal_choices",
    "report",
    "unknown_fields_message",
    "unknown_key_message",
    "was_reported",
]


def nearest_key_hint(unknown: str, known: Iterable[str], prefix: str = "") -> str:
    """`` Did you mean <prefix>.<closest>?`` for the known key closest to ``unknown`` (or "")."""
    return did_you_mean(
        unknown, known, cutoff=0.5, show=lambda near: ".".join(p for p in (prefix, near) if p)
    )


def unknown_key_message(exc: ConfigKeyError | ConfigAttributeError, where: str) -> str:
    """``<where>: unknown key. Did you mean <nearest>? Known keys: ...`` for an unknown-key error."""
    schema = exc.object_type
    key = str(exc.key) if exc.key is not None else where.rsplit(".", 1)[-1]
    prefix = where.rpartition(".")[0]
    if schema is not None and is_dataclass(schema):
        names = [f.name for f in fields(schema)]
    else:  # a plain mapping (the root config, pricing.models, ...): the keys it holds
        parent = getattr(exc, "parent_node", None)
        names = [str(k) for k in parent if str(k) != "hydra"] if isinstance(parent, DictConfig) else []
    return unknown_fields_message(where, [key], names, prefix)


def unknown_fields_message(where: str, unknown: Iterable[str], known: Iterable[str], prefix: str = "") -> str:
    """One line for keys a setting does not have: the nearest known key, then the known keys.

    ``where`` names the first unknown key as the user wrote it (``judge.provider.modle``);
    ``prefix`` is what the known keys are under (``judge.provider``). Keys that belong to
    another option of the group (``provider.model`` with ``provider=none``) say which option.
    """
    unknown = list(unknown)
    known = [k for k in known if not k.startswith("_")]
    first = unknown[0] if unknown else ""
    group = where.partition(".")[0]
    options = _option_keys(group) if first and group == prefix else {}
    others = sorted({k for keys in options.values() for k in keys} - set(known))
    # another option's setting: the exact key, or (with nothing chosen, ``provider=none``) a
    # close one; an option's own near-miss (``provider.temprature`` with Ollama) is a typo
    nothing_chosen = bool(options) and set(known) == options.get("none")
    close = closest(first, known + others) if first and nothing_chosen else None
    target = first if any(first in keys for keys in options.values()) else (close or "")
    if target and target not in known and options:
        owners = sorted((o for o, keys in options.items() if target in keys), key=lambda o: o != "openai")
        choices = " or ".join(f"{group}={option}" for option in owners)
        return (
            f"{where}: not a setting of the chosen {group}; {target!r} is a setting of {choices}: "
            f"choose one first (e.g. `{group}={owners[0]} {prefix}.{target}=...`)"
        )
    hint = nearest_key_hint(first, known, prefix) if first else ""
    listing = f" Known keys here: {', '.join(known)}" if known else ""
    return f"{where}: unknown key.{hint}{listing}"


def _option_keys(group: str) -> dict[str, set[str]]:
    """The settings of each option of a config group (``conf/<group>/*.yaml``)."""
    from hydra.core.config_store import ConfigStore

    folder = Path(__file__).resolve().parents[2] / "conf" / group
    if not folder.is_dir():
        folder = Path(__file__).resolve().parents[1] / "_conf" / group
    if not folder.is_dir():
        return {}
    import yaml

    repo = ConfigStore.instance().repo.get(group, {})
    options: dict[str, set[str]] = {}
    for path in sorted(folder.glob("*.yaml")):
        try:
            declared = yaml.safe_load(path.read_text("utf-8")) or {}
        except (OSError, yaml.YAMLError):
            continue
        if not isinstance(declared, dict):
            continue
        keys = {str(k) for k in declared if k != "defaults"}
        for base in declared.get("defaults") or []:
            entry = repo.get(f"{base}.yaml") if isinstance(base, str) else None
            node = getattr(entry, "node", None)
            if isinstance(node, DictConfig):
                keys |= {str(k) for k in node}
        options[path.stem] = {k for k in keys if not k.startswith("_")}
    return options


def is_internal_option(name: str) -> bool:
    """Schema entries (``base_tinystories``, ``base_model``...) are not options a user picks."""
    return name.startswith("base_")


def refuse_internal_choices(choices: Mapping[str, str | None]) -> None:
    """Raise :class:`ConfigError` when a group option picked is a schema (``task=base_tinystories``)."""
    for group, option in choices.items():
        if option is not None and not group.startswith("hydra/") and is_internal_option(option):
            raise ConfigError(
                f"{group}={option} is the schema behind the {group} options, not an option; "
                f"`python run.py --help` lists the options of {group}"
            )


#: Top-level keys a run may be given with "+" although the root config does not list them.
APPENDABLE = frozenset({"resume", "hydra"})


def refuse_unknown_top_level(keys: Iterable[str], root_file: Path | None, groups: Iterable[str]) -> None:
    """Raise :class:`ConfigError` for a top-level key (``+sed=1``) that neither the root config
    file nor a config group defines, naming the nearest known key."""
    if root_file is None or not root_file.is_file():
        return
    import yaml

    declared = yaml.safe_load(root_file.read_text("utf-8")) or {}
    if not isinstance(declared, dict):
        return
    known = {str(k) for k in declared if k != "defaults"} | {g.split("/", 1)[0] for g in groups} | APPENDABLE
    for key in keys:
        if key not in known:
            hint = nearest_key_hint(key, sorted(known))
            raise ConfigError(f"{key}: unknown key.{hint} (`+{key}=...` adds no setting storyforge reads)")


def root_config_file(hydra_cfg: Any) -> Path | None:
    """The root config file of a Hydra run (``conf/config.yaml``, or a snapshot's), if on disk."""
    for source in hydra_cfg.runtime.config_sources:
        if source.provider == "main" and source.schema == "file":
            return Path(source.path) / f"{hydra_cfg.job.config_name}.yaml"
    return None


def _missing_option(text: str) -> str:
    """Hydra's "Could not find 'task/nope'" and its list of options, in one line, schemas left out."""
    first = _first_line(text).removeprefix("In 'config': ")
    _, _, rest = text.partition("Available options in")
    if not rest:
        return first
    group, _, listing = rest.partition(":")
    options: list[str] = []
    for line in listing.splitlines()[1:]:
        if not line.startswith(("\t", " ")):
            break  # the config search path follows the indented options
        if line.strip() and not is_internal_option(line.strip()):
            options.append(line.strip())
    return f"{first}. Options of{group}: {', '.join(options)}"


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def _yaml_error(exc: BaseException) -> str | None:
    """``FILE:LINE:COLUMN: <problem>`` for a YAML syntax error in a config file, else None."""
    import yaml

    if not isinstance(exc, yaml.YAMLError):
        return None
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = " ".join(
        str(part) for part in (getattr(exc, "context", None), getattr(exc, "problem", None)) if part
    )
    problem = problem or _first_line(str(exc))
    if mark is None:
        return f"a config file is not valid YAML: {problem}"
    return f"{mark.name}:{mark.line + 1}:{mark.column + 1}: not valid YAML: {problem}"


def report(exc: BaseException) -> tuple[str, int] | None:
    """The one line and exit status for an error Hydra raised, or None when it is not a user's."""
    yaml_error = _yaml_error(exc)
    if yaml_error is not None:
        return f"error: {yaml_error}", EXIT_CODES["config"]
    if isinstance(exc, MissingConfigException):
        return f"error: {_missing_option(str(exc))}", EXIT_CODES["config"]
    if isinstance(exc, OSError) and not isinstance(exc, HydraException):
        target = exc.filename or ""
        line = (
            f"error: cannot write the run directory {target!r}: {exc.strerror or exc}; "
            "choose another with hydra.run.dir=... (hydra.sweep.dir=... for -m)"
        )
        return line, EXIT_CODES["config"]
    if not isinstance(exc, (HydraException, OmegaConfBaseException)):
        return None
    cause = exc.__cause__ if isinstance(exc.__cause__, OmegaConfBaseException) else exc
    if isinstance(cause, (ConfigKeyError, ConfigAttributeError)) and getattr(cause, "full_key", None):
        return f"error: {unknown_key_message(cause, str(cause.full_key))}", EXIT_CODES["config"]
    message = _first_line(str(exc))
    if isinstance(exc, OverrideParseException):
        message = message.rstrip(".") + (
            ". Quote a value with spaces, accents or punctuation for Hydra and the shell: "
            "'key=\"text (like this)\"'"
        )
    detail = _first_line(str(cause)) if cause is not exc else ""
    if detail and detail not in message:
        message = f"{message} {detail}"
    # Hydra suggests "+key=value" for a key the schema does not have; storyforge refuses it too.
    message = message.replace("To append to your config use", "(not in the config:")
    return f"error: {message}", EXIT_CODES["config"]


_REPORTED = "_storyforge_reported"


def mark_reported(exc: BaseException) -> None:
    """Say that ``exc``'s one line is on stderr already (a sweep's job said it as it failed)."""
    setattr(exc, _REPORTED, True)


def was_reported(exc: BaseException) -> bool:
    """Whether ``exc``'s one line is on stderr already (:func:`mark_reported`)."""
    return bool(getattr(exc, _REPORTED, False))


class _ReportedJobReturn(JobReturn):
    """A failed job whose error was said in one line: Hydra re-raises it without saying more."""

    @property
    def return_value(self) -> Any:
        if self.status == JobStatus.FAILED:
            raise self._return_value
        return self._return_value

    @return_value.setter
    def return_value(self, value: Any) -> None:
        self._return_value = value


class JobErrors(Callback):
    """Hydra callback: a job's overrides without credentials, and one line per failed job.

    Hydra prints "Error executing job with overrides: [...]" when a job fails (with a
    ``provider.base_url``'s ``user:pass@`` in clear); a job of a sweep whose error run.py
    already said in one line (:func:`mark_reported`) is re-raised without it. The sweep's
    ``multirun.yaml``, which Hydra writes before any job starts, is redacted as the first starts.
    """

    def on_job_start(self, config: Any, **kwargs: Any) -> None:
        from hydra.types import RunMode

        from storyforge.snapshot import scrub

        if config.hydra.mode == RunMode.MULTIRUN:  # Hydra's copy of the sweep's config, made before
            scrub(Path(config.hydra.sweep.dir) / "multirun.yaml")

    def on_job_end(self, config: Any, job_return: JobReturn, **kwargs: Any) -> None:
        if job_return.overrides:
            job_return.overrides = [redact(str(item)) for item in job_return.overrides]
        if job_return.status == JobStatus.FAILED and was_reported(job_return._return_value):
            job_return.__class__ = _ReportedJobReturn
