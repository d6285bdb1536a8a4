"""The studio's HTTP server: the page's static files and its JSON API, on 127.0.0.1 only.

Takes: a :class:`~storyforge.studio.api.Studio` and a port. Gives: :func:`create_app` (the
Starlette application), :func:`bind` (the listening socket, 127.0.0.1 only) and :func:`serve`
(runs the application with uvicorn on that socket until interrupted).

Why: an author edits a template in the browser and sees the engine's verdict at once. The
server is local, so its safety rules are about the browser, not about users:

- every request must name this server in its ``Host`` header (``127.0.0.1:PORT`` or
  ``localhost:PORT``), so a page on another site cannot reach it through DNS rebinding;
- a request that changes or computes anything (``POST``) is refused when it carries an
  ``Origin`` other than the page's own, so another site cannot post to it;
- a request with two ``Host`` or two ``Origin`` headers is refused (which one would count?);
- request bodies are capped (:data:`MAX_BODY`), and files are read only from the store and
  the folders fixed at start (see :mod:`storyforge.studio.api`);
- checks, renders and diffs run in child processes with a time limit and an answer size cap
  (:mod:`storyforge.studio.worker`): one heavy template never stalls the other requests, and
  the page gets the limit error;
- a connection must send its headers within :data:`HEADER_TIMEOUT_S` and at most
  :data:`MAX_CONNECTIONS` are served at once, so idle connections cannot pile up.

Refusals are ``403`` (``413`` for a body too large) with one line of JSON saying why.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import signal
import socket
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from types import FrameType
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from storyforge.errors import StoryforgeError
from storyforge.studio.api import MAX_BUDGET, Studio, StudioError
from storyforge.studio.worker import LimitExceeded, Worker

__all__ = [
    "HEADER_TIMEOUT_S",
    "HOST",
    "MAX_BODY",
    "MAX_CONNECTIONS",
    "STATIC_DIR",
    "bind",
    "create_app",
    "serve",
    "server_config",
]

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
#: Largest request body accepted (a template and a context); larger ones get 413.
MAX_BODY = 2 * 1024 * 1024
STATIC_DIR = Path(__file__).resolve().parent / "static"
#: Seconds a connection may take to send a request's headers (from connecting, or from the end of
#: its previous answer); a slower or idle one is closed.
HEADER_TIMEOUT_S = 10.0
#: Connections served at once; more are answered 503 at once.
MAX_CONNECTIONS = 128

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_SECURITY_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
]


class Guard:
    """ASGI middleware: the Host and Origin rules, the body cap, and the security headers."""

    def __init__(self, app: ASGIApp, *, max_body: int = MAX_BODY) -> None:
        self.app = app
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":  # no websockets here
            return
        refusal, body = _refusal(scope, self.max_body), b""
        if refusal is None:
            body, too_big = await _read_body(receive, self.max_body)
            if too_big:
                refusal = 413, f"refused: the request body is larger than {self.max_body} bytes"
        if refusal is not None:
            await _refuse(send, *refusal)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = list(message.get("headers", [])) + _SECURITY_HEADERS
            await send(message)

        await self.app(scope, replay, send_with_headers)


def _refusal(scope: Scope, max_body: int) -> tuple[int, str] | None:
    """Why the request is refused by its headers (the status and one line), or None."""
    names = [k.decode("latin-1").lower() for k, _ in scope["headers"]]
    repeated = sorted({name for name in ("host", "origin") if names.count(name) > 1})
    if repeated:  # which one would count? Refuse rather than guess.
        return 403, f"refused: the request has more than one {' and '.join(repeated)} header"
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
    server = scope.get("server")
    port = server[1] if server else None
    own = {f"127.0.0.1:{port}", f"localhost:{port}"}
    host = headers.get("host")
    if host not in own:
        return 403, f"refused: the Host header {host!r} is not this studio's (127.0.0.1:{port})"
    origin = headers.get("origin")
    if (
        scope["method"] not in ("GET", "HEAD")
        and origin is not None
        and origin not in {f"http://{h}" for h in own}
    ):
        return 403, f"refused: a {scope['method']} from origin {origin!r}, not this page's"
    length = headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > max_body):
        return 413, f"refused: the request body is larger than {max_body} bytes"
    return None


async def _read_body(receive: Receive, limit: int) -> tuple[bytes, bool]:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"", False
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return b"", True
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks), False


async def _refuse(send: Send, status: int, message: str) -> None:
    log.warning("%s", message)
    body = json.dumps({"error": message}).encode("utf-8")
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode("ascii")),
                *_SECURITY_HEADERS,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class _JSON(JSONResponse):
    """JSON with non-ASCII escaped: any string a context holds (even a lone surrogate) is sent."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


