"""TinyStories job speed and memory: ``python run.py task=tinystories`` against a plain script.

Takes: ``--sizes`` (default ``10000 100000 1000000``; ``--quick``: 2000 only, the smoke run) and
``--repeat`` (1). Gives: the job's peak RSS at 10 seeds (its start-up: imports, Hydra, the
writer threads), then per size the wall time and peak RSS of (a) the real job,
``python run.py task.n_seeds=N`` (Hydra, structured configs, the engine rendering every
instruction, seed validation, atomic hashed writes, the Parquet twins, manifest), and (b) a
plain-Python baseline that draws the same seeds with the same generator, fills the seed
specification's template with ``str.format`` and writes both files with ``json.dumps``; then
the ratio, whether both wrote the same bytes, and the goals: the job's wall time within
1.4x the plain script's and its peak RSS at most 150 MiB at every size (flat in the seeds).
Each run is its own subprocess, measured with ``os.wait4`` (wall clock, the child's CPU time
and ``ru_maxrss``), so start-up costs are included and memory is the whole process's peak;
the children keep Python's bytecode cache, written by the first (start-up) run, as a user's
second and later runs do.
CPU time is printed too because on a shared machine it is the steadier of the two figures;
with ``--repeat`` the fastest wall time of each side is kept.

``--before DIR`` (another checkout, e.g. a worktree of the main line) compares the job with
that checkout's instead of with the plain script: the two take turns ``--repeat`` times per
size, and the medians of each side's CPU, wall time and peak RSS are printed (before -> after).

    python bench/pipeline_bench.py
    python bench/pipeline_bench.py --sizes 10000 100000
    python bench/pipeline_bench.py --quick
    python bench/pipeline_bench.py --sizes 1000 100000 --repeat 5 --before ../main
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_RATIO = 1.4  # the job's wall time against the plain script's
MAX_MIB = 150.0  # the job's peak RSS, at every size
# The children keep Python's bytecode cache as a user's runs do (an environment that turns
# it off, PYTHONDONTWRITEBYTECODE, would make every job recompile storyforge's own modules,
# ~0.1 s); the untimed start-up run below writes it, so the timed runs all read it.
CHILD_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}

# The seed specification's canonical template, as the baseline fills it.
SPEC_TEMPLATE = """Write a children's story.

Constraints:
- Protagonist: {protagonist}
- Theme: {theme}
- Length: {min_sentences} to {max_sentences} sentences.
- Must include ALL of these exact phrases (case-insensitive match is acceptable):
{required_list}
- Must NOT include any of these phrases (case-insensitive match):
{banned_list_or_NONE}

Style:
- Simple words and short sentences.
- Child-friendly tone.
- No meta commentary about writing.
- Do not use bullet points or numbered lists.

