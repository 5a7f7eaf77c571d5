"""What the built-in HTTP providers share on the wire: one request, put on the wire
once within a total deadline, reported as what happened (``base.Wire``); reply bodies
read with a size cap; and a redactor that keeps secrets out of every string a
provider hands back.

Nothing here retries or decides what a reply means for an action.

**The total deadline.** httpx's timeouts bound each network operation: a reply
dripped one byte a second never trips a 2 s read timeout. Each try here has one
deadline for connect, write and read together. settled's own client (``make_client``)
enforces it inside the transport, where every socket operation gets the time that
is left (``DeadlineBackend``); with any other client the same bound is applied per
phase and checked between body chunks.

**Never sent.** A request that fails before its first byte is written (an invalid
URL, a header that cannot be encoded, a refused connection, a lapsed ``send_by``) is
``Wire.NOT_CONNECTED``: the provider never saw it. httpcore's trace hook tells the
moment the request headers start to be written; that is where ``send_by`` is checked
for the last time and ``written_at`` is taken.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import quote

import httpcore
import httpx

from .. import crashpoints, tracing
from ..clock import steady
from ._redact import Redactor
from .base import Wire

MAX_BODY = 1024 * 1024
TOO_BIG = f"reply larger than {MAX_BODY} bytes, not read"

# Raised before any byte of the request left this machine.
NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol)

# httpcore trace events that come right before the request's first byte is written.
_WRITE_STARTS = ("http11.send_request_headers.started", "http2.send_request_headers.started")
_HEADERS_WRITTEN = ("http11.send_request_headers.complete", "http2.send_request_headers.complete")


@dataclass(frozen=True)
class Exchange:
    """One request's fate. ``body`` is None when no status line came back, or when
    the reply was too large or unreadable (``problem`` says which)."""

    wire: Wire
    status_code: int | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes | None = None
    problem: str = ""
    written_at: float | None = None
    retry_after: float | None = None

    @property
    def ok(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code <= 299


class SendByPassed(Exception):
    """Raised from the trace hook to stop a request before its first byte."""


# -- the total deadline, inside the transport ---------------------------------------------

_LOCAL = threading.local()  # .deadline: the steady-clock instant this thread's try ends


def _left(exc: type[Exception]) -> float | None:
    deadline: float | None = getattr(_LOCAL, "deadline", None)
    if deadline is None:
        return None
    left = deadline - steady()
    if left <= 0:
        raise exc("the total deadline of this try has passed")
    return left


def _clamp(timeout: float | None, exc: type[Exception]) -> float | None:
    left = _left(exc)
    if left is None:
        return timeout
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    """A socket stream whose every read and write gets at most the time left."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _clamp(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _clamp(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self,
        ssl_context: Any,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        inner = self._inner.start_tls(
            ssl_context, server_hostname, _clamp(timeout, httpcore.ConnectTimeout)
        )
        return _DeadlineStream(inner)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's synchronous sockets, bounded by the calling thread's deadline."""

    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        stream = self._inner.connect_tcp(
            host, port, _clamp(timeout, httpcore.ConnectTimeout), local_address, socket_options
        )
        return _DeadlineStream(stream)

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        stream = self._inner.connect_unix_socket(
            path, _clamp(timeout, httpcore.ConnectTimeout), socket_options
        )
        return _DeadlineStream(stream)

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def deadline_transport(verify: Any) -> httpx.HTTPTransport:
    """An ``httpx.HTTPTransport`` (no proxies from the environment, HTTP/1.1, up to 100
    connections, all kept alive) whose sockets honour the total deadline of each try.

    httpx has no public way to hand its transport a network backend, so the pool it
    builds is swapped for an equal one that has ours; ``test_http_deadline`` proves
    the swap takes effect."""
    transport = httpx.HTTPTransport(verify=verify, trust_env=False)
    pool = transport._pool  # noqa: SLF001  (no public way, see above)
    if isinstance(pool, httpcore.ConnectionPool):
        # Bulk dispatch and concurrent checks share one client from up to 100 threads:
        # keep a connection alive for each (httpx keeps 20; past 20 threads, requests
        # would keep opening new connections).
        limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
        transport._pool = httpcore.ConnectionPool(  # noqa: SLF001  (the swap, see above)
            ssl_context=pool._ssl_context,  # noqa: SLF001  (the same TLS settings httpx chose)
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            http1=True,
            http2=False,
            network_backend=DeadlineBackend(),
        )
    return transport


# -- one request ------------------------------------------------------------------------------


class _Trace:
    """httpcore's trace hook for one try: the last ``send_by`` check, ``written_at``."""

    def __init__(self, send_by: float | None, chained: Callable[..., Any] | None) -> None:
        self.send_by = send_by
        self.chained = chained
        self.seen = False  # the transport traces at all (httpcore does; a mock does not)
        self.written_at: float | None = None
        self.headers_written = False

    def __call__(self, event: str, info: Mapping[str, Any]) -> None:
        self.seen = True
        if event in _WRITE_STARTS:
            crashpoints.hit("before_write")  # a pause here is what send_by is for
            now = steady()
            if self.send_by is not None and now >= self.send_by:
                raise SendByPassed(
                    f"the dispatcher's lease lapsed {now - self.send_by:.3f} s before "
                    "the request could be written"
                )
            self.written_at = now
        elif event in _HEADERS_WRITTEN:
            self.headers_written = True
        if self.chained is not None:
            self.chained(event, info)