# -- request bodies ----------------------------------------------------------------------------


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise StudioError(f"the request body is not JSON: {exc}") from None
    except RecursionError:
        raise StudioError("the request body is not JSON this page reads: nested too deeply") from None
    if not isinstance(data, dict):
        raise StudioError(f"the request body must be a JSON object, got {type(data).__name__}")
    return data


def _text(data: dict[str, Any], key: str) -> str:
    value = data.get(key)
    if not isinstance(value, str):
        raise StudioError(f"{key}: expected a string, got {type(value).__name__}")
    return value


def _format(data: dict[str, Any]) -> str | None:
    value = data.get("format")
    if value is not None and value not in ("json", "yaml"):
        raise StudioError(f"format: expected 'json' or 'yaml', got {value!r}")
    return value


def _int(data: dict[str, Any], key: str, *, optional: bool = False) -> int | None:
    value = data.get(key)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise StudioError(f"{key}: expected a whole number, got {json.dumps(value)}")
    if not 0 <= value <= MAX_BUDGET:
        raise StudioError(f"{key}: expected a whole number from 0 to {MAX_BUDGET}, got {value}")
    return value


def _revision_number(text: str) -> int:
    """A revision number from the URL; past any stored one (or not a number) is a 404, never a 500."""
    if not text.isascii() or not text.isdigit():
        raise StudioError(f"no revision {text[:40]!r}: a revision is a whole number", status=404)
    if len(text) > 12:
        raise StudioError(f"no revision {text[:12]}...: past any stored revision", status=404)
    return int(text)


# -- the application ---------------------------------------------------------------------------


def static_page(name: str) -> Callable[[Request], Awaitable[Response]]:
    """The endpoint of one of the page's HTML files."""

    async def page(request: Request) -> Response:
        return FileResponse(STATIC_DIR / name, media_type="text/html")

    return page


def create_app(studio: Studio, *, worker: Worker | None = None) -> Guard:
    """The studio as an ASGI application (routes wrapped in :class:`Guard`).

    Checks, renders and diffs run in ``worker`` (child processes with a time limit and an
    answer size cap), so a heavy template never stalls the other requests.
    """
    pool = worker if worker is not None else Worker()
    pool.target = studio

    def handler(work: Callable[[Request], Any]) -> Callable[[Request], Awaitable[Response]]:
        """``work`` (a function of the request, or a coroutine function) as an endpoint that
        answers its JSON-able result, a response it made, or its error as JSON."""

        async def endpoint(request: Request) -> Response:
            try:
                answer = work(request)
                if inspect.isawaitable(answer):
                    answer = await answer
                if isinstance(answer, Response):
                    return answer
                if isinstance(answer, bytes):  # JSON made by the worker
                    return Response(answer, media_type="application/json")
                return _JSON(answer)
            except LimitExceeded as exc:
                return _JSON({"error": str(exc), "issues": [], "limit": True}, status_code=422)
            except StudioError as exc:
                return _JSON({"error": str(exc), "issues": exc.issues}, status_code=exc.status)
            except StoryforgeError as exc:
                return _JSON({"error": str(exc), "issues": []}, status_code=400)
            except Exception as exc:  # a bug: one line to the page, the traceback to the log
                log.exception("studio: %s %s failed", request.method, request.url.path)
                return _JSON({"error": f"internal error: {type(exc).__name__}: {exc}", "issues": []}, 500)

        return endpoint

    def info(request: Request) -> Any:
        from storyforge import __version__
        from storyforge.tasks.base import task_kind_names

        return {
            "version": __version__,
            "store": studio.store.display_url,
            "estimator": studio.estimator_name,
            "tasks": list(task_kind_names()),
            "max_body": MAX_BODY,
        }

    async def check(request: Request) -> Any:
        data = await _body(request)
        return await pool.run("check_json", _text(data, "template"), _format(data))

    async def render(request: Request) -> Any:
        data = await _body(request)
        return await pool.run(
            "render",
            _text(data, "template"),
            data.get("context"),
            _int(data, "budget", optional=True),
            _format(data),
        )

    async def save(request: Request) -> Any:
        data = await _body(request)
        return await asyncio.to_thread(studio.save, _text(data, "template"), _format(data))

    async def diff(request: Request) -> Any:
        data = await _body(request)
        a, b = _int(data, "a"), _int(data, "b")
        assert a is not None and b is not None
        template_id, context, budget = (
            _text(data, "id"),
            data.get("context"),
            _int(data, "budget", optional=True),
        )
        # The two revisions are read here (the store stays in this process); the renders run in the worker.
        revisions = (studio.stored_revision(template_id, a), studio.stored_revision(template_id, b))
        return await pool.run("diff_records", template_id, revisions, context, budget)

    def revision(request: Request) -> Any:
        return studio.revision(request.path_params["id"], _revision_number(request.path_params["rev"]))

    from storyforge.studio.run_routes import run_routes

    routes = [
        Route("/", static_page("index.html")),
        Route("/api/info", handler(info)),
        Route("/api/examples", handler(lambda request: studio.examples())),
        Route("/api/examples/{name}", handler(lambda request: studio.example(request.path_params["name"]))),
        Route("/api/contexts", handler(lambda request: studio.contexts(request.query_params.get("task")))),
        Route("/api/contexts/{name}", handler(lambda request: studio.context(request.path_params["name"]))),
        Route("/api/check", handler(check), methods=["POST"]),
        Route("/api/render", handler(render), methods=["POST"]),
        Route("/api/templates", handler(lambda request: studio.templates())),
        Route("/api/templates", handler(save), methods=["POST"]),
        Route(
            "/api/templates/{id}/revisions",
            handler(lambda request: studio.revisions(request.path_params["id"])),
        ),
        Route("/api/templates/{id}/revisions/{rev}", handler(revision)),
        Route("/api/diff", handler(diff), methods=["POST"]),
        Route("/runs", static_page("runs.html")),
        *run_routes(studio, handler),
        Mount("/static", app=StaticFiles(directory=STATIC_DIR), name="static"),
    ]
    return Guard(Starlette(routes=routes))


