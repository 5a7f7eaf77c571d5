"""The callback core: one request in, what to answer out (rule 16). No web framework:
the service mounts ``Hooks.handle`` as ``POST /hooks/{provider}``; a test or another
server can call it directly.

Order, for every request: the method, the provider, the headers the scheme requires
(all three answerable before the body is taken: ``before_body``), the body's size,
the signature (over the raw bytes, before anything reads them), a handshake the
scheme owes (Slack's challenge), then the events, each recorded once per event id and
applied to the record it names in one transaction with its dedupe row. What the
sender gets back:

=====  ================  ==========================================================
code   reason            when
=====  ================  ==========================================================
200    matched,          the signature held and the body was read; every event is
       pending,          counted in the JSON body by what became of it (a batch
       duplicate,        with one bad event is still 200: sending it again could
       ignored, batch    not make that event readable, and the others are kept)
200    challenge         a signed handshake, answered as the scheme says; nothing
                         is recorded
400    malformed         signed, but the body cannot be read at all
401    bad_signature     a missing or wrong signature (no detail); a missing
                         signature header before the body is read
401    stale             a signed timestamp outside ``tolerance``, either way
404    unknown_provider  no such provider, or it has no ``[providers.NAME.callbacks]``
405    method            not POST
413    too_large         the body is over ``max_body``
503    unavailable       the ledger could not be written; the sender should retry
=====  ================  ==========================================================

Nothing but a 200 changes the ledger, and a 503 may have recorded some events of a
batch (a redelivery finds them as duplicates). ``Answer`` carries the reason code
and, for a batch, each reason's count, for a metric and a log line without the body.
"""

from __future__ import annotations

import json
import os
import threading
from collections import Counter
from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .. import policy, tracing
from ..errors import LedgerError
from .events import Malformed, read
from .settings import CallbackConfig, resolve_secrets
from .verify import Refused, Verifier

if TYPE_CHECKING:
    from ..clock import Clock
    from ..config import Config
    from ..storage import Ledger

MAX_BODY = 1024 * 1024  # bytes: the default cap ([serve] max_body, docs/serve.md)
Headers = Mapping[str, str] | Iterable[tuple[str | bytes, str | bytes]]


@dataclass(frozen=True)
class Answer:
    """What to answer: the HTTP ``status``, a small JSON ``body``, the ``reason`` code
    (for a metric label and a log line), per reason how many events had it, and the
    status moves the events made (``(from_status, to_status)``, one per moved record)."""

    status: int
    body: dict[str, Any]
    reason: str
    provider: str
    counts: dict[str, int] = field(default_factory=dict)
    moves: tuple[tuple[str, str], ...] = ()

    def content(self) -> bytes:
        """The body as ``application/json`` bytes."""
        return json.dumps(self.body, separators=(",", ":")).encode()


