"""Hostile sizes: compile time against placeholders in one string, and history walking under a budget.

Run from the repository root: ``python bench/hostile_bench.py``. Prints CPU times measured in
this process and ratios against the smallest size, which is what to compare (absolute numbers
move with machine load):

* ``compile_template`` and the first render of one
  layout message with 20k, 40k and 100k placeholders, all different (``{{x0}} {{x1}} ...``)
  or all the same (``{{x}} {{x}} ...``), and of a layout of 200, 1,000 and 4,000 short
  messages: linear growth gives ratios close to 1x, 2x and 5x (1x, 5x, 20x for the messages);
* a turn-generation render whose history source returns 10,000 or 50,000 turns under a
  2,000-token budget (the same ~60 turns fit). The walk ends as soon as less is left than any
  turn could cost; until then, turns surely too long for what is left are passed over
  without being rendered (a shorter one further on could still fit, as in the reference),
  so the cost still grows with the list, by a dictionary lookup or two per turn;
* every hostile template of ``tests/hostile_cases.py`` (nested loops, amplifying filters, data
  expansion, deep data, an alias bomb, ...), each in a fresh interpreter: how it ended, its
  CPU seconds and peak allocated memory as fractions of the 2 s and 200 MB caps.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from storyforge import compile_template, render
from storyforge.tasks.base import get_task_kind


def _placeholders(count: int, same: bool = False) -> dict[str, Any]:
    content = "".join("word {{x}} " if same else f"word {{{{x{i}}}}} " for i in range(count))
    return {
        "id": "big",
        "name": "big",
        "task": "x",
        "version": 1,
        "layout": [{"kind": "message", "role": "user", "content": content}],
        "slots": {},
    }


def _messages(count: int) -> dict[str, Any]:
    roles = ("user", "assistant")
    return {
        "id": "messages",
        "name": "messages",
        "task": "x",
        "version": 1,
        "layout": [
            {"kind": "message", "role": roles[i % 2], "content": f"m{i} {{{{x}}}} {{{{y}}}}"}
            for i in range(count)
        ],
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


def _compile_and_render(doc: dict[str, Any]) -> tuple[float, float]:
    """CPU seconds of an uncached compile, then of the first render."""
    start = time.process_time()
    compiled = compile_template(doc, name=f"n{time.perf_counter_ns()}")
    middle = time.process_time()
    render(compiled, {"x": "1", "y": "2"})
    return middle - start, time.process_time() - middle


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog="Takes no options; it runs at the sizes above (about a minute).",
    ).parse_args(argv)
    cases = [
        ("different placeholders", [(n, _placeholders(n)) for n in (20_000, 40_000, 100_000)]),
        ("the same placeholder", [(n, _placeholders(n, same=True)) for n in (20_000, 40_000, 100_000)]),
        ("short messages", [(n, _messages(n)) for n in (200, 1_000, 4_000)]),
    ]
    for title, docs in cases:
        print(
            f"compile_template and first render, one string with N {title} (uncached):"
            if "placeholder" in title
            else f"compile_template and first render, a layout of N {title} (uncached):"
        )
        base: float | None = None
        for count, doc in docs:
            compile_s, render_s = _compile_and_render(doc)
            total = compile_s + render_s
            base = base or total
            print(
                f"  {count:>7,}  compile {compile_s:7.3f} s  first render {render_s:7.3f} s   {total / base:5.2f}x"
            )

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

    hostile_cases()


def hostile_cases() -> None:
    """Every case of tests/hostile_cases.py in a fresh interpreter: how it ended, its CPU
    time and its peak allocated memory, as fractions of the 2 s and 200 MB caps."""
    import json
    import subprocess

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from hostile_cases import CASES, MEMORY_CAP, TIME_CAP

    script = Path(__file__).resolve().parent.parent / "tests" / "hostile_cases.py"
    print(f"hostile templates (fresh interpreter each; caps {TIME_CAP:.0f} s and {MEMORY_CAP >> 20} MB):")
    for name in CASES:
        done = subprocess.run([sys.executable, str(script), name], capture_output=True, text=True, check=True)
        outcome = json.loads(done.stdout.splitlines()[-1])
        ending = outcome.get("limit") or outcome["error"] or "rendered, warned"
        seconds, peak = outcome["seconds"], outcome["peak_bytes"]
        print(
            f"  {name:<36} {ending:<24} {seconds:6.3f} s ({seconds / TIME_CAP:5.1%})"
            f"  {peak / 2**20:7.1f} MB ({peak / MEMORY_CAP:5.1%})"
        )


if __name__ == "__main__":
    main()
