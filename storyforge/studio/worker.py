"""The studio's heavy work off the event loop: each check, render or diff in a child process with a time limit.

Takes: the name of a method of the :class:`~storyforge.studio.api.Studio` and its arguments.
Gives: :class:`Worker`, whose :meth:`Worker.run` (awaitable) has a child process call it and
send back the answer as JSON bytes; the event loop waits for the child in a thread, so every
other request is served meanwhile. Children are forked once and reused (a fork per request
would add about 0.1 s to every edit), and replaced when one is stopped.

Why a process and not a thread: a render of a hostile template can take seconds of pure
Python (the GIL would stall the server just the same), and a thread cannot be stopped. A
child that runs past :attr:`Worker.time_limit_s` is killed and the page is answered with the
limit error (HTTP 422); an answer larger than :attr:`Worker.max_response_bytes` is replaced by
an error in the child, before it is sent. At most :attr:`Worker.slots` children run at once.

The child is forked (POSIX), so it starts with the studio as it is (estimator, folders) and
needs nothing pickled but the request's arguments. It never touches the store: saving stays in
the server process.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from storyforge.errors import StoryforgeError
from storyforge.studio.errors import StudioError

__all__ = ["LimitExceeded", "Worker"]


class LimitExceeded(StoryforgeError):
    """The work ran past the studio's time limit or produced a larger answer than it sends."""


#: How the child reports: (kind, payload) with kind "ok" (JSON bytes), "studio" (message,
#: status, issues: the studio's own errors, any ``StoryforgeError`` a 400), "limit" (message)
#: or "bug" (one line).
_Reply = tuple[str, Any]


def _answer(work: Callable[..., Any], args: tuple[Any, ...], max_bytes: int) -> _Reply:
    try:
        result = work(*args)
        body = json.dumps(result, ensure_ascii=True, separators=(",", ":")).encode("ascii")
        if len(body) > max_bytes:
            return (
                "limit",
                (
                    f"the answer is {len(body):,} bytes, more than the studio sends ({max_bytes:,}); "
                    "render less (a smaller context or budget)"
                ),
            )
        return ("ok", body)
    except StudioError as exc:
        return ("studio", (str(exc), exc.status, list(exc.issues)))
    except StoryforgeError as exc:
        return ("studio", (str(exc), 400, []))
    except MemoryError:
        return ("limit", "the work ran out of memory")
    except RecursionError:
        return ("limit", "the work nested too deeply")
    except Exception as exc:  # noqa: BLE001 - a bug: one line back to the server, which logs it
        return ("bug", f"{type(exc).__name__}: {exc}")


def _serve(conn: Any, target: Any, max_bytes: int) -> None:
    """The child's loop: answer ``(method name, args)`` requests until the pipe closes."""
    # The server's signal handlers came with the fork: a child ends on SIGTERM, and leaves
    # Ctrl-C (sent to the whole process group) to the server, which stops it.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Nothing the server holds open stays open here (its listening socket, its connections,
    # other programs' pipes): a child must not keep a port bound or a pipe from reaching EOF.
    keep = conn.fileno()
    os.closerange(3, keep)
    os.closerange(keep + 1, _MAX_FD)
    try:
        while True:
            try:
                name, args = conn.recv()
            except (EOFError, OSError):
                break
            conn.send(_answer(getattr(target, name), args, max_bytes))
    finally:
        os._exit(0)  # no atexit handlers, no flush of the parent's buffers


_MAX_FD = 1 << 16


@dataclass(slots=True)
class _Child:
    process: Any
    conn: Any

    def kill(self) -> None:
        self.conn.close()
        if self.process.is_alive() and self.process.pid is not None:
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.join()


@dataclass(slots=True, kw_only=True)
class Worker:
    """Runs studio work in forked children: at most ``slots`` at once, each call for ``time_limit_s``.

    A child is forked on first use and kept for the next calls; one that runs past the limit
    (or dies) is killed, and the next call forks a fresh one. ``target`` is the object whose
    methods are called (the :class:`~storyforge.studio.api.Studio`; set by ``create_app``).
    """

    time_limit_s: float = 10.0
    max_response_bytes: int = 16 * 1024 * 1024
    slots: int = 2
    target: Any = None
    _gate: asyncio.Semaphore | None = field(default=None, init=False, repr=False)
    _idle: list[_Child] = field(default_factory=list, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    async def run(self, name: str, *args: Any) -> bytes:
        """The JSON bytes of ``target.<name>(*args)`` computed in a child process.

        Raises :class:`LimitExceeded` past the time or size limit, and re-raises the studio's
        own errors (:class:`~storyforge.studio.api.StudioError`, any ``StoryforgeError``).
        """
        if self._gate is None:
            self._gate = asyncio.Semaphore(self.slots)
        async with self._gate:
            return await asyncio.to_thread(self._call, name, args)

    def close(self) -> None:
        """Stop every idle child."""
        with self._lock:
            children, self._idle = self._idle, []
        for child in children:
            child.kill()

    def _spawn(self) -> _Child:
        context = multiprocessing.get_context("fork")
        mine, theirs = context.Pipe(duplex=True)
        process = context.Process(
            target=_serve, args=(theirs, self.target, self.max_response_bytes), daemon=True
        )
        process.start()
        theirs.close()
        return _Child(process=process, conn=mine)

    def _call(self, name: str, args: tuple[Any, ...]) -> bytes:
        with self._lock:
            child = self._idle.pop() if self._idle else None
        if child is None or not child.process.is_alive():
            child = self._spawn()
        try:
            child.conn.send((name, args))
            if not child.conn.poll(self.time_limit_s):
                child.kill()
                raise LimitExceeded(
                    f"the work ran past the studio's time limit of {self.time_limit_s:g}s and was "
                    "stopped; make the template or the context smaller"
                )
            kind, payload = child.conn.recv()
        except (EOFError, OSError):
            child.kill()
            raise LimitExceeded(
                f"the work stopped without an answer (exit status {child.process.exitcode}); it may "
                "have run out of memory"
            ) from None
        with self._lock:
            self._idle.append(child)
        if kind == "ok":
            assert isinstance(payload, bytes)
            return payload
        if kind == "studio":
            message, status, issues = payload
            raise StudioError(message, status=status, issues=issues)
        if kind == "limit":
            raise LimitExceeded(payload)
        raise RuntimeError(payload)
