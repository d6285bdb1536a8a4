"""Check research-QA artifacts and Modelfiles for drift from the prompt format.

Takes: a prompt format (composed from ``conf/`` with any Hydra overrides), Modelfiles
(``PATH`` with a ``# storyforge: model_type=…`` header, or ``MODEL_TYPE=PATH``) and export
folders (``train.jsonl`` / ``eval.jsonl`` / ``manifest.json``, found recursively). Gives:
:func:`run_checks` -> :class:`CheckReport` (every finding names its file and shows both
strings), :func:`format_report`, and the ``storyforge check`` subcommand
(:func:`add_arguments`, :func:`command`; exit 0 = consistent, 1 = drift, 2 = the check could
not run). ``python run.py task=research_qa stage=check`` runs the same checks.

Why: artifacts made at different times or by other code drift from the config (a system
message edited after training, a Modelfile written by hand, a stored prompt that repeats the
system text); these checks fail loudly before such drift reaches an experiment.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from storyforge import jsontext
from storyforge.errors import StoryforgeError
from storyforge.runfiles import EVAL, MANIFEST, TRAIN
from storyforge.tasks.research_qa.export import sha256_text
from storyforge.tasks.research_qa.format import (
    MODEL_TYPES,
    MODES_BY_MODEL_TYPE,
    PROMPT_MODES,
    PromptFormat,
    normalize_model_type,
)
from storyforge.tasks.research_qa.modelfile import ModelfileError, read_modelfile
from storyforge.tasks.research_qa.validators import (
    validate_modelfile_system_message,
    validate_prompt_format_consistency,
)

__all__ = [
    "CheckReport",
    "Finding",
    "add_arguments",
    "command",
    "format_report",
    "run_checks",
    "split_modelfile_spec",
]

EXAMPLES_PER_KIND = 3
"""Findings of one kind in one file shown in full; the rest are counted."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    """One problem: the file (or ``prompt_format``) it is in, and what is wrong."""

    where: str
    message: str
    kind: str = "drift"

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckReport:
    """What was checked and every finding (empty = no drift)."""

    checked: tuple[str, ...]
    findings: tuple[Finding, ...]
    suppressed: tuple[tuple[str, str, int], ...] = field(default=())

    @property
    def ok(self) -> bool:
        return not self.findings


def split_modelfile_spec(spec: str) -> tuple[str | None, str]:
    """``"rag_trained=ollama/Modelfile"`` -> ``("rag_trained", "ollama/Modelfile")``;
    a plain path -> ``(None, path)``. Only a known model type before ``=`` counts."""
    head, sep, rest = spec.partition("=")
    if sep and head.strip().casefold() in MODEL_TYPES:
        return head.strip().casefold(), rest
    return None, spec


# -- the checks ----------------------------------------------------------------------------------


def check_prompt_format(fmt: PromptFormat) -> list[Finding]:
    """The format against itself: each mode renders its markers and no system text, and each
    system message can be written into a Modelfile unchanged."""
    from storyforge.tasks.research_qa.modelfile import render_modelfile
    from storyforge.tasks.research_qa.prompts import PromptBuilder, PromptRequest

    findings: list[Finding] = []
    where = f"prompt_format {fmt.name!r}"
    for model_type in MODEL_TYPES:
        try:
            render_modelfile(
                model_type=model_type,
                prompt_format=fmt.name,
                system=fmt.system_message(model_type),
                from_="model.gguf",
                parameters={},
            )
        except ModelfileError as exc:
            findings.append(Finding(where=where, message=f"system_messages.{model_type}: {exc}"))
    builder = PromptBuilder(fmt)
    sample = {
        "instruction": "What does the sample question ask?",
        "contexts": ["First sample snippet.", "Second sample snippet."],
        "stored_prompt": (
            "Answer the question using the provided context.\n\nContext:\n[1] First sample snippet.\n\n"
            "Question: What does the sample question ask?\nAnswer:"
        ),
    }
    for mode in PROMPT_MODES:
        model_type = (
            next(t for t in MODEL_TYPES if mode in MODES_BY_MODEL_TYPE[t]) if mode != "rag_stored" else "base"
        )
        rendered = builder.render(
            PromptRequest(
                model_type=model_type,
                mode=mode,
                instruction=sample["instruction"],
                contexts=sample["contexts"],
                stored_prompt=sample["stored_prompt"],
            )
        )
        for issue in validate_prompt_format_consistency(
            rendered.system, None, rendered.user, mode=mode, prompt_format=fmt
        ):
            findings.append(Finding(where=f"{where}, template of mode {mode!r}", message=issue))
    return findings


def check_modelfile(fmt: PromptFormat, spec: str) -> tuple[str, list[Finding]]:
    """One Modelfile against the system message of the model type it serves."""
    model_type, raw_path = split_modelfile_spec(spec)
    path = Path(raw_path)
    if model_type is None:
        try:
            header = read_modelfile(path).header
        except ModelfileError as exc:
            return str(path), [
                Finding(where=str(path), message=f"Modelfile cannot be read as Ollama reads it: {exc}")
            ]
        declared = header.get("model_type")
        if declared is None:
            return str(path), [
                Finding(
                    where=str(path),
                    message="cannot tell which model type this Modelfile serves: it has no "
                    "'# storyforge: model_type=…' header; pass it as MODEL_TYPE=PATH "
                    f"(one of {', '.join(MODEL_TYPES)})",
                    kind="usage",
                )
            ]
        try:
            model_type = normalize_model_type(declared, key=f"{path}: header model_type")
        except StoryforgeError as exc:
            return str(path), [Finding(where=str(path), message=str(exc), kind="usage")]
    expected = fmt.system_message(model_type)
    issues = validate_modelfile_system_message(path, expected)
    return str(path), [Finding(where=str(path), message=f"[{model_type}] {issue}") for issue in issues]


def check_export(fmt: PromptFormat, folder: Path) -> list[Finding]:
    """One export folder (its manifest, train and eval files) against the prompt format."""
    findings: list[Finding] = []
    manifest_path = folder / MANIFEST
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    model = manifest.get("model") or {}
    try:
        model_type = normalize_model_type(model.get("model_type"), key=f"{manifest_path}: model.model_type")
    except StoryforgeError as exc:
        return [Finding(where=str(manifest_path), message=str(exc))]
    expected = fmt.system_message(model_type)
    recorded = manifest.get("system_message")
    if recorded != expected:
        findings.append(
            Finding(
                where=str(manifest_path),
                message=f"system message mismatch ({model_type}): the export was made with another "
                f"system message than the prompt format has now\n  prompt format: {expected!r}\n"
                f"  export:        {recorded!r}",
            )
        )
    users: dict[str, str] = {}
    for name, has_answer in ((TRAIN, True), (EVAL, False)):
        path = folder / name
        if not path.is_file():
            findings.append(
                Finding(where=str(path), message=f"missing: the export at {folder} has no {name}")
            )
            continue
        for number, record in jsontext.read_jsonl(path):
            problem = record.message if isinstance(record, jsontext.BadLine) else _malformed(record)
            if problem is not None:
                findings.append(Finding(where=f"{path}, line {number}", message=problem, kind="malformed"))
                continue
            findings.extend(_check_record(fmt, path, number, record, model_type, expected, has_answer, users))
    for other in sorted(folder.glob("Modelfile.*")):
        if other.suffix.lstrip(".") in MODEL_TYPES:
            findings.extend(check_modelfile(fmt, str(other))[1])
    return findings


def _malformed(record: Any) -> str | None:
    """What keeps an export line from being checked: not an object, or ``messages`` that is
    not a list of ``{"role", "content"}`` strings."""
    if not isinstance(record, dict):
        return f"expected a JSON object, got {type(record).__name__}"
    messages = record.get("messages")
    if messages is None:
        return None  # the role check reports it
    if not isinstance(messages, list) or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
        for m in messages
    ):
        return 'messages must be a list of {"role", "content"} strings'
    return None


def _check_record(
    fmt: PromptFormat,
    path: Path,
    number: int,
    record: dict[str, Any],
    model_type: str,
    expected: str,
    has_answer: bool,
    users: dict[str, str],
) -> list[Finding]:
    task_id = record.get("task_id")
    where = f"{path}, record {task_id!r} (line {number})"
    messages = record.get("messages") or []
    roles = [m.get("role") for m in messages]
    wanted = ["system", "user", "assistant"] if has_answer else ["system", "user"]
    if roles != wanted:
        return [
            Finding(where=where, message=f"messages must have roles {wanted}, found {roles}", kind="roles")
        ]
    system, user = messages[0]["content"], messages[1]["content"]
    found: list[Finding] = []
    if system != expected:
        found.append(
            Finding(
                where=where,
                kind="system",
                message=f"system message mismatch ({model_type})\n  prompt format: {expected!r}\n"
                f"  {path.name}: {system!r}",
            )
        )
    mode = record.get("prompt_mode")
    if mode not in PROMPT_MODES:
        found.append(Finding(where=where, kind="mode", message=f"unknown prompt_mode {mode!r}"))
    else:
        for issue in validate_prompt_format_consistency(expected, None, user, mode=mode, prompt_format=fmt):
            kind = issue.split(":", 1)[0]
            if kind == "system message mismatch":
                continue
            found.append(Finding(where=where, kind=kind, message=issue))
    if not has_answer:
        for key, text in (("system_sha256", system), ("user_sha256", user)):
            if record.get(key) != sha256_text(text):
                found.append(
                    Finding(
                        where=where,
                        kind=key,
                        message=f"{key} does not match the {key.split('_')[0]} content: the request was "
                        "edited after export (or the hash was computed over other text)",
                    )
                )
    if isinstance(task_id, str):
        previous = users.setdefault(task_id, user)
        if previous != user:
            found.append(
                Finding(
                    where=where,
                    kind="train_eval",
                    message="the user turn differs between train.jsonl and eval.jsonl of the same condition"
                    f"\n  train: {previous[:160]!r}\n  eval:  {user[:160]!r}",
                )
            )
    if has_answer and not str(messages[2].get("content", "")).strip():
        found.append(Finding(where=where, kind="answer", message="the assistant turn is empty"))
    return found


def _export_folders(root: Path) -> list[Path]:
    if (root / MANIFEST).is_file():
        candidates = [root]
    else:
        candidates = sorted(p.parent for p in root.rglob(MANIFEST))
    out = []
    for folder in candidates:
        try:
            task = json.loads((folder / MANIFEST).read_text(encoding="utf-8")).get("task")
        except (OSError, json.JSONDecodeError):
            continue
        if task == "research_qa":
            out.append(folder)
    return out


def run_checks(
    fmt: PromptFormat,
    *,
    modelfiles: Sequence[str] = (),
    artifacts: Sequence[Path] = (),
    check_format: bool = True,
) -> CheckReport:
    """Every validator over the format, the Modelfiles and the export folders given."""
    checked: list[str] = []
    findings: list[Finding] = []
    if check_format:
        checked.append(f"prompt_format {fmt.name}")
        findings.extend(check_prompt_format(fmt))
    seen: set[Path] = set()

    def modelfile(spec: str) -> None:  # each file once, however often it is named
        key = Path(split_modelfile_spec(spec)[1]).resolve()
        if key not in seen:
            seen.add(key)
            where, found = check_modelfile(fmt, spec)
            checked.append(where)
            findings.extend(found)

    for spec in modelfiles:
        modelfile(spec)
    for root in artifacts:
        if not root.exists():
            findings.append(Finding(where=str(root), message="no such file or folder", kind="usage"))
            continue
        if root.is_file():
            modelfile(str(root))
            continue
        folders = _export_folders(root)
        if not folders:
            findings.append(
                Finding(
                    where=str(root),
                    message="no research_qa export found (no manifest.json with task research_qa)",
                    kind="usage",
                )
            )
        for folder in folders:
            checked.append(str(folder))
            findings.extend(
                f for f in check_export(fmt, folder) if Path(f.where.split(",")[0]).resolve() not in seen
            )
            seen.update(p.resolve() for p in folder.glob("Modelfile.*"))
    shown, suppressed = _cap(findings)
    return CheckReport(checked=tuple(checked), findings=tuple(shown), suppressed=tuple(suppressed))


def _cap(findings: Iterable[Finding]) -> tuple[list[Finding], list[tuple[str, str, int]]]:
    """At most :data:`EXAMPLES_PER_KIND` findings per (file, kind); the rest are counted."""
    shown: list[Finding] = []
    counts: dict[tuple[str, str], int] = {}
    for finding in findings:
        key = (finding.where.split(",")[0], finding.kind)
        counts[key] = counts.get(key, 0) + 1
        if counts[key] <= EXAMPLES_PER_KIND:
            shown.append(finding)
    extra = [
        (file, kind, n - EXAMPLES_PER_KIND) for (file, kind), n in counts.items() if n > EXAMPLES_PER_KIND
    ]
    return shown, extra


def format_report(report: CheckReport) -> str:
    """The report as text: each finding, then a one-line verdict."""
    lines = [str(f) for f in report.findings]
    for file, kind, more in report.suppressed:
        lines.append(f"{file}: … and {more} more {kind} finding(s) of the same kind")
    total = len(report.findings) + sum(n for _, _, n in report.suppressed)
    if total:
        lines.append(f"drift: {total} finding(s) in {len(report.checked)} checked item(s)")
    else:
        lines.append(f"ok: no drift in {len(report.checked)} checked item(s): {', '.join(report.checked)}")
    return "\n".join(lines)


# -- the `storyforge check` subcommand -----------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``storyforge check``."""
    parser.description = (
        "Check research-QA artifacts for drift from the prompt format in conf/: Modelfile SYSTEM "
        "messages, and the system and user turns of train.jsonl / eval.jsonl exports. Exit 0 when "
        "everything agrees, 1 on drift, 2 when the check cannot run."
    )
    parser.add_argument(
        "--modelfile",
        action="append",
        default=[],
        metavar="[MODEL_TYPE=]PATH",
        help="a Modelfile to check; MODEL_TYPE (base, instruction_only, rag_trained) is needed "
        "unless the file has a '# storyforge: model_type=…' header (repeatable)",
    )
    parser.add_argument(
        "--artifacts",
        action="append",
        default=[],
        metavar="DIR",
        help="an export folder, or a folder holding several (searched recursively) (repeatable)",
    )
    parser.add_argument(
        "--conf-dir",
        default=None,
        metavar="DIR",
        help="config folder to compose from (default: the packaged conf/)",
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="Hydra overrides, as for run.py (prompt_format=…, prompt_format.system_messages.base=…)",
    )


