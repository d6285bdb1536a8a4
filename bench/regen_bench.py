"""Regeneration overhead: a run whose every sample needs a second attempt against a plain run
sending as many requests.

Takes: ``--seeds`` (400), ``--latency`` (0.02 s per answer), ``--concurrency`` (8),
``--repeat`` (3). Gives, per repeat, the wall and CPU time of two TinyStories runs against one
loopback server (in this process, scripted): the baseline, ``provider.samples=2`` with every
answer passing (2 x seeds requests in one pass), and the regeneration run,
``regenerate.max_attempts=2`` with ``provider.samples=1`` where every first answer fails its
checks and every repair passes (2 x seeds requests in two attempts: the failing answers read
back, validated, a repair turn rendered for each and a second journaled pass). The ratio of the
two is the regeneration machinery's overhead; the goal is under 5% at 20 ms server latency.
The two runs alternate in order from repeat to repeat; the last line gives the medians.
``--ray`` then does the same pairs with ``executor=ray executor.shards=2`` (a private Ray
instance of 2 CPUs, started once before the pairs): each shard runs its own chains.

    python bench/regen_bench.py
    python bench/regen_bench.py --seeds 40 --repeat 1
    python bench/regen_bench.py --seeds 200 --repeat 2 --ray
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hydra import compose, initialize_config_dir

from storyforge.config import register_configs
from storyforge.pipeline import run_in
from tests.support.fake_server import FakeServer
from tests.support.scripted_stories import instruction_of, is_repair, passing_story


def script(body: dict) -> str:  # type: ignore[type-arg]
    """Every first attempt of regeneration fails (one sentence); everything else passes."""
    if body.get("seed", 0) >= 1000 and not is_repair(body):
        return "The end."
    return passing_story(instruction_of(list(body["messages"])))


def one(url: str, out: Path, *overrides: str) -> tuple[float, float]:
    """Wall and CPU seconds of one run; checks it sent what it should (every sample passes)."""
    cfg = compose(
        "config",
        overrides=[
            "task=tinystories",
            "provider=openai",
            f"provider.base_url={url}",
            "provider.model=fake",
            "provider.progress=false",
            "cache.path=null",
            "export.plots=false",
            "dedup=none",  # the scripted stories of one seed are the same text
            *overrides,
        ],
    )
    wall, cpu = time.perf_counter(), time.process_time()
    manifest = run_in(cfg, out)
    elapsed = time.perf_counter() - wall, time.process_time() - cpu
    assert manifest["completions"]["pass_rate"] == 1.0, manifest["completions"]["pass_rate"]
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description="regeneration overhead against a plain run")
    parser.add_argument("--seeds", type=int, default=400)
    parser.add_argument("--latency", type=float, default=0.02)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--ray", action="store_true", help="also the same pairs with executor=ray, 2 shards")
    args = parser.parse_args()
    register_configs()
    common = [f"task.n_seeds={args.seeds}", f"provider.concurrency={args.concurrency}"]
    plain = [*common, "provider.samples=2", "provider.seed=1"]
    regen = [*common, "provider.samples=1", "provider.seed=1000", "regenerate.max_attempts=2"]
    with (
        tempfile.TemporaryDirectory() as tmp,
        FakeServer(script=script, latency_s=args.latency, record=False) as server,
        initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None),
    ):
        # Warm-up: imports, template compilation and the server's first connections.
        one(server.base_url, Path(tmp) / "warm", *regen)
        pairs(server.base_url, Path(tmp) / "local", plain, regen, args, "executor=local")
        if args.ray:
            import ray

            from storyforge.executors.ray_executor import ray_messages_to_log_file, start_local_ray

            with ray_messages_to_log_file():  # Ray's start-up notices stay off the bench's output
                start_local_ray(2)
            try:
                on_ray = ["executor=ray", "executor.shards=2"]
                one(server.base_url, Path(tmp) / "warm-ray", *regen, *on_ray)  # the workers' imports
                pairs(
                    server.base_url,
                    Path(tmp) / "ray",
                    [*plain, *on_ray],
                    [*regen, *on_ray],
                    args,
                    "executor=ray",
                )
            finally:
                ray.shutdown()


def pairs(
    url: str, tmp: Path, plain: list[str], regen: list[str], args: argparse.Namespace, label: str
) -> None:
    """``args.repeat`` pairs of a plain and a regeneration run; prints each ratio and the medians
    (CPU: this process's, so under Ray the driver's only)."""
    ratios: list[float] = []
    cpu_ratios: list[float] = []
    for k in range(args.repeat):
        runs = [("plain", plain), ("regen", regen)]
        if k % 2:
            runs.reverse()
        got: dict[str, tuple[float, float]] = {}
        for name, overrides in runs:
            got[name] = one(url, tmp / f"{name}-{k}", *overrides)
        (pw, pc), (rw, rc) = got["plain"], got["regen"]
        ratios.append(rw / pw)
        cpu_ratios.append(rc / pc)
        print(
            f"{label} repeat {k + 1}: {2 * args.seeds} requests each; plain (samples=2) {pw:.2f} s wall "
            f"{pc:.2f} s CPU; regeneration (2 attempts) {rw:.2f} s wall {rc:.2f} s CPU; "
            f"wall ratio {rw / pw:.3f}, CPU ratio {rc / pc:.3f}"
        )
    print(
        f"{label}: median wall ratio {statistics.median(ratios):.3f} "
        f"(overhead {100 * (statistics.median(ratios) - 1):+.1f}%, goal < +5% at {args.latency * 1000:.0f} ms); "
        f"median CPU ratio {statistics.median(cpu_ratios):.3f}"
    )


if __name__ == "__main__":
    main()