def build(
    client: httpx.Client,
    method: str,
    url: str,
    *,
    headers: Mapping[str, str] | None = None,
    json_body: Any = None,
    content: bytes | None = None,
    params: Any = None,
) -> httpx.Request | str:
    """The request exactly as it would be sent, or why it cannot be built (nothing
    was sent: an invalid URL, a header value that cannot be encoded).

    Header values go as their Latin-1 bytes, exactly as given: httpx would take
    only ASCII, and nothing here re-encodes a value (a token's ``%2F`` stays
    ``%2F``)."""
    try:
        raw = {k: v.encode("latin-1") for k, v in (headers or {}).items()}
    except UnicodeEncodeError as exc:
        return f"the request cannot be encoded: a header value holds {exc.object[exc.start]!r}"
    kwargs: dict[str, Any] = {"headers": raw}
    if json_body is not None:
        kwargs["json"] = json_body
    elif content is not None:
        kwargs["content"] = content
    if params:
        kwargs["params"] = params
    try:
        return client.build_request(method, url, **kwargs)
    except (httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:
        return f"invalid URL: {describe(exc)}"
    except (UnicodeError, ValueError, TypeError) as exc:
        return f"the request cannot be encoded: {describe(exc)}"


def show(request: httpx.Request, redact: Redactor | None = None) -> dict[str, Any]:
    """A built request as ``settled providers render`` prints it: every header httpx
    will send (secrets as ``***``) and the body as text."""
    scrub = redact or Redactor()
    headers = [[k.decode("latin-1"), scrub(v.decode("latin-1"))] for k, v in request.headers.raw]
    body = request.content.decode("utf-8", "replace") if request.content else None
    return {
        "method": request.method,
        "url": scrub(str(request.url)),
        "headers": headers,
        "body": scrub(body) if body is not None else None,
    }


def exchange(  # noqa: PLR0913  (httpx.Client.build_request's options, passed through)
    client: httpx.Client,
    method: str,
    url: str,
    *,
    timeout: float,
    send_by: float | None = None,
    headers: Mapping[str, str] | None = None,
    json_body: Any = None,
    content: bytes | None = None,
    params: Any = None,
    extensions: Mapping[str, Any] | None = None,
    redact: Redactor | None = None,
) -> Exchange:
    """Build one request and put it on the wire; see ``send``."""
    scrub = redact or Redactor()
    built = build(
        client, method, url, headers=headers, json_body=json_body, content=content, params=params
    )
    if isinstance(built, str):
        return Exchange(Wire.NOT_CONNECTED, problem=scrub.clean("not sent: " + built))
    return send(
        client, built, timeout=timeout, send_by=send_by, extensions=extensions, redact=scrub
    )


def send(
    client: httpx.Client,
    request: httpx.Request,
    *,
    timeout: float,
    send_by: float | None = None,
    extensions: Mapping[str, Any] | None = None,
    redact: Redactor | None = None,
) -> Exchange:
    """Put one request on the wire within a total deadline of ``timeout`` seconds and
    report what happened; never raises for transport trouble. The request is not
    started once ``send_by`` (a ``settled.clock.steady()`` instant) has passed.

    With OpenTelemetry installed (``settled.tracing``), the request is an HTTP client
    span and carries its W3C ``traceparent``."""
    if not tracing.enabled():
        return _send(client, request, timeout, send_by, extensions, redact)
    scrub = redact or Redactor()
    url = request.url
    attributes = {
        "http.request.method": request.method,
        "server.address": url.host,
        "server.port": url.port or (443 if url.scheme == "https" else 80),
        "url.full": tracing.url_full(scrub(str(url))),
    }
    with tracing.span(request.method, attributes, client=True) as s:
        carrier: dict[str, str] = {}
        tracing.inject(carrier)
        for name, value in carrier.items():
            request.headers[name] = value
        ex = _send(client, request, timeout, send_by, extensions, scrub)
        if ex.status_code is not None:
            tracing.note(s, **{"http.response.status_code": ex.status_code})
        if ex.wire is not Wire.ANSWERED:
            found = _ERROR_TYPE.search(ex.problem or "")
            tracing.note(s, **{"error.type": found.group(1) if found else "_OTHER"})
            tracing.failed(s, ex.problem or str(ex.wire))
        elif ex.status_code is not None and ex.status_code >= 400:
            tracing.note(s, **{"error.type": str(ex.status_code)})
            tracing.failed(s, f"HTTP {ex.status_code}")
    return ex


_ERROR_TYPE = re.compile(r"\b([A-Z][A-Za-z0-9_]*(?:Error|Timeout|Exception|Passed))\b")


def _send(
    client: httpx.Client,
    request: httpx.Request,
    timeout: float,
    send_by: float | None,
    extensions: Mapping[str, Any] | None,
    redact: Redactor | None,
) -> Exchange:
    scrub = redact or Redactor()
    start = steady()
    if send_by is not None and start >= send_by:
        return Exchange(
            Wire.NOT_CONNECTED,
            problem=f"not sent: the dispatcher's lease lapsed {start - send_by:.3f} s before "
            "the request could leave",
        )
    deadline = start + timeout
    extra = dict(extensions or {})
    trace = _Trace(send_by, extra.pop("trace", None))
    request.extensions = {
        **request.extensions,
        **extra,
        "trace": trace,
        "timeout": httpx.Timeout(timeout).as_dict(),
    }
    outer = getattr(_LOCAL, "deadline", None)
    _LOCAL.deadline = deadline
    try:
        resp = client.send(request, stream=True)
        try:
            raw, problem = read_capped(resp, deadline)
        finally:
            resp.close()
    except SendByPassed as exc:
        return Exchange(Wire.NOT_CONNECTED, problem=scrub.clean(f"not sent: {exc}"))
    except NOT_SENT as exc:
        # Nothing left this machine: refused, unreachable, TLS refused, no free connection.
        return Exchange(Wire.NOT_CONNECTED, problem=scrub.clean(f"not sent: {describe(exc)}"))
    except httpx.TransportError as exc:
        unwritten = trace.seen and trace.written_at is None
        refused_locally = isinstance(exc, httpx.LocalProtocolError) and not trace.headers_written
        if unwritten or refused_locally:
            # h11 refused the request before writing it, or nothing was written at all.
            return Exchange(Wire.NOT_CONNECTED, problem=scrub.clean(f"not sent: {describe(exc)}"))
        # Sent, or maybe sent, and no status line came back.
        return Exchange(
            Wire.NO_ANSWER,
            problem=scrub.clean(describe(exc)),
            written_at=trace.written_at if trace.seen else start,
        )
    finally:
        _LOCAL.deadline = outer
    headers = dict(resp.headers)
    return Exchange(
        Wire.ANSWERED,
        resp.status_code,
        headers,
        raw,
        scrub.clean(problem),
        written_at=trace.written_at if trace.seen else start,
        retry_after=retry_after(resp.status_code, headers),
    )


def read_capped(resp: httpx.Response, deadline: float | None = None) -> tuple[bytes | None, str]:
    """The body, or ``(None, why)`` when it is larger than MAX_BODY, unreadable, or
    still arriving at ``deadline``.

    Stops reading at the cap, so a huge reply never sits in memory; leaving the
    ``stream`` block then closes the connection instead of draining it."""
    declared = resp.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY:
        return None, TOO_BIG
    buf = bytearray()
    try:
        for chunk in resp.iter_bytes():
            buf += chunk
            if len(buf) > MAX_BODY:
                return None, TOO_BIG
            if deadline is not None and steady() > deadline:
                return None, "reply body unreadable: the total deadline of this try passed"
    except (httpx.TransportError, httpx.DecodingError) as exc:
        return None, f"reply body unreadable: {describe(exc)}"
    return bytes(buf), ""


def retry_after(status: int | None, headers: Mapping[str, str]) -> float | None:
    """Seconds a 429 or 503 asks to wait (``Retry-After``: seconds or an HTTP date)."""
    if status not in (429, 503):
        return None
    value = next((v for k, v in headers.items() if k.lower() == "retry-after"), "").strip()
    if value.isdigit():
        return float(int(value))
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def parse_json(raw: bytes) -> tuple[Any, str]:
    try:
        return json.loads(raw), ""
    except UnicodeDecodeError:
        return None, "reply body is not valid UTF-8"
    except (ValueError, RecursionError):
        return None, "reply body is not JSON"


def describe(exc: BaseException) -> str:
    """``Type: message`` for an error. httpx puts no request headers in its messages,
    but h11 may quote one: callers pass the result through their ``Redactor``."""
    text = str(exc) or "no message"
    return f"{type(exc).__name__}: {text}"


# -- text that leaves a provider -----------------------------------------------------------


def excerpt(raw: bytes, limit: int = 200, redact: Redactor | None = None) -> str:
    """The start of a reply body as one line: secrets redacted in the *whole* body
    first, then control characters escaped, then cut to ``limit`` characters (a cut
    never leaves part of a secret behind)."""
    text = raw[: MAX_BODY + 1].decode("utf-8", "replace")
    cleaned = (redact or Redactor()).clean(text)
    return cleaned if len(cleaned) <= limit else cleaned[:limit] + "…"


def header_value(text: str) -> str:
    """``text`` as an HTTP header value: unchanged when it is visible ASCII (and
    spaces) without ``%``; otherwise ``%`` and every character outside that range are
    percent-encoded as UTF-8 (``café-42:1`` → ``caf%C3%A9-42:1``).

    Percent-encoding keeps the value ASCII, deterministic (the same key on every
    repeat, which deduplication needs) and injective: ``%`` itself is encoded, so two
    different ids never become one key. RFC 8187's ``UTF-8''…`` form is for header
    *parameters*, which an idempotency key is not."""
    if all(0x20 <= ord(c) <= 0x7E for c in text) and "%" not in text:
        return text
    return quote(text, safe="".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%"))
