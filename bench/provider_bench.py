"""Generation throughput: wall time of ``generate_for_job`` against the ideal for a fixed latency.

Takes: ``--requests`` (2000), ``--latency`` (0.05 s), ``--concurrency`` (64), ``--server``
(``process``: the loopback server runs in its own process, as a real model server would;
``thread``: inside this process, so client and server share one interpreter lock).
Gives: the pipeline's wall time, the ideal (requests x latency / concurrency) and their
ratio (the goal is within 1.3x), then a baseline run in the same process: the same workers
sending bare requests through one stock ``httpx.AsyncClient`` pool of ``concurrency``
connections (``--baseline`` requests, 400 by default; 0 skips it). The whole pipeline is
measured: reading prompts.jsonl, hashing bodies, HTTP, parsing, and fsynced appends.

    python bench/provider_bench.py
    python bench/provider_bench.py --server thread --requests 500
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from storyforge.config.provider import OpenAIProviderConf
from storyforge.providers import generate_for_job
from storyforge.testing.fake_server import FakeServer


def write_prompts(path: Path, n: int) -> None:
    with path.open("w", encoding="utf-8") as fh:
        for i in range(n):
            messages = [
                {"role": "system", "content": "You write short stories for children."},
                {"role": "user", "content": f"Write a children's story about a cat named Tom, number {i}."},
            ]
            fh.write(json.dumps({"id": f"s{i:05d}", "split": "train", "messages": messages}) + "\n")


def run_once(
    base_url: str, requests: int, concurrency: int, workdir: Path
) -> tuple[float, float, dict[str, object]]:
    prompts = workdir / "prompts.jsonl"
    write_prompts(prompts, requests)
    conf = OpenAIProviderConf(base_url=base_url, model="bench", concurrency=concurrency, progress=False)
    cfg = OmegaConf.create({"provider": OmegaConf.structured(conf)})
    cpu, started = time.process_time(), time.perf_counter()
    path, stats = generate_for_job(cfg, workdir, prompts)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    lines = path.read_text(encoding="utf-8").count("\n")
    if lines != requests or stats["errors"]:
        raise SystemExit(f"bench run wrote {lines} lines with {stats['errors']} errors; expected {requests}")
    return wall, cpu, stats


async def stock_pool(base_url: str, requests: int, concurrency: int) -> float:
    """Bare POSTs through one stock httpx pool shared by ``concurrency`` workers; wall seconds."""
    url = base_url + "/chat/completions"
    body = json.dumps({"model": "bench", "messages": [{"role": "user", "content": "hi"}]}).encode()
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    left = iter(range(requests))
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(60.0, pool=None)) as client:

        async def worker() -> None:
            for _ in left:
                (await client.post(url, content=body)).raise_for_status()

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description="provider throughput against the ideal")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--server", choices=("process", "thread"), default="process")
    parser.add_argument("--baseline", type=int, default=400, help="requests for the stock-pool baseline")
    args = parser.parse_args()
    ideal = args.requests * args.latency / args.concurrency

    proc: subprocess.Popen[str] | None = None
    server: FakeServer | None = None
    if args.server == "process":
        proc = subprocess.Popen(
            [sys.executable, "-m", "storyforge.testing.fake_server", "--latency", str(args.latency)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        assert proc.stdout is not None
        base_url = f"http://127.0.0.1:{int(proc.stdout.readline())}/v1"
    else:
        server = FakeServer(latency_s=args.latency, record=False).start()
        base_url = server.base_url
    try:
        with tempfile.TemporaryDirectory() as tmp:
            wall, cpu, stats = run_once(base_url, args.requests, args.concurrency, Path(tmp))
        baseline = (
            asyncio.run(stock_pool(base_url, args.baseline, args.concurrency)) if args.baseline else None
        )
    finally:
        if proc is not None:
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(timeout=10)
        if server is not None:
            server.stop()
    ratio = wall / ideal
    verdict = "within" if ratio <= 1.3 else "OUTSIDE"
    print(
        f"provider_bench server={args.server} requests={args.requests} latency={args.latency * 1000:.0f}ms "
        f"concurrency={args.concurrency}: wall {wall:.3f}s, ideal {ideal:.3f}s, "
        f"ratio {ratio:.2f}x ({verdict} the 1.3x goal), {args.requests / wall:.0f} req/s, "
        f"retries {stats['retries']}"
    )
    print(
        f"client CPU {cpu:.2f}s ({cpu / args.requests * 1000:.2f} ms/request; the goal needs "
        f"< {1.3 * ideal / args.requests * 1000:.2f}), load average {os.getloadavg()[0]:.1f} "
        f"on {os.cpu_count()} cores"
    )
    if baseline is not None:
        base_rate = args.baseline / baseline
        base_ideal = args.baseline * args.latency / args.concurrency
        print(
            f"baseline stock httpx pool, bare requests={args.baseline}: wall {baseline:.3f}s, "
            f"ideal {base_ideal:.3f}s, ratio {baseline / base_ideal:.2f}x, {base_rate:.0f} req/s; "
            f"pipeline throughput {args.requests / wall / base_rate:.2f}x the baseline's"
        )


if __name__ == "__main__":
    main()
