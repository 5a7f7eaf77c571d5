"""The simulated provider's server: a real HTTP/1.1 server on loopback with a scriptable
fault plan and exact ground truth. Standard library only, with settled's callback
signers.

Operations (``POST /v1/{op}``, JSON body ``{"action_id", "reconciliation_key", "params"}``,
header ``Idempotency-Key``) and their normal replies. A body without ``"params"`` is
taken as the params themselves (what a generic HTTP client such as the ``http``
provider sends), with the key in its ``"reconciliation_key"`` field and the action
named by the ``Idempotency-Key`` header's ``{action_id}:{attempt}``, else by an
``"action_id"`` field, else by the reconciliation key:

    book     201 {"id": "bk-…", "status": "booked"}       the reply proves the effect
    send     202 {"id": "msg-…", "status": "queued"}      the reply only says queued
    deliver  202 {"receipt": "rcpt-…"}                    delivery receipt only
    notify   204 (no body)                                blind
    set      202 {"status": "accepted"}                   params {"name", "value"}

Each request for an action pops the next fault from that action's plan (FIFO; the
server's ``default_fault`` when the plan is empty). A fault decides two things: whether
the effect is applied, and what goes on the wire. Faults that fail *before* the server
reaches its idempotency-key store (``drop``, ``timeout_before_apply``, ``5xx_before``,
``reject``, ``http:CODE``, an unknown fault) never apply and never replay. Every other
fault reaches the key store: a key whose earlier request applied an effect replays the
stored reply instead of applying again, and the fault's wire behaviour (hang, reset, 500,
garbled body…) then distorts that replay exactly as it would a first reply.

The stored reply for a key is the operation's normal reply — what an idempotency store
keeps — even when a wire fault garbled or withheld it the first time.

Latency: the server answers each operation request ``latency`` seconds after applying
it (``SimServer(latency=…)``, ``--latency``; a query to ``/v1/`` waits as long), plus what the request asks for in an
``X-Sim-Latency`` header (seconds), plus a planned ``latency:SECONDS`` fault (which
otherwise behaves as ``ok``). The wait happens outside the server's lock, so slow
answers overlap as a real provider's do.

Callbacks: the server can call back, as Twilio, SendGrid or any Standard Webhooks sender
does, reporting its ground truth for each effect it applies (``applied`` for a booking,
``delivered`` for a message or a receipt, ``bounced``): ``SimServer(callbacks=
CallbackPlan(url, scheme, secret, when, options))``, or ``POST /_callbacks`` with those
keys. ``scheme`` is any of settled's callback schemes, and the callback is signed by
that scheme's own signer (``settled.callbacks.schemes``), so none is special here;
``options`` are the scheme's own keys as settled.toml has them (``header`` for
``hmac-sha256``, ``public_key`` for ``sendgrid``), and ``url`` is the one the callback
goes to. ``secret`` is what the sender holds (the private key for ``sendgrid``).
"before" posts the signed callback and waits for its answer before the reply is written
(a provider whose callback overtakes its reply); "after" posts it once the reply is out.
``POST /_plan`` takes an optional ``"callback"`` (a ``when`` for that action alone, or
"none"). The body is JSON ``{"type": "effect.status", "data": {"id", "action_id",
"reconciliation_key", "status"}}``, with the callback's own id where the scheme reads
one from the body (Stripe's ``/id``); a scheme whose sender posts forms gets the form
``MessageSid``, ``MessageStatus``, ``ActionId``, ``Key``. Each delivery and the answer it
got are in the ground truth (``callbacks``).

An outage of its queries: ``SimServer.unavailable(503)`` (or ``POST /_unavailable``
{"status": 503}) answers every ``GET /v1/...`` with that code until
``unavailable(None)`` (``{"status": null}``).

Scripting: ``POST /_plan`` {"action_id", "faults": [...]}, ``POST /_reset``,
``GET /_truth``, ``PUT /_settings/{name}`` {"value"} (a change "by someone else").
Ground truth also counts queries per reconciliation key (or setting name), so tests can
check that reconcilers never ask twice for the same due time.
Queries: ``GET /v1/effects/{reconciliation_key}``, ``GET /v1/settings/{name}``.

Run it alone with ``python -m settled.providers.sim_server [--port N] …``.
"""

from __future__ import annotations

