"""executor=local vs executor=ray on one machine: wall time, merge share, and the n= prompt-token saving.

Takes: ``--seeds`` (20,000), ``--latency`` (0.02 s per answer), ``--in-flight`` (16: requests in
flight over both endpoints, the same for both executors), ``--shards`` (2, one per Ray worker),
``--n-seeds`` / ``--n-samples`` for the n= part (500 seeds x 4 samples). Two loopback model
servers run as separate processes and the run spreads over both (``provider.base_url`` as a
list). Gives: the wall time of each executor on the same config, Ray's over local's (with and
without starting the private Ray instance), the share of the Ray run spent merging shard files,
validating on the shards and summing up on the driver, a check that both wrote the same data
sets, and the prompt tokens a samples=N run processes with and without ``n=N`` per request.

    python bench/scale_bench.py
    python bench/scale_bench.py --seeds 2000 --n-seeds 0   # quick: a smaller run, no n= part

Absolute figures move with the machine's load (the 2 cores are shared); the ratios compare runs
made one after the other in the same process.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ray
from hydra import compose, initialize_config_dir

from storyforge.config import register_configs
from storyforge.executors.ray_executor import start_local_ray
from storyforge.pipeline import run_in


def start_server(latency: float) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.fake_server", "--latency", str(latency)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    port = int(proc.stdout.readline())
    return proc, f"http://127.0.0.1:{port}/v1"


def provider(urls: list[str], concurrency: int, samples: int = 1) -> list[str]:
    return [
        "provider=openai",
        f"provider.base_url=[{','.join(urls)}]",
        "provider.model=fake",
        "provider.seed=1",
        f"provider.samples={samples}",
        f"provider.concurrency={concurrency}",
        "provider.progress=false",
    ]


def timed(overrides: list[str], out: Path) -> tuple[float, dict[str, Any]]:
    started = time.perf_counter()
    manifest = run_in(compose("config", overrides=overrides), out)
    return time.perf_counter() - started, manifest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20_000)
    parser.add_argument("--latency", type=float, default=0.02)
    parser.add_argument("--in-flight", type=int, default=16)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--n-seeds", type=int, default=500)
    parser.add_argument("--n-samples", type=int, default=4)
    args = parser.parse_args()

    servers = [start_server(args.latency) for _ in range(2)]
    urls = [url for _, url in servers]
    register_configs()
    tmp = Path(tempfile.mkdtemp(prefix="scale_bench-"))
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        try:
            seeds = [f"task.n_seeds={args.seeds}"]
            per_endpoint = args.in_flight // 2
            local_s, _ = timed([*seeds, *provider(urls, per_endpoint)], tmp / "local")
            print(f"executor=local: {local_s:.2f}s for {args.seeds} requests ({args.in_flight} in flight)")

            started = time.perf_counter()
            start_local_ray(args.shards)
            ray_start_s = time.perf_counter() - started
            per_shard = max(1, per_endpoint // args.shards)
            ray_args = [*seeds, *provider(urls, per_shard), "executor=ray", f"executor.shards={args.shards}"]
            ray_s, manifest = timed(ray_args, tmp / "ray")
            laps = manifest["executor"]["timings"]
            print(
                f"executor=ray ({args.shards} workers): {ray_s:.2f}s, plus {ray_start_s:.2f}s to start Ray; "
                f"phases {json.dumps(laps)}"
            )
            print(
                f"ray/local: {ray_s / local_s:.2f}x (with Ray start-up {(ray_s + ray_start_s) / local_s:.2f}x)"
            )
            print(
                f"driver share of the Ray run (merging shard files, summing up, the report): "
                f"{laps['merge_s'] / ray_s:.1%}; validation on the shards: {laps['shard_validate_s'] / ray_s:.1%}"
            )
            same = all(
                (tmp / "local" / name).read_bytes() == (tmp / "ray" / name).read_bytes()
                for name in (
                    "prompts_seed.jsonl",
                    "prompts.jsonl",
                    "validated.jsonl",
                    "sft.jsonl",
                    "rejects.jsonl",
                    "validated.parquet",
                )
            )
            print(f"same data sets from both executors: {same}")
            ray.shutdown()

            if not args.n_seeds:
                return
            n_seeds = [f"task.n_seeds={args.n_seeds}"]
            tokens = {}
            for mode in ("false", "true"):
                _, manifest = timed(
                    [
                        *n_seeds,
                        *provider(urls, per_endpoint, args.n_samples),
                        f"provider.n_per_request={mode}",
                    ],
                    tmp / f"n-{mode}",
                )
                tokens[mode] = manifest["generation"]["tokens"]["prompt"]
            saving = 1 - tokens["true"] / tokens["false"]
            print(
                f"prompt tokens for {args.n_seeds} seeds x {args.n_samples} samples: {tokens['false']} with one "
                f"request per sample, {tokens['true']} with n={args.n_samples} per request ({saving:.1%} saved)"
            )
        finally:
            for proc, _ in servers:
                proc.terminate()
                proc.wait()


if __name__ == "__main__":
    main()
