"""What the studio page asks for, as plain functions over JSON-able data (no HTTP here).

Takes: template text (YAML or JSON), a context (a mapping, or JSON text), a token budget, and a
:class:`~storyforge.store.TemplateStore`. Gives: :class:`Studio`, whose methods return the JSON
bodies of the page's API: ``check`` (every lint and validation issue at its file line and
column, with the did-you-mean hint split out), ``render`` (the messages with their token
counts and the trace, per slot and per layout item: kept, dropped by the budget or skipped,
and why), the sample contexts of a task kind, and the store (list, revisions, save, diff).

Why: the server (:mod:`storyforge.studio.server`) stays a thin layer of routes and safety
checks, and the benchmark times exactly what a request does. Templates and contexts are data:
they go through the engine's loader, validation gate and renderer, nothing else. Files are
read only from the folders fixed when the studio starts (the shipped templates and sample
contexts), by names listed then, never by a path from a request.
"""

from __future__ import annotations

import difflib
import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from storyforge.engine.budget import Estimator, default_estimator
from storyforge.engine.loader import load_template_text
from storyforge.errors import DataError, Issue, StoreError, TemplateValidationError
from storyforge.positions import compose, file_position, issue_position
from storyforge.store import CheckedTemplate, TemplateRecord, TemplateStore, check_template, dump_template
from storyforge.studio.errors import StudioError
from storyforge.template_files import TEMPLATE_SUFFIXES

if TYPE_CHECKING:
    from storyforge.studio.runs import Runs

__all__ = ["MAX_BUDGET", "Studio", "StudioError", "issue_json"]

#: Largest budget a request may ask for (the slider's range ends far below it).
MAX_BUDGET = 10_000_000

_T = TypeVar("_T")
_HINT = re.compile(r"(Did you mean[^?]*\?)")
_DROPPED = frozenset({"over_budget", "out_of_budget"})
_LAYOUT_KINDS = frozenset({"layout", "header", "footer", "insert"})


def issue_json(issue: Issue, position: tuple[int, int] | None, *, where: str = "template") -> dict[str, Any]:
    """One issue for the page: template path, file line/column, message, did-you-mean hint."""
    hint = _HINT.search(issue.message)
    return {
        "where": where,
        "code": issue.code,
        "path": str(issue.path),
        "line": position[0] if position else None,
        "column": position[1] if position else None,
        "message": issue.message,
        "hint": hint.group(1) if hint else None,
        "context": issue.context,
    }


def _format_of(text: str, fmt: str | None) -> Literal["json", "yaml"]:
    """``fmt`` when given, else what the text looks like (JSON opens with ``{``)."""
    return "json" if fmt == "json" or (fmt != "yaml" and text.lstrip().startswith("{")) else "yaml"


@dataclass(frozen=True, slots=True, kw_only=True)
class Checked:
    """The outcome of checking template text: issues, or the template ready to render."""

    issues: list[dict[str, Any]]
    notes: list[dict[str, Any]] = field(default_factory=list)
    checked: CheckedTemplate | None = None
    task: str | None = None