import argparse
import json
import math
import secrets
import signal
import socket
import socketserver
import struct
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self
from urllib.parse import unquote, urlencode

from ..callbacks.schemes import SCHEMES, Message, Scheme
from ..errors import ConfigError, SettledError

OPERATIONS = ("book", "send", "deliver", "notify", "set")

# Faults with a fixed name. ``lag:SECONDS``, ``latency:SECONDS`` and ``http:CODE`` take
# an argument.
BEFORE_APPLY = frozenset({"drop", "timeout_before_apply", "5xx_before", "reject"})
AFTER_APPLY = frozenset(
    {"ok", "timeout_after_apply", "reset_after_apply", "5xx_after", "garbage", "badutf8", "huge"}
)
NEVER_APPLY = frozenset({"lost_after_accept", "bounce"})  # reach the key store, apply nothing
FAULTS = BEFORE_APPLY | AFTER_APPLY | NEVER_APPLY

_CHUNK = 64 * 1024
_RST_LINGER = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends a TCP RST


@dataclass(frozen=True)
class _Reply:
    code: int
    body: bytes = b""
    content_type: str = "application/json"


@dataclass(frozen=True)
class _Effect:
    status: str  # applied | delivered | bounced
    object_id: str | None
    visible_at: float  # time.monotonic()


@dataclass(frozen=True)
class _Outcome:
    """What the handler does on the wire once the state change is recorded."""

    wire: str  # reply | hang | reset | garbage | badutf8 | huge
    reply: _Reply | None = None
    delay: float = 0.0  # s to wait before answering (a planned latency:SECONDS)
    effect: dict[str, Any] | None = None  # what a callback reports (a first application)


CALLBACK_SCHEMES = tuple(SCHEMES)
CALLBACK_WHEN = ("before", "after", "both", "none")
_CALLBACK_TIMEOUT = 10.0  # s a callback waits for the hook's answer
_FORM = "application/x-www-form-urlencoded"


@dataclass(frozen=True)
class CallbackPlan:
    """Where and how the server calls back (see the module's docstring)."""

    url: str
    scheme: str = "standard-webhooks"
    secret: str = ""
    when: str = "after"
    options: Mapping[str, Any] = field(default_factory=dict)
    signer: Scheme = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.scheme not in CALLBACK_SCHEMES:
            raise ValueError(f"callback scheme {self.scheme!r}: use one of {CALLBACK_SCHEMES}")
        if self.when not in CALLBACK_WHEN:
            raise ValueError(f"callback when {self.when!r}: use one of {CALLBACK_WHEN}")
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"callback url {self.url!r} must be http:// or https://")

        def refuse(key: str, problem: str) -> ConfigError:
            return ConfigError(f"callback option {key}: {problem}")

        table = {"url": self.url.partition("?")[0], **self.options}
        try:
            signer = SCHEMES[self.scheme].parse(table, refuse)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        object.__setattr__(self, "signer", signer)  # made once, from the frozen fields
        try:  # a secret the scheme cannot sign with is refused now, not in a handler
            self.request({"id": "", "action_id": "", "reconciliation_key": "", "status": ""}, 0)
        except (ValueError, TypeError, SettledError) as exc:
            raise ValueError(
                f"callback secret: {self.scheme} cannot sign with it ({exc})"
            ) from None

    def unsigned(self, effect: dict[str, Any], event_id: str) -> Message:
        """The callback for ``effect`` before it is signed: its body, content type and
        the query string of ``url``."""
        if self.signer.form:
            params = {
                "MessageSid": str(effect["id"] or ""),
                "MessageStatus": effect["status"],
                "ActionId": effect["action_id"],
                "Key": effect["reconciliation_key"] or "",
            }
            body, ctype = urlencode(params).encode(), _FORM
        else:
            doc: dict[str, Any] = {"type": "effect.status", "data": effect}
            if self.signer.event_field:
                _put(doc, self.signer.event_field, event_id)
            body, ctype = json.dumps(doc).encode(), "application/json"
        return Message(body, {"Content-Type": ctype}, self.url.partition("?")[2])

    def request(self, effect: dict[str, Any], now: float) -> tuple[str, bytes, dict[str, str]]:
        """The signed callback for ``effect``: the URL it goes to, its body and headers,
        as the sender signs them."""
        event_id = "msg_" + secrets.token_hex(12)
        base = self.url.partition("?")[0]
        signed = self.signer.sign(
            self.secret, self.unsigned(effect, event_id), url=base, now=now, event_id=event_id
        )
        target = base + (f"?{signed.query}" if signed.query else "")
        return target, signed.body, dict(signed.headers)


