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

    python bench/regen_bench.py
    python bench/regen_bench.py --seeds 40 --repeat 1
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
from storyforge.testing.fake_server import FakeServer
from storyforge.testing.scripted_stories import instruction_of, is_repair, passing_story


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
    args = parser.parse_args()
    register_configs()
    common = [f"task.n_seeds={args.seeds}", f"provider.concurrency={args.concurrency}"]
    plain = [*common, "provider.samples=2", "provider.seed=1"]
    regen = [*common, "provider.samples=1", "provider.seed=1000", "regenerate.max_attempts=2"]
    ratios: list[float] = []
    cpu_ratios: list[float] = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        FakeServer(script=script, latency_s=args.latency, record=False) as server,
        initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None),
    ):
        # Warm-up: imports, template compilation and the server's first connections.
        one(server.base_url, Path(tmp) / "warm", *regen)
        for k in range(args.repeat):
            runs = [("plain", plain), ("regen", regen)]
            if k % 2:
                runs.reverse()
            got: dict[str, tuple[float, float]] = {}
            for name, overrides in runs:
                got[name] = one(server.base_url, Path(tmp) / f"{name}-{k}", *overrides)
            (pw, pc), (rw, rc) = got["plain"], got["regen"]
            ratios.append(rw / pw)
            cpu_ratios.append(rc / pc)
            print(
                f"repeat {k + 1}: {2 * args.seeds} requests each; plain (samples=2) {pw:.2f} s wall "
                f"{pc:.2f} s CPU; regeneration (2 attempts) {rw:.2f} s wall {rc:.2f} s CPU; "
                f"wall ratio {rw / pw:.3f}, CPU ratio {rc / pc:.3f}"
            )
    print(
        f"median wall ratio {statistics.median(ratios):.3f} (overhead {100 * (statistics.median(ratios) - 1):+.1f}%, "
        f"goal < +5% at {args.latency * 1000:.0f} ms); median CPU ratio {statistics.median(cpu_ratios):.3f}"
    )


if __name__ == "__main__":
    main()
