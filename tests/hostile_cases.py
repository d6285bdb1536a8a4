"""Hostile templates and contexts, each with the documented way it must end.

Takes: a case name. Gives: :data:`CASES` (name -> :class:`Case`) and, run as a script
(``python tests/hostile_cases.py NAME``), one JSON line describing how that case ended: the
error's type, ``limit`` and ``path`` (or the warnings of a render that completed), the CPU
seconds it took and the peak memory Python allocated while compiling and rendering it
(``tracemalloc``). ``tests/test_hostile_templates.py`` runs every case in a fresh interpreter
and checks the outcome and the memory cap; ``bench/hostile_bench.py`` prints the figures.

Why a separate process: a case that grew without bound would take the test run with it, and
peak memory is only meaningful in an interpreter that did nothing else.
"""

from __future__ import annotations

import json
import sys
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from storyforge import RenderLimitError, SourceRegistry, StoryforgeError, compile_template, render
from storyforge.engine.compiler import clear_cache
from storyforge.engine.loader import load_template_text
from storyforge.engine.parser import _compile_leaf_cached

MEMORY_CAP = 200 * 1024 * 1024
"""Most memory (bytes Python allocated, at its peak) any case may take."""

TIME_CAP = 2.0
"""Seconds each case must end within (checked by the benchmark, guarded in the tests)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Case:
    """A template (dict, or YAML text), its context and registry, and the expected ending:
    ``error`` (an exception class name) with its ``limit``, or ``warning`` (a fragment of a
    warning of a render that completes)."""

    template: Callable[[], Any]
    ctx: Callable[[], dict[str, Any]]
    error: str | None = None
    limit: str | None = None
    path: str | None = None
    warning: str | None = None
    budget: int | None = None


def _doc(layout: list[Any], slots: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"id": "h", "name": "hostile", "task": "x", "version": 1, "layout": layout, "slots": slots or {}}


def _msg(content: str) -> dict[str, Any]:
    return {"kind": "message", "role": "user", "content": content}


def _nested(depth: int) -> dict[str, Any]:
    node: dict[str, Any] = _msg("{{item}}")
    for _ in range(depth):
        node = {"kind": "forEach", "source": {"source": "$ctx", "args": {"path": "xs"}}, "map": [node]}
    return _doc([{"kind": "slot", "name": "s"}], {"s": {"priority": 0, "plan": [node]}})


def _loop(content: str, **extra: Any) -> dict[str, Any]:
    plan = [
        {
            "kind": "forEach",
            "source": {"source": "$ctx", "args": {"path": "xs"}},
            "map": [_msg(content)],
            **extra,
        }
    ]
    return _doc([{"kind": "slot", "name": "s"}], {"s": {"priority": 0, "plan": plan}})


_HALF_MB = "y" * 500_000
_NESTED_PATH = "slots.s.plan[0]" + ".map[0]" * 7  # the innermost loop visits the 250,001st item
_BOMB = "\n".join(
    [f"l0: &l0 [{', '.join(['lol'] * 9)}]"]
    + [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 9)]
    + ["id: bomb", "name: bomb", "task: x", "version: 1", "layout: []", "slots: {}"]
)


def _deep(levels: int) -> Any:
    value: Any = "bottom"
    for _ in range(levels):
        value = {"k": value}
    return value


CASES: dict[str, Case] = {
    # 10**8 messages if nothing stopped it; stops at the 250,001st item
    "nested-forEach-8x10": Case(
        template=lambda: _nested(8),
        ctx=lambda: {"xs": list(range(10))},
        error="RenderLimitError",
        limit="MAX_RENDER_ITEMS",
        path=_NESTED_PATH,
    ),
    "nested-forEach-8x10-budget": Case(
        template=lambda: _nested(8),
        ctx=lambda: {"xs": list(range(10))},
        error="RenderLimitError",
        limit="MAX_RENDER_ITEMS",
        path=_NESTED_PATH,
        budget=10**9,
    ),
    "one-long-loop": Case(
        template=lambda: _loop("{{item}}"),
        ctx=lambda: {"xs": [1] * 300_000},
        error="RenderLimitError",
        limit="MAX_RENDER_ITEMS",
        path="slots.s.plan[0]",
    ),
    # 20,000 copies of a 1,000-character text: 20 million characters of messages
    "loop-repeating-long-text": Case(
        template=lambda: _loop("{{item}}"),
        ctx=lambda: {"xs": ["z" * 1000] * 20_000},
        error="RenderLimitError",
        limit="MAX_OUTPUT_CHARS",
        path="slots.s.plan[0].map[0]",
    ),
    "many-layout-messages": Case(
        template=lambda: _doc([_msg("{{a}}") for _ in range(40)]),
        ctx=lambda: {"a": "q" * 900_000},
        error="RenderLimitError",
        limit="MAX_OUTPUT_CHARS",
        path="layout[18]",
    ),
    # a 0.5 MB template: 2,000 items joined by a 0.5 MB separator would be 1 GB
    "join-half-megabyte-separator": Case(
        template=lambda: _doc([_msg('{{ xs | join("' + _HALF_MB + '") }}')]),
        ctx=lambda: {"xs": list(range(2000))},
        error="RenderLimitError",
        limit="MAX_RENDER_CHARS",
        path="layout[0]",
    ),
    "bullets-half-megabyte-prefix": Case(
        template=lambda: _doc([_msg('{{ xs | bullets("' + _HALF_MB + '") }}')]),
        ctx=lambda: {"xs": list(range(2000))},
        error="RenderLimitError",
        limit="MAX_RENDER_CHARS",
        path="layout[0]",
    ),
    "numbered-half-megabyte-format": Case(
        template=lambda: _doc([_msg('{{ xs | numbered("#' + _HALF_MB + '") }}')]),
        ctx=lambda: {"xs": list(range(2000))},
        error="RenderLimitError",
        limit="MAX_RENDER_CHARS",
        path="layout[0]",
    ),
    "join-of-a-list-repeating-data": Case(
        template=lambda: _doc([_msg("{{ [" + ", ".join(["a"] * 2000) + "] | join(a) }}")]),
        ctx=lambda: {"a": "x" * 100_000},
        error="RenderLimitError",
        limit="MAX_RENDER_CHARS",
        path="layout[0]",
    ),
    "json-of-a-list-repeating-a-list": Case(
        template=lambda: _doc([_msg("{{ [" + ", ".join(["xs"] * 200) + "] | json }}")]),
        ctx=lambda: {"xs": [1] * 100_000},
        error="RenderLimitError",
        limit="MAX_OUTPUT_CHARS",
        path="layout[0]",
    ),
    # a 1 MB context whose string expands 200,000 placeholders, each to 500 characters
    "data-expansion-1MB-context": Case(
        template=lambda: _doc([_msg("{{a}}")]),
        ctx=lambda: {"a": "{{b}}" * 200_000, "b": "{{c}}" * 5, "c": "x" * 100},
        error="RenderLimitError",
        limit="MAX_RENDER_CHARS",
        path="layout[0]",
    ),
    "data-expansion-doubling": Case(
        template=lambda: _doc([_msg("{{a}}")]),
        ctx=lambda: {"a": "{{a}}" * 64},
        error="RenderLimitError",
        limit="MAX_RENDER_CHARS",
        path="layout[0]",
    ),
    "data-reads-the-context": Case(
        template=lambda: _loop("{{item}}"),
        ctx=lambda: {
            "xs": ["{{ctx}}", "{{globals}}", "{{hero}}"],
            "hero": {"secret": "s"},
            "globals": {"k": 1},
        },
        warning="reached a mapping or list and rendered empty",
    ),
    "data-nested-1000-deep": Case(
        template=lambda: _doc([_msg("[{{deep}}]")]),
        ctx=lambda: {"deep": _deep(1000)},
        warning="nested more than MAX_JSON_DEPTH=500",
    ),
    "lone-surrogate-literal": Case(
        template=lambda: _doc([_msg('{{ "\\ud800" }}')]),
        ctx=dict,
        error="TemplateValidationError",
    ),
    "yaml-alias-bomb": Case(template=lambda: _BOMB, ctx=dict, error="TemplateValidationError"),
}


def _attempt(case: Case) -> dict[str, Any]:
    source, ctx = case.template(), case.ctx()
    outcome: dict[str, Any] = {}
    try:
        template = load_template_text(source, format="yaml") if isinstance(source, str) else source
        result = render(compile_template(template), ctx, SourceRegistry(), budget=case.budget)
        outcome.update(
            error=None, warnings=result.warnings, chars=sum(len(m["content"]) for m in result.messages)
        )
    except RenderLimitError as exc:
        outcome.update(error=type(exc).__name__, limit=exc.limit, path=str(exc.path), message=str(exc))
    except StoryforgeError as exc:
        outcome.update(error=type(exc).__name__, message=str(exc))
    return outcome


def run(name: str) -> dict[str, Any]:
    """Compile and render one case twice: once timed (CPU seconds), once under ``tracemalloc``
    (which slows every allocation down) for the peak memory; how it ended, and both figures."""
    case = CASES[name]
    started = time.process_time()
    outcome = {"case": name, **_attempt(case)}
    outcome["seconds"] = time.process_time() - started
    clear_cache()  # compile again: the memory of compiling counts too
    _compile_leaf_cached.cache_clear()
    tracemalloc.start()
    again = _attempt(case)
    outcome["peak_bytes"] = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    outcome["same_outcome_twice"] = again == {k: v for k, v in outcome.items() if k in again}
    return outcome


if __name__ == "__main__":
    print(json.dumps(run(sys.argv[1])))