def _put(doc: dict[str, Any], pointer: str, value: str) -> None:
    """Set ``value`` at a JSON pointer of plain names, making the objects on the way."""
    *path, last = [t.replace("~1", "/").replace("~0", "~") for t in pointer.split("/")[1:]]
    for name in path:
        doc = doc.setdefault(name, {})
    doc[last] = value


def _json(code: int, obj: Any) -> _Reply:
    return _Reply(code, json.dumps(obj).encode())


def _parse_fault(fault: str) -> tuple[str, float | int | None, str]:
    """``(kind, argument, error)``; kind is "unknown" with an explanation when invalid."""
    if fault in FAULTS:
        return fault, None, ""
    name, sep, arg = fault.partition(":")
    if sep and name in ("lag", "latency"):
        try:
            seconds = float(arg)
        except ValueError:
            return "unknown", None, f"fault {fault!r}: {name} needs seconds, e.g. {name}:2.5"
        if not (math.isfinite(seconds) and seconds >= 0):
            return "unknown", None, f"fault {fault!r}: {name} must be a finite number >= 0"
        return name, seconds, ""
    if sep and name == "http":
        # 1xx would be informational (the client would keep waiting), so 200..999 only.
        if not (arg.isdigit() and len(arg) == 3 and 200 <= int(arg) <= 999):
            return "unknown", None, f"fault {fault!r}: http needs a code 200..999, e.g. http:429"
        return "http", int(arg), ""
    known = ", ".join(sorted(FAULTS | {"lag:SECONDS", "latency:SECONDS", "http:CODE"}))
    return "unknown", None, f"unknown fault {fault!r}; known faults: {known}"


