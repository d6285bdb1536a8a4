"""The ``storyforge`` command: lint and render template files, manage the template store.

Takes: command-line arguments. Gives: :func:`main` (the console script, also
``python -m storyforge.cli``) with these subcommands::

    storyforge lint FILE... [--task KIND]
    storyforge render FILE --task KIND --context CTX.json [--budget N] [--explain] [--json]
    storyforge templates [--store URL] add|update|import|list|show|export|delete ...
    storyforge [--store URL] studio [--port P] [--tokenizer FILE] [--runs DIR...]   (the template studio page; runs and sweeps)
    storyforge check ...          (research-QA output checks, when that task kind is installed)
    storyforge report SWEEP_DIR [--no-plots]   (rebuild a multirun's summary and report)
    storyforge drift EXPORT... --tokenizer DIR [--server URL] [--gguf FILE] [--modelfile FILE]
                                  (train/serve equivalence of the exported conversations)
    storyforge tokenizer-from-gguf MODEL.gguf OUT_DIR   (Hugging Face tokenizer files from a GGUF)
    storyforge setup-model [--server-only]   (build llama-server, fetch SmolLM2; print the model's path)

Why: authors need the engine's verdict without writing Python: every problem of a template,
each with its file, line, column and template path; the prompt a context renders to, and
(``--explain``) which slots and nodes were kept or skipped and why. Expected failures (a bad
template, a missing file, an unknown id) print their problems and exit 1, never a traceback;
``argparse`` usage errors exit 2.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import importlib.util
import json
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from storyforge.errors import Issue, StoryforgeError, TemplateValidationError
from storyforge.extras import MissingExtra
from storyforge.positions import compose, file_position, issue_position
from storyforge.runfiles import MANIFEST, SWEEP_REPORT_MD

__all__ = ["build_parser", "main"]

_CHECK_MODULE = "storyforge.tasks.research_qa.check"

Command = Callable[[argparse.Namespace], int]


# --- output helpers ------------------------------------------------------------------------


def _out(text: str = "") -> None:
    sys.stdout.write(text + "\n")


def _err(text: str) -> None:
    sys.stderr.write(text + "\n")


def _describe_error(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.filename:
        return f"error: {exc.strerror or exc}: {exc.filename}"
    return f"error: {exc}"


def _task_kind(name: str) -> Any:
    """The task kind called ``name``; an unknown name is an expected error, not a crash."""
    from storyforge.tasks.base import get_task_kind

    try:
        return get_task_kind(name)
    except KeyError as exc:
        raise StoryforgeError(str(exc.args[0])) from None


def _format_issue(file: str, issue: Issue, position: tuple[int, int] | None, *, in_string: bool) -> str:
    """``file:line:column: path: message [code]``, plus the engine's caret excerpt if any.

    ``in_string`` marks issues whose ``line``/``column`` count inside the string at ``path``
    (the engine's); the loader's issues count in the file itself.
    """
    where = f"{file}:{position[0]}:{position[1]}" if position else file
    path = str(issue.path)
    if in_string and issue.line is not None:
        path += f" (line {issue.line}, column {issue.column} of the string)"
    line = f"{where}: {path}: {issue.message} [{issue.code}]"
    if issue.context:
        line += "\n" + "\n".join(f"    | {ln}" for ln in issue.context.splitlines())
    return line


# --- lint ----------------------------------------------------------------------------------


def _lint_one(file: str, task: str | None) -> tuple[list[str], bool]:
    from storyforge.engine.loader import read_template_text
    from storyforge.tasks.base import get_task_kind, task_kind_names
    from storyforge.template_files import check_template, read_template_file

    def in_file(issues: Sequence[Issue]) -> list[str]:
        return [_format_issue(file, i, file_position(i), in_string=False) for i in issues]

    try:
        text = read_template_text(file)  # refuses a FIFO or device, and bytes that are not UTF-8
    except OSError as exc:
        return [f"{file}: error: cannot read the file: {exc.strerror or exc}"], False
    except TemplateValidationError as exc:
        return in_file(exc.issues[:1]), False
    try:
        loaded = read_template_file(file)
    except TemplateValidationError as exc:  # syntax errors and duplicate keys, at file positions
        return in_file(exc.issues), False
    root = compose(text)
    lines: list[str] = []
    declared = loaded.data.get("task") if isinstance(loaded.data, Mapping) else None
    if task is None and isinstance(declared, str):
        try:
            get_task_kind(declared)
        except KeyError:
            lines.append(
                f"{file}: note: task {declared!r} is not a known task kind, so sources were not "
                f"checked (known: {', '.join(task_kind_names())})"
            )
    try:
        checked = check_template(loaded.data, task=task, require_known_task=False)
    except TemplateValidationError as exc:
        lines.extend(
            _format_issue(file, i, issue_position(i, text, root, loaded.locate), in_string=True)
            for i in exc.issues
        )
        count = len(exc.issues)
        lines.append(f"{file}: {count} problem{'s' if count != 1 else ''}")
        return lines, False
    for note in getattr(checked.compiled, "notes", ()):
        lines.append("note: " + _format_issue(file, note, loaded.locate(note.path), in_string=True))
    kind = f"task {checked.kind.name}" if checked.kind else "no task kind"
    lines.append(f"{file}: ok ({kind})")
    return lines, True


def _lint_files(names: Sequence[str]) -> tuple[list[str], list[str]]:
    """The files to lint (a folder gives its template files, sorted) and the folders without any."""
    from storyforge.template_files import TEMPLATE_SUFFIXES

    files: list[str] = []
    empty: list[str] = []
    for name in names:
        path = Path(name)
        if not path.is_dir():
            files.append(name)
            continue
        found = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in TEMPLATE_SUFFIXES)
        if not found:
            empty.append(name)
        files.extend(str(p) for p in found)
    return files, empty


def _cmd_lint(args: argparse.Namespace) -> int:
    if args.task is not None:
        _task_kind(args.task)  # an unknown --task is reported once, before any file
    files, empty = _lint_files(args.files)
    ok = not empty
    for folder in empty:
        _out(f"{folder}: no template files (.json, .yaml, .yml) in this folder")
    for file in files:
        lines, good = _lint_one(file, args.task)
        ok = ok and good
        for line in lines:
            _out(line)
    return 0 if ok else 1


# --- render --------------------------------------------------------------------------------


def _model_arg(text: str) -> dict[str, Any]:
    provider, sep, name = text.partition(":")
    if not provider:
        raise argparse.ArgumentTypeError("expected PROVIDER or PROVIDER:MODEL, e.g. ollama:llama3.2")
    return {"provider": provider, "name": name if sep and name else None, "prefill": True}


def _int_arg(expected: str, low: int, high: int | None, out_of_range: str) -> Callable[[str], int]:
    """An argparse type: a whole number from ``low`` to ``high``, else the given messages."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{out_of_range}, got {value}")
        return value

    return parse