@dataclass(slots=True, kw_only=True)
class Studio:
    """The studio's state: the store, the estimator and the folders fixed at start."""

    store: TemplateStore
    template_dir: Path | None = None
    context_dir: Path | None = None
    estimator: Estimator = default_estimator
    estimator_name: str = "ceil(len/4)"
    #: The run viewer (``storyforge studio --runs DIR``), when a runs folder was given.
    runs: Runs | None = None
    _examples: dict[str, Path] = field(init=False, repr=False)
    _contexts: dict[str, Path] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # The only files the studio ever opens by itself: listed once, served by name.
        self._examples = _listing(self.template_dir)
        self._contexts = _listing(self.context_dir)

    # -- check -----------------------------------------------------------------------------

    def check(self, text: str, fmt: str | None = None) -> Checked:
        """Load, lint, validate and compile template text; every issue at its file position."""
        try:
            loaded = load_template_text(text, format=_format_of(text, fmt), source="template")
        except TemplateValidationError as exc:  # syntax, duplicate keys: positions in the file already
            return Checked(issues=[issue_json(i, file_position(i)) for i in exc.issues])
        task = _task_of(loaded.data)
        try:
            checked = check_template(loaded, require_known_task=True)
        except UnicodeEncodeError:  # the engine hashes the document as UTF-8
            return Checked(issues=[_SURROGATE], task=task)
        except TemplateValidationError as exc:
            root = compose(text)
            return Checked(
                issues=[issue_json(i, issue_position(i, text, root, loaded.locate)) for i in exc.issues],
                task=task,
            )
        notes = [issue_json(n, loaded.locate(n.path)) for n in getattr(checked.compiled, "notes", ())]
        return Checked(
            issues=[], notes=notes, checked=checked, task=checked.kind.name if checked.kind else None
        )

    def check_json(self, text: str, fmt: str | None = None) -> dict[str, Any]:
        """``check`` as the API's body."""
        result = self.check(text, fmt)
        return {"ok": not result.issues, "task": result.task, "issues": result.issues, "notes": result.notes}

    # -- render ----------------------------------------------------------------------------

    def render(self, text: str, context: Any, budget: int | None, fmt: str | None = None) -> dict[str, Any]:
        """Check, then render with ``context`` under ``budget``: messages, trace and issues."""
        started = time.perf_counter()
        result = self.check(text, fmt)
        ctx, ctx_issues = _context_of(context)
        body: dict[str, Any] = {
            "ok": False,
            "task": result.task,
            "issues": result.issues + ctx_issues,
            "notes": result.notes,
            "messages": [],
            "warnings": [],
            "trace": None,
        }
        if result.checked is not None and ctx is not None:
            body.update(self.render_checked(result.checked, ctx, budget), ok=True)
        body["elapsed_ms"] = round((time.perf_counter() - started) * 1000, 2)
        return body

    def render_checked(
        self, checked: CheckedTemplate, ctx: Mapping[str, Any], budget: int | None
    ) -> dict[str, Any]:
        """Render a checked template: what ``storyforge render --explain --json`` prints, plus
        token counts per message and the per-slot and per-layout-item verdicts."""
        from storyforge import render

        if budget is not None and not 0 <= budget <= MAX_BUDGET:
            raise StudioError(f"budget: expected a whole number from 0 to {MAX_BUDGET}, got {budget}")
        if "model" not in ctx:  # as ``storyforge render`` does: no provider, prefill allowed
            ctx = {**ctx, "model": {"provider": "none", "name": None, "prefill": True}}
        kind = checked.kind
        registry = kind.registry(ctx) if kind is not None else None
        try:
            result = render(checked.compiled, ctx, registry, budget=budget, estimator=self.estimator)
            trace = result.trace.to_dict()
            messages = [
                {
                    "role": m.get("role"),
                    "content": m.get("content", ""),
                    "prefix": bool(m.get("prefix", False)),
                    "tokens": self.estimator(str(m.get("content", ""))),
                }
                for m in result.messages
            ]
        except TemplateValidationError as exc:  # a render-time check of the task kind
            raise StudioError(str(exc)) from None
        except UnicodeEncodeError:  # estimators count UTF-16 units or encode to UTF-8
            raise StudioError(
                "the context holds a character that is not valid Unicode (a lone surrogate, as written "
                "by an escape such as \\ud800); write the character itself or a surrogate pair"
            ) from None
        return {
            "messages": messages,
            "warnings": list(result.warnings),
            "trace": trace,
            "slots": _slot_rows(checked, trace),
            "layout": _layout_rows(trace),
            "budget": {
                "max_tokens": budget,
                "consumed": trace["budget"]["consumed"],
                "emitted": sum(m["tokens"] for m in messages),
            },
            "estimator": self.estimator_name,
        }

    # -- files fixed at start --------------------------------------------------------------

    def examples(self) -> list[dict[str, Any]]:
        """The shipped templates the page can open: name and task kind."""
        return [
            {"name": name, "task": _declared_task(path.read_text(encoding="utf-8"))}
            for name, path in self._examples.items()
        ]

    def example(self, name: str) -> dict[str, Any]:
        """The text of one shipped template, by its listed name."""
        path = self._examples.get(name)
        if path is None:
            raise StudioError(
                f"no shipped template named {name!r}; known: {', '.join(self._examples)}", status=404
            )
        text = path.read_text(encoding="utf-8")
        return {"name": name, "format": _format_of(text, None), "text": text, "task": _declared_task(text)}

    def contexts(self, task: str | None) -> list[dict[str, Any]]:
        """Sample contexts for ``task`` (files named ``<task>.json`` or ``<task>_*.json``)."""
        names = [n for n in self._contexts if task is None or n == task or n.startswith(f"{task}_")]
        return [{"name": n} for n in names]

    def context(self, name: str) -> dict[str, Any]:
        """One sample context as JSON-able data (``$generate`` files are generated)."""
        from storyforge.jobs.render_task import load_context

        path = self._contexts.get(name)
        if path is None:
            raise StudioError(
                f"no sample context named {name!r}; known: {', '.join(self._contexts)}", status=404
            )
        try:
            data = load_context(path)
        except DataError as exc:
            raise StudioError(str(exc)) from None
        return {"name": name, "context": data}

    # -- store -----------------------------------------------------------------------------

    def templates(self) -> list[dict[str, Any]]:
        """Every stored template (the current revision of each)."""
        return [_record_json(r) for r in self.store.list()]

    def revisions(self, template_id: str) -> list[dict[str, Any]]:
        """Every kept revision of a stored template, oldest first."""
        return [_record_json(r) for r in self._store_call(lambda: self.store.revisions(template_id))]

    def revision(self, template_id: str, revision: int | None) -> dict[str, Any]:
        """One revision, with its document as YAML text for the editor."""
        record = self._store_call(lambda: self.store.get(template_id, revision=revision))
        body = _record_json(record)
        body["text"] = dump_template(record.document(), "yaml")
        body["format"] = "yaml"
        return body

    def save(self, text: str, fmt: str | None = None) -> dict[str, Any]:
        """Validate, then store a new revision; refused with every issue when invalid."""
        result = self.check(text, fmt)
        if result.checked is None:
            n = len(result.issues)
            raise StudioError(
                f"not saved: {n} problem{'s' if n != 1 else ''} in the template",
                status=422,
                issues=result.issues,
            )
        data = result.checked.data
        record, status = self._store_call(lambda: self.store.save(data))
        return {"status": status, "record": _record_json(record)}

    def diff_records(
        self,
        template_id: str,
        records: tuple[TemplateRecord, TemplateRecord],
        context: Any,
        budget: int | None,
    ) -> dict[str, Any]:
        """Render two revisions on the same context and budget; a unified diff of the prompts.
        The revisions are read from the store beforehand (:meth:`stored_revision`), so this runs
        anywhere, the worker's child included."""
        from storyforge.jobs.render_task import format_messages

        a, b = records[0].revision, records[1].revision
        ctx, ctx_issues = _context_of(context)
        if ctx is None:
            raise StudioError("the context is not valid", issues=ctx_issues)
        sides = []
        for rev, record in zip((a, b), records, strict=True):
            try:
                checked = check_template(record.document(), require_known_task=True)
            except TemplateValidationError as exc:
                raise StudioError(
                    f"revision {rev} of {template_id!r} is no longer valid",
                    issues=[issue_json(i, None) for i in exc.issues],
                ) from None
            rendered = self.render_checked(checked, ctx, budget)
            sides.append((rev, rendered))
        texts = [format_messages(r["messages"]) for _, r in sides]
        lines = list(
            difflib.unified_diff(
                texts[0].splitlines(),
                texts[1].splitlines(),
                fromfile=f"{template_id}@{a}",
                tofile=f"{template_id}@{b}",
                lineterm="",
            )
        )
        return {
            "id": template_id,
            **{
                key: {"revision": rev, "messages": side["messages"], "tokens": side["budget"]["emitted"]}
                for key, (rev, side) in zip("ab", sides, strict=True)
            },
            "same": texts[0] == texts[1],
            "diff": lines,
        }

    def stored_revision(self, template_id: str, revision: int) -> TemplateRecord:
        """One revision from the store; an unknown id or revision is a 404."""
        return self._store_call(lambda: self.store.get(template_id, revision=revision))

    @staticmethod
    def _store_call(work: Callable[[], _T]) -> _T:
        """Run a store call; its expected errors (an unknown id or revision) become a 404."""
        try:
            return work()
        except StoreError as exc:
            raise StudioError(str(exc), status=404) from None


