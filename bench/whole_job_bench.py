"""The whole TinyStories regeneration job against a plain asyncio + aiohttp script doing the same.

Takes: ``--seeds`` (2000), ``--attempts`` (3), ``--concurrency`` (32), ``--latencies`` (0.001,0.05
seconds per answer), ``--rounds`` (2), and for the long-tailed server ``--tail-seeds`` (100),
``--tail-concurrency`` (8) (``--no-tail`` skips it). Gives, per server and round (the two tools
alternate in order from round to round), each tool's wall and CPU seconds, peak RSS and the
server's busy share, then the ratios to the plain script; and a per-stage table of the finish
(seconds per 10,000 answers).

The tools run as child processes against one loopback fake server in this process (its CPU is
not counted). Each tool's figures are ``wait4``'s: CPU seconds of the process and of every
process it started and waited for; peak RSS the largest peak of any one of them, not their
sum (Linux's ``ru_maxrss`` of a child is the max of its own and its children's). The tools: ``python run.py`` (a
regeneration run: ``regenerate.max_attempts``, repair turns, ``dedup=default``, plots on) and
``python bench/whole_job_bench.py plain``, which reads the same rendered prompts, sends each
seed's chain (attempt k+1 as soon as attempt k is answered and checked, all through one
semaphore of ``concurrency``), checks every answer with the same checks and sends the same
repair turns (storyforge's :class:`SeedChecks` and repair template), appending every answer to
one JSONL file. Both send the same requests, so the fake server's answers (a hash of each
request) are the same: the bench checks both made as many requests.

The busy share: each request's time in the server (its arrival to its answer, known when it
arrives: the latency plus the stall the rule gives it), summed, over ``concurrency`` times the
span from the first arrival to the last answer. The long-tailed server answers after a
log-normal time (median 200 ms, p99 about 4 s) drawn from a hash of the request, so both tools
wait the same for the same request.

The per-stage table: ``python run.py completions=<attempts.jsonl>`` of the 1 ms storyforge run,
in a child process whose stage functions are wrapped with timers (validation: the checks;
dedup: signing, the cluster search and ``duplicates.jsonl``; diversity: sampling and the
figures; twins: writing the Parquet twins from the finished files; report: ``report/``).

    python bench/whole_job_bench.py --seeds 200 --rounds 1 --no-tail
    python bench/whole_job_bench.py
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODEL = "fake"
SEED = 1


# -- the plain script ---------------------------------------------------------------------------


def plain(args: argparse.Namespace) -> None:
    """Each seed's chain through one semaphore; the same checks and repair turns as storyforge."""
    import aiohttp

    from storyforge.tasks.tinystories.echo import REASON_PREFIX
    from storyforge.tasks.tinystories.repair import RepairRenderer, repair_context
    from storyforge.tasks.tinystories.validate import SeedChecks, check_answer, prompt_texts

    run = Path(args.dir)
    prompts = [json.loads(line) for line in (run / "prompts.jsonl").open("rb")]
    seeds = {r["id"]: r for r in map(json.loads, (run / "prompts_seed.jsonl").open("rb"))}
    checks = {seed_id: SeedChecks.from_seed(seed) for seed_id, seed in seeds.items()}
    repair = RepairRenderer.load(None)
    url = args.url.rstrip("/") + "/chat/completions"
    out = (run / "plain.jsonl").open("ab")

    async def main() -> None:
        limit = asyncio.Semaphore(args.concurrency)
        connector = aiohttp.TCPConnector(limit=args.concurrency)
        async with aiohttp.ClientSession(connector=connector) as session:

            async def chain(prompt: Mapping[str, Any]) -> None:
                seed_id, messages = prompt["id"], list(prompt["messages"])
                turn = None  # the repair turn this attempt answers
                for attempt in range(1, args.attempts + 1):
                    body = {"model": MODEL, "messages": messages, "seed": SEED + attempt - 1}
                    async with limit, session.post(url, json=body) as response:
                        answer = await response.json()
                    choice = answer["choices"][0]
                    text, finish = choice["message"]["content"], choice.get("finish_reason")
                    out.write(
                        json.dumps({"id": seed_id, "attempt": attempt, "output": text}).encode() + b"\n"
                    )
                    result = check_answer(
                        checks[seed_id],
                        text,
                        finish_reason=finish,
                        prompts=prompt_texts(prompt["messages"], turn),
                    )
                    if result.passed:
                        return
                    echo = next((r for r in result.reasons if r.startswith(REASON_PREFIX)), "")
                    context = repair_context(
                        seeds[seed_id],
                        checks[seed_id],
                        text,
                        result.labels,
                        attempt=attempt,
                        finish_reason=finish,
                        echo=echo,
                    )
                    turn = repair(context)
                    messages = [
                        *prompt["messages"],
                        {"role": "assistant", "content": text},
                        {"role": "user", "content": turn},
                    ]

            await asyncio.gather(*(chain(p) for p in prompts))

    asyncio.run(main())
    out.close()