_budget_arg = _int_arg("a whole number of tokens", 0, None, "the budget must be >= 0")
_port_arg = _int_arg("a port number", 1, 65535, "the port must be from 1 to 65535")


def _cmd_render(args: argparse.Namespace) -> int:
    from storyforge import render
    from storyforge.jobs.render_task import format_messages, load_context, with_model
    from storyforge.template_files import check_template, read_template_file

    kind = _task_kind(args.task)
    problems, good = _lint_one(args.file, kind.name)
    if not good:  # the same lines, at the same file:line:column, as `storyforge lint`
        for line in problems:
            _err(line)
        return 1
    loaded = read_template_file(args.file)
    checked = check_template(loaded, task=kind.name)
    ctx: dict[str, Any] = load_context(Path(args.context))
    if args.model is not None:
        model = dict(args.model)
        model["prefill"] = not args.no_prefill
        ctx = with_model(ctx, model)
    elif "model" not in ctx or args.no_prefill:
        ctx = with_model(ctx, {"provider": "none", "name": None, "prefill": not args.no_prefill})
    from storyforge.engine.feasibility import check_budget

    lint = [issue.message for issue in check_budget(checked.compiled.template, args.budget)]
    for message in lint:
        _err(f"warning: budget: {message}")
    # the command prints the lint and the warnings itself; the engine's log lines would repeat them
    engine_log = logging.getLogger("storyforge.engine.renderer")
    level = engine_log.level
    engine_log.setLevel(logging.ERROR)
    try:
        result = render(checked.compiled, ctx, kind.registry(ctx), budget=args.budget)
    finally:
        engine_log.setLevel(level)
    if args.json:
        body: dict[str, Any] = {
            "messages": [dict(m) for m in result.messages],
            "warnings": list(result.warnings),
            "lint": lint,
        }
        if args.explain:
            body["trace"] = result.trace.to_dict()
        _out(json.dumps(body, ensure_ascii=False, indent=2))
    else:
        sys.stdout.write(format_messages(result.messages))
        if args.explain:
            _out()
            _out(result.trace.format())
    for warning in result.warnings:
        _err(f"warning: {warning}")
    return 0