class SimServer:
    """A simulated provider on ``host:port`` (port 0 picks a free one at ``start()``)."""

    def __init__(  # noqa: PLR0913  (a test double's knobs, all defaulted)
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        honour_keys: bool = True,
        hang: float = 5.0,
        lag: float = 0.0,
        default_fault: str = "ok",
        huge_bytes: int = 8 * 1024 * 1024,
        latency: float = 0.0,
        callbacks: CallbackPlan | None = None,
    ) -> None:
        self.host = host
        self.latency = latency  # s before each operation's answer
        self._requested_port = port
        self.honour_keys = honour_keys
        self.hang = hang
        self.lag = lag
        self.default_fault = default_fault
        self.huge_bytes = huge_bytes
        self.callbacks = callbacks  # None: the server never calls back
        self.queries_answer: int | None = None  # every query answers this code (an outage)
        self._lock = threading.Lock()
        self._stopping = threading.Event()  # hanging handlers wait on this
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._init_state()

    def _init_state(self) -> None:
        self._plans: dict[str, deque[str]] = {}
        self._requests: list[dict[str, Any]] = []
        self._counts: dict[str, int] = {}  # action_id -> effects applied
        self._effects: dict[str, list[_Effect]] = {}  # reconciliation key -> effects
        self._replies: dict[str, _Reply] = {}  # idempotency key -> stored reply
        self._queries: dict[str, int] = {}  # reconciliation key / setting name -> GETs
        # name -> [(visible_at, value)] in write order; the last visible entry wins.
        self._settings: dict[str, list[tuple[float, Any]]] = {}
        self._callback_when: dict[str, str] = {}  # action_id -> when, from a plan
        self._callbacks_sent: list[dict[str, Any]] = []

    # -- lifecycle ------------------------------------------------------------------

    def start(self) -> Self:
        if self._httpd is not None:
            raise RuntimeError("SimServer already started")
        self._stopping.clear()
        self._httpd = _HTTPServer((self.host, self._requested_port), _Handler, self)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},  # shutdown() waits up to one poll interval
            name=f"sim-server:{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def pause(self, seconds: float) -> None:
        """Wait ``seconds`` (a slow provider, a hanging reply); ``stop()`` cuts it short."""
        self._stopping.wait(seconds)

    @property
    def stopping(self) -> bool:
        """True once ``stop()`` was called: a streaming reply ends early."""
        return self._stopping.is_set()

    def stop(self) -> None:
        """Stop serving; returns promptly even while handlers hang or stream."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        self._stopping.set()
        httpd.shutdown()
        httpd.drop_connections()  # wake handlers blocked reading an idle keep-alive
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
            self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("SimServer not started")
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # -- scripting and ground truth ---------------------------------------------------

    def plan(self, action_id: str, *faults: str) -> None:
        """Queue faults for the next requests of ``action_id``, one per request."""
        with self._lock:
            self._plans.setdefault(action_id, deque()).extend(faults)

    def unavailable(self, code: int | None = 503) -> None:
        """Answer every query (``GET /v1/...``) with ``code`` and no Retry-After from now
        on (a provider in an outage: 503, 429, 500…); None answers them again."""
        self.queries_answer = code

    def reset(self) -> None:
        with self._lock:
            self._init_state()

    def plan_callback(self, action_id: str, when: str) -> None:
        """Call back for ``action_id`` at ``when`` (or "none"), whatever the server's own."""
        if when not in CALLBACK_WHEN:
            raise ValueError(f"callback when {when!r}: use one of {CALLBACK_WHEN}")
        with self._lock:
            self._callback_when[action_id] = when

    def callbacks_for(self, action_id: str) -> list[dict[str, Any]]:
        """The callbacks posted for ``action_id``, each with the answer it got."""
        with self._lock:
            return [dict(c) for c in self._callbacks_sent if c["action_id"] == action_id]

    def _call_back(self, effect: dict[str, Any] | None, moment: str) -> None:
        """Post the callback for ``effect`` if the plan says so at ``moment``."""
        plan = self.callbacks
        if effect is None or plan is None:
            return
        with self._lock:
            when = self._callback_when.get(effect["action_id"], plan.when)
        if when not in (moment, "both"):
            return
        import urllib.error
        import urllib.request

        target, body, headers = plan.request(effect, time.time())
        sent: dict[str, Any] = {**effect, "when": moment, "code": None, "answer": None}
        req = urllib.request.Request(target, data=body, headers=headers, method="POST")  # noqa: S310 - loopback test double
        try:
            with urllib.request.urlopen(req, timeout=_CALLBACK_TIMEOUT) as res:  # noqa: S310
                sent["code"], sent["answer"] = res.status, res.read(4096).decode("utf-8", "replace")
        except urllib.error.HTTPError as exc:
            sent["code"], sent["answer"] = exc.code, exc.read(4096).decode("utf-8", "replace")
        except OSError as exc:
            sent["answer"] = f"not delivered: {exc}"
        with self._lock:
            self._callbacks_sent.append(sent)

    def truth(self) -> dict[str, Any]:
        with self._lock:
            return {
                "requests": [dict(r) for r in self._requests],
                "effects": dict(self._counts),
                "queries": dict(self._queries),
                "callbacks": [dict(c) for c in self._callbacks_sent],
            }

    def requests_for(self, action_id: str) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(r) for r in self._requests if r["action_id"] == action_id]

    def effects_for(self, action_id: str) -> int:
        with self._lock:
            return self._counts.get(action_id, 0)

    def queries_for(self, key: str) -> int:
        """How many times ``GET /v1/effects/{key}`` (or ``/v1/settings/{key}``) was asked."""
        with self._lock:
            return self._queries.get(key, 0)

    def put_setting(self, name: str, value: Any) -> None:
        """Change a setting now, as someone other than settled would (no truth entry)."""
        with self._lock:
            self._settings.setdefault(name, []).append((time.monotonic(), value))

    # -- queries ------------------------------------------------------------------------

    def effect_view(self, key: str) -> dict[str, Any] | None:
        """What ``GET /v1/effects/{key}`` shows now; None while nothing is visible."""
        now = time.monotonic()
        with self._lock:
            self._queries[key] = self._queries.get(key, 0) + 1
            visible = [e for e in self._effects.get(key, []) if e.visible_at <= now]
        if not visible:
            return None
        # An applied effect outweighs a bounce of the same key (in either order).
        chosen = next((e for e in visible if e.status != "bounced"), visible[0])
        return {"status": chosen.status, "id": chosen.object_id}

    def setting_view(self, name: str) -> Any:
        now = time.monotonic()
        with self._lock:
            self._queries[name] = self._queries.get(name, 0) + 1
            for visible_at, value in reversed(self._settings.get(name, [])):
                if visible_at <= now:
                    return value
        return None

    # -- the operation endpoint -------------------------------------------------------

    def _process(
        self, op: str, action_id: str, rkey: str | None, ikey: str | None, params: Any
    ) -> _Outcome:
        """Pop the fault, change state and log the request: all under the lock, so that
        ground truth is exact under concurrency. Returns what to put on the wire."""
        with self._lock:
            plan = self._plans.get(action_id)
            fault = plan.popleft() if plan else self.default_fault
            kind, arg, error = _parse_fault(fault)
            entry: dict[str, Any] = {
                "action_id": action_id,
                "op": op,
                "idempotency_key": ikey,
                "reconciliation_key": rkey,
                "fault": fault,
                "applied": False,
                "replayed": False,
                "at": time.time(),
            }
            self._requests.append(entry)
            self._counts.setdefault(action_id, 0)

            # Failures before the server reaches its key store.
            if kind == "unknown":
                return _Outcome("reply", _json(500, {"error": error}))
            if kind == "reject" or (op == "set" and not _valid_setting(params)):
                return _Outcome("reply", _json(422, {"error": "invalid params"}))
            if kind == "drop":
                return _Outcome("drop")
            if kind == "timeout_before_apply":
                return _Outcome("hang")
            if kind == "5xx_before":
                return _Outcome("reply", _json(503, {"error": "service unavailable"}))
            if kind == "http":
                return _Outcome("reply", _json(int(arg or 0), {"error": f"scripted HTTP {arg}"}))

            # The key store.
            if self.honour_keys and ikey and ikey in self._replies:
                entry["replayed"] = True
                return self._deliver(kind, self._replies[ikey])

            if kind == "lost_after_accept":
                return _Outcome("reply", _accepted_reply(op))
            if kind == "bounce":
                if rkey is not None:
                    visible = time.monotonic() + self.lag
                    self._effects.setdefault(rkey, []).append(_Effect("bounced", None, visible))
                bounced = {
                    "id": None,
                    "action_id": action_id,
                    "reconciliation_key": rkey,
                    "status": "bounced",
                }
                return _Outcome("reply", _json(202, {"status": "queued"}), effect=bounced)

            # Everything left applies the effect exactly once.
            lag = float(arg) if kind == "lag" and arg is not None else self.lag
            reply = self._apply(op, action_id, rkey, params, lag)
            entry["applied"] = True
            if ikey:
                self._replies.setdefault(ikey, reply)
            out = self._deliver(kind, reply)
            effect = {
                "id": _reply_id(reply),
                "action_id": action_id,
                "reconciliation_key": rkey,
                "status": "applied" if op in ("book", "set") else "delivered",
            }
            delay = float(arg) if kind == "latency" and arg is not None else out.delay
            return _Outcome(out.wire, out.reply, delay, effect)

    def _apply(self, op: str, action_id: str, rkey: str | None, params: Any, lag: float) -> _Reply:
        """Apply one effect (lock held) and return the operation's normal reply."""
        visible_at = time.monotonic() + lag
        self._counts[action_id] = self._counts.get(action_id, 0) + 1
        reply, object_id = _normal_reply(op)
        if op == "set":
            self._settings.setdefault(params["name"], []).append((visible_at, params["value"]))
        elif rkey is not None:
            status = "applied" if op == "book" else "delivered"
            self._effects.setdefault(rkey, []).append(_Effect(status, object_id, visible_at))
        return reply

    @staticmethod
    def _deliver(kind: str, reply: _Reply) -> _Outcome:
        """The wire behaviour of a fault that reached the key store."""
        if kind == "timeout_after_apply":
            return _Outcome("hang")
        if kind == "reset_after_apply":
            return _Outcome("reset")
        if kind == "5xx_after":
            return _Outcome("reply", _json(500, {"error": "internal error"}))
        if kind in ("garbage", "badutf8", "huge"):
            return _Outcome(kind)
        return _Outcome("reply", reply)  # ok, lag, and replays under never-apply faults