# -- helpers -----------------------------------------------------------------------------------


def _page_issue(
    where: str, code: str, path: str, message: str, line: int | None = None, column: int | None = None
) -> dict[str, Any]:
    """An issue the page shows that is not the engine's (the fields of :func:`issue_json`)."""
    return {
        "where": where,
        "code": code,
        "path": path,
        "line": line,
        "column": column,
        "message": message,
        "hint": None,
        "context": None,
    }


_SURROGATE = _page_issue(
    "template",
    "encoding",
    "<template>",
    "the template holds a character that is not valid Unicode (a lone surrogate, as written "
    "by an escape such as \\ud800); write the character itself or a \\U0001xxxx escape",
)


def _listing(folder: Path | None) -> dict[str, Path]:
    if folder is None or not folder.is_dir():
        return {}
    return {
        p.stem: p for p in sorted(folder.iterdir()) if p.is_file() and p.suffix.lower() in TEMPLATE_SUFFIXES
    }


def _declared_task(text: str) -> str | None:
    try:
        return _task_of(load_template_text(text).data)
    except TemplateValidationError:
        return None


def _task_of(data: Any) -> str | None:
    """The task kind a template document names, if it names one."""
    task = data.get("task") if isinstance(data, Mapping) else None
    return task if isinstance(task, str) else None


