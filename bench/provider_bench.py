"""Generation throughput: wall time of ``generate_for_job`` against the ideal for a fixed latency.

Takes: ``--requests`` (2000), ``--latency`` (0.05 s), ``--concurrency`` (64), ``--repeat`` (3),
``--server`` (``process``: the loopback server runs in its own process, as a real model
server would; ``thread``: inside this process, so client and server share one interpreter
lock), ``--baseline`` (requests for the baseline; the same as ``--requests`` by default,
0 skips it). Gives, per repeat: the pipeline's wall time, the ideal (requests x latency /
concurrency) and their ratio (the goal is within 1.3x), the client's CPU per request (the
goal's budget is 1.3 x ideal / requests of wall per request, shared with everything else on
the machine), the server's CPU per request and the load average; then the same for a
baseline run in the same process right after: the same number of workers sending bare
requests (prebuilt body, no timeout, no parsing, no journal) through the same
``aiohttp`` session, i.e. the floor for any pipeline on this client, machine and moment.
The last line gives the medians. The whole pipeline is measured: reading prompts.jsonl,
encoding and hashing bodies, HTTP, parsing, and fsynced appends.

    python bench/provider_bench.py
    python bench/provider_bench.py --server thread --requests 500 --repeat 1

Absolute figures move with the machine's load (other work on its 2 cores); compare the
pipeline with the baseline of the same repeat.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from storyforge.config.provider import GenerationSettings, OpenAIProviderConf
from storyforge.providers import generate_for_job
from storyforge.providers.transport import open_session
from tests.support.fake_server import FakeServer


@dataclass(frozen=True, slots=True, kw_only=True)
class Measure:
    """One timed run: wall seconds, client and server CPU seconds, load average after it."""

    wall: float
    cpu: float
    server_cpu: float | None
    load: float


def write_prompts(path: Path, n: int) -> None:
    with path.open("w", encoding="utf-8") as fh:
        for i in range(n):
            messages = [
                {"role": "system", "content": "You write short stories for children."},
                {"role": "user", "content": f"Write a children's story about a cat named Tom, number {i}."},
            ]
            fh.write(json.dumps({"id": f"s{i:05d}", "split": "train", "messages": messages}) + "\n")


def process_cpu(pid: int | None) -> float | None:
    """User + system CPU seconds of process ``pid`` so far (Linux), else None."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(run: Callable[[], object], server_pid: int | None) -> Measure:
    server_before = process_cpu(server_pid)
    cpu, started = time.process_time(), time.perf_counter()
    run()
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    server_after = process_cpu(server_pid)
    server = server_after - server_before if server_after is not None and server_before is not None else None
    return Measure(wall=wall, cpu=cpu, server_cpu=server, load=os.getloadavg()[0])


def run_pipeline(base_url: str, requests: int, concurrency: int, workdir: Path) -> None:
    prompts = workdir / "prompts.jsonl"
    conf = OpenAIProviderConf(base_url=base_url, model="bench", concurrency=concurrency, progress=False)
    path, stats = generate_for_job(GenerationSettings(provider=conf.seal()), workdir, prompts)
    lines = path.read_text(encoding="utf-8").count("\n")
    if lines != requests or stats["errors"] or stats["retries"]:
        raise SystemExit(
            f"bench run wrote {lines} lines with {stats['errors']} errors and {stats['retries']} "
            f"retries; expected {requests} clean lines"
        )


async def bare_requests(base_url: str, requests: int, concurrency: int) -> None:
    """Bare POSTs through one session of ``concurrency`` connections shared by as many workers."""
    url = base_url + "/chat/completions"
    body = json.dumps({"model": "bench", "messages": [{"role": "user", "content": "hi"}]}).encode()
    headers = {"Content-Type": "application/json"}
    left = iter(range(requests))
    async with open_session(concurrency, url, trust_env=False) as session:

        async def worker() -> None:
            for _ in left:
                async with session.post(url, data=body, headers=headers) as response:
                    await response.read()
                    if response.status != 200:
                        raise SystemExit(f"baseline request answered HTTP {response.status}")

        await asyncio.gather(*(worker() for _ in range(concurrency)))


def describe(name: str, m: Measure, requests: int, ideal: float) -> str:
    server = (
        f", server CPU {m.server_cpu / requests * 1000:.2f} ms/request" if m.server_cpu is not None else ""
    )
    return (
        f"{name}: wall {m.wall:.3f}s, ratio {m.wall / ideal:.2f}x, {requests / m.wall:.0f} req/s, "
        f"client CPU {m.cpu / requests * 1000:.2f} ms/request{server}, load average {m.load:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description="provider throughput against the ideal")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--server", choices=("process", "thread"), default="process")
    parser.add_argument("--baseline", type=int, default=None, help="requests for the bare-request baseline")
    args = parser.parse_args()
    baseline_n = args.requests if args.baseline is None else args.baseline
    ideal = args.requests * args.latency / args.concurrency
    base_ideal = baseline_n * args.latency / args.concurrency

    proc: subprocess.Popen[str] | None = None
    server: FakeServer | None = None
    if args.server == "process":
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.fake_server", "--latency", str(args.latency)],
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        assert proc.stdout is not None
        base_url = f"http://127.0.0.1:{int(proc.stdout.readline())}/v1"
    else:
        server = FakeServer(latency_s=args.latency, record=False).start()
        base_url = server.base_url
    server_pid = proc.pid if proc is not None else None
    print(
        f"provider_bench server={args.server} requests={args.requests} latency={args.latency * 1000:.0f}ms "
        f"concurrency={args.concurrency}: ideal {ideal:.3f}s, goal within 1.3x ({1.3 * ideal:.3f}s), "
        f"{os.cpu_count()} cores"
    )
    ratios: list[float] = []
    cpus: list[float] = []
    base_ratios: list[float] = []
    try:
        for repeat in range(1, args.repeat + 1):
            with tempfile.TemporaryDirectory() as tmp:
                workdir = Path(tmp)
                write_prompts(workdir / "prompts.jsonl", args.requests)
                m = timed(
                    functools.partial(run_pipeline, base_url, args.requests, args.concurrency, workdir),
                    server_pid,
                )
            ratios.append(m.wall / ideal)
            cpus.append(m.cpu / args.requests * 1000)
            verdict = "within" if m.wall / ideal <= 1.3 else "OUTSIDE"
            print(f"[{repeat}] " + describe("pipeline", m, args.requests, ideal) + f" ({verdict} the goal)")
            if baseline_n:
                b = timed(
                    lambda: asyncio.run(bare_requests(base_url, baseline_n, args.concurrency)), server_pid
                )
                base_ratios.append(b.wall / base_ideal)
                print(f"[{repeat}] " + describe("baseline bare requests", b, baseline_n, base_ideal))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=10)
        if server is not None:
            server.stop()
    summary = (
        f"median of {args.repeat}: pipeline ratio {statistics.median(ratios):.2f}x "
        f"(best {min(ratios):.2f}x), client CPU {statistics.median(cpus):.2f} ms/request"
    )
    if base_ratios:
        summary += (
            f"; baseline ratio {statistics.median(base_ratios):.2f}x; pipeline wall "
            f"{statistics.median(ratios) / statistics.median(base_ratios):.2f}x the baseline's"
        )
    print(summary)


if __name__ == "__main__":
    main()