def _seconds(text: str | None) -> float:
    """An ``X-Sim-Latency`` header's seconds; 0 when absent or not a number >= 0."""
    try:
        value = float(text) if text else 0.0
    except ValueError:
        return 0.0
    return value if math.isfinite(value) and value > 0 else 0.0


def _valid_setting(params: Any) -> bool:
    return isinstance(params, dict) and isinstance(params.get("name"), str) and "value" in params


def _normal_reply(op: str) -> tuple[_Reply, str | None]:
    """The operation's "ok" reply and the object id it names (if any)."""
    if op == "book":
        oid = "bk-" + secrets.token_hex(8)
        return _json(201, {"id": oid, "status": "booked"}), oid
    if op == "send":
        oid = "msg-" + secrets.token_hex(8)
        return _json(202, {"id": oid, "status": "queued"}), oid
    if op == "deliver":
        oid = "rcpt-" + secrets.token_hex(8)
        return _json(202, {"receipt": oid}), oid
    if op == "notify":
        return _Reply(204), None
    return _json(202, {"status": "accepted"}), None  # set


def _reply_id(reply: _Reply) -> str | None:
    """The object id a normal reply names (``id`` or ``receipt``)."""
    try:
        body = json.loads(reply.body) if reply.body else {}
    except ValueError:
        return None
    found = body.get("id", body.get("receipt")) if isinstance(body, dict) else None
    return found if isinstance(found, str) else None