def _context_of(context: Any) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The context mapping, or the problem with it (JSON text gets its line and column)."""
    if isinstance(context, str):
        try:
            context = json.loads(context) if context.strip() else {}
        except json.JSONDecodeError as exc:
            return None, [_context_issue(f"JSON syntax error: {exc.msg}", exc.lineno, exc.colno)]
        except RecursionError:
            return None, [_context_issue("the context nests arrays or objects too deeply to read", 1, 1)]
    if context is None:
        return {}, []
    if not isinstance(context, dict):
        return None, [
            _context_issue(f"the context must be a JSON object, got {type(context).__name__}", 1, 1)
        ]
    return context, []


def _context_issue(message: str, line: int | None, column: int | None) -> dict[str, Any]:
    return _page_issue("context", "context", "context", message, line, column)


def _slot_rows(checked: CheckedTemplate, trace: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per slot, in fill order: the trace's summary, the slot budget, and a verdict.

    ``verdict`` is ``kept`` (everything it produced was emitted), ``partial`` (the budget
    dropped some of its messages), ``dropped`` (the budget dropped all of them) or
    ``skipped`` (nothing to emit: a false condition, no data, ...; ``reason`` says which).
    """
    slots = checked.compiled.template.slots
    dropped: dict[str, int] = {}
    for event in trace["events"]:
        # what the slot's own plan lost; its header and footer are layout items (_layout_rows)
        if event["kind"] in _LAYOUT_KINDS or event["kind"] == "slot":
            continue
        if event["status"] == "skipped" and event["reason"] in _DROPPED and event["slot"]:
            dropped[event["slot"]] = dropped.get(event["slot"], 0) + 1
    rows = []
    for s in trace["slots"]:
        slot = slots.get(s["name"])
        cap = slot.budget.max_tokens if slot is not None and slot.budget is not None else None
        lost = dropped.get(s["name"], 0)
        if s["status"] == "rendered" and s["messages"]:
            verdict = "partial" if lost else "kept"
        elif lost:
            verdict = "dropped"
        else:
            verdict = "skipped"
        rows.append({**s, "max_tokens": cap, "dropped": lost, "verdict": verdict})
    return rows


def _layout_rows(trace: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per layout item (messages, slot inserts, headers, footers): kept, dropped or skipped."""
    rows = []
    for e in trace["events"]:
        if e["kind"] not in _LAYOUT_KINDS:
            continue
        if e["status"] == "skipped":
            verdict = "dropped" if e["reason"] in _DROPPED else "skipped"
        else:
            verdict = "kept"
        rows.append(
            {
                "kind": e["kind"],
                "path": e["path"],
                "verdict": verdict,
                **{k: e[k] for k in ("reason", "tokens", "detail")},
            }
        )
    return rows


def _record_json(record: TemplateRecord) -> dict[str, Any]:
    return {
        "id": record.id,
        "name": record.name,
        "task": record.task,
        "version": record.version,
        "revision": record.revision,
        "hash": record.content_hash,
        "updated_at": record.updated_at.isoformat(),
    }