# -- measuring ----------------------------------------------------------------------------------


class Busy:
    """Each request's time in the server, recorded as it arrives (see the module)."""

    def __init__(self, latency: float, stall: Callable[[Any], float] | None = None) -> None:
        self.latency = latency
        self.stall = stall
        self.spans: list[tuple[float, float]] = []
        self.lock = threading.Lock()

    def rule(self, received: Any) -> Any:
        from tests.support.fake_server import Fault

        extra = self.stall(received.json) if self.stall is not None else 0.0
        now = time.monotonic()
        with self.lock:
            self.spans.append((now, now + self.latency + extra))
        return Fault.stall(extra) if extra else None

    def share(self, concurrency: int) -> float:
        with self.lock:
            spans, self.spans = self.spans, []
        if not spans:
            return 0.0
        first, last = min(s for s, _ in spans), max(e for _, e in spans)
        return sum(e - s for s, e in spans) / (concurrency * (last - first))


def log_normal(body: Any) -> float:
    """A long-tailed answer time from the request's hash: median 0.2 s, p99 about 4 s."""
    # What the answer depends on (as the fake server's story): the same for both tools.
    key = json.dumps([body.get("messages"), body.get("seed")], sort_keys=True).encode()
    rng = random.Random(hashlib.sha256(key).digest())
    return 0.2 * math.exp(rng.gauss(0.0, math.log(20) / 2.326))


def child(cmd: list[str], env: dict[str, str] | None = None) -> dict[str, float]:
    """Wall and CPU seconds and peak RSS (MiB) of one child process."""
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        err = proc.stderr.read().decode() if proc.stderr else ""
        raise SystemExit(f"{' '.join(cmd[:3])} ... failed ({proc.returncode}):\n{err[-3000:]}")
    if proc.stderr:
        proc.stderr.close()
    return {"wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "rss": usage.ru_maxrss / 1024}


def storyforge_cmd(
    url: str, run: Path, seeds: int, attempts: int, concurrency: int, *extra: str
) -> list[str]:
    return [
        sys.executable,
        "run.py",
        "task=tinystories",
        f"task.n_seeds={seeds}",
        "provider=openai",
        f"provider.base_url={url}",
        f"provider.model={MODEL}",
        f"provider.seed={SEED}",
        f"provider.concurrency={concurrency}",
        "provider.progress=false",
        "cache.path=null",
        f"regenerate.max_attempts={attempts}",
        f"hydra.run.dir={run}",
        *extra,
    ]


def env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }


def compare(
    label: str,
    server: Any,
    busy: Busy,
    tmp: Path,
    *,
    seeds: int,
    attempts: int,
    concurrency: int,
    rounds: int,
) -> dict[str, list[dict[str, float]]]:
    """``rounds`` alternated runs of both tools against ``server``; prints each and the ratios."""
    rendered = tmp / f"{label}-render"
    render = [sys.executable, "run.py", "task=tinystories", f"task.n_seeds={seeds}", "provider=none"]
    child([*render, f"hydra.run.dir={rendered}"], env())
    busy.share(concurrency)  # nothing was sent; starts the record afresh
    got: dict[str, list[dict[str, float]]] = {"storyforge": [], "plain": []}
    for k in range(rounds):
        order = ["storyforge", "plain"] if k % 2 == 0 else ["plain", "storyforge"]
        for tool in order:
            before = server.request_count
            if tool == "storyforge":
                run = tmp / f"{label}-sf-{k}"
                figures = child(storyforge_cmd(server.base_url, run, seeds, attempts, concurrency), env())
            else:
                run = tmp / f"{label}-plain-{k}"
                shutil.copytree(rendered, run)
                cmd = [sys.executable, __file__, "plain", "--dir", str(run), "--url", server.base_url]
                cmd += ["--concurrency", str(concurrency), "--attempts", str(attempts)]
                figures = child(cmd, env())
            figures["busy"] = busy.share(concurrency)
            figures["requests"] = server.request_count - before
            got[tool].append(figures)
            print(
                f"{label} round {k + 1} {tool:10s}: {figures['requests']:.0f} requests, wall {figures['wall']:.2f} s, "
                f"CPU {figures['cpu']:.2f} s, peak RSS {figures['rss']:.0f} MiB, busy share {figures['busy']:.2f}",
                flush=True,
            )
    med = {
        tool: {key: statistics.median(r[key] for r in rows) for key in rows[0]} for tool, rows in got.items()
    }
    sf, pl = med["storyforge"], med["plain"]
    print(
        f"{label} medians: wall {sf['wall']:.2f} / {pl['wall']:.2f} s = {sf['wall'] / pl['wall']:.2f}x, "
        f"CPU {sf['cpu']:.2f} / {pl['cpu']:.2f} s = {sf['cpu'] / pl['cpu']:.2f}x, "
        f"peak RSS {sf['rss']:.0f} / {pl['rss']:.0f} MiB, busy share {sf['busy']:.2f} / {pl['busy']:.2f}",
        flush=True,
    )
    return got


