"""``settled daemon --metrics HOST:PORT``: Prometheus metrics and a health check.

- ``/metrics``: ``settled_transitions_total{from_status,to_status,kind}`` (``kind="callback"``:
  a move a provider's callback made, when a pass matched a kept one or, in ``settled
  serve``, when the callback itself moved the record),
  ``settled_callbacks_total{provider,reason}`` (for a process that receives callbacks),
  ``settled_queue_depth{status,provider}`` (open records, as of the last pass; 0 for
  every open status of every configured provider and of every provider with records),
  ``settled_checks_failing{provider}`` (open records whose last check could not be
  made: a broken verifier, or a provider that asked for a pause),
  ``settled_provider_paused_seconds{provider}`` (how long every check of it has failed,
  ``settled.outage``), ``settled_provider_outage{provider}`` (1 once that lasted
  its ``outage_after``), ``settled_checks_total{result}`` (what each provider
  query observed; ``error`` when it could not observe anything),
  ``settled_dispatch_outcomes_total{outcome,status}`` (for a process that dispatches:
  ``settled serve``), ``settled_passes_total{result}``,
  ``settled_pass_duration_seconds`` (histogram),
  ``settled_last_successful_pass_timestamp_seconds`` and ``settled_healthy``.
- ``/healthz``: 200 while passes succeed; 503 before the first pass has finished and
  after a failed one. The body names the providers whose records cannot be checked
  now and the providers in an outage (a pass that runs is healthy even when a provider
  is down: the status stays 200).

prometheus_client is an optional extra (``pip install 'settled[metrics]'``): only a
daemon that exports metrics needs it. The HTTP server is the standard library's, so
that ``/healthz`` lives beside ``/metrics`` on one port.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .errors import InvalidInput
from .model import TERMINAL, Status

OPEN = tuple(s.value for s in Status if s not in TERMINAL)
INSTALL = "pip install 'settled[metrics]'"


def require() -> None:
    """Exit 1 naming the install command when prometheus_client is missing."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        raise InvalidInput(f"--metrics needs the prometheus_client package: {INSTALL}") from None


