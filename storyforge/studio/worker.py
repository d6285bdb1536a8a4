"""The studio's heavy work off the event loop: each check, render or diff in a child process with a time limit.

Takes: a function of the :class:`~storyforge.studio.api.Studio` and its arguments. Gives:
:class:`Worker`, whose :meth:`Worker.run` (awaitable) forks a child process that calls the
function and sends back its answer as JSON bytes; the event loop waits for the child in a
thread, so every other request is served meanwhile.

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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from storyforge.errors import StoryforgeError

__all__ = ["LimitExceeded", "Worker"]


class LimitExceeded(StoryforgeError):
    """The work ran past the studio's time limit or produced a larger answer than it sends."""


#: How the child reports: (kind, payload) with kind "ok" (JSON bytes), "error" (message,
#: status), "limit" (message).
_Reply = tuple[str, Any]


def _child(conn: Any, work: Callable[..., Any], args: tuple[Any, ...], max_bytes: int) -> None:
    from storyforge.studio.api import StudioError

    reply: _Reply
    try:
        result = work(*args)
        body = json.dumps(result, ensure_ascii=True, separators=(",", ":")).encode("ascii")
        if len(body) > max_bytes:
            reply = (
                "limit",
                (
                    f"the answer is {len(body):,} bytes, more than the studio sends ({max_bytes:,}); "
                    "render less (a smaller context or budget)"
                ),
            )
        else:
            reply = ("ok", body)
    except StudioError as exc:
        reply = ("studio", (str(exc), exc.status, list(exc.issues)))
    except StoryforgeError as exc:
        reply = ("error", str(exc))
    except MemoryError:
        reply = ("limit", "the work ran out of memory")
    except RecursionError:
        reply = ("limit", "the work nested too deeply")
    except BaseException as exc:  # noqa: BLE001 - a bug: one line back to the server, which logs it
        reply = ("bug", f"{type(exc).__name__}: {exc}")
    try:
        conn.send(reply)
    finally:
        conn.close()
        os._exit(0)  # no atexit handlers, no flush of the parent's buffers


@dataclass(slots=True, kw_only=True)
class Worker:
    """Runs studio work in forked children: at most ``slots`` at once, each for ``time_limit_s``."""

    time_limit_s: float = 10.0
    max_response_bytes: int = 16 * 1024 * 1024
    slots: int = 2
    _gate: asyncio.Semaphore | None = field(default=None, init=False, repr=False)

    async def run(self, work: Callable[..., Any], *args: Any) -> bytes:
        """The JSON bytes of ``work(*args)`` computed in a child process.

        Raises :class:`LimitExceeded` past the time or size limit, and re-raises the studio's
        own errors (:class:`~storyforge.studio.api.StudioError`, any ``StoryforgeError``).
        """
        if self._gate is None:
            self._gate = asyncio.Semaphore(self.slots)
        async with self._gate:
            return await asyncio.to_thread(self._run_blocking, work, args)

    def _run_blocking(self, work: Callable[..., Any], args: tuple[Any, ...]) -> bytes:
        from storyforge.studio.api import StudioError

        context = multiprocessing.get_context("fork")
        receiver, sender = context.Pipe(duplex=False)
        process = context.Process(
            target=_child, args=(sender, work, args, self.max_response_bytes), daemon=True
        )
        process.start()
        sender.close()
        try:
            if not receiver.poll(self.time_limit_s):
                raise LimitExceeded(
                    f"the work ran past the studio's time limit of {self.time_limit_s:g}s and was "
                    "stopped; make the template or the context smaller"
                )
            try:
                kind, payload = receiver.recv()
            except EOFError:
                raise LimitExceeded(
                    f"the work stopped without an answer (exit status {process.exitcode}); it may have "
                    "run out of memory"
                ) from None
        finally:
            receiver.close()
            if process.is_alive() and process.pid is not None:
                os.kill(process.pid, signal.SIGKILL)
            process.join()
        if kind == "ok":
            assert isinstance(payload, bytes)
            return payload
        if kind == "studio":
            message, status, issues = payload
            raise StudioError(message, status=status, issues=issues)
        if kind == "error":
            raise StudioError(payload)
        if kind == "limit":
            raise LimitExceeded(payload)
        raise RuntimeError(payload)
