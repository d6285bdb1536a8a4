"""A journal line a rerun cannot use is reported by file and line, never as a traceback: one
nested 100,000 deep stops the run (exit 3), and one repeating an earlier record with another
answer is said (terminal and run.log) and moved aside."""

from __future__ import annotations

import json
from pathlib import Path

from test_provider_hostile import openai, run_py

from tests.support.fake_server import FakeServer


def _first_run(server: FakeServer, run_dir: Path) -> list[bytes]:
    result = run_py(run_dir, *openai(server), "task.n_seeds=4")
    assert result.returncode == 0, result.stderr[-2000:]
    return (run_dir / "generations.jsonl").read_bytes().splitlines(keepends=True)


def test_a_line_nested_100000_deep_is_a_problem_with_its_line_number(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with FakeServer() as server:
        lines = _first_run(server, run_dir)
        deep = b'{"id": "x", "sample": 0, "output": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n"
        (run_dir / "generations.jsonl").write_bytes(b"".join([lines[0], deep, *lines[1:]]))
        again = run_py(run_dir, *openai(server), "task.n_seeds=4")
    assert again.returncode == 3, again.stderr[-2000:]
    [line] = again.stderr.strip().splitlines()
    assert line.startswith(f"error: {run_dir / 'generations.jsonl'}:2: not JSON: arrays or objects nested")


def test_a_line_repeated_with_another_answer_is_reported(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with FakeServer() as server:
        lines = _first_run(server, run_dir)
        copy = json.loads(lines[0])
        copy["output"] = "Another answer altogether."
        repeated = json.dumps(copy).encode() + b"\n"
        (run_dir / "generations.jsonl").write_bytes(b"".join([*lines, repeated]))
        sent = server.request_count
        again = run_py(run_dir, *openai(server), "task.n_seeds=4")
        assert server.request_count == sent
    assert again.returncode == 0, again.stderr[-2000:]
    said = f"line {len(lines) + 1} repeats line 1 (id {copy['id']!r} sample {copy['sample']})"
    log = (run_dir / "run.log").read_text("utf-8")
    assert said in again.stdout + again.stderr and said in log
    kept = [json.loads(line) for line in (run_dir / "generations.jsonl").read_bytes().splitlines()]
    assert [r["output"] for r in kept if (r["id"], r["sample"]) == (copy["id"], copy["sample"])] == [
        json.loads(lines[0])["output"]
    ]
    replaced = (run_dir / "generations.replaced.jsonl").read_text("utf-8")
    assert "Another answer altogether." in replaced
