"""Drift gate throughput: 10,000 exported examples against a local llama-server.

Takes: ``--examples`` (10,000), ``--baseline`` (examples for the baseline, 1,000; 0 skips
it). Gives: the gate's wall time for the examples, everything included (reading the files,
loading the tokenizer, training side, llama-server side, comparison; the goal is under 30 s
on this 2-core machine) and the training side's share; then, in the same process with
everything loaded, the ``--baseline`` examples checked with the batched server side and with
one request at a time (``/apply-template`` per example, one text per ``/tokenize``, one
connection), and the ratio of their times per example.

The examples are the research-QA export of the shipped fixture (``run.py task=research_qa``,
both closed-book and with-context conditions), repeated with a number appended to each
question so that no two are alike; the server serves the tests' tiny GGUF.

    python bench/drift_bench.py
    python bench/drift_bench.py --examples 2000 --baseline 200
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from storyforge.config.drift import DriftConf
from storyforge.drift.command import check_exports
from storyforge.drift.examples import read_examples
from storyforge.drift.report import run_drift
from storyforge.drift.serving import LlamaServerSide
from storyforge.drift.training import TrainingSide
from tests.support.llama_server import LlamaServer
from tests.support.tiny_gguf import write_tiny_llama
from tests.support.tiny_tokenizer import write_tiny_tokenizer


def export(root: Path) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for name, extra in (("closed", []), ("rag", ["model=rag_trained", "task.prompt_mode=with_context"])):
        subprocess.run(
            [sys.executable, "run.py", "task=research_qa", "task.progress=false", *extra, f"hydra.run.dir={root / name}"],
            cwd=REPO, env=env, check=True, capture_output=True,
        )  # fmt: skip
        for file in ("train.jsonl", "eval.jsonl"):
            rows += [json.loads(line) for line in (root / name / file).read_text().splitlines()]
    return rows


def scaled(rows: list[dict[str, object]], count: int, path: Path) -> Path:
    with path.open("w") as out:
        for i in range(count):
            row = json.loads(json.dumps(rows[i % len(rows)]))
            row["task_id"] = f"{row['task_id']}-{i}"
            messages = row["messages"]
            assert isinstance(messages, list)
            user = next(m for m in messages if m["role"] == "user")
            user["content"] += f" ({i})"
            out.write(json.dumps(row) + "\n")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=10_000)
    parser.add_argument("--baseline", type=int, default=1_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="storyforge-drift-bench-") as tmp:
        root = Path(tmp)
        model = root / "model"
        model.mkdir()
        write_tiny_tokenizer(write_tiny_llama(model / "tiny.gguf"), model)
        rows = export(root / "exports")
        data_file = scaled(rows, args.examples, root / "eval.jsonl")
        with LlamaServer(model / "tiny.gguf", context=4096, parallel=1) as server:
            start = time.perf_counter()
            report = check_exports(
                DriftConf(exports=[str(data_file)], tokenizer=str(model), server=server.base_url)
            )
            gate = time.perf_counter() - start
            assert report.ok, report.format()
            print(
                "gate (storyforge drift, everything from reading the files and loading the tokenizer): "
                f"{args.examples} examples in {gate:.2f} s, drifted {report.drifted}"
            )
            data = read_examples([data_file])
            training = TrainingSide(model)
            start = time.perf_counter()
            training.render(data.examples)
            alone = time.perf_counter() - start
            print(f"  training side alone (transformers): {alone:.2f} s ({alone / gate:.0%} of the gate)")
            if args.baseline:
                subset = read_examples([data_file], limit=args.baseline)
                sides = (
                    ("batched: per-shape templates, 256 texts per /tokenize, 2 connections", {}),
                    (
                        "one request at a time: /apply-template per example, one text per /tokenize",
                        {"concurrency": 1, "tokenize_batch": 1, "render_each": True},
                    ),
                )
                per: list[float] = []
                for label, options in sides:
                    side = LlamaServerSide(server.base_url, **options)  # type: ignore[arg-type]
                    start = time.perf_counter()
                    result = run_drift(subset, training, [side])
                    elapsed = time.perf_counter() - start
                    assert result.ok, result.format()
                    per.append(elapsed / args.baseline)
                    print(
                        f"  {label}: {args.baseline} examples in {elapsed:.2f} s ({per[-1] * 1000:.3f} ms/example)"
                    )
                print(f"  one-at-a-time / batched, per example: {per[1] / per[0]:.2f}x")
        print(
            f"goal: {args.examples} examples under 30 s: {'met' if gate < 30 else 'NOT met'} ({gate:.2f} s)"
        )


if __name__ == "__main__":
    main()