Formatting:
- Output plain text only."""


def baseline(n: int, out_dir: Path) -> None:
    """The plain script: same generator, str.format, json.dumps, no validation or framework."""
    import yaml

    sys.path.insert(0, str(ROOT))
    from storyforge.tasks.tinystories.seeds import SeedGenerator
    from storyforge.tasks.tinystories.spec import SPEC_CONSTRAINTS

    conf = ROOT / "conf"
    pools = yaml.safe_load((conf / "pools/default.yaml").read_text("utf-8"))
    themes = yaml.safe_load((conf / "themes/all.yaml").read_text("utf-8"))["names"]
    gen = SeedGenerator(
        seed=1234,
        themes=themes,
        constraints=SPEC_CONSTRAINTS,
        protagonists=pools["protagonists"],
        objects=pools["objects"],
        banned=pools["banned"],
    )
    with (
        open(out_dir / "prompts_seed.jsonl", "w", encoding="utf-8") as seeds,
        open(out_dir / "prompts.jsonl", "w", encoding="utf-8") as prompts,
    ):
        for i in range(n):
            r = gen.record(i)
            r["instruction"] = SPEC_TEMPLATE.format(
                protagonist=r["protagonist"],
                theme=r["theme"],
                min_sentences=r["min_sentences"],
                max_sentences=r["max_sentences"],
                required_list="\n".join("  - " + p for p in r["required"]),
                banned_list_or_NONE="\n".join("  - " + p for p in r["banned"]) if r["banned"] else "  NONE",
            )
            seeds.write(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n")
            prompt = {
                "id": r["id"],
                "split": r["split"],
                "messages": [{"role": "user", "content": r["instruction"]}],
            }
            prompts.write(json.dumps(prompt, ensure_ascii=False, separators=(",", ":")) + "\n")


def measure(cmd: list[str], root: Path = ROOT) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds (user + system) and peak RSS (MiB) of one child process run
    in the checkout ``root`` (its own ``storyforge`` first on the path)."""
    env = {**CHILD_ENV, "PYTHONPATH": str(root)}
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode() if proc.stderr else ""
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--quick", action="store_true", help="2,000 seeds only (a smoke run)")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--before", type=Path, help="another checkout to compare the job with")
    parser.add_argument("--baseline", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.baseline is not None:
        baseline(args.baseline, args.out)
        return
    sizes = [2000] if args.quick else args.sizes
    if args.before is not None:
        compare(args.before.resolve(), sizes, args.repeat)
        return

    with tempfile.TemporaryDirectory() as tmp:
        _, _, startup = measure([sys.executable, "run.py", "task.n_seeds=10", f"hydra.run.dir={tmp}"])
    print(f"job start-up (10 seeds): peak RSS {startup:.1f} MiB")
    print(
        f"{'n_seeds':>8} {'job s':>7} {'plain s':>7} {'ratio':>5} {'job cpu':>7} {'plain cpu':>9}"
        f" {'ratio':>5} {'job MiB':>7} {'plain MiB':>9}  same bytes"
        f"  goals (ratio <= {MAX_RATIO}x, job <= {MAX_MIB:.0f} MiB)"
    )
    peaks = []
    for n in sizes:
        best: dict[str, tuple[float, float, float]] = {}
        with tempfile.TemporaryDirectory() as tmp:
            job_dir, plain_dir = Path(tmp, "job"), Path(tmp, "plain")
            plain_dir.mkdir()
            for _ in range(args.repeat):
                runs = {
                    "job": [sys.executable, "run.py", f"task.n_seeds={n}", f"hydra.run.dir={job_dir}"],
                    "plain": [sys.executable, __file__, "--baseline", str(n), "--out", str(plain_dir)],
                }
                for name, cmd in runs.items():
                    wall, cpu, rss = measure(cmd)
                    if name not in best or wall < best[name][0]:
                        best[name] = (wall, cpu, rss)
            same = all(
                filecmp.cmp(job_dir / f, plain_dir / f, shallow=False)
                for f in ("prompts_seed.jsonl", "prompts.jsonl")
            )
        (job_s, job_cpu, job_mb), (plain_s, plain_cpu, plain_mb) = best["job"], best["plain"]
        peaks.append(job_mb)
        ratio = job_s / plain_s
        goals = f"{'met' if ratio <= MAX_RATIO else 'NOT met'}, {'met' if job_mb <= MAX_MIB else 'NOT met'}"
        print(
            f"{n:>8} {job_s:>7.2f} {plain_s:>7.2f} {ratio:>5.2f} {job_cpu:>7.2f} {plain_cpu:>9.2f}"
            f" {job_cpu / plain_cpu:>5.2f} {job_mb:>7.1f} {plain_mb:>9.1f}  {same!s:<10}  {goals}",
            flush=True,
        )
    if len(peaks) > 1:
        print(
            f"job peak RSS from {sizes[0]:,} to {sizes[-1]:,} seeds: {peaks[0]:.1f} -> {peaks[-1]:.1f} MiB "
            f"({peaks[-1] - peaks[0]:+.1f}); {peaks[0] - startup:+.1f} MiB over start-up at {sizes[0]:,}"
        )


def compare(before: Path, sizes: list[int], repeat: int) -> None:
    """The job of ``before`` and of this checkout, taking turns; medians, and the same bytes."""
    print(f"before: {before}; after: {ROOT}; {repeat} runs of each, medians (load: {os.getloadavg()[0]:.1f})")
    print(
        f"{'n_seeds':>8} {'cpu s before -> after':>22} {'ratio':>5} {'wall s before -> after':>23} {'MiB before -> after':>20}  same bytes"
    )
    for n in sizes:
        runs: dict[Path, list[tuple[float, float, float]]] = {before: [], ROOT: []}
        with tempfile.TemporaryDirectory() as tmp:
            for root in (before, ROOT):  # an untimed start-up run each: the bytecode caches
                measure([sys.executable, "run.py", "task.n_seeds=10", f"hydra.run.dir={tmp}/warm"], root)
            for _ in range(repeat):
                for side, root in enumerate((before, ROOT)):
                    out = f"hydra.run.dir={tmp}/{side}"
                    runs[root].append(measure([sys.executable, "run.py", f"task.n_seeds={n}", out], root))
            same = all(
                filecmp.cmp(Path(tmp, "0", f), Path(tmp, "1", f), shallow=False)
                for f in ("prompts_seed.jsonl", "prompts.jsonl", "rejected_seeds.jsonl")
            )
        (b_wall, b_cpu, b_mib), (a_wall, a_cpu, a_mib) = (
            tuple(statistics.median(r[i] for r in runs[root]) for i in range(3)) for root in (before, ROOT)
        )
        print(
            f"{n:>8} {b_cpu:>10.2f} -> {a_cpu:<8.2f} {a_cpu / b_cpu:>5.2f} {b_wall:>11.2f} -> {a_wall:<8.2f}"
            f" {b_mib:>8.1f} -> {a_mib:<8.1f}  {same}",
            flush=True,
        )


if __name__ == "__main__":
    main()
