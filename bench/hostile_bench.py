"""Hostile sizes: compile time against placeholders in one string, and history walking under a budget.

Run from the repository root: ``python bench/hostile_bench.py``. Prints CPU times measured in
this process and ratios against the smallest size, which is what to compare (absolute numbers
move with machine load):

* ``compile_template`` of one layout message with 20k, 40k and 100k placeholders: linear
  growth gives ratios close to 1x, 2x and 5x;
* a turn-generation render whose history source returns 10,000 or 50,000 turns under a
  2,000-token budget (the same ~60 turns fit). The walk ends as soon as less is left than any
  turn could cost; until then, turns surely too long for what is left are passed over
  without being rendered (a shorter one further on could still fit, as in the reference),
  so the cost still grows with the list, by a dictionary lookup or two per turn.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from storyforge import compile_template, render
from storyforge.tasks.base import get_task_kind


def _placeholders(count: int) -> dict[str, Any]:
    content = "".join(f"word {{{{x{i}}}}} " for i in range(count))
    return {
        "id": "big",
        "name": "big",
        "task": "x",
        "version": 1,
        "layout": [{"kind": "message", "role": "user", "content": content}],
        "slots": {},
    }


def _history_template() -> dict[str, Any]:
    return {
        "id": "history",
        "name": "history",
        "task": "turn_generation",
        "version": 1,
        "layout": [
            {"kind": "message", "role": "system", "content": "Write the next turn as {{actor.name}}."},
            {"kind": "slot", "name": "history", "header": {"role": "user", "content": "Story so far:"}},
        ],
        "slots": {
            "history": {
                "priority": 0,
                "budget": {"maxTokens": 1500},
                "plan": [
                    {
                        "kind": "forEach",
                        "source": {"source": "turns", "args": {"order": "desc"}},
                        "fillDir": "prepend",
                        "map": [
                            {
                                "kind": "message",
                                "role": "user",
                                "content": "[{{item.turnNo}}] {{item.authorName}}: {{item.content}}",
                            }
                        ],
                    }
                ],
            }
        },
    }


def cpu(fn: Any, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
    return best


def main() -> None:
    print("compile_template, one string with N placeholders (uncached):")
    base: float | None = None
    for count in (20_000, 40_000, 100_000):
        doc = _placeholders(count)
        seconds = cpu(lambda doc=doc: compile_template(doc, name=f"n{time.perf_counter_ns()}"), repeat=1)
        base = base or seconds
        print(f"  {count:>7,} placeholders {seconds:7.3f} s   {seconds / base:5.2f}x")

    from storyforge.tasks.turn_generation import sample_context

    kind = get_task_kind("turn_generation")
    compiled = compile_template(_history_template())
    print("history walk under a 2,000-token budget (1,500 for the history slot):")
    first: float | None = None
    for turns in (10_000, 50_000):
        ctx = dict(sample_context(turns=turns))
        registry = kind.registry(ctx)
        result = render(compiled, ctx, registry, budget=2000)
        kept = sum(1 for e in result.trace.events if e.kind == "message" and e.status == "rendered")
        seconds = cpu(
            lambda ctx=ctx, registry=registry: render(compiled, ctx, registry, budget=2000), repeat=5
        )
        first = first or seconds
        print(f"  {turns:>6,} turns {seconds * 1000:8.2f} ms   {seconds / first:5.2f}x   ({kept} turns kept)")


if __name__ == "__main__":
    main()
