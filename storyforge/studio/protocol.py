"""uvicorn's HTTP/1.1 protocol with a header-read timeout.

Takes: a number of seconds. Gives: :func:`header_timeout_protocol`, a subclass of uvicorn's
``H11Protocol`` that closes a connection which has not sent a whole request head within that
time, counted from the connection's start and again from the end of each answer.

Why: uvicorn closes idle keep-alive connections after an answer, but a connection that never
sends a request (or trickles its headers one byte at a time) is held for as long as the client
likes, so a few hundred of them tie up the server. A connection whose request is being
answered is never closed by this timer, however long the answer takes.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["header_timeout_protocol"]


def header_timeout_protocol(seconds: float) -> type[H11Protocol]:
    """An ``H11Protocol`` class that gives each request head ``seconds`` to arrive."""

    class HeaderTimeoutProtocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None
        _armed_cycle: Any = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._header_timer is not None and self.cycle is not self._armed_cycle:
                self._disarm()  # a request head arrived: its answer may take as long as it takes

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._armed_cycle = self.cycle
            self._header_timer = self.loop.call_later(seconds, self._expired)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _expired(self) -> None:
            self._header_timer = None
            busy = self.cycle is not None and not self.cycle.response_complete
            if self.cycle is self._armed_cycle and not busy and not self.transport.is_closing():
                self.transport.close()

    return HeaderTimeoutProtocol