def _accepted_reply(op: str) -> _Reply:
    """A reply that looks like acceptance for a request the server will drop."""
    if op == "book":
        return _json(202, {"id": "bk-" + secrets.token_hex(8), "status": "queued"})
    return _normal_reply(op)[0]


def _huge_body(size: int) -> Iterator[bytes]:
    """``size`` bytes that start like JSON, produced in chunks (never all in memory)."""
    head, tail = b'{"pad": "', b'"}'
    pad = max(0, size - len(head) - len(tail))
    yield head
    while pad > 0:
        n = min(_CHUNK, pad)
        yield b"x" * n
        pad -= n
    yield tail


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], handler: type[_Handler], sim: SimServer) -> None:
        self.sim = sim
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        super().__init__(address, handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind calls socket.getfqdn(), which can stall on DNS.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)

    def track(self, conn: socket.socket, alive: bool) -> None:
        with self._conns_lock:
            (self._conns.add if alive else self._conns.discard)(conn)

    def drop_connections(self) -> None:
        with self._conns_lock:
            conns = list(self._conns)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by its handler

    def shutdown_request(self, request: Any) -> None:
        # A connection marked for reset must not send a FIN first (shutdown(SHUT_WR)):
        # close it straight away so the kernel answers with RST.
        try:
            linger = request.getsockopt(socket.SOL_SOCKET, socket.SO_LINGER, len(_RST_LINGER))
        except OSError:
            linger = b""
        if linger == _RST_LINGER:
            self.close_request(request)
        else:
            super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hangs up mid-reply (a capped read, a timeout) is expected here.
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive; every reply carries a Content-Length
    disable_nagle_algorithm = True  # headers and body go in separate writes
    server: _HTTPServer

    def setup(self) -> None:
        super().setup()
        self.server.track(self.connection, True)

    def finish(self) -> None:
        self.server.track(self.connection, False)
        super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        return None  # quiet: ground truth is the log

    @property
    def sim(self) -> SimServer:
        return self.server.sim

    # -- routing ----------------------------------------------------------------------

    def do_GET(self) -> None:
        self._read_body()
        path = self.path.split("?", 1)[0]
        if path.startswith("/v1/") and self.sim.latency > 0:
            self.sim.pause(self.sim.latency)  # a query to a far provider waits too
        if path == "/_truth":
            return self._send(_json(200, self.sim.truth()))
        outage = self.sim.queries_answer
        if outage is not None and path.startswith("/v1/"):
            return self._send(_json(outage, {"error": f"unavailable (HTTP {outage})"}))
        if path.startswith("/v1/effects/"):
            view = self.sim.effect_view(unquote(path[len("/v1/effects/") :]))
            return self._send(
                _json(404, {"status": "not_found"}) if view is None else _json(200, view)
            )
        if path.startswith("/v1/settings/"):
            name = unquote(path[len("/v1/settings/") :])
            return self._send(_json(200, {"name": name, "value": self.sim.setting_view(name)}))
        self._send(_json(404, {"error": f"no route GET {path}"}))

    def do_PUT(self) -> None:
        body, error = self._json_body()
        path = self.path.split("?", 1)[0]
        if not path.startswith("/_settings/"):
            return self._send(_json(404, {"error": f"no route PUT {path}"}))
        if error or not isinstance(body, dict) or "value" not in body:
            return self._send(_json(400, {"error": error or 'body must be {"value": ...}'}))
        name = unquote(path[len("/_settings/") :])
        self.sim.put_setting(name, body["value"])
        self._send(_json(200, {"name": name, "value": body["value"]}))

    def do_POST(self) -> None:
        body, error = self._json_body()
        path = self.path.split("?", 1)[0]
        if path == "/_reset":
            self.sim.reset()
            return self._send(_json(200, {"reset": True}))
        if path == "/_plan":
            return self._plan(body, error)
        if path == "/_callbacks":
            return self._callbacks(body, error)
        if path == "/_unavailable":
            code = body.get("status") if isinstance(body, dict) and not error else "bad"
            if code is not None and (isinstance(code, bool) or not isinstance(code, int)):
                return self._send(_json(400, {"error": 'body must be {"status": 503 or null}'}))
            self.sim.unavailable(code)
            return self._send(_json(200, {"status": code}))
        if path.startswith("/v1/"):
            return self._operation(path[len("/v1/") :], body, error)
        self._send(_json(404, {"error": f"no route POST {path}"}))

    def _plan(self, body: Any, error: str) -> None:
        ok = (
            not error
            and isinstance(body, dict)
            and isinstance(body.get("action_id"), str)
            and isinstance(body.get("faults"), list)
            and all(isinstance(f, str) for f in body["faults"])
        )
        if not ok:
            msg = error or 'body must be {"action_id": str, "faults": [str, ...]}'
            return self._send(_json(400, {"error": msg}))
        if "callback" in body:
            try:
                self.sim.plan_callback(body["action_id"], str(body["callback"]))
            except ValueError as exc:
                return self._send(_json(400, {"error": str(exc)}))
        self.sim.plan(body["action_id"], *body["faults"])
        self._send(_json(200, {"action_id": body["action_id"], "queued": len(body["faults"])}))

    def _callbacks(self, body: Any, error: str) -> None:
        if error or not isinstance(body, dict) or not isinstance(body.get("url"), str):
            return self._send(_json(400, {"error": error or 'body must be {"url": str, ...}'}))
        options = body.get("options", {})
        if not isinstance(options, dict):
            return self._send(_json(400, {"error": '"options" must be an object'}))
        try:
            plan = CallbackPlan(
                body["url"],
                str(body.get("scheme", "standard-webhooks")),
                str(body.get("secret", "")),
                str(body.get("when", "after")),
                options,
            )
        except ValueError as exc:
            return self._send(_json(400, {"error": str(exc)}))
        self.sim.callbacks = plan
        self._send(_json(200, {"callbacks": plan.url}))

    def _operation(self, op: str, body: Any, error: str) -> None:
        if op not in OPERATIONS:
            return self._send(_json(404, {"error": f"unknown operation {op!r}"}))
        rkey = body.get("reconciliation_key") if isinstance(body, dict) else None
        # settled percent-encodes a key that is not plain ASCII, and "%" itself
        # (``_wire.header_value``): decoded, the key is the ledger's own.
        raw_key = self.headers.get("Idempotency-Key") or None
        ikey = unquote(raw_key) if raw_key else None
        if not error and isinstance(body, dict) and "params" not in body:
            # A plain body (what a generic HTTP client sends): the body is the params.
            # The action is named by the idempotency key ("{action_id}:{attempt}"),
            # else an "action_id" field, else the reconciliation key.
            named = ikey.rpartition(":")[0] if ikey and ":" in ikey else None
            action_id = named or body.get("action_id") or rkey
            body = {"action_id": action_id, "params": body}
        if error or not isinstance(body, dict) or not isinstance(body.get("action_id"), str):
            return self._send(_json(400, {"error": error or "body needs an action_id string"}))
        if rkey is not None and not isinstance(rkey, str):
            return self._send(_json(400, {"error": "reconciliation_key must be a string or null"}))
        # The handler is the server's own part: it runs the server's step under its lock.
        outcome = self.sim._process(op, body["action_id"], rkey, ikey, body.get("params"))  # noqa: SLF001
        delay = self.sim.latency + outcome.delay + _seconds(self.headers.get("X-Sim-Latency"))
        if delay > 0:
            self.sim.pause(delay)  # outside the lock; stop() cuts it short
        self.sim._call_back(outcome.effect, "before")  # noqa: SLF001  (overtakes the reply)
        self._perform(outcome)
        self.wfile.flush()
        self.sim._call_back(outcome.effect, "after")  # noqa: SLF001  (the server's own step)

    # -- the wire ---------------------------------------------------------------------

    def _perform(self, outcome: _Outcome) -> None:
        if outcome.wire == "reply" and outcome.reply is not None:
            return self._send(outcome.reply)
        if outcome.wire == "hang":
            self.sim.pause(self.sim.hang)  # stop() cuts the hang short
        elif outcome.wire == "reset":
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RST_LINGER)
        elif outcome.wire == "garbage":
            return self._send(_Reply(200, b"<html>this is not json", "application/json"))
        elif outcome.wire == "badutf8":
            return self._send(
                _Reply(200, b'{"id": "\xff\xfe\xfd"}', "application/json; charset=utf-8")
            )
        elif outcome.wire == "huge":
            return self._send_huge()
        # drop, hang, reset: close without a reply (the server's shutdown_request does it).
        self.close_connection = True

    def _send(self, reply: _Reply) -> None:
        self.send_response(reply.code)
        if reply.code not in (204, 304):  # these may carry neither body nor length
            self.send_header("Content-Type", reply.content_type)
            self.send_header("Content-Length", str(len(reply.body)))
        self.end_headers()
        if reply.body and reply.code not in (204, 304):
            self.wfile.write(reply.body)

    def _send_huge(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(self.sim.huge_bytes))
        self.end_headers()
        for chunk in _huge_body(self.sim.huge_bytes):
            if self.sim.stopping:
                self.close_connection = True
                return
            self.wfile.write(chunk)

    def _read_body(self) -> bytes:
        length = self.headers.get("Content-Length")
        if not length or not length.isdigit():
            return b""
        return self.rfile.read(int(length))

    def _json_body(self) -> tuple[Any, str]:
        raw = self._read_body()
        if not raw:
            return None, "empty body"
        try:
            return json.loads(raw), ""
        except ValueError as exc:
            return None, f"body is not JSON: {exc}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m settled.providers.sim_server",
        description="Run the simulated provider on loopback until SIGTERM/SIGINT.",
    )
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--no-honour-keys", action="store_true", help="ignore Idempotency-Key")
    parser.add_argument("--lag", type=float, default=0.0, help="s before effects are visible")
    parser.add_argument("--hang", type=float, default=5.0, help="s a timeout fault holds on")
    parser.add_argument("--default-fault", default="ok", help="fault when a plan is empty")
    parser.add_argument("--latency", type=float, default=0.0, help="s before each answer")
    parser.add_argument("--callback-url", help="call back to this URL for each effect")
    parser.add_argument("--callback-scheme", default="standard-webhooks", choices=CALLBACK_SCHEMES)
    parser.add_argument(
        "--callback-secret", default="", help="the secret callbacks are signed with"
    )
    parser.add_argument("--callback-when", default="after", choices=CALLBACK_WHEN)
    parser.add_argument(
        "--callback-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="one of the scheme's own keys, as in settled.toml (e.g. header=X-Signature)",
    )
    args = parser.parse_args(argv)
    options = {k: v for k, _, v in (o.partition("=") for o in args.callback_option)}

    # A list, not a threading.Event: Event.set in a handler can wait forever on the
    # lock of the very Event.wait the signal interrupted.
    stop: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: stop.append(signum))
    try:
        callbacks = (
            CallbackPlan(
                args.callback_url,
                args.callback_scheme,
                args.callback_secret,
                args.callback_when,
                options,
            )
            if args.callback_url
            else None
        )
    except ValueError as exc:
        parser.error(str(exc))  # one line and exit 2, as for any other bad argument
    server = SimServer(
        port=args.port,
        honour_keys=not args.no_honour_keys,
        lag=args.lag,
        hang=args.hang,
        default_fault=args.default_fault,
        latency=args.latency,
        callbacks=callbacks,
    )
    with server:
        print(server.url, flush=True)
        while not stop:
            threading.Event().wait(0.2)  # clock.nap: no time.sleep in settled
    return 0


if __name__ == "__main__":
    sys.exit(main())