# --- templates -----------------------------------------------------------------------------


def _open_store(args: argparse.Namespace) -> Any:
    from storyforge.store import TemplateStore

    return TemplateStore(getattr(args, "store", None))


def _cmd_add(args: argparse.Namespace, *, mode: str) -> int:
    from storyforge.template_files import read_template_file

    status = 0
    with _open_store(args) as store:
        for file in args.files:
            try:
                loaded = read_template_file(file)
                if mode == "add":
                    record = store.create(loaded, task=args.task)
                    verb = "added"
                else:
                    record, verb = store.update_status(loaded, task=args.task)  # or "unchanged"
            except StoryforgeError as exc:
                _err(_describe_error(exc))
                status = 1
                continue
            _out(f"{verb} {record.id} (task {record.task}, revision {record.revision}) from {file}")
    return status


def _cmd_import(args: argparse.Namespace) -> int:
    with _open_store(args) as store:
        for record, status in store.import_paths(args.paths, task=args.task):
            _out(f"{status} {record.id} (task {record.task}, revision {record.revision})")
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    with _open_store(args) as store:
        records = store.list(task=args.task)
    if not records:
        _out(f"no templates in {store.display_url}" + (f" for task {args.task}" if args.task else ""))
        return 0
    rows = [("ID", "TASK", "VERSION", "REVISION", "UPDATED", "NAME")]
    for r in records:
        stamp = r.updated_at.strftime("%Y-%m-%d %H:%M:%S")
        rows.append((r.id, r.task, str(r.version), str(r.revision), stamp, r.name))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        _out("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[-1])
    return 0


def _cmd_show(args: argparse.Namespace) -> int:
    with _open_store(args) as store:
        record = store.get(args.id)
        problem: TemplateValidationError | None = None
        try:
            store.load(args.id)
        except TemplateValidationError as exc:
            problem = exc
    for label, value in (
        ("id", record.id),
        ("name", record.name),
        ("task", record.task),
        ("version", record.version),
        ("revision", record.revision),
        ("hash", record.content_hash),
        ("created", record.created_at.isoformat()),
        ("updated", record.updated_at.isoformat()),
        ("status", "INVALID" if problem else "valid"),
    ):
        _out(f"{label + ':':<10}{value}")
    if args.raw:
        try:
            _out(json.dumps(json.loads(record.raw), ensure_ascii=False, indent=2))
        except ValueError:
            _out(record.raw)
    if problem is not None:
        _err(_describe_error(problem))
        return 1
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from storyforge.template_files import TEMPLATE_SUFFIXES

    with _open_store(args) as store:
        if args.all:
            for path in store.export_folder(Path(args.all), fmt=args.format or "json", task=args.task):
                _out(str(path))
            return 0
        if args.id is None:
            raise StoryforgeError("name a template id, or use --all FOLDER")
        if args.output is None or args.output == "-":
            from storyforge.template_files import dump_template

            sys.stdout.write(dump_template(store.get(args.id).document(), args.format or "json"))
            return 0
        target = Path(args.output)
        if args.format is not None and target.suffix.lower() not in TEMPLATE_SUFFIXES:
            target = target.with_suffix(".yaml" if args.format == "yaml" else ".json")
        _out(str(store.export(args.id, target)))
    return 0


def _cmd_delete(args: argparse.Namespace) -> int:
    with _open_store(args) as store:
        store.delete(args.id)
    _out(f"deleted {args.id}")
    return 0


# --- studio --------------------------------------------------------------------------------


def _cmd_studio(args: argparse.Namespace) -> int:
    from storyforge.jobs.costing import estimator_for
    from storyforge.jobs.render_task import conf_dir
    from storyforge.studio import Studio
    from storyforge.studio.server import HOST, bind, serve  # the studio extra (storyforge.extras)

    tokenizer = Path(args.tokenizer) if args.tokenizer is not None else None
    estimator, estimator_name = estimator_for(tokenizer, default="ceil(len/4)")
    conf = conf_dir()
    folders = [Path(f) for f in args.runs] if args.runs is not None else _default_runs()
    runs = None
    if folders:
        from storyforge.studio.runs import Runs

        runs = Runs(root=folders)
    with _open_store(args) as store:
        studio = Studio(
            store=store,
            template_dir=conf / "template",
            context_dir=conf / "context",
            estimator=estimator,
            estimator_name=estimator_name,
            runs=runs,
        )

        def ready() -> None:  # Ctrl-C is the studio's from here on: the URL says it is up
            _out(
                f"storyforge studio: http://{HOST}:{args.port}/ (store {store.display_url}; Ctrl-C stops it)"
            )
            if runs is not None:
                _out(
                    f"runs: http://{HOST}:{args.port}/runs ({len(runs.listing())} runs and sweeps under "
                    f"{', '.join(str(f) for f in folders)})"
                )
            sys.stdout.flush()

        with bind(args.port) as sock:  # bound before the URL is printed: a taken port fails here
            serve(studio, sock, ready=ready)
    return 0


#: Where runs (``python run.py``) and sweeps (``-m``) go unless ``hydra.run.dir`` or ``hydra.sweep.dir`` say otherwise.
DEFAULT_RUNS = ("outputs", "multirun")


def _default_runs() -> list[Path]:
    """The studio's runs folders without ``--runs``: ``outputs`` and ``multirun`` here, those that exist."""
    return [Path(name) for name in DEFAULT_RUNS if Path(name).is_dir()]


# --- parser --------------------------------------------------------------------------------


def _first_command(argv: Sequence[str]) -> str | None:
    return next((a for a in argv if not a.startswith("-")), None)


def _compose_prompt_format(overrides: Sequence[str], conf_dir: str | Path | None) -> Any:
    from storyforge.config.research_qa import compose_prompt_format

    return compose_prompt_format(overrides, conf_dir)


def _check_installed() -> bool:
    try:
        return importlib.util.find_spec(_CHECK_MODULE) is not None
    except ModuleNotFoundError:
        return False


def _check_module(argv: Sequence[str]) -> ModuleType | None:
    """The research-QA ``check`` module, imported only when ``check`` is the command."""
    if not _check_installed() or _first_command(argv) != "check":
        return None
    return importlib.import_module(_CHECK_MODULE)


def _cmd_setup_model(args: argparse.Namespace) -> int:
    from storyforge.providers.llama_setup import command  # a download and a build: imported when asked

    return command(args)


def _cmd_report(args: argparse.Namespace) -> int:
    from storyforge.sweep import write_sweep

    root = Path(args.sweep_dir)
    summary = write_sweep(root, plots=not args.no_plots, metric=args.metric)
    failed = [job for job in summary["jobs"] if job["status"] != "ok"]
    print(f"{root / SWEEP_REPORT_MD}: {len(summary['jobs'])} job(s), {len(failed)} without a result")
    for job in failed:
        print(f"  job {job['job']}: {job['status']}: {job.get('error') or 'no manifest.json'}")
    return 0


def _cmd_card(args: argparse.Namespace) -> int:
    from storyforge.card import write_card

    root = Path(args.run_dir)
    if not (root / MANIFEST).is_file() and root.is_dir() and any(root.glob("*/.hydra")):
        from storyforge.card import write_sweep_card  # a sweep root: its card lists the jobs
        from storyforge.sweep import summarize_sweep

        for job in sorted(p.parent for p in root.glob("*/.hydra")):
            if (job / MANIFEST).is_file():
                write_card(job, license_=args.license, task_categories=args.task_category)
        print(write_sweep_card(root, summarize_sweep(root)))
        return 0
    print(write_card(root, license_=args.license, task_categories=args.task_category))
    return 0


def _cmd_push(args: argparse.Namespace) -> int:
    from storyforge.card import push, upload_plan

    files, message = upload_plan(Path(args.run_dir))
    if args.dry_run:
        print(f"{args.repo}: {message}")
        for name in files:
            print(f"  {name}")
        return 0
    print(push(Path(args.run_dir), args.repo, private=args.private))
    return 0


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The argument parser (``argv`` decides whether the ``check`` module is imported)."""
    from storyforge import __version__
    from storyforge.template_files import DEFAULT_URL

    parser = argparse.ArgumentParser(
        prog="storyforge",
        description="Lint and render storyforge prompt templates; manage the template store.",
    )
    parser.add_argument("--version", action="version", version=f"storyforge {__version__}")
    # --store may stand before the subcommand too (``storyforge --store URL templates list``);
    # SUPPRESS keeps a later default from overwriting it.
    parser.add_argument(
        "--store",
        default=argparse.SUPPRESS,
        metavar="URL",
        help=f"SQLAlchemy URL of the template store (default: $STORYFORGE_STORE or {DEFAULT_URL})",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    lint = sub.add_parser("lint", help="check template files and print every problem")
    lint.add_argument(
        "files", nargs="+", metavar="FILE", help="template files (.json, .yaml, .yml), or folders of them"
    )
    lint.add_argument("--task", help="the task kind the templates must be for (lints its sources)")
    lint.set_defaults(func=_cmd_lint)

    rend = sub.add_parser("render", help="render a template file with a context and print the messages")
    rend.add_argument("file", metavar="FILE", help="template file (.json, .yaml, .yml)")
    rend.add_argument("--task", required=True, help="task kind (turn_generation, writing_assistant, ...)")
    rend.add_argument("--context", required=True, metavar="CTX", help="context file (.json or .yaml)")
    rend.add_argument("--budget", type=_budget_arg, default=None, metavar="N", help="global token budget")
    rend.add_argument(
        "--explain", action="store_true", help="also show the trace: what was kept, skipped, why"
    )
    rend.add_argument("--json", action="store_true", help="print messages (and --explain trace) as JSON")
    rend.add_argument(
        "--model", type=_model_arg, default=None, metavar="PROVIDER[:MODEL]", help="set ctx.model"
    )
    rend.add_argument("--no-prefill", action="store_true", help="set ctx.model.prefill to false")
    rend.set_defaults(func=_cmd_render)

    store_help = f"SQLAlchemy URL of the store (default: $STORYFORGE_STORE or {DEFAULT_URL})"
    tmpl = sub.add_parser("templates", help="manage the template store")
    tmpl.add_argument("--store", default=argparse.SUPPRESS, metavar="URL", help=store_help)
    tsub = tmpl.add_subparsers(dest="action", metavar="ACTION")
    tsub.required = True
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--store", default=argparse.SUPPRESS, metavar="URL", help=store_help)

    for mode, says in (
        ("add", "validate and store new templates"),
        ("update", "validate and replace stored templates"),
    ):
        add = tsub.add_parser(mode, parents=[common], help=says)
        add.add_argument("files", nargs="+", metavar="FILE")
        add.add_argument("--task", help="the task kind the templates must be for")
        add.set_defaults(func=functools.partial(_cmd_add, mode=mode))

    imp = tsub.add_parser(
        "import", parents=[common], help="add or update every template in files or folders (all or nothing)"
    )
    imp.add_argument(
        "paths", nargs="+", metavar="PATH", help="template files or folders such as conf/template"
    )
    imp.add_argument("--task", help="the task kind the templates must be for")
    imp.set_defaults(func=_cmd_import)

    lst = tsub.add_parser("list", parents=[common], help="list stored templates")
    lst.add_argument("--task", help="only this task kind")
    lst.set_defaults(func=_cmd_list)

    show = tsub.add_parser("show", parents=[common], help="show a stored template and whether it is valid")
    show.add_argument("id")
    show.add_argument("--raw", action="store_true", help="also print the stored JSON")
    show.set_defaults(func=_cmd_show)

    exp = tsub.add_parser("export", parents=[common], help="write stored templates as JSON or YAML")
    exp.add_argument("id", nargs="?", help="template id (omit with --all)")
    exp.add_argument("-o", "--output", metavar="PATH", help="file to write (.json or .yaml); default stdout")
    exp.add_argument("--format", choices=("json", "yaml"), default=None)
    exp.add_argument("--all", metavar="FOLDER", help="export every stored template into FOLDER")
    exp.add_argument("--task", help="with --all: only this task kind")
    exp.set_defaults(func=_cmd_export)

    dele = tsub.add_parser("delete", parents=[common], help="remove a stored template")
    dele.add_argument("id")
    dele.set_defaults(func=_cmd_delete)

    studio = sub.add_parser(
        "studio", help="serve the template studio page on 127.0.0.1 (needs the [studio] extra)"
    )
    studio.add_argument("--store", default=argparse.SUPPRESS, metavar="URL", help=store_help)
    studio.add_argument("--port", type=_port_arg, default=8765, help="port on 127.0.0.1 (default: 8765)")
    studio.add_argument(
        "--tokenizer",
        metavar="FILE",
        default=None,
        help="count tokens with a local tokenizer.json or .tiktoken file (default: ceil(len/4))",
    )
    studio.add_argument(
        "--runs",
        metavar="DIR",
        nargs="+",
        action="extend",
        default=None,
        help="also open the runs and sweeps under each DIR (the flag may be repeated), read-only, "
        "at /runs, listed once at start (default: outputs and multirun here, those that exist)",
    )
    studio.set_defaults(func=_cmd_studio)
    rep = sub.add_parser(
        "report", help="rebuild the summary and report of a multirun sweep from its job directories"
    )
    rep.add_argument("sweep_dir", metavar="SWEEP_DIR", help="the sweep root (multirun/DATE/TIME)")
    rep.add_argument("--no-plots", action="store_true", help="write the tables only")
    rep.add_argument(
        "--metric",
        default="distinct_2",
        help="diversity figure drawn beside the pass rate in each heatmap (docs/diversity.md)",
    )
    rep.set_defaults(func=_cmd_report)

    card = sub.add_parser(
        "card", help="write the dataset card (README.md) of a run directory, or of a sweep and its jobs"
    )
    card.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (or a multirun sweep root)")
    card.add_argument(
        "--license", default=None, help="license identifier (default: the run's export.license)"
    )
    card.add_argument(
        "--task-category",
        action="append",
        default=None,
        metavar="NAME",
        help="task category, repeatable (default: the run's export.task_categories)",
    )
    card.set_defaults(func=_cmd_card)
    push = sub.add_parser(
        "push", help="upload a run directory to a Hugging Face dataset repository (needs the [hub] extra)"
    )
    push.add_argument("run_dir", metavar="RUN_DIR", help="a run directory with its card")
    push.add_argument("--repo", required=True, metavar="NAME", help="the dataset repository (owner/name)")
    push.add_argument("--private", action="store_true", help="create the repository private")
    push.add_argument("--dry-run", action="store_true", help="list the files and the commit message only")
    push.set_defaults(func=_cmd_push)

    from storyforge.drift import command as drift_command

    drift = sub.add_parser(
        "drift",
        help="compare what the model sees in training and when served, token by token",
        description="Render exported conversations with the training tokenizer's chat template and "
        "with each serving side; report the first divergence of each drifting example. "
        "Exit status: 0 no drift (or at most --allow), 1 drift, 2 the check could not run.",
    )
    drift_command.add_arguments(drift)
    drift.set_defaults(func=drift_command.command)

    from storyforge.drift import hf_tokenizer

    from_gguf = sub.add_parser(
        "tokenizer-from-gguf",
        help="write Hugging Face tokenizer files (tokenizer.json, tokenizer_config.json) from a GGUF",
        description="Write tokenizer.json, tokenizer_config.json (with the chat template) and "
        "special_tokens_map.json from a GGUF's vocabulary, without PyTorch: BOS/EOS by the GGUF's ids, "
        "BOS added only when the GGUF adds it. Exit status: 0 written, 2 the GGUF could not be used.",
    )
    hf_tokenizer.add_arguments(from_gguf)
    from_gguf.set_defaults(func=hf_tokenizer.command)

    setup_model = sub.add_parser(
        "setup-model",
        help="build llama-server and fetch SmolLM2-135M-Instruct once, for provider=llama_cpp",
        description="Build llama.cpp's llama-server from source when the cache has none (a 76 MB "
        "download, then minutes of compiling, with progress shown) and fetch SmolLM2-135M-Instruct "
        "(a 93 MB download, checked against a pinned sha256) into ~/.cache/storyforge (or "
        "$STORYFORGE_CACHE); print the model's path. Exit status: 0 ready, 1 the build or download failed.",
    )
    setup_model.add_argument(
        "--server-only",
        action="store_true",
        help="only build llama-server when missing, and print its path instead of the model's",
    )
    setup_model.set_defaults(func=_cmd_setup_model)

    module = _check_module(argv)
    if module is not None:
        doc = (module.__doc__ or "check research-QA outputs").strip().splitlines()[0]
        check = sub.add_parser("check", help=doc)
        module.add_arguments(check)
        check.set_defaults(func=functools.partial(module.command, compose=_compose_prompt_format))
    elif _check_installed():
        sub.add_parser("check", help="check research-QA outputs (storyforge check -h for options)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns the exit status (0 ok, 1 problems found, 2 usage)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(args_list)
    try:
        args = parser.parse_args(args_list)
    except SystemExit as exc:  # --help, --version, usage errors
        return int(exc.code) if isinstance(exc.code, int) else 2
    func: Command = args.func
    try:
        return int(func(args))
    except BrokenPipeError:  # the reader (``| head``) went away: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except MissingExtra as exc:  # an optional library to install: a usage error
        _err(_describe_error(exc))
        return 2
    except (StoryforgeError, OSError) as exc:
        _err(_describe_error(exc))
        return 1
    except KeyboardInterrupt:
        _err("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