class Hooks:
    """The providers' callbacks one process receives, verified against ``ledger``.

    ``callbacks`` is ``Config.callbacks``; every secret is read from ``env`` (default
    ``os.environ``) now, so a missing one stops the process at start with a
    ``ConfigError`` naming the variable. ``clock`` defaults to the ledger's (rule 12:
    freshness is judged by the ledger's clock). ``handle`` is safe to call from several
    threads: a ledger that is not (SQLite's one connection) is used by one at a time."""

    def __init__(
        self,
        ledger: Ledger,
        callbacks: Mapping[str, CallbackConfig],
        *,
        env: Mapping[str, str] | None = None,
        clock: Clock | None = None,
        max_body: int = MAX_BODY,
    ) -> None:
        environ = os.environ if env is None else env
        self._verifiers = {
            name: Verifier(cfg, resolve_secrets(cfg, environ)) for name, cfg in callbacks.items()
        }
        self.ledger = ledger
        self.clock = clock if clock is not None else ledger.clock()
        self.max_body = max_body
        self._lock: AbstractContextManager[Any] = (
            nullcontext() if getattr(ledger, "thread_safe", False) else threading.Lock()
        )

    @classmethod
    def from_config(
        cls,
        ledger: Ledger,
        config: Config,
        *,
        env: Mapping[str, str] | None = None,
        max_body: int = MAX_BODY,
    ) -> Hooks:
        return cls(ledger, config.callbacks, env=env, max_body=max_body)

    @property
    def providers(self) -> list[str]:
        """The providers whose callbacks are received."""
        return sorted(self._verifiers)

    def before_body(self, provider: str, method: str, headers: Headers) -> Answer | None:
        """What a request to ``/hooks/{provider}`` is answered from its method and
        headers alone: 405, 404, or 401 when a header the scheme requires is missing
        (``verify.required_headers``); None when its body must be read. A server may
        call it before taking the body, so that an unsigned upload is never read."""
        if method.upper() != "POST":
            return Answer(405, {"error": "use POST"}, "method", provider)
        verifier = self._verifiers.get(provider)
        if verifier is None:
            return Answer(
                404, {"error": "no callbacks for this provider"}, "unknown_provider", provider
            )
        if verifier.missing(_headers(headers)):
            return Answer(401, {"error": "unauthorized"}, "bad_signature", provider)
        return None

    def handle(
        self, provider: str, method: str, headers: Headers, body: bytes, query: str = ""
    ) -> Answer:
        """Verify, record and apply one request to ``/hooks/{provider}``. ``headers``
        as a mapping or as (name, value) pairs (ASGI's bytes are fine); ``body`` the raw
        bytes as received; ``query`` the URL's query string without ``?`` (the
        ``twilio`` scheme signs it, the ``token`` scheme reads it). Never raises for
        what a sender sent; a ``LedgerError`` is answered 503."""
        hdrs = _headers(headers)  # once: pairs may come as an iterator
        early = self.before_body(provider, method, hdrs)
        if early is not None:
            return early
        verifier = self._verifiers[provider]
        if len(body) > self.max_body:
            return Answer(
                413, {"error": "body too large", "max_body": self.max_body}, "too_large", provider
            )
        try:
            with self._lock:
                now = self.clock.now()
            signed = verifier.check(hdrs, body, query, now)
        except Refused as no:
            return Answer(no.status, {"error": "unauthorized"}, no.reason, provider)
        reply = verifier.handshake(hdrs, body, query)
        if reply is not None:
            return Answer(200, reply, "challenge", provider)
        try:
            items = read(
                verifier.cfg, body, hdrs.get("content-type", ""), query, signed.event_id, now
            )
        except Malformed as exc:
            return Answer(400, {"error": f"malformed: {exc}"}, "malformed", provider)
        counts: Counter[str] = Counter()
        moves: list[tuple[str, str]] = []
        try:
            for item in items:
                if item.callback is None:
                    counts[item.reason] += 1
                    continue
                with self._lock, _callback_span(provider, item.callback) as s:
                    taken, move = self.ledger.take_callback(item.callback, policy.callback, now=now)
                    tracing.note(
                        s,
                        **{
                            "settled.outcome": str(taken),
                            "settled.action_id": None if move is None else move.action_id,
                        },
                    )
                counts[str(taken)] += 1
                if move is not None and move.frm is not move.to:
                    moves.append((move.frm.value, move.to.value))
        except LedgerError:
            return Answer(
                503,
                {"error": "the ledger is unavailable; deliver again later"},
                "unavailable",
                provider,
                dict(counts),
                tuple(moves),
            )
        reason = next(iter(counts)) if len(items) == 1 else "batch"
        return Answer(
            200, {"received": len(items), **counts}, reason, provider, dict(counts), tuple(moves)
        )


def _callback_span(provider: str, callback: Any) -> AbstractContextManager[Any]:
    """The ``settled.callback`` span of one event a provider called back with."""
    return tracing.span(
        "settled.callback",
        {
            "settled.provider": provider,
            "settled.callback.event_id": callback.event_id,
            "settled.callback.status": callback.status,
        },
    )


def _headers(headers: Headers) -> dict[str, str]:
    """Lower-case names; the first of a repeated header counts."""
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    out: dict[str, str] = {}
    for name, value in pairs:
        n = name.decode("latin-1") if isinstance(name, bytes) else str(name)
        v = value.decode("latin-1") if isinstance(value, bytes) else str(value)
        out.setdefault(n.lower(), v)
    return out


__all__ = ["MAX_BODY", "Answer", "Headers", "Hooks"]
