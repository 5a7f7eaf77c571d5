"""Stand-ins for the cookbook's providers: real HTTP/1.1 servers on 127.0.0.1 that
answer as each provider's own documentation says, failure modes included (the error
inside a 200, a temporary failure, a 202 with no body, a search that lags, a 404 from
the wrong host, a duplicate id refused with 409). Each keeps the ground truth of what
it did (``effects``) and every request it got (``requests``), so a test checks what
settled recorded against what happened.

A stand-in is a ``StandIn`` (the server) around one provider object whose ``handle``
maps a ``Call`` to a ``Reply``; its ``plan`` holds what the next sends should meet.

Where the provider calls back (a webhook), its ``hook`` (a ``Hook``) queues each event
as the provider's docs shape it, when it happens; ``hook.flush()`` posts them to the
receiver over real HTTP, signed by the scheme's own signer (``Scheme.sign``, the class
settled verifies with), as late as the provider would. Standard library only, like
the sim, besides that signer.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar
from urllib.parse import parse_qs, urlsplit

from settled.callbacks.schemes import SCHEMES, Message


@dataclass
class Call:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes
    url: str = ""

    def json(self) -> Any:
        return json.loads(self.body or b"null")

    def form(self) -> dict[str, list[str]]:
        return parse_qs(self.body.decode(), keep_blank_values=True)

    def q(self, name: str, default: str = "") -> str:
        return self.query.get(name, [default])[0]

    def header(self, name: str) -> str:
        return next((v for k, v in self.headers.items() if k.lower() == name.lower()), "")


@dataclass
class Reply:
    status: int
    body: Any = None  # JSON, or bytes as they are
    headers: dict[str, str] = field(default_factory=dict)


def ok(body: Any, status: int = 200, **headers: str) -> Reply:
    return Reply(status, body, dict(headers))


class StandIn:
    """One host: a threaded HTTP server on 127.0.0.1 that hands each request to
    ``handle`` (under a lock: a provider's state changes one request at a time)."""

    def __init__(self, handle: Callable[[Call], Reply]) -> None:
        self.handle = handle
        self.requests: list[Call] = []
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                return

            def _any(self) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(size) if size else b""
                parts = urlsplit(self.path)
                call = Call(
                    self.command,
                    parts.path,
                    parse_qs(parts.query, keep_blank_values=True),
                    dict(self.headers.items()),
                    body,
                    url=f"{outer.url}{self.path}",
                )
                with outer._lock:
                    outer.requests.append(call)
                    reply = outer.handle(call)
                raw = (
                    reply.body
                    if isinstance(reply.body, bytes)
                    else b""
                    if reply.body is None
                    else json.dumps(reply.body).encode()
                )
                self.send_response(reply.status)
                if reply.body is not None and not isinstance(reply.body, bytes):
                    self.send_header("Content-Type", "application/json; charset=utf-8")
                for k, v in reply.headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _any

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def sent(self, method: str = "POST") -> list[Call]:
        with self._lock:
            return [c for c in self.requests if c.method == method]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


@contextmanager
def serving(*handles: Callable[[Call], Reply]) -> Iterator[list[StandIn]]:
    hosts = [StandIn(h) for h in handles]
    try:
        yield hosts
    finally:
        for h in hosts:
            h.close()


def not_found(body: Any = None) -> Reply:
    return Reply(404, body if body is not None else {"error": "not found"})


# -- webhooks ---------------------------------------------------------------------------------


@dataclass
class Posted:
    """One webhook as it went out, and what the receiver answered."""

    body: bytes
    headers: dict[str, str]
    status: int
    answer: Any


class Hook:
    """A provider's webhooks: each event queued as it happens (``queue``), posted by
    ``flush`` to ``url``, signed by ``scheme``'s own signer with every one of
    ``secrets``. Several secrets give one signature each in one header, comma
    separated, as Stripe and PagerDuty sign while a secret is rolled. ``batch``: the
    queued events go out together, as one JSON array (SendGrid)."""

    def __init__(self, scheme: str, *secrets: str, batch: bool = False) -> None:
        self.signer = SCHEMES[scheme]()
        self.secrets = secrets
        self.batch = batch
        self.url = ""  # the receiver's, once it listens
        self.queue: list[tuple[Any, str, dict[str, str]]] = []
        self.posted: list[Posted] = []

    def enqueue(self, payload: Any, event_id: str = "", **headers: str) -> None:
        """An event to send: its JSON body, the id the scheme carries outside the body
        (a header, a token) and the provider's other headers."""
        self.queue.append((payload, event_id, headers))

    def flush(self, count: int | None = None) -> list[Posted]:
        """Post the first ``count`` queued events (all by default), oldest first."""
        take = self.queue[: len(self.queue) if count is None else count]
        del self.queue[: len(take)]
        if self.batch and take:
            merged = {k: v for _, _, h in take for k, v in h.items()}
            return [self.post([p for p, _, _ in take], take[0][1], **merged)]
        return [self.post(p, eid, **h) for p, eid, h in take]

    def post(self, payload: Any, event_id: str = "", **headers: str) -> Posted:
        body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        message = Message(body, {"Content-Type": "application/json", **headers})
        now = time.time()
        signed = [
            self.signer.sign(secret, message, url=self.url, now=now, event_id=event_id)
            for secret in self.secrets
        ]
        sent = signed[0]
        out = dict(sent.headers)
        for other in signed[1:]:
            for name, value in other.headers.items():
                if out.get(name) != value:  # each signature once, the shared parts once
                    parts = [*out[name].split(","), *value.split(",")]
                    out[name] = ",".join(dict.fromkeys(parts))
        return self.send(sent.body, out)

    def again(self, posted: Posted, **headers: str) -> Posted:
        """A delivery sent once more, byte for byte (a retry), with ``headers`` changed
        (another subscription's delivery of the same event)."""
        return self.send(posted.body, {**posted.headers, **headers})

    def send(self, body: bytes, headers: Mapping[str, str]) -> Posted:
        assert self.url, "the hook's receiver has no URL yet"
        request = urllib.request.Request(self.url, data=body, headers=dict(headers), method="POST")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:  # loopback only
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        answer = json.loads(raw) if raw else None
        posted = Posted(body, dict(headers), status, answer)
        self.posted.append(posted)
        return posted


# -- Slack: chat.postMessage, conversations.history -----------------------------------------


class Slack:
    """Slack's Web API answers HTTP 200 for errors too: ``{"ok": false, "error": ...}``.
    ``internal_error`` and ``fatal_error`` may come after the message was posted (Slack's
    docs say so), and this stand-in posts it first when planned so. History pages newest
    first with ``response_metadata.next_cursor``. A message posted with metadata is
    announced to the Events API's Request URL as ``message_metadata_posted`` (``hook``)."""

    def __init__(self, hook: Hook | None = None) -> None:
        self.plan: list[str] = []  # per send: "ok", or an error code ("+error": posted first)
        self.messages: list[dict[str, Any]] = []
        self.page_size = 2
        self.hook = hook

    @property
    def effects(self) -> list[dict[str, Any]]:
        return self.messages

    def handle(self, c: Call) -> Reply:
        if c.header("authorization") != "Bearer xoxb-test-token":
            return ok({"ok": False, "error": "invalid_auth"})
        if c.path == "/api/chat.postMessage" and c.method == "POST":
            step = self.plan.pop(0) if self.plan else "ok"
            body = c.json()
            if step.startswith("+") or step == "ok":
                ts = f"{1700000000 + len(self.messages)}.{len(self.messages):06d}"
                msg = {"type": "message", "ts": ts, "text": body.get("text", "")}
                if "metadata" in body:
                    msg["metadata"] = body["metadata"]
                self.messages.append({"channel": body.get("channel"), **msg})
                self._announce(body.get("channel"), msg)
                if step == "ok":
                    return ok(
                        {"ok": True, "channel": body.get("channel"), "ts": ts, "message": msg}
                    )
                return ok({"ok": False, "error": step[1:]})
            return ok({"ok": False, "error": step})
        if c.path == "/api/conversations.history" and c.method == "GET":
            channel = c.q("channel")
            newest_first = [m for m in reversed(self.messages) if m["channel"] == channel]
            start = int(c.q("cursor") or 0)
            page = newest_first[start : start + self.page_size]
            shown = [
                {
                    k: v
                    for k, v in m.items()
                    if k != "channel" and (k != "metadata" or c.q("include_all_metadata") == "true")
                }
                for m in page
            ]
            more = start + self.page_size < len(newest_first)
            meta = {"next_cursor": str(start + self.page_size) if more else ""}
            return ok({"ok": True, "messages": shown, "has_more": more, "response_metadata": meta})
        return ok({"ok": False, "error": "unknown_method"})

    def _announce(self, channel: str | None, msg: dict[str, Any]) -> None:
        """The Events API's ``message_metadata_posted``, in its ``event_callback``
        wrapper, as Slack's event reference shows it."""
        if self.hook is None or "metadata" not in msg:
            return
        self.hook.enqueue(
            {
                "token": "XXYYZZ",
                "team_id": "T123ABC456",
                "api_app_id": "A123ABC456",
                "event": {
                    "type": "message_metadata_posted",
                    "app_id": "A123ABC456",
                    "bot_id": "B123ABC456",
                    "user_id": "U123ABC456",
                    "team_id": "T123ABC456",
                    "channel_id": channel,
                    "metadata": msg["metadata"],
                    "message_ts": msg["ts"],
                    "event_ts": msg["ts"],
                },
                "type": "event_callback",
                "event_id": "Ev" + uuid.uuid4().hex[:10].upper(),
                "event_time": int(float(msg["ts"])),
            }
        )


# -- Mailgun: messages, events -----------------------------------------------------------------


class Mailgun:
    """``POST /v3/{domain}/messages`` queues (``200 {"id": "<…>", "message": "Queued. Thank
    you."}``); the events log shows what happened later, and lags: an event is listed
    only ``lag`` searches after it happened. A failure with ``severity = temporary``
    is retried by Mailgun and may still be delivered. Each event is also posted to the
    webhook (``hook``) as ``{"event-data": …}``, the signature beside it in the body
    under a fresh token."""

    def __init__(self, domain: str = "mg.example.com", hook: Hook | None = None) -> None:
        self.hook = hook
        self.domain = domain
        self.plan: list[list[str]] = []  # per send: the events it goes through
        self.events: list[dict[str, Any]] = []
        self.lag = 1
        self.searches = 0
        self.sent: list[dict[str, Any]] = []

    @property
    def effects(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == "delivered"]

    def handle(self, c: Call) -> Reply:
        if not c.header("authorization").startswith("Basic "):
            return Reply(401, b"Forbidden")
        if c.method == "POST" and c.path == f"/v3/{self.domain}/messages":
            form = c.form()
            mid = f"{uuid.uuid4().hex[:20]}@{self.domain}"
            user = {k[2:]: v[0] for k, v in form.items() if k.startswith("v:")}
            self.sent.append({"id": mid, "form": form})
            steps = self.plan.pop(0) if self.plan else ["delivered"]
            for i, step in enumerate(["accepted", *steps]):
                event, _, severity = step.partition(":")
                item: dict[str, Any] = {
                    "id": uuid.uuid4().hex[:22],
                    "event": event,
                    "timestamp": 1700000000.0 + len(self.events) + i,
                    "recipient": form.get("to", [""])[0],
                    "message": {"headers": {"message-id": mid}},
                    "user-variables": user,
                    "visible_from": self.searches + self.lag,
                }
                if severity:
                    item["severity"] = severity
                self.events.append(item)
                if self.hook is not None:
                    data = {k: v for k, v in item.items() if k != "visible_from"}
                    self.hook.enqueue(
                        {"event-data": data}, uuid.uuid4().hex + uuid.uuid4().hex[:18]
                    )
            return ok({"id": f"<{mid}>", "message": "Queued. Thank you."})
        if c.method == "GET" and c.path == f"/v3/{self.domain}/events":
            self.searches += 1
            seen = [
                {k: v for k, v in e.items() if k != "visible_from"}
                for e in self.events
                if e["visible_from"] < self.searches
            ]
            page = int(c.q("page") or 0)
            items = seen[page * 3 : page * 3 + 3]
            nxt = f"{c.url.split('?')[0]}?page={page + 1}"
            return ok({"items": items, "paging": {"next": nxt, "previous": c.url}})
        return not_found({"message": "not found"})


# -- SendGrid: mail/send, email activity -------------------------------------------------------


class SendGrid:
    """``POST /v3/mail/send`` answers ``202 Accepted`` with an empty body and the message
    id in ``X-Message-Id``; the activity feed lists messages by recipient and status
    and carries no custom args, so an earlier mail to the same address looks the same.
    The Event Webhook (``hook``, a batch) carries each event with the custom args as
    its own top-level fields."""

    EVENTS: ClassVar[dict[str, list[str]]] = {  # what a message goes through, by its plan
        "delivered": ["processed", "delivered"],
        "bounce": ["processed", "bounce"],
        "dropped": ["dropped"],
        "lagging": ["dropped"],
    }

    def __init__(self, hook: Hook | None = None) -> None:
        # per send: "delivered" | "bounce" | "dropped" | "lagging" (dropped, not listed yet)
        self.plan: list[str] = []
        self.messages: list[dict[str, Any]] = []
        self.hook = hook

    @property
    def effects(self) -> list[dict[str, Any]]:
        return [m for m in self.messages if m["status"] == "delivered"]

    def handle(self, c: Call) -> Reply:
        if c.header("authorization") != "Bearer SG.test-key":
            return Reply(401, {"errors": [{"message": "authorization required"}]})
        if c.method == "POST" and c.path == "/v3/mail/send":
            body = c.json()
            mid = uuid.uuid4().hex[:22]
            to = body["personalizations"][0]["to"][0]["email"]
            status = self.plan.pop(0) if self.plan else "delivered"
            self.messages.append(
                {
                    "msg_id": f"{mid}.filter0001.1.0",
                    "to_email": to,
                    "status": status,
                    "custom_args": body["personalizations"][0].get("custom_args", {}),
                }
            )
            self._events(self.messages[-1])
            return Reply(202, None, {"X-Message-Id": mid})
        if c.method == "GET" and c.path == "/v3/messages":
            query = c.q("query")
            items = [
                {k: v for k, v in m.items() if k != "custom_args"}
                for m in self.messages
                if f'to_email="{m["to_email"]}"' in query and m["status"] != "lagging"
            ]
            return ok({"messages": items})
        return not_found({"errors": [{"message": "not found"}]})

    def _events(self, message: dict[str, Any]) -> None:
        """The Event Webhook's events for one message, as SendGrid's reference shows
        them (a bounce carries its ``type`` and SMTP ``reason``)."""
        if self.hook is None:
            return
        for n, event in enumerate(self.EVENTS[message["status"]]):
            item: dict[str, Any] = {
                "email": message["to_email"],
                "timestamp": 1700000000 + len(self.messages) * 10 + n,
                "smtp-id": f"<{message['msg_id']}@ismtpd0001>",
                "event": event,
                "sg_event_id": uuid.uuid4().hex[:22],
                "sg_message_id": message["msg_id"],
                **message["custom_args"],
            }
            if event == "bounce":
                item |= {"type": "bounce", "status": "5.1.1", "reason": "550 5.1.1 no mailbox"}
            if event == "dropped":
                item["reason"] = "Bounced Address"
            self.hook.enqueue(item)


# -- PagerDuty: the Events API host and the REST API host ------------------------------------


class PagerDuty:
    """Events v2 on one host (``POST /v2/enqueue`` → ``202 {"status": "success",
    "dedup_key": …}``; an event with a known dedup_key joins its alert), incidents on
    another (``GET /incidents?incident_key=…``, a token of its own). The events host
    answers 404 to anything else, the REST host its own not-found shape. A new
    incident is announced to the v3 webhook subscription (``hook``) as
    ``incident.triggered``."""

    def __init__(self, hook: Hook | None = None) -> None:
        self.incidents: list[dict[str, Any]] = []
        self.plan: list[str] = []  # per event: "ok" | "invalid"
        self.hook = hook

    @property
    def effects(self) -> list[dict[str, Any]]:
        return self.incidents

    def events(self, c: Call) -> Reply:
        if c.method == "POST" and c.path == "/v2/enqueue":
            body = c.json()
            if body.get("routing_key") != "R0UTINGKEY0000000000000000000000":
                return Reply(
                    400,
                    {
                        "status": "invalid event",
                        "message": "Event object is invalid",
                        "errors": ["Invalid routing key"],
                    },
                )
            if (self.plan.pop(0) if self.plan else "ok") == "invalid":
                return Reply(
                    400,
                    {
                        "status": "invalid event",
                        "message": "Event object is invalid",
                        "errors": ["'payload.summary' is missing"],
                    },
                )
            key = body.get("dedup_key") or uuid.uuid4().hex
            if not any(i["incident_key"] == key for i in self.incidents):
                self.incidents.append(
                    {
                        "id": "P" + uuid.uuid4().hex[:6].upper(),
                        "incident_key": key,
                        "status": "triggered",
                        "title": body.get("payload", {}).get("summary", ""),
                    }
                )
                self._announce(self.incidents[-1])
            return Reply(202, {"status": "success", "message": "Event processed", "dedup_key": key})
        return Reply(
            404, b"<html><body>404 page not found</body></html>", {"Content-Type": "text/html"}
        )

    def rest(self, c: Call) -> Reply:
        if c.header("authorization") != "Token token=pd-rest-token":
            return Reply(401, {"error": {"message": "Unauthorized", "code": 2006}})
        if c.method == "GET" and c.path == "/incidents":
            key = c.q("incident_key")
            found = [i for i in self.incidents if i["incident_key"] == key]
            return ok({"incidents": found, "limit": 25, "offset": 0, "more": False, "total": None})
        return Reply(404, {"error": {"message": "Not Found", "code": 2100}})

    def _announce(self, incident: dict[str, Any]) -> None:
        """A v3 webhook event, as PagerDuty's webhook reference shapes it."""
        if self.hook is None:
            return
        self.hook.enqueue(
            {
                "event": {
                    "id": "01" + uuid.uuid4().hex[:24].upper(),
                    "event_type": "incident.triggered",
                    "resource_type": "incident",
                    "occurred_at": "2026-01-01T00:00:00.000Z",
                    "agent": None,
                    "client": None,
                    "data": {
                        "id": incident["id"],
                        "type": "incident",
                        "self": f"https://api.pagerduty.com/incidents/{incident['id']}",
                        "number": len(self.incidents),
                        "status": incident["status"],
                        "incident_key": incident["incident_key"],
                        "title": incident["title"],
                    },
                }
            }
        )


# -- Stripe: PaymentIntents and their search ---------------------------------------------------


class Stripe:
    """``POST /v1/payment_intents`` (form, ``Idempotency-Key`` replayed for 24 h); a
    declined card is ``402`` with the error; the search API lags behind writes. Each
    change of an intent is an event for the webhook endpoint (``hook``):
    ``payment_intent.created``, then ``.processing``, ``.succeeded``,
    ``.payment_failed`` or ``.canceled`` (``settle`` moves a processing intent on)."""

    EVENTS: ClassVar[dict[str, str]] = {
        "processing": "processing",
        "succeeded": "succeeded",
        "requires_payment_method": "payment_failed",
        "canceled": "canceled",
    }

    def __init__(self, hook: Hook | None = None) -> None:
        self.intents: list[dict[str, Any]] = []
        self.keys: dict[str, Reply] = {}
        self.plan: list[str] = []  # per new key: "succeeded" | "processing" | "declined"
        self.lag = 1
        self.searches = 0
        self.hook = hook

    @property
    def effects(self) -> list[dict[str, Any]]:
        return [i for i in self.intents if i["status"] == "succeeded"]

    def handle(self, c: Call) -> Reply:
        if c.header("authorization") != "Bearer sk_test_standin":
            return Reply(
                401,
                {"error": {"type": "invalid_request_error", "message": "Invalid API Key provided"}},
            )
        if c.method == "POST" and c.path == "/v1/payment_intents":
            key = c.header("idempotency-key")
            if key in self.keys:
                return self.keys[key]
            form = c.form()
            step = self.plan.pop(0) if self.plan else "succeeded"
            intent = {
                "id": "pi_" + uuid.uuid4().hex[:24],
                "object": "payment_intent",
                "amount": int(form["amount"][0]),
                "currency": form["currency"][0],
                "status": "requires_payment_method" if step == "declined" else step,
                "metadata": {k[9:-1]: v[0] for k, v in form.items() if k.startswith("metadata[")},
                "searchable_from": self.searches + self.lag,
            }
            self.intents.append(intent)
            self._event(intent, "created")
            self._event(intent, self.EVENTS.get(str(intent["status"]), ""))
            shown = {k: v for k, v in intent.items() if k != "searchable_from"}
            reply = (
                Reply(
                    402,
                    {
                        "error": {
                            "type": "card_error",
                            "code": "card_declined",
                            "decline_code": "generic_decline",
                            "payment_intent": shown,
                        }
                    },
                )
                if step == "declined"
                else ok(shown)
            )
            self.keys[key] = reply
            return reply
        if c.method == "GET" and c.path == "/v1/payment_intents/search":
            self.searches += 1
            query = c.q("query")
            data = [
                {k: v for k, v in i.items() if k != "searchable_from"}
                for i in self.intents
                if i["searchable_from"] < self.searches
                and any(f"metadata['{k}']:'{v}'" == query for k, v in i["metadata"].items())
            ]
            return ok(
                {
                    "object": "search_result",
                    "data": data,
                    "has_more": False,
                    "next_page": None,
                    "url": "/v1/payment_intents/search",
                }
            )
        return Reply(
            404,
            {
                "error": {
                    "type": "invalid_request_error",
                    "code": "resource_missing",
                    "message": "No such payment_intent",
                }
            },
        )

    def settle(self, intent_id: str, status: str) -> None:
        """A processing intent reaches ``status`` later (a bank debit clears, or not)."""
        intent = next(i for i in self.intents if i["id"] == intent_id)
        intent["status"] = status
        self._event(intent, self.EVENTS[status])

    def _event(self, intent: dict[str, Any], kind: str) -> None:
        """An Event object for the webhook endpoint, as Stripe's API reference shows it."""
        if self.hook is None or not kind:
            return
        shown = {k: v for k, v in intent.items() if k != "searchable_from"}
        self.hook.enqueue(
            {
                "id": "evt_" + uuid.uuid4().hex[:24],
                "object": "event",
                "api_version": "2024-06-20",
                "created": 1700000000 + len(self.intents),
                "type": f"payment_intent.{kind}",
                "data": {"object": shown},
            }
        )


# -- GitHub: check runs --------------------------------------------------------------------------


class GitHubChecks:
    """``POST /repos/{owner}/{repo}/check-runs`` → ``201`` with the run (its
    ``external_id`` is ours); no idempotency: a repeat makes a second run. Runs of a
    commit are listed under ``/commits/{ref}/check-runs``."""

    def __init__(self) -> None:
        self.runs: list[dict[str, Any]] = []
        self.plan: list[str] = []  # per send: "ok" | "lost" (made, the reply dropped: 502)

    @property
    def effects(self) -> list[dict[str, Any]]:
        return self.runs

    def handle(self, c: Call) -> Reply:
        parts = c.path.strip("/").split("/")
        if c.method == "POST" and len(parts) == 4 and parts[3] == "check-runs":
            body = c.json()
            run = {
                "id": 4 + len(self.runs),
                "head_sha": body["head_sha"],
                "name": body["name"],
                "external_id": body.get("external_id", ""),
                "status": body.get("status", "queued"),
                "conclusion": body.get("conclusion"),
            }
            self.runs.append(run)
            if (self.plan.pop(0) if self.plan else "ok") == "lost":
                return Reply(502, {"message": "Server Error"})
            return ok(run, 201)
        if c.method == "GET" and len(parts) == 6 and parts[5] == "check-runs":
            runs = [r for r in self.runs if r["head_sha"] == parts[4]]
            return ok({"total_count": len(runs), "check_runs": runs})
        if c.method == "POST" and len(parts) == 4 and parts[3] == "issues":
            return ok({"id": 1, "number": 1347, "state": "open", "title": c.json()["title"]}, 201)
        return Reply(
            404, {"message": "Not Found", "documentation_url": "https://docs.github.com/rest"}
        )


# -- Google Calendar: events.insert with a client-chosen id -----------------------------------


class GoogleCalendar:
    """``POST /calendar/v3/calendars/{id}/events`` with a client-chosen ``id``
    (base32hex, 5-1024 characters, else 400); a second insert with the same id is
    ``409 duplicate``; ``GET …/events/{eventId}`` reads it back, 404 ``notFound``."""

    ALPHABET = frozenset("0123456789abcdefghijklmnopqrstuv")

    def __init__(self) -> None:
        self.events: dict[str, dict[str, Any]] = {}
        self.plan: list[str] = []  # per insert: "ok" | "lost" (made, the reply dropped: 503)

    @property
    def effects(self) -> list[dict[str, Any]]:
        return list(self.events.values())

    def handle(self, c: Call) -> Reply:
        parts = c.path.strip("/").split("/")
        if c.method == "POST" and parts[-1] == "events":
            body = c.json()
            eid = body.get("id", "")
            if not (5 <= len(eid) <= 1024 and set(eid) <= self.ALPHABET):
                return Reply(
                    400,
                    {
                        "error": {
                            "code": 400,
                            "message": "Invalid resource id value.",
                            "errors": [{"reason": "invalid"}],
                        }
                    },
                )
            if eid in self.events:
                return Reply(
                    409,
                    {
                        "error": {
                            "code": 409,
                            "message": "The requested identifier already exists.",
                            "errors": [{"reason": "duplicate"}],
                        }
                    },
                )
            event = {
                "kind": "calendar#event",
                "id": eid,
                "status": "confirmed",
                "summary": body.get("summary"),
                "start": body.get("start"),
                "end": body.get("end"),
            }
            self.events[eid] = event
            if (self.plan.pop(0) if self.plan else "ok") == "lost":
                return Reply(503, {"error": {"code": 503, "message": "Backend Error"}})
            return ok(event)
        if c.method == "GET" and parts[-2] == "events":
            event = self.events.get(parts[-1])
            if event is None:
                return Reply(
                    404,
                    {
                        "error": {
                            "code": 404,
                            "message": "Not Found",
                            "errors": [{"domain": "global", "reason": "notFound"}],
                        }
                    },
                )
            return ok(event)
        return Reply(
            404,
            {"error": {"code": 404, "message": "Not Found", "errors": [{"reason": "notFound"}]}},
        )


# -- Microsoft Graph: sendMail and Sent Items ----------------------------------------------------


class Graph:
    """``POST /v1.0/users/{id}/sendMail`` → ``202 Accepted``, no body; the sent message
    shows in Sent Items later, with its single-value extended properties when asked
    (``$expand``), as a list in ``value`` paged by ``@odata.nextLink``."""

    PROP = "String {00020329-0000-0000-C000-000000000046} Name settled_key"

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.lag = 1
        self.reads = 0

    @property
    def effects(self) -> list[dict[str, Any]]:
        return self.sent

    def handle(self, c: Call) -> Reply:
        if c.method == "POST" and c.path.endswith("/sendMail"):
            msg = c.json()["message"]
            self.sent.append(
                {
                    "id": "AAMk" + uuid.uuid4().hex[:16],
                    "subject": msg.get("subject"),
                    "singleValueExtendedProperties": msg.get("singleValueExtendedProperties", []),
                    "visible_from": self.reads + self.lag,
                }
            )
            return Reply(202, None)
        if c.method == "GET" and c.path.endswith("/mailFolders/SentItems/messages"):
            self.reads += 1
            seen = [m for m in self.sent if m["visible_from"] < self.reads]
            skip = int(c.q("$skip") or 0)
            page = seen[skip : skip + 2]
            value = [
                {
                    k: v
                    for k, v in m.items()
                    if k != "visible_from"
                    and (k != "singleValueExtendedProperties" or c.q("$expand"))
                }
                for m in page
            ]
            out: dict[str, Any] = {"value": value}
            if skip + 2 < len(seen):
                out["@odata.nextLink"] = (
                    f"{c.url.split('?')[0]}?$expand={c.q('$expand')}&$skip={skip + 2}"
                )
            return ok(out)
        return Reply(
            404,
            {
                "error": {
                    "code": "ErrorItemNotFound",
                    "message": "The specified object was not found in the store.",
                }
            },
        )


# -- Shopify: orders --------------------------------------------------------------------------------


class Shopify:
    """``POST /admin/api/2024-07/orders.json`` → ``201 {"order": …}``, no idempotency
    key; orders are listed newest first, paged by a ``Link`` header (``rel="next"``).
    A new order is delivered to the ``orders/create`` subscription (``hook``): the order
    as the body, with the headers Shopify's delivery reference lists."""

    def __init__(self, hook: Hook | None = None) -> None:
        self.orders: list[dict[str, Any]] = []
        self.plan: list[str] = []  # per send: "ok" | "lost" (made, the reply dropped: 504)
        self.hook = hook

    @property
    def effects(self) -> list[dict[str, Any]]:
        return self.orders

    def handle(self, c: Call) -> Reply:
        if c.header("x-shopify-access-token") != "shpat_standin":
            return Reply(401, {"errors": "[API] Invalid API key or access token"})
        if c.method == "POST" and c.path == "/admin/api/2024-07/orders.json":
            order = dict(c.json()["order"])
            order["id"] = 450789469 + len(self.orders)
            self.orders.append(order)
            if self.hook is not None:
                self.hook.enqueue(
                    {"financial_status": "paid", **order},
                    str(uuid.uuid4()),  # X-Shopify-Event-Id
                    **{
                        "X-Shopify-Topic": "orders/create",
                        "X-Shopify-Shop-Domain": "standin.myshopify.com",
                        "X-Shopify-API-Version": "2024-07",
                        "X-Shopify-Webhook-Id": str(uuid.uuid4()),
                        "X-Shopify-Triggered-At": "2026-01-01T00:00:00.000Z",
                    },
                )
            if (self.plan.pop(0) if self.plan else "ok") == "lost":
                return Reply(504, b"Gateway Timeout")
            return ok({"order": order}, 201)
        if c.method == "GET" and c.path == "/admin/api/2024-07/orders.json":
            newest = list(reversed(self.orders))
            start = int(c.q("page_info") or 0)
            page = newest[start : start + 2]
            headers = {}
            if start + 2 < len(newest):
                headers["Link"] = f'<{c.url.split("?")[0]}?page_info={start + 2}>; rel="next"'
            return ok({"orders": page}, 200, **headers)
        return Reply(404, {"errors": "Not Found"})


# -- the first cookbook entries: Stripe refunds, Marketing Cloud, Twilio, a webhook ------------


class StripeRefunds:
    """``POST /v1/refunds`` (form, ``Idempotency-Key`` replayed); a refund is
    ``pending`` first when planned so, then read back by ``GET /v1/refunds/{id}``."""

    def __init__(self) -> None:
        self.refunds: dict[str, dict[str, Any]] = {}
        self.keys: dict[str, Reply] = {}
        self.plan: list[str] = []  # per new key: the status it starts in
        self.drop_next = False  # apply the next refund, then answer 500 (a lost reply)

    @property
    def effects(self) -> list[dict[str, Any]]:
        return list(self.refunds.values())

    def handle(self, c: Call) -> Reply:
        if c.method == "POST" and c.path == "/v1/refunds":
            key = c.header("idempotency-key")
            if key not in self.keys:
                form = c.form()
                rid = "re_" + uuid.uuid4().hex[:24]
                refund = {
                    "id": rid,
                    "object": "refund",
                    "payment_intent": form["payment_intent"][0],
                    "status": self.plan.pop(0) if self.plan else "succeeded",
                }
                self.refunds[rid] = refund
                self.keys[key] = ok(refund)
            if self.drop_next:
                self.drop_next = False
                return Reply(500, {"error": {"type": "api_error"}})
            return self.keys[key]
        if c.method == "GET" and c.path.startswith("/v1/refunds/"):
            refund = self.refunds.get(c.path.rsplit("/", 1)[1])
            if refund is None:
                return Reply(404, {"error": {"code": "resource_missing"}})
            return ok(refund)
        return not_found()


class MarketingCloud:
    """``POST /messaging/v1/email/messages/{messageKey}`` → ``202`` (queued); the
    message's ``eventCategoryType`` moves from ``EmailQueued`` to ``EmailSent`` or
    ``EmailNotSent`` as planned; an unknown key is ``404``."""

    def __init__(self) -> None:
        self.messages: dict[str, list[str]] = {}
        self.plan: list[list[str]] = []  # per send: the event categories it goes through

    @property
    def effects(self) -> list[str]:
        return [k for k, v in self.messages.items() if v[-1] == "EmailSent"]

    def handle(self, c: Call) -> Reply:
        key = c.path.rsplit("/", 1)[1]
        if c.method == "POST":
            self.messages[key] = self.plan.pop(0) if self.plan else ["EmailQueued", "EmailSent"]
            return Reply(202, {"requestId": uuid.uuid4().hex, "responses": [{"messageKey": key}]})
        steps = self.messages.get(key)
        if steps is None:
            return Reply(404, {"message": "not found"})
        status = steps.pop(0) if len(steps) > 1 else steps[0]
        return ok({"messageKey": key, "eventCategoryType": f"TransactionalSendEvents.{status}"})


class Twilio:
    """``POST …/Messages.json`` → ``201`` with the Message, ``queued``; its status then
    moves through the planned values, read by ``GET …/Messages/{Sid}.json``."""

    def __init__(self) -> None:
        self.messages: dict[str, list[str]] = {}
        self.plan: list[list[str]] = []  # per send: the statuses it goes through

    @property
    def effects(self) -> list[str]:
        return [s for s, v in self.messages.items() if v[-1] == "delivered"]

    def handle(self, c: Call) -> Reply:
        if c.method == "POST" and c.path.endswith("/Messages.json"):
            sid = "SM" + uuid.uuid4().hex
            self.messages[sid] = self.plan.pop(0) if self.plan else ["sending", "delivered"]
            return ok({"sid": sid, "status": "queued"}, 201)
        sid = c.path.rsplit("/", 1)[1].removesuffix(".json")
        steps = self.messages.get(sid)
        if steps is None:
            return Reply(404, {"code": 20404, "message": "not found"})
        return ok({"sid": sid, "status": steps.pop(0) if len(steps) > 1 else steps[0]})


class Webhook:
    """A receiver that answers ``204`` and says nothing more."""

    def __init__(self) -> None:
        self.received: list[Any] = []

    @property
    def effects(self) -> list[Any]:
        return self.received

    def handle(self, c: Call) -> Reply:
        self.received.append(c.json())
        return Reply(204)
