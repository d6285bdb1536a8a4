"""The pieces of the studio tests: a real studio server on a free loopback port, and HTTP helpers.

The server is uvicorn running :func:`storyforge.studio.server.create_app` in a thread of the
test process, on 127.0.0.1, with a throwaway SQLite store. Requests go through real sockets
(``http.client``), so the Host and Origin rules are tested as a browser would meet them.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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


def start_studio(store_url: str, runs: Path | None = None) -> tuple[Running, Any, threading.Thread]:
    import uvicorn

    from storyforge.store import TemplateStore
    from storyforge.studio import Studio
    from storyforge.studio.server import server_config

    store = TemplateStore(store_url)
    viewer = None
    if runs is not None:
        from storyforge.studio.runs import Runs

        viewer = Runs(root=runs)
    studio = Studio(
        store=store,
        template_dir=ROOT / "conf" / "template",
        context_dir=ROOT / "conf" / "context",
        runs=viewer,
    )
    port = free_port()
    server = uvicorn.Server(server_config(studio, port))
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