def server_config(
    studio: Studio,
    port: int,
    *,
    log_config: Any = None,
    worker: Worker | None = None,
    header_timeout_s: float = HEADER_TIMEOUT_S,
) -> Any:
    """The uvicorn configuration: 127.0.0.1 only, no websockets, no server header, a header-read
    timeout, at most :data:`MAX_CONNECTIONS` connections, heavy work in ``worker``."""
    import uvicorn

    from storyforge.studio.protocol import header_timeout_protocol

    return uvicorn.Config(
        create_app(studio, worker=worker),
        host=HOST,
        port=port,
        ws="none",
        http=header_timeout_protocol(header_timeout_s),
        lifespan="off",
        server_header=False,
        access_log=False,
        log_level="warning",
        log_config=log_config,
        limit_concurrency=MAX_CONNECTIONS,
        timeout_keep_alive=5,
    )


def bind(port: int) -> socket.socket:
    """A socket bound to ``127.0.0.1:port``; a port already in use is one clear error."""
    # IPPROTO_TCP named, not 0: asyncio turns Nagle off (TCP_NODELAY) only on connections of
    # sockets that say they are TCP; without it each keep-alive answer waited ~40 ms for an ACK.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((HOST, port))
    except OSError as exc:
        sock.close()
        raise StoryforgeError(f"cannot listen on {HOST}:{port}: {exc.strerror or exc}") from None
    return sock


def serve(studio: Studio, sock: socket.socket, *, ready: Callable[[], None] | None = None) -> None:
    """Serve the studio on the bound socket (see :func:`bind`) until Ctrl-C, then raise
    :class:`KeyboardInterrupt` (the command's exit status 130).

    ``ready`` is called (the command prints its URL there) once Ctrl-C is taken over: from then
    on SIGINT only marks the studio interrupted and asks the server to stop, whatever runs at
    that moment. (Python's own handler raises ``KeyboardInterrupt`` at whatever line runs; one
    raised inside code run by ``exec``, as the dataclasses of uvicorn's imports are built, makes
    CPython end the process as killed by SIGINT, not with 130, even once it is caught.) A
    second Ctrl-C stops at once (open connections dropped).
    """
    import uvicorn

    server = uvicorn.Server(server_config(studio, sock.getsockname()[1]))
    interrupted = False

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        nonlocal interrupted
        if interrupted:
            server.force_exit = True
        interrupted = True
        server.should_exit = True  # read by the server's startup and loop (it may not run yet)

    # uvicorn puts its own handler in place while it serves and, once stopped, sends the
    # signals it caught again: to this handler.
    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        if ready is not None:
            ready()
        if not interrupted:
            server.run(sockets=[sock])
    finally:
        signal.signal(signal.SIGINT, previous)
    if interrupted:
        raise KeyboardInterrupt
