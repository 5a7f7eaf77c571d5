"""Bounded connections: every connection the service holds is closed on time.

uvicorn (0.55) times a connection only between requests: its keep-alive timer is armed
after a response and cancelled by any byte that arrives. A connection that sends
nothing, half a request head, or a body that stops is held for ever, and each holds a
file descriptor: about a thousand of them took the whole service down. ``bounded``
makes uvicorn's own h11 protocol class with these limits added (``uvicorn.Config``
takes a protocol class for ``http``: the supported hook, no monkey-patching):

- **head**: a request's head must arrive whole within ``head_timeout`` seconds, counted
  from the connection's start, or, on a kept-alive connection, from the first byte of
  the next head (an idle kept-alive connection is uvicorn's, ``timeout_keep_alive``).
  Past it: ``408`` if the client sent anything, and the connection is closed.
- **body**: a request's body must arrive whole within ``body_timeout`` seconds of its
  head. Past it: ``408`` (unless the route answered already) and the connection is
  closed; the route, if it was reading, sees the client gone (``TIMED_OUT`` in its
  scope says why).
- **an early answer**: a route that answers before its request's body arrived (a
  callback refused for its missing signature, a body over the cap) drains the rest:
  h11 goes on parsing what the client sends and uvicorn drops it (it keeps nothing of a
  body it answered already), so the client reads its answer and may send its next
  request on the same connection, as HTTP/1.1 allows. The drain is bounded: the
  connection is closed when the client sends nothing for ``LINGER`` seconds, when
  ``body_timeout`` passes from the answer, or at once while more than half the
  connections are taken. (Closing at once would reset a connection whose client is
  still sending, and the client could lose the answer; shutting only the write side
  loses the next request of a client that had not yet seen the shutdown.)
- **connections**: at most ``max_connections`` at once; one more is answered ``503``
  at once and closed, so stalled clients can never take the descriptors the service
  needs for its ledger and for new clients (``run.py`` keeps that number below the
  descriptor limit).

Why the protocol and not an ASGI layer: the application sees nothing of a request until
its head is complete, so only the protocol can time a head; and uvicorn buffers a body
(and holds its connection) even for a route that never reads it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .service import TIMED_OUT  # the scope's key: "body" when the body's limit passed

LINGER = 2.0  # s a client answered early may pause while it sends what nobody reads


def _raw(status: int, reason: str) -> bytes:
    return (f"HTTP/1.1 {status} {reason}\r\nconnection: close\r\ncontent-length: 0\r\n\r\n").encode(
        "ascii"
    )


REQUEST_TIMEOUT = _raw(408, "Request Timeout")
BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\nretry-after: 1\r\n"
    b"content-length: 0\r\n\r\n"
)


@dataclass(frozen=True)
class Limits:
    head_timeout: float
    body_timeout: float
    max_connections: int


class BoundedH11(H11Protocol):
    """uvicorn's h11 protocol with the limits of the module docstring."""

    limits: Limits  # set by ``bounded``

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._timer: asyncio.TimerHandle | None = None
        self._phase: str | None = None  # "head" or "body": what the timer waits for
        self._fresh = True  # no request head has arrived on this connection yet
        self._sent_any = False
        self._lingering = False  # nothing more it sends is read (the 503 of a full house)
        self._draining = False  # answered early: the rest of its body is parsed and dropped
        self._idle: asyncio.TimerHandle | None = None  # a draining sender gone quiet
        self._drain: asyncio.TimerHandle | None = None  # the drain's own limit

    # ------------------------------------------------------------ asyncio's calls

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            self._lingering = True  # nothing it sends is read
            transport.write(BUSY)
            self._end()
            return
        self._watch()

    def data_received(self, data: bytes) -> None:
        if self._lingering:  # a refused connection: nothing it sends is read
            return
        self._sent_any = True
        super().data_received(data)
        if self._draining:
            if self.conn.their_state is h11.SEND_BODY:  # still coming: within the drain's limits
                self._quiet_after(LINGER)
                return
            self._stop_draining()  # its body ended: the connection is an ordinary one again
        self._watch()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel()
        self._stop_draining()
        super().connection_lost(exc)

    # ------------------------------------------------------------ uvicorn's calls

    def handle_events(self) -> None:
        super().handle_events()
        if self.cycle is not None:
            self._fresh = False

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.transport.is_closing():
            return
        if self.conn.their_state is h11.SEND_BODY:  # answered before the body came
            self._drain_rest()
            return
        self._watch()

    # ------------------------------------------------------------ the limits

    def _waiting_for(self) -> str | None:
        their, ours = self.conn.their_state, self.conn.our_state
        if their is h11.SEND_BODY and ours is not h11.DONE:
            return "body"
        if their is h11.IDLE and ours is h11.IDLE and (self._fresh or self.conn.trailing_data[0]):
            return "head"
        return None

    def _watch(self) -> None:
        """Arm the limit of what the connection waits for now, once per phase: a byte
        that arrives never extends it."""
        if self.transport is None or self.transport.is_closing():
            return
        phase = self._waiting_for()
        if phase == self._phase:
            return
        self._cancel()
        self._phase = phase
        if phase is not None:
            seconds = self.limits.head_timeout if phase == "head" else self.limits.body_timeout
            self._timer = self.loop.call_later(seconds, self._expired, phase)

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._phase = None

    def _expired(self, phase: str) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if phase == "body" and cycle is not None and not cycle.response_complete:
            cycle.scope[TIMED_OUT] = "body"  # type: ignore[literal-required]
            answered = cycle.response_started
            cycle.disconnected = True  # the route's receive() sees the client gone
            cycle.message_event.set()
            if not answered:
                self.transport.write(REQUEST_TIMEOUT)
        elif phase == "head" and self._sent_any:
            self.transport.write(REQUEST_TIMEOUT)
        self._end()

    def _drain_rest(self) -> None:
        """Parse and drop the rest of a body answered early, until it ends (then the
        connection serves its next request), the client stops sending for ``LINGER``
        seconds, or ``body_timeout`` passes; close at once when half the connections
        are taken (stalled clients may be the cause, and a descriptor is worth more
        than a slow sender's chance to read its answer)."""
        self._cancel()
        if len(self.connections) > self.limits.max_connections // 2:
            self._end()
            return
        self._draining = True
        self.flow.resume_reading()
        self._quiet_after(LINGER)
        self._drain = self.loop.call_later(self.limits.body_timeout, self._end)

    def _quiet_after(self, seconds: float) -> None:
        if self._idle is not None:
            self._idle.cancel()
        self._idle = self.loop.call_later(seconds, self._end)

    def _stop_draining(self) -> None:
        self._draining = False
        for timer in (self._idle, self._drain):
            if timer is not None:
                timer.cancel()
        self._idle = self._drain = None

    def _end(self) -> None:
        """Close; and drop the connection outright if a client that reads nothing
        keeps the answer from ever being written."""
        self._cancel()
        self._stop_draining()
        if not self.transport.is_closing():
            self.transport.close()
        self.loop.call_later(LINGER, self.transport.abort)


def bounded(limits: Limits) -> type[BoundedH11]:
    """The protocol class for ``uvicorn.Config(http=...)`` with these limits."""
    return type("BoundedH11", (BoundedH11,), {"limits": limits})


__all__ = ["BUSY", "LINGER", "REQUEST_TIMEOUT", "BoundedH11", "Limits", "bounded"]