def parse_address(text: str) -> tuple[str, int]:
    """'127.0.0.1:9108', '[::1]:9108', 'localhost:9108' or ':9108' (all interfaces);
    port 0 takes a free port (the ``started`` line says which)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise InvalidInput(f"--metrics {text!r}: use HOST:PORT, e.g. 127.0.0.1:9108")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    return host or "0.0.0.0", int(port)  # noqa: S104 - ':PORT' asks for every interface


class Metrics:
    """``providers``: the configured ones, whose queue depth reads 0 rather than
    vanishing while they have no open record (with those the ledger has records of)."""

    def __init__(self, providers: Iterable[str] = ()) -> None:
        require()
        self.providers = frozenset(providers)
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.transitions = Counter(
            "settled_transitions",
            "Status moves this daemon made.",
            ["from_status", "to_status", "kind"],
            registry=r,
        )
        self.checks = Counter(
            "settled_checks",
            "Provider queries, by what they observed (error: nothing could be observed).",
            ["result"],
            registry=r,
        )
        self.passes = Counter(
            "settled_passes", "Reconciliation passes, by result.", ["result"], registry=r
        )
        self.callbacks = Counter(
            "settled_callbacks",
            "Provider callbacks received, by provider and what became of them (the reason "
            "code of settled.callbacks.Answer: matched, pending, duplicate, bad_signature…).",
            ["provider", "reason"],
            registry=r,
        )
        self.dispatches = Counter(
            "settled_dispatch_outcomes",
            "Dispatch and confirm calls this process answered, by what the call did "
            "(dispatched, recorded, already_completed, in_progress, blocked) and the "
            "action's status after it (a send the provider refused is FAILED, not a 201).",
            ["outcome", "status"],
            registry=r,
        )
        self.duration = Histogram(
            "settled_pass_duration_seconds",
            "How long a reconciliation pass took.",
            registry=r,
            buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900),
        )
        self.last_success = Gauge(
            "settled_last_successful_pass_timestamp_seconds",
            "Unix time at which the last successful pass ended.",
            registry=r,
        )
        self.healthy = Gauge(
            "settled_healthy", "1 while the last pass succeeded, else 0.", registry=r
        )
        self._queue: dict[tuple[str, str], int] = {}
        self._failing: dict[str, int] = {}
        # provider -> (seconds failing, an outage, why, since), as of the last pass
        self._outages: dict[str, tuple[float, bool, str, str]] = {}
        self._ok: bool | None = None  # None: no pass has finished yet
        self._why = "no pass has finished yet"
        r.register(_QueueCollector(lambda: (self._queue, self._failing)))
        r.register(_OutageCollector(lambda: (self._failing, self._outages)))
        for result in ("ok", "failed"):
            self.passes.labels(result)  # exported at 0 from the start
        self._server: ThreadingHTTPServer | None = None

    # -- what the sweeper reports
    def transition(self, ch: Any) -> None:
        self.transitions.labels(ch.from_status, ch.to_status, ch.kind).inc()
        if getattr(ch, "error", None) is not None:
            self.checks.labels("error").inc()
        elif ch.seen:
            self.checks.labels(ch.seen).inc()

    def callback(self, answer: Any, provider: str | None = None) -> None:
        """One answered callback request (``settled.callbacks.Answer``): each event of a
        batch by its own reason, a refused request by its reason, under ``provider``
        (default the answer's; a server passes a fixed label for a provider it does not
        know, so that a sender's path text never becomes a series). Each status move
        the callback made is a transition of kind ``callback``: "confirmed by callback"
        is ``settled_transitions_total{kind="callback",to_status="CONFIRMED"}``."""
        label = answer.provider if provider is None else provider
        counts = answer.counts or {answer.reason: 1}
        for reason, n in counts.items():
            self.callbacks.labels(label, reason).inc(n)
        for frm, to in getattr(answer, "moves", ()):
            self.transitions.labels(frm, to, "callback").inc()

    def dispatched(self, report: Any) -> None:
        """One dispatch (or confirm) call's answer (``settled.sending.Report``): its
        outcome and the action's status after it (``none`` without a record)."""
        rec = getattr(report, "record", None)
        status = str(rec.status) if rec is not None else "none"
        self.dispatches.labels(str(report.outcome), status).inc()

    def check(self, ch: Any, failed: bool) -> None:
        """A check that moved nothing: what it saw, or ``error`` when it could not see
        anything. A record that was not queried (a pause the provider asked for, a
        provider configured on another host) is no check."""
        if failed:
            self.checks.labels("error").inc()
        elif ch.seen is not None:
            self.checks.labels(ch.seen).inc()

    def pass_ended(self, ok: bool, seconds: float, ended_at: float, why: str = "") -> None:
        self.duration.observe(seconds)
        self.passes.labels("ok" if ok else "failed").inc()
        self.healthy.set(1 if ok else 0)
        if ok:
            self.last_success.set(ended_at)
        self._ok, self._why = ok, why

    def queue(
        self, counts: dict[tuple[str, str], int], failing: dict[str, int] | None = None
    ) -> None:
        """Records by (status, provider), and open records whose last check could not
        be made by provider, as the ledger counted them after a pass. Every open status
        of every known provider (configured, or with records in the ledger: records are
        never deleted) is a series, 0 when nothing is in it, and so is every known
        provider's failing count: a queue that empties reads 0 instead of disappearing
        (an alert on ``> 0`` would otherwise keep its last value, and ``absent()`` could
        not tell "empty" from "no daemon")."""
        failing = dict(failing or {})
        known = self.providers | {provider for _status, provider in counts} | set(failing)
        depth = {(status, p): 0 for status in OPEN for p in known}
        depth.update({k: n for k, n in counts.items() if k[0] in OPEN})
        # Replaced whole: a scrape sees one pass's figures.
        self._queue = depth
        self._failing = {**dict.fromkeys(known, 0), **failing}

    def outages(self, figures: dict[str, tuple[float, bool, str, str]]) -> None:
        """Each troubled provider's (seconds every check has failed, past its
        ``outage_after``, what the checks met, since when), as of the last pass
        (``Outages.figures``); every other known provider reads 0."""
        self._outages = dict(figures)

    def health(self) -> tuple[int, str]:
        """The status (200 while passes succeed) and a body that also names the
        providers whose records cannot be checked now (the status stays 200: the
        daemon is working; the monitors of the queue and the gauge page for those)."""
        broken = ""
        failing = {p: n for p, n in self._failing.items() if n}
        if failing:
            named = ", ".join(
                f"{p} ({n} record{'' if n == 1 else 's'})" for p, n in sorted(failing.items())
            )
            broken = f"cannot be checked now: {named}\n"
        for p, (seconds, loud, why, since) in sorted(self._outages.items()):
            if loud:
                broken += f"outage: {p} has failed every check for {seconds:.0f} s ({why} since {since})\n"
        if self._ok:
            return 200, "ok\n" + broken
        return 503, f"unhealthy: {self._why}\n" + broken

    # -- serving
    def serve(self, host: str, port: int) -> tuple[str, int]:
        """Listen now (so a taken port stops the daemon at start); serve in a thread."""
        from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

        metrics = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    code, body, ctype = 200, generate_latest(metrics.registry), CONTENT_TYPE_LATEST
                elif path == "/healthz":
                    code, text = metrics.health()
                    body, ctype = text.encode(), "text/plain; charset=utf-8"
                else:
                    code, body, ctype = 404, b"not found: try /metrics or /healthz\n", "text/plain"
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # scrapes every few seconds do not belong in the daemon's log

        try:
            self._server = ThreadingHTTPServer((host, port), Handler)
        except OSError as exc:
            raise InvalidInput(
                f"--metrics {host}:{port}: cannot listen: {exc.strerror or exc}"
            ) from None
        self._server.daemon_threads = True
        threading.Thread(
            target=self._server.serve_forever, name="settled-metrics", daemon=True
        ).start()
        bound = self._server.server_address
        return str(bound[0]), int(bound[1])

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class _QueueCollector:
    """Exports the figures of the last pass; ``read`` returns them as they now stand
    (queue depth by status and provider, failing checks by provider)."""

    def __init__(
        self, read: Callable[[], tuple[dict[tuple[str, str], int], dict[str, int]]]
    ) -> None:
        self.read = read

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        g = GaugeMetricFamily(
            "settled_queue_depth",
            "Open records by status and provider, as of the last pass.",
            labels=["status", "provider"],
        )
        queue, failing = self.read()
        for (status, provider), n in sorted(queue.items()):
            g.add_metric([status, provider], n)
        yield g
        f = GaugeMetricFamily(
            "settled_checks_failing",
            "Open records whose last check could not be made (provider unreachable or "
            "unusable), by provider, as of the last pass.",
            labels=["provider"],
        )
        for provider, n in sorted(failing.items()):
            f.add_metric([provider], n)
        yield f

    def describe(self) -> list[Any]:
        return []


class _OutageCollector:
    """``settled_provider_paused_seconds`` and ``settled_provider_outage`` for every known
    provider (0 while it answers), as of the last pass."""

    def __init__(
        self,
        read: Callable[[], tuple[dict[str, int], dict[str, tuple[float, bool, str, str]]]],
    ) -> None:
        self.read = read

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        failing, outages = self.read()
        known = sorted(set(failing) | set(outages))
        paused = GaugeMetricFamily(
            "settled_provider_paused_seconds",
            "Seconds every check of the provider has failed (it answered 429/503 or could "
            "not be reached), as of the last pass; 0 while it answers.",
            labels=["provider"],
        )
        down = GaugeMetricFamily(
            "settled_provider_outage",
            "1 once the provider's checks have failed for its outage_after, else 0.",
            labels=["provider"],
        )
        for provider in known:
            seconds, loud, _why, _since = outages.get(provider, (0.0, False, "", ""))
            paused.add_metric([provider], round(seconds, 3))
            down.add_metric([provider], 1 if loud else 0)
        yield paused
        yield down

    def describe(self) -> list[Any]:
        return []


__all__ = ["INSTALL", "Metrics", "parse_address", "require"]
