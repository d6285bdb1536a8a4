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
* ``--outputs N`` (instead of the above): whole ``completions=`` runs of N seeds whose outputs
  are all different, all the same, or all different but one, a single 2,000,000-character
  word; each in its own process, with its wall seconds and peak RSS, as ratios against the
  all-different run (goal: 1.5x at most). The seeds are made once, by a run with no provider.
  At 100,000 seeds: 80.0 s / 723 MiB all different, 30.7 s (0.38x) / 696 MiB all the same,
  49.7 s (0.62x) / 724 MiB with the long word. Before, at 20,000 seeds: 64.6 s / 356 MiB,
  105.9 s (1.64x, growing with the square of the repeats) / 263 MiB, and 553.5 s (8.57x) /
  2,307 MiB (6.48x), most of it drawing the uncut opening;
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import os
import subprocess

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
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog="Without options it runs the templates at the sizes above (about a minute).",
    )
    parser.add_argument(
        "--outputs", type=int, default=0, help="hostile outputs instead, for N seeds (100000)"
    )
    args = parser.parse_args(argv)
    if args.outputs:
        hostile_outputs(args.outputs)
        return
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


def _timed_run(*overrides: str) -> tuple[float, int, int, str]:
    """Wall seconds, peak RSS (bytes), exit status and stderr of ``python run.py OVERRIDES``."""
    import tempfile

    with tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "run.py"), *overrides],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        return seconds, usage.ru_maxrss * 1024, proc.returncode, err.read()


def hostile_outputs(count: int) -> None:
    """``completions=`` runs of ``count`` seeds: outputs all different, all the same, one huge word."""
    import json
    import random
    import tempfile

    with tempfile.TemporaryDirectory(prefix="hostile-outputs-") as tmp:
        root = Path(tmp)
        *_, status, err = _timed_run(f"task.n_seeds={count}", f"hydra.run.dir={root / 'seeds'}")
        if status != 0:
            raise SystemExit(err)
        seeds = root / "seeds" / "prompts_seed.jsonl"
        ids = [json.loads(line)["id"] for line in seeds.read_text("utf-8").splitlines()]
        rng = random.Random(38)
        vocab = [
            "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 8)))
            for _ in range(6000)
        ]

        def story() -> str:
            sentences = (" ".join(rng.choice(vocab) for _ in range(rng.randint(6, 14))) for _ in range(8))
            return " ".join(f"{s[0].upper()}{s[1:]}." for s in sentences)

        refusal = "I'm sorry, but I can't help with that request."
        distinct = [story() for _ in ids]
        cases = {
            "all different": distinct,
            "all the same": [refusal] * len(ids),
            # first, so its opening is among the top openings the report draws
            "one 2,000,000-character word": ["a" * 2_000_000, *distinct[1:]],
        }
        print(f"{count:,} outputs checked with completions= (a whole run each, in its own process):")
        base: tuple[float, int] | None = None
        for name, outputs in cases.items():
            path = root / f"{len(name)}.jsonl"
            with open(path, "w", encoding="utf-8") as fh:
                fh.writelines(
                    json.dumps({"id": seed_id, "output": output}) + "\n"
                    for seed_id, output in zip(ids, outputs, strict=True)
                )
            seconds, peak, status, err = _timed_run(
                f"seeds_path={seeds}",
                f"completions={path}",
                f"task.n_seeds={count}",
                f"hydra.run.dir={root / str(len(name))}",
                f"cache.path={root / 'cache' / 'responses.sqlite'}",
            )
            base = base or (seconds, peak)
            print(
                f"  {name:<30} {seconds:8.2f} s ({seconds / base[0]:4.2f}x)  peak {peak / 2**20:8.1f} MiB"
                f" ({peak / base[1]:4.2f}x)  exit {status}"
            )
            if status != 0:
                print("    " + err.strip().splitlines()[-1][:300])


if __name__ == "__main__":
    main()
