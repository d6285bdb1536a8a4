"""A real model in the loop: SmolLM2-135M-Instruct through ``provider=llama_cpp``.

Takes: ``--seeds`` (50), ``--attempts`` (3), ``--concurrency`` (2: the server's slots),
``--threads`` (1), ``--max-tokens`` (256), ``--speed-seeds`` (8), ``--repeat`` (2). Gives two parts:

1. Quality: a TinyStories run of ``--seeds`` easy seeds (two everyday objects as the required
   phrases; the real-model tests' seeds) with up to ``--attempts`` attempts and the
   ``content_safety`` judge, started the way a user starts it (``python run.py ...
   provider=llama_cpp provider.gguf=...``): pass rate by attempt with 95% intervals, what each
   failing label turned into on the next attempt, the judge's verdicts, and the wall time per
   passing sample.
2. Speed: one llama-server (same settings) answering ``--speed-seeds`` prompts twice: through
   storyforge (``provider=openai``, one attempt, no cache), then alone (a plain client:
   ``--concurrency`` threads posting the same request bodies with urllib), ``--repeat`` times,
   each on a freshly started server (no prompt cache carried over): completion tokens per
   second of each, and the ratio of their means (goal: <= 1.1x).

The model and the llama-server build come from the test set-up's cache
(``python -m tests.support.setup --no-tests``).

    python bench/real_model_bench.py
    python bench/real_model_bench.py --seeds 12 --speed-seeds 6
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from storyforge.providers.llama_setup import ensure_model
from tests.support.llama_server import LlamaServer

EASY = (
    "constraints.required_count.max=2",
    "pools.objects=[ball,tree,dog,cat,cake,hat,box,bird]",
    "pools.banned=[dragon,castle]",
)


def run_storyforge(run_dir: Path, *overrides: str) -> float:
    """Wall seconds of ``python run.py task=tinystories ...`` (fails loudly on a non-zero exit)."""
    command = [
        sys.executable,
        "run.py",
        "task=tinystories",
        "provider.progress=false",
        "export.plots=false",
        *EASY,
        *overrides,
        f"hydra.run.dir={run_dir}",
    ]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    started = time.perf_counter()
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return wall


def quality(args: argparse.Namespace, gguf: Path, tmp: Path) -> dict[str, Any]:
    run = tmp / "quality"
    wall = run_storyforge(
        run,
        f"task.n_seeds={args.seeds}",
        "provider=llama_cpp",
        f"provider.gguf={gguf}",
        f"provider.concurrency={args.concurrency}",
        f"provider.threads={args.threads}",
        f"provider.max_tokens={args.max_tokens}",
        "provider.seed=7",
        "provider.timeout_s=600",
        "cache.path=null",
        f"regenerate.max_attempts={args.attempts}",
        "judge=content_safety",
        "judge.max_tokens=96",
        "+judge.schema.properties.rule.maxLength=24",
        "+judge.schema.properties.reason.maxLength=60",
    )
    manifest = json.loads((run / "manifest.json").read_text("utf-8"))
    regeneration = manifest["completions"]["regeneration"]
    passed = regeneration["by_attempt"][-1]["passed_by"]
    return {
        "seeds": args.seeds,
        "wall_s": round(wall, 1),
        "by_attempt": regeneration["by_attempt"],
        "transitions": regeneration["transitions"],
        "judge": manifest["regeneration"]["judge"]["verdicts"],
        "passing_samples": passed,
        "wall_s_per_passing_sample": round(wall / passed, 1) if passed else None,
    }


def bodies(prompts: Path, n: int, max_tokens: int) -> list[bytes]:
    """The request bodies storyforge sends for the first ``n`` prompts (alias ``smollm2``)."""
    out = []
    for line in prompts.read_text("utf-8").splitlines()[:n]:
        record = json.loads(line)
        body = {
            "model": "smollm2",
            "messages": record["messages"],
            "stream": False,
            "temperature": 1.0,
            "top_p": 1.0,
            "max_tokens": max_tokens,
            "seed": 7,
        }
        out.append(json.dumps(body).encode())
    return out


def alone(url: str, work: list[bytes], concurrency: int) -> tuple[int, float]:
    """Completion tokens and wall seconds of a plain client posting ``work``."""
    todo = list(work)
    lock = threading.Lock()
    tokens = [0]

    def worker() -> None:
        while True:
            with lock:
                if not todo:
                    return
                body = todo.pop(0)
            request = urllib.request.Request(
                f"{url}/chat/completions", data=body, headers={"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(request, timeout=600) as answer:
                usage = json.load(answer)["usage"]
            with lock:
                tokens[0] += int(usage["completion_tokens"])

    started = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return tokens[0], time.perf_counter() - started


def speed(args: argparse.Namespace, gguf: Path, tmp: Path) -> dict[str, Any]:
    """``--speed-seeds`` prompts through storyforge, then the same request bodies alone, ``--repeat``
    times; each measurement on a freshly started server, so none reuses another's prompt cache."""
    context = 2 * args.concurrency * (args.max_tokens + 512)

    def fresh() -> LlamaServer:
        return LlamaServer(
            gguf, alias="smollm2", context=context, parallel=args.concurrency, threads=args.threads
        )

    rates: dict[str, list[float]] = {"alone": [], "storyforge": []}
    tokens: dict[str, int] = {}
    for k in range(args.repeat):
        run = tmp / f"speed{k}"
        with fresh() as server:
            run_storyforge(
                run,
                f"task.n_seeds={args.speed_seeds}",
                "provider=openai",
                f"provider.base_url={server.base_url}",
                "provider.model=smollm2",
                f"provider.concurrency={args.concurrency}",
                f"provider.max_tokens={args.max_tokens}",
                "provider.seed=7",
                "provider.timeout_s=600",
                "cache.path=null",
            )
        generation = json.loads((run / "manifest.json").read_text("utf-8"))["generation"]
        tokens["storyforge"] = int(generation["tokens"]["completion"])
        rates["storyforge"].append(tokens["storyforge"] / float(generation["wall_time_s"]))
        work = bodies(run / "prompts.jsonl", args.speed_seeds, args.max_tokens)
        with fresh() as server:
            tokens["alone"], wall = alone(server.base_url, work, args.concurrency)
        rates["alone"].append(tokens["alone"] / wall)
    mean = {name: sum(values) / len(values) for name, values in rates.items()}
    return {
        "requests": args.speed_seeds,
        "repeats": args.repeat,
        "completion_tokens": tokens,
        "tokens_per_s": {name: [round(v, 2) for v in values] for name, values in rates.items()},
        "ratio_of_means": round(mean["alone"] / mean["storyforge"], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=50)
    parser.add_argument("--attempts", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--speed-seeds", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=2, help="speed measurements of each kind")
    args = parser.parse_args()
    gguf = ensure_model()
    with tempfile.TemporaryDirectory(prefix="storyforge-real-model-bench-") as tmp:
        quality_figures = quality(args, gguf, Path(tmp))
        speed_figures = speed(args, gguf, Path(tmp))
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}",
        "quality": quality_figures,
        "speed": speed_figures,
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
