"""Round-trip time of the template studio: one HTTP POST compile + render + JSON per shipped template.

Takes: nothing (run ``python bench/studio_bench.py [--rounds N] [--budget N]`` from the repository
root; needs the ``studio`` extra). Starts ``storyforge studio`` in a subprocess on a free loopback
port with a throwaway SQLite store, then for each template in ``conf/template/`` posts what the
page posts on every edit (``/api/render``: the template text, the task kind's first sample
context as JSON text, a budget) over one keep-alive connection, and reads the JSON answer.

Gives: per template, the round trip's median and p95 in milliseconds, and two baselines run in
this process without HTTP, with the ratios: the same work (load + validate + compile + render +
trace to JSON), and a bare render of the already compiled template. The goal is a round trip of at most 50 ms for every shipped template.

Why: the page re-renders on each edit (debounced), so the round trip is what an author feels.
The ratio says what HTTP, JSON and the server add over the engine's own work.

``--run-answers N`` (default 1,000,000; 0 skips it) adds the run table: a run of about N answers
is written through the real completion stage (once; ``--runs-dir DIR`` keeps it for the next
time), the studio is started with ``--runs`` on it, and the bench times the first open (the
index build), then GETs of the first page, of a filter change (label, theme, passed, split in
turn), of a sort change and of one answer. Baseline: reading the run's light columns whole
from its Parquet twin and filtering them with pyarrow in this process, what a viewer without
an index would do per request. Goal: first page and filter change within 300 ms p95.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from storyforge.providers.llama_server import free_port
from storyforge.store import TemplateStore
from storyforge.studio import Studio

GOAL_MS = 50.0
RUN_GOAL_MS = 300.0


def _p95(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def _start(port: int, db: Path, runs: Path | None = None) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [
        sys.executable,
        "-m",
        "storyforge.cli",
        "--store",
        f"sqlite:///{db}",
        "studio",
        "--port",
        str(port),
        *(["--runs", str(runs)] if runs is not None else []),
    ]
    proc = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"storyforge studio exited: {proc.stderr.read() if proc.stderr else ''}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return proc
        except OSError:
            time.sleep(0.05)
    proc.terminate()
    raise SystemExit(f"storyforge studio did not start on port {port}")


def _post(conn: http.client.HTTPConnection, port: int, body: bytes) -> dict[str, Any]:
    conn.request(
        "POST",
        "/api/render",
        body,
        {
            "Host": f"127.0.0.1:{port}",
            "Content-Type": "application/json",
            "Origin": f"http://127.0.0.1:{port}",
        },
    )
    response = conn.getresponse()
    data = json.loads(response.read())
    if response.status != 200:
        raise SystemExit(f"/api/render answered {response.status}: {data}")
    return data  # type: ignore[no-any-return]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=60, help="timed round trips per template (default 60)")
    parser.add_argument("--budget", type=int, default=2000, help="global token budget sent (default 2000)")
    parser.add_argument(
        "--run-answers",
        type=int,
        default=1_000_000,
        help="answers in the run table's run (0: skip; default 1e6)",
    )
    parser.add_argument("--runs-dir", type=Path, default=None, help="keep (and reuse) the benchmark run here")
    parser.add_argument("--skip-render", action="store_true", help="time only the run table")
    args = parser.parse_args()
    if not args.skip_render:
        _render_bench(args)
    if args.run_answers > 0:
        if args.runs_dir is not None:
            return _run_table_bench(args, args.runs_dir)
        with tempfile.TemporaryDirectory() as tmp:
            return _run_table_bench(args, Path(tmp))
    return 0


def _get(conn: http.client.HTTPConnection, port: int, path: str) -> tuple[float, dict[str, Any]]:
    started = time.perf_counter()
    conn.request("GET", path, headers={"Host": f"127.0.0.1:{port}"})
    response = conn.getresponse()
    data = json.loads(response.read())
    elapsed = (time.perf_counter() - started) * 1000
    if response.status != 200:
        raise SystemExit(f"GET {path} answered {response.status}: {data}")
    return elapsed, data


def _run_table_bench(args: argparse.Namespace, folder: Path) -> int:
    """The run table of a run of ``args.run_answers`` answers: first open, pages, filters, sorts."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from tests.support.runs import make_run

    # about 2.03 answers per seed (see tests.support.runs)
    n_seeds = max(1, round(args.run_answers / (1 + 1 / 2 + 1 / 3 + 1 / 5)))
    run = folder / f"run-{args.run_answers}"
    if not (run / "manifest.json").is_file():
        started = time.perf_counter()
        print(f"writing a run of {n_seeds} seeds through the completion stage ...", flush=True)
        make_run(run, n_seeds)
        print(f"  written in {time.perf_counter() - started:.0f} s", flush=True)
    name = run.name
    port = free_port()
    rounds = args.rounds
    with tempfile.TemporaryDirectory() as tmp:
        proc = _start(port, Path(tmp) / "bench.db", runs=folder)
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
            conn.connect()
            # as browsers do: no Nagle delay on the client's small writes
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            # Opening the run as the page does: its figures, then its first page; the index is
            # built meanwhile (the page polls /api/run until "indexing" is false).
            started = time.perf_counter()
            _, info = _get(conn, port, f"/api/run?name={name}")
            first_page, _ = _get(conn, port, f"/api/run/answers?name={name}")
            first_open = (time.perf_counter() - started) * 1000
            indexing = info["indexing"]
            while info["indexing"]:
                time.sleep(0.05)
                _, info = _get(conn, port, f"/api/run?name={name}")
            indexed = (time.perf_counter() - started) * 1000
            answers = info["answers"]
            themes = info["facets"]["themes"]
            filters = [
                "label=missing_required",
                f"theme={themes[0]}",
                "passed=false",
                "split=val",
                "label=wrong_sentence_count&passed=false",
                f"theme={themes[-1]}&label=contains_banned",
            ]
            cases: dict[str, list[str]] = {
                "first page": [f"/api/run/answers?name={name}"],
                "filter change": [f"/api/run/answers?name={name}&{f}" for f in filters],
                "deep page": [f"/api/run/answers?name={name}&label=missing_required&offset=200000"],
                "sort change": [
                    f"/api/run/answers?name={name}&sort={key}&desc={d}"
                    for key in ("chars", "id", "theme")
                    for d in ("true", "false")
                ],
                "one answer": [
                    f"/api/run/answer?name={name}&row={row}" for row in (0, answers // 2, answers - 1)
                ],
            }
            for paths in cases.values():  # warm up: first sorts are computed once, then kept
                for path in paths:
                    _get(conn, port, path)
            timings: dict[str, list[float]] = {}
            for case, paths in cases.items():
                timings[case] = [_get(conn, port, paths[i % len(paths)])[0] for i in range(rounds)]
            conn.close()
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    # Baseline: no index, each request reads the light columns whole and filters them.
    twin = run / "validated.parquet"
    columns = ["id", "sample", "passed", "labels", "chars", "sentence_count", "finish_reason"]
    whole = []
    for _ in range(max(3, rounds // 10)):
        started = time.perf_counter()
        table = pq.read_table(twin, columns=columns)
        labels = table.column("labels")
        hits = pc.filter(
            pc.list_parent_indices(labels), pc.equal(pc.list_flatten(labels), "missing_required")
        )
        table.take(hits).slice(0, 50).to_pylist()
        whole.append((time.perf_counter() - started) * 1000)
    baseline = statistics.median(whole)
    print()
    print(f"run table: a run of {answers} answers, {rounds} requests per case over HTTP (GET, keep-alive)")
    print(
        f"first open (figures + first page, as the page asks): {first_open:.0f} ms"
        f" (the first page {first_page:.0f} ms{', read from the twin while the index was built' if indexing else ''});"
        f" index built (columns, seeds, line offsets) {indexed:.0f} ms after the open began"
    )
    print(
        f"baseline: read the light columns whole from the Parquet twin + filter + 50 rows, in process: {baseline:.0f} ms median"
    )
    head = f"{'case':<16} {'median ms':>9} {'p95 ms':>7} {'vs baseline':>11}  goal"
    print(head)
    print("-" * len(head))
    worst = 0.0
    for case, samples in timings.items():
        p95 = _p95(samples)
        goal = case in ("first page", "filter change")
        if goal:
            worst = max(worst, p95)
        verdict = ("ok" if p95 <= RUN_GOAL_MS else "OVER") if goal else "-"
        median = statistics.median(samples)
        print(f"{case:<16} {median:>9.1f} {p95:>7.1f} {baseline / median:>10.1f}x  {verdict}")
    print(
        f"worst p95 of first page and filter change: {worst:.1f} ms ({'within' if worst <= RUN_GOAL_MS else 'over'} the {RUN_GOAL_MS:.0f} ms goal)"
    )
    return 0


def _render_bench(args: argparse.Namespace) -> None:

    studio = Studio(
        store=TemplateStore("sqlite:///:memory:"),
        template_dir=ROOT / "conf" / "template",
        context_dir=ROOT / "conf" / "context",
    )
    cases = []
    for example in studio.examples():
        text = studio.example(example["name"])["text"]
        contexts = studio.contexts(example["task"]) if example["task"] else []
        name = contexts[0]["name"] if contexts else None
        ctx = studio.context(name)["context"] if name else {}
        cases.append((example["name"], name or "{}", text, json.dumps(ctx, indent=2)))

    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        proc = _start(port, Path(tmp) / "bench.db")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            rows = []
            for name, ctx_name, text, ctx_text in cases:
                body = json.dumps({"template": text, "context": ctx_text, "budget": args.budget}).encode()
                for _ in range(5):  # warm up: imports, caches, the connection
                    answer = _post(conn, port, body)
                if not answer["ok"]:
                    raise SystemExit(f"{name}: the template does not render: {answer['issues']}")
                trips = []
                for _ in range(args.rounds):
                    started = time.perf_counter()
                    _post(conn, port, body)
                    trips.append((time.perf_counter() - started) * 1000)
                local = []
                for _ in range(args.rounds):
                    started = time.perf_counter()
                    json.dumps(studio.render(text, ctx_text, args.budget))
                    local.append((time.perf_counter() - started) * 1000)
                checked = studio.check(text).checked
                assert checked is not None
                ctx = json.loads(ctx_text)
                bare = []
                for _ in range(args.rounds):
                    started = time.perf_counter()
                    studio.render_checked(checked, ctx, args.budget)
                    bare.append((time.perf_counter() - started) * 1000)
                rows.append(
                    (
                        name,
                        ctx_name,
                        statistics.median(trips),
                        _p95(trips),
                        statistics.median(local),
                        statistics.median(bare),
                    )
                )
            conn.close()
        finally:
            proc.terminate()
            proc.wait(timeout=30)

    print(
        f"studio round trip: POST /api/render (compile + render + JSON), budget {args.budget}, {args.rounds} rounds"
    )
    print("baselines in this process, no HTTP: in-proc = the same check + render + json.dumps;")
    print(f"render = render of the already compiled template with its trace; goal p95 <= {GOAL_MS:.0f} ms")
    head = (
        f"{'template':<28} {'context':<22} {'median ms':>9} {'p95 ms':>7} {'in-proc':>8} {'ratio':>6}"
        f" {'render':>7} {'ratio':>7}  goal"
    )
    print(head)
    print("-" * len(head))
    worst = 0.0
    for name, ctx_name, median, p95, local, bare in rows:
        worst = max(worst, p95)
        verdict = "ok" if p95 <= GOAL_MS else "OVER"
        print(
            f"{name:<28} {ctx_name:<22} {median:>9.2f} {p95:>7.2f} {local:>8.2f} {median / local:>5.2f}x"
            f" {bare:>7.2f} {median / bare:>6.1f}x  {verdict}"
        )
    print(f"worst p95: {worst:.2f} ms ({'within' if worst <= GOAL_MS else 'over'} the {GOAL_MS:.0f} ms goal)")


if __name__ == "__main__":
    sys.exit(main())
