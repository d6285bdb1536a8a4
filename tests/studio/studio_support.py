"""The pieces of the studio tests: a real studio server on a free loopback port, and HTTP helpers.

The server is uvicorn running :func:`storyforge.studio.server.create_app` in a thread of the
test process, on 127.0.0.1, with a throwaway SQLite store. Requests go through real sockets
(``http.client``), so the Host and Origin rules are tested as a browser would meet them.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from storyforge.providers.llama_server import free_port

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Running:
    """A running studio: its port, and a request helper speaking real HTTP to it."""

    port: int
    store_url: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        headers: dict[str, str] | None = None,
        raw: bytes | None = None,
    ) -> Reply:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            sent = {"Host": f"127.0.0.1:{self.port}", **(headers or {})}
            data = raw if raw is not None else None if body is None else json.dumps(body).encode("utf-8")
            if data is not None:
                sent.setdefault("Content-Type", "application/json")
            conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            for key, value in sent.items():
                conn.putheader(key, value)
            if data is not None and "Content-Length" not in sent:
                conn.putheader("Content-Length", str(len(data)))
            conn.endheaders(data)
            response = conn.getresponse()
            return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())
        finally:
            conn.close()

    def get(self, path: str, **kw: Any) -> Reply:
        return self.request("GET", path, **kw)

    def post(self, path: str, body: Any = None, **kw: Any) -> Reply:
        return self.request("POST", path, body, **kw)


@contextmanager
def studio_command(
    tmp_path: Path, *extra: str, wait: bool = True, cwd: Path | None = None
) -> Iterator[tuple[Running, subprocess.Popen[str], str]]:
    """`storyforge studio` in a subprocess on a free port, in ``cwd`` (default ``tmp_path``, so
    no ``outputs`` of the checkout is opened); yields once it answers (``wait``), else as soon
    as it printed its URL."""
    port = free_port()
    url = f"sqlite:///{tmp_path / 'store.db'}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "storyforge.cli", "--store", url, "studio", "--port", str(port), *extra],
        cwd=cwd or tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        running = Running(port=port, store_url=url)
        for _ in range(600 if wait else 0):
            try:
                running.get("/api/info")
                break
            except ConnectionRefusedError:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                time.sleep(0.05)
        yield running, proc, first
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)


def start_studio(
    store_url: str, runs: Path | None = None, **options: Any
) -> tuple[Running, Any, threading.Thread]:
    """A studio server in a thread; ``options``: ``estimator`` (for the Studio), ``worker``,
    ``header_timeout_s`` (for :func:`~storyforge.studio.server.server_config`)."""
    import uvicorn

    from storyforge.store import TemplateStore
    from storyforge.studio import Studio
    from storyforge.studio.server import server_config

    store = TemplateStore(store_url)
    extra = {"estimator": options.pop("estimator")} if "estimator" in options else {}
    viewer = None
    if runs is not None:
        from storyforge.studio.runs import Runs

        viewer = Runs(root=runs)
    studio = Studio(
        store=store,
        template_dir=ROOT / "conf" / "template",
        context_dir=ROOT / "conf" / "context",
        runs=viewer,
        **extra,
    )
    port = free_port()
    server = uvicorn.Server(server_config(studio, port, **options))
    thread = threading.Thread(target=server.run, name=f"studio-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the studio server did not start on port {port}")
        time.sleep(0.02)
    server.store = store  # closed by stop_studio
    return Running(port=port, store_url=store_url), server, thread


def stop_studio(server: Any, thread: threading.Thread) -> None:
    server.should_exit = True
    thread.join(timeout=30)
    server.store.close()


@pytest.fixture(scope="module")
def studio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """A studio server on a free port with an empty SQLite store (one per test module)."""
    db = tmp_path_factory.mktemp("studio") / "store.db"
    running, server, thread = start_studio(f"sqlite:///{db}")
    try:
        yield running
    finally:
        stop_studio(server, thread)


@pytest.fixture(scope="session")
def artifacts() -> Path:
    """Where the browser tests write screenshots: $STORYFORGE_TEST_ARTIFACTS or tests/artifacts/studio."""
    folder = Path(os.environ.get("STORYFORGE_TEST_ARTIFACTS") or ROOT / "tests" / "artifacts") / "studio"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


REGENERATED_SEEDS = 4


def make_regenerated_run(run: Path, *overrides: str, seeds: int = REGENERATED_SEEDS) -> list[dict[str, Any]]:
    """A run made by the real regeneration path: the TinyStories job against a scripted
    loopback server (sample 0's first answer of every seed fails, its second passes), with
    ``regenerate.max_attempts=2``, over ``seeds`` generated seeds. Gives the request bodies the server received."""
    # In a thread of its own: the job runs its own event loop, and Chromium's may be running here.
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(_regenerated_run, run, overrides, seeds).result()


def _regenerated_run(run: Path, overrides: tuple[str, ...], seeds: int) -> list[dict[str, Any]]:
    from hydra import compose, initialize_config_dir

    from storyforge.config import register_configs
    from storyforge.pipeline import run_in
    from tests.support.fake_server import FakeServer
    from tests.support.scripted_stories import FIRST_SEED, script

    register_configs()
    conf = Path(__file__).resolve().parents[2] / "conf"
    with FakeServer(script=script) as server, initialize_config_dir(config_dir=str(conf), version_base=None):
        cfg = compose(
            "config",
            overrides=[
                "task=tinystories",
                f"task.n_seeds={seeds}",
                "provider=openai",
                f"provider.base_url={server.base_url}",
                "provider.model=fake",
                f"provider.seed={FIRST_SEED}",
                "provider.samples=2",
                "provider.concurrency=2",
                "provider.progress=false",
                f"cache.path={run.parent / (run.name + '-cache.sqlite')}",
                "export.plots=false",
                "dedup=none",
                "regenerate.max_attempts=2",
                *overrides,
            ],
        )
        run_in(cfg, run)
        return [r.json for r in server.received]
