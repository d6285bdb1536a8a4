"""Generation throughput: wall time of ``generate_for_job`` against the ideal for a fixed latency.

Takes: ``--requests`` (2000), ``--latency`` (0.05 s), ``--concurrency`` (64), ``--server``
(``process``: the loopback server runs in its own process, as a real model server would;
``thread``: inside this process, so client and server share one interpreter lock).
Gives: one line per run with wall time, the ideal (requests x latency / concurrency) and
their ratio; the goal is a ratio within 1.3. The whole pipeline is measured: reading
prompts.jsonl, hashing bodies, HTTP through one pooled client, and fsynced appends.

    python bench/provider_bench.py
    python bench/provider_bench.py --server thread --requests 500
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from storyforge.config.provider import OpenAIProviderConf  # noqa: E402
from storyforge.providers import generate_for_job  # noqa: E402
from storyforge.testing.fake_server import FakeServer  # noqa: E402


def write_prompts(path: Path, n: int) -> None:
    with path.open("w", encoding="utf-8") as fh:
        for i in range(n):
            messages = [
                {"role": "system", "content": "You write short stories for children."},
                {"role": "user", "content": f"Write a children's story about a cat named Tom, number {i}."},
            ]
            fh.write(json.dumps({"id": f"s{i:05d}", "split": "train", "messages": messages}) + "\n")


def run_once(base_url: str, requests: int, concurrency: int, workdir: Path) -> tuple[float, dict[str, object]]:
    prompts = workdir / "prompts.jsonl"
    write_prompts(prompts, requests)
    conf = OpenAIProviderConf(base_url=base_url, model="bench", concurrency=concurrency, progress=False)
    cfg = OmegaConf.create({"provider": OmegaConf.structured(conf)})
    started = time.perf_counter()
    path, stats = generate_for_job(cfg, workdir, prompts)
    wall = time.perf_counter() - started
    lines = path.read_text(encoding="utf-8").count("\n")
    if lines != requests or stats["errors"]:
        raise SystemExit(f"bench run wrote {lines} lines with {stats['errors']} errors; expected {requests}")
    return wall, stats


def main() -> None:
    parser = argparse.ArgumentParser(description="provider throughput against the ideal")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--server", choices=("process", "thread"), default="process")
    args = parser.parse_args()
    ideal = args.requests * args.latency / args.concurrency

    proc: subprocess.Popen[str] | None = None
    server: FakeServer | None = None
    if args.server == "process":
        proc = subprocess.Popen(
            [sys.executable, "-m", "storyforge.testing.fake_server", "--latency", str(args.latency)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
        )
        assert proc.stdout is not None
        base_url = f"http://127.0.0.1:{int(proc.stdout.readline())}/v1"
    else:
        server = FakeServer(latency_s=args.latency, record=False).start()
        base_url = server.base_url
    try:
        with tempfile.TemporaryDirectory() as tmp:
            wall, stats = run_once(base_url, args.requests, args.concurrency, Path(tmp))
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


if __name__ == "__main__":
    main()
