"""OpenTelemetry traces, when ``opentelemetry-api`` is installed (``pip install
'settled[otel]'``); nothing at all when it is not.

Spans (docs/observability.md): ``settled.dispatch`` (one claimed attempt, its tries and
its outcome written), ``settled.try`` (one request of it), ``settled.check`` (one
query of the reconciler or of the check before a verdict), ``settled.callback`` (one
event a provider called back with), ``settled.verdict`` (a person's), each with
``settled.action_id``, ``settled.provider``, ``settled.operation``, ``settled.tier``
and ``settled.outcome``; and an HTTP client span for each request a built-in provider
makes, with the semantic conventions' ``http.request.method``, ``server.address``,
``server.port``, ``url.full`` (query values and user info replaced by ``REDACTED``)
and ``http.response.status_code`` (``error.type`` when no answer came). Each such
request carries the W3C ``traceparent`` of its span; ``settled serve`` continues the
trace of a caller that sent one.

The API is imported at the first span, not before: a process that makes none (every
CLI command that sends nothing) pays for no import, and without the package each
call here costs one attribute read. The SDK and its exporters are the application's
to set up, as OpenTelemetry intends for libraries; until one is, settled makes no
span and sends no header (each call here then costs a look at the global provider).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

_MISSING: Any = object()
_state: dict[str, Any] = {}  # "tracer": the API's tracer, or _MISSING without the package


def _tracer() -> Any:
    """The tracer, or None when spans would all be no-ops: the package is missing, or
    no SDK was set up (the global provider is still the API's placeholder), so that
    settled then skips the span machinery and the header entirely."""
    tracer = _state.get("tracer")
    if tracer is None:
        try:
            from opentelemetry import trace
        except ImportError:
            _state["tracer"] = _MISSING
            return None
        from importlib.metadata import version

        tracer = _state["tracer"] = trace.get_tracer("settled", version("settled"))
        _state["api"] = trace
        _state["idle"] = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
        # a provider named in the environment is made at the API's first look, only then
        _state["named"] = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ
    if tracer is _MISSING:
        return None
    api = _state.get("api")
    if api is None:
        return tracer
    if getattr(api, "_TRACER_PROVIDER", _MISSING) is None and not _state["named"]:
        return None  # none set up yet (the API's own test, without its look at os.environ)
    if isinstance(api.get_tracer_provider(), _state["idle"]):
        return None  # set up later, the next span finds it: the provider is read each time
    return tracer


def use(provider: Any) -> None:
    """Make spans with this ``TracerProvider`` instead of the global one (a test's
    in-memory exporter, an application that keeps settled's traces apart); None goes
    back to the global provider."""
    _state.clear()
    if provider is not None:
        from importlib.metadata import version

        _state["tracer"] = provider.get_tracer("settled", version("settled"))
        _state.pop("api", None)  # this provider, whatever the global one is


def enabled() -> bool:
    """Whether spans are made: the OpenTelemetry API is installed and a provider is
    set up (the application's SDK, or ``use``)."""
    return _tracer() is not None


_NO_SPAN = nullcontext(None)  # reusable: the block without a span


def span(
    name: str, attributes: Mapping[str, Any] | None = None, *, client: bool = False
) -> AbstractContextManager[Any]:
    """A span around the block (the current one's child), or None without the API.
    An exception that leaves the block is recorded on it and marks it an error."""
    tracer = _tracer()
    if tracer is None:
        return _NO_SPAN  # no generator made for a span that would do nothing
    return _span(tracer, name, attributes, client)


@contextmanager
def _span(
    tracer: Any, name: str, attributes: Mapping[str, Any] | None, client: bool
) -> Iterator[Any]:
    from opentelemetry.trace import SpanKind

    kind = SpanKind.CLIENT if client else SpanKind.INTERNAL
    with tracer.start_as_current_span(name, kind=kind, attributes=_clean(attributes)) as s:
        yield s


def note(s: Any, **attributes: Any) -> None:
    """Set attributes on a span from ``span`` (None: nothing to do); None values are
    left out."""
    if s is not None:
        s.set_attributes(_clean(attributes))


def failed(s: Any, why: str) -> None:
    """Mark a span an error, with a short description."""
    if s is not None:
        from opentelemetry.trace import Status, StatusCode

        s.set_status(Status(StatusCode.ERROR, why))


def inject(headers: MutableMapping[str, str]) -> None:
    """Add the current span's W3C ``traceparent`` (and ``tracestate``) to ``headers``."""
    if _tracer() is None:
        return
    from opentelemetry import propagate

    propagate.inject(headers)


@contextmanager
def continued(headers: Mapping[str, str]) -> Iterator[None]:
    """Within the block, the trace a caller's ``traceparent`` names is the current one
    (a malformed or absent header starts none: the block's spans are then roots)."""
    if _tracer() is None or "traceparent" not in headers:
        yield
        return
    from opentelemetry import context, propagate

    token = context.attach(propagate.extract(dict(headers)))
    try:
        yield
    finally:
        context.detach(token)


def record(action_id: str, provider: str, operation: str, tier: Any = None) -> dict[str, Any]:
    """The attributes that name an action on every span about it."""
    return {
        "settled.action_id": action_id,
        "settled.provider": provider,
        "settled.operation": operation,
        "settled.tier": None if tier is None else str(tier),
    }


def url_full(url: str) -> str:
    """``url.full`` as the semantic conventions want it: user info and the values of
    the query string replaced by ``REDACTED`` (a token in a URL never reaches a trace)."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "REDACTED:REDACTED@" + netloc.rsplit("@", 1)[1]
    query = parts.query
    if query:
        query = urlencode(
            [(k, "REDACTED") for k, _ in parse_qsl(query, keep_blank_values=True)], safe="=&"
        )
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def _clean(attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    return {
        k: (v if isinstance(v, (str, bool, int, float)) else str(v))
        for k, v in (attributes or {}).items()
        if v is not None
    }


__all__ = [
    "continued",
    "enabled",
    "failed",
    "inject",
    "note",
    "record",
    "span",
    "url_full",
    "use",
]