# -- the per-stage table ------------------------------------------------------------------------

STAGES = ("validation", "dedup", "diversity", "twins", "report")


def stages(args: argparse.Namespace) -> None:
    """``completions=`` of a finished run with its stage functions timed; prints the totals as JSON."""
    from hydra import compose, initialize_config_dir

    from storyforge import tables
    from storyforge.config import register_configs
    from storyforge.pipeline import run_in
    from storyforge.quality import dedup as quality_dedup
    from storyforge.quality import diversity as quality_diversity
    from storyforge.tasks.tinystories import dedup_stage, outputs, validate

    spent = dict.fromkeys(STAGES, 0.0)

    def timed(owner: Any, name: str, stage: str) -> None:
        inner = getattr(owner, name)

        def wrapper(*a: Any, **kw: Any) -> Any:
            started = time.perf_counter()
            try:
                return inner(*a, **kw)
            finally:
                spent[stage] += time.perf_counter() - started

        setattr(owner, name, wrapper)

    timed(validate.SeedChecks, "validate", "validation")
    for owner, name in (
        (quality_dedup.SignatureBuilder, "add"),
        (quality_dedup.SignatureBuilder, "build"),
        (dedup_stage, "find_clusters"),
        (dedup_stage, "_write_duplicates"),
    ):
        timed(owner, name, "dedup")
    timed(quality_diversity.BottomSample, "add", "diversity")
    timed(dedup_stage, "_diversity_summary", "diversity")
    timed(tables, "write_parquet", "twins")
    timed(outputs, "write_report", "report")
    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = compose(
            "config", overrides=[f"task.n_seeds={args.seeds}", f"completions={args.completions}", *args.extra]
        )
    run_in(cfg, Path(args.out))
    print(json.dumps(spent))


def stage_table(completions: Path, seeds: int, tmp: Path) -> dict[str, float]:
    """Seconds per 10,000 answers of each stage of the finish, for ``completions``."""
    answers = sum(1 for line in completions.open("rb") if line.strip())
    cmd = [sys.executable, __file__, "stages", "--completions", str(completions), "--seeds", str(seeds)]
    cmd += ["--out", str(tmp / "stages")]
    proc = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, check=True)
    spent = json.loads(proc.stdout.strip().splitlines()[-1])
    return {stage: spent[stage] * 10_000 / answers for stage in STAGES}


def main() -> None:
    parser = argparse.ArgumentParser(description="the whole regeneration job against a plain script")
    sub = parser.add_subparsers(dest="command")
    p = sub.add_parser("plain")
    p.add_argument("--dir", required=True)
    p.add_argument("--url", required=True)
    p.add_argument("--concurrency", type=int, required=True)
    p.add_argument("--attempts", type=int, required=True)
    s = sub.add_parser("stages")
    s.add_argument("--completions", required=True)
    s.add_argument("--seeds", type=int, required=True)
    s.add_argument("--out", required=True)
    s.add_argument("extra", nargs="*")
    parser.add_argument("--seeds", type=int, default=2000)
    parser.add_argument("--attempts", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--latencies", default="0.001,0.05", help="'' for none (only the long tail)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tail-seeds", type=int, default=100)
    parser.add_argument("--tail-concurrency", type=int, default=8)
    parser.add_argument("--no-tail", action="store_true")
    args = parser.parse_args()
    if args.command == "plain":
        return plain(args)
    if args.command == "stages":
        return stages(args)

    from tests.support.fake_server import FakeServer

    resource.setrlimit(resource.RLIMIT_NOFILE, resource.getrlimit(resource.RLIMIT_NOFILE))
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        latencies = [float(x) for x in args.latencies.split(",") if x]
        for latency in latencies:
            busy = Busy(latency)
            label = f"{latency * 1000:g}ms"
            with FakeServer(latency_s=latency, replies="story", record=False, rule=busy.rule) as server:
                compare(
                    label,
                    server,
                    busy,
                    tmp,
                    seeds=args.seeds,
                    attempts=args.attempts,
                    concurrency=args.concurrency,
                    rounds=args.rounds,
                )
            if latency == min(latencies):
                table = stage_table(tmp / f"{label}-sf-0" / "attempts.jsonl", args.seeds, tmp)
                print(
                    "per stage, seconds per 10,000 answers: "
                    + ", ".join(f"{k} {v:.3f}" for k, v in table.items())
                )
        if not args.no_tail:
            busy = Busy(0.0, log_normal)
            with FakeServer(latency_s=0.0, replies="story", record=False, rule=busy.rule) as server:
                compare(
                    "long-tail",
                    server,
                    busy,
                    tmp,
                    seeds=args.tail_seeds,
                    attempts=args.attempts,
                    concurrency=args.tail_concurrency,
                    rounds=args.rounds,
                )


if __name__ == "__main__":
    main()
