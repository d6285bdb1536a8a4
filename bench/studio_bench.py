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

from storyforge.store import TemplateStore
from storyforge.studio import Studio

GOAL_MS = 50.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _p95(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def _start(port: int, db: Path) -> subprocess.Popen[str]:
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
    args = parser.parse_args()

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

    port = _free_port()
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