ComposeFormat = Callable[[Sequence[str], str | Path | None], PromptFormat]
"""``compose(overrides, conf_dir)``: the prompt format a config composes to (the command line
passes :func:`storyforge.config.research_qa.compose_prompt_format`)."""


def command(args: argparse.Namespace, *, compose: ComposeFormat) -> int:
    """Run ``storyforge check``: print the findings; 0 = no drift, 1 = drift, 2 = could not run."""
    named = [("--modelfile", Path(split_modelfile_spec(spec)[1])) for spec in args.modelfile]
    named += [("--artifacts", Path(p)) for p in args.artifacts]
    absent = [f"{option} {path}" for option, path in named if not path.exists()]
    if absent:  # nothing to check is not drift: the check could not run
        print(
            f"storyforge check: could not run: no such file or folder: {', '.join(absent)}", file=sys.stderr
        )
        return 2
    try:
        fmt = compose(list(args.overrides), args.conf_dir)
        report = run_checks(
            fmt,
            modelfiles=list(args.modelfile),
            artifacts=[Path(p) for p in args.artifacts],
        )
    except StoryforgeError as exc:
        print(f"storyforge check: {exc}", file=sys.stderr)
        return 2
    text = format_report(report)
    print(text, file=sys.stdout if report.ok else sys.stderr)
    return 0 if report.ok else 1
