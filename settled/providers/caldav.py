"""The ``caldav`` provider: book, move and cancel events on a real CalDAV server
(RFC 4791) through httpx. Tested against Radicale.

Every operation is ``full``: its reply proves the effect, because every write is
conditional.

- ``book`` — ``PUT {calendar}/{uid}.ics`` with ``If-None-Match: *``; the UID is the
  action's reconciliation key, reported as the provider object id. ``201``/``204``
  prove it was created. ``412`` says a resource with this UID exists already — most
  likely an earlier try of this very action, but a server may answer 412 for other
  reasons, so it is a *conflict* (``WireResult.conflict``), never proof: the query
  reads the event and only an event that carries this action's own mark counts.
- ``move`` and ``cancel`` — read the event (``GET``, with its ETag), change
  ``DTSTART``/``DTEND`` or set ``STATUS:CANCELLED``, add a line
  ``X-SETTLED-KEY:<reconciliation key>``, and ``PUT`` it back with ``If-Match`` on the
  ETag. A 2xx proves this very change was stored; ``412`` means someone changed the
  event in between and ours was refused (not applied). A repeat that finds its own
  ``X-SETTLED-KEY`` already there reports the earlier try's success instead of
  writing again, which is what makes repeating these operations safe.
- Queries read the real effect (``GET`` of the event): booked = the UID exists and
  carries this action's ``X-SETTLED-KEY``;
  moved = this action's key is on the event at the new time; cancelled = its key is
  on a ``STATUS:CANCELLED`` event.

Moves and cancels address events by UID at ``{calendar}/{uid}.ics`` — the events
settled booked, and those of clients that name resources after their UID.
"""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import httpx

from ..checks import expand_env, expand_url, number
from ..clock import steady, utcnow
from ..errors import ConfigError, InvalidInput, UnknownProvider
from ..model import Tier
from ._redact import Redactor
from ._shape import ShapeError, segment
from ._wire import Exchange, build, excerpt, exchange, show
from .base import (
    BaseProvider,
    Observation,
    OperationSpec,
    QueryTarget,
    Request,
    Seen,
    Wire,
    WireResult,
)

KEYS = ("url", "username", "password", "timeout", "attempts", "consistency_window", "verify")
MARK = "X-SETTLED-KEY"
ICS = "text/calendar; charset=utf-8"
_STAMP = "%Y%m%dT%H%M%SZ"


def create(name: str, conf: Mapping[str, Any], client: httpx.Client) -> CalDavProvider:
    return CalDavProvider(name, conf, client, os.environ)


# -- configuration --------------------------------------------------------------------------


# -- iCalendar, just enough ------------------------------------------------------------------


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace(";", "\\;").replace(",", "\\,").replace("\n", "\\n")


def _fold(line: str) -> str:
    """RFC 5545 §3.1: lines of at most 75 octets, never splitting a character."""
    out, cur, size = [], "", 0
    for ch in line:
        n = len(ch.encode())
        if size + n > 75:
            out.append(cur)
            cur, size = " ", 1
        cur += ch
        size += n
    out.append(cur)
    return "\r\n".join(out)


def _unfold(text: str) -> list[str]:
    text = text.replace("\r\n", "\n")
    return re.sub(r"\n[ \t]", "", text).split("\n")


def _split(line: str) -> tuple[str, str, str]:
    """``(NAME, params, value)`` of a content line (a quoted param may hold ':')."""
    quoted = False
    for i, ch in enumerate(line):
        if ch == '"':
            quoted = not quoted
        elif ch == ":" and not quoted:
            head, value = line[:i], line[i + 1 :]
            name, _, params = head.partition(";")
            return name.upper(), params, value
    return line.upper(), "", ""


def _utc(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime(_STAMP)


@dataclass
class _Event:
    """The first VEVENT of a calendar object: its lines, and where they are."""

    lines: list[str]
    start: int  # index of BEGIN:VEVENT
    end: int  # index of END:VEVENT

    @classmethod
    def parse(cls, text: str) -> _Event | None:
        lines = [ln for ln in _unfold(text) if ln != ""]
        try:
            start = next(i for i, ln in enumerate(lines) if ln.upper() == "BEGIN:VEVENT")
            end = next(i for i in range(start, len(lines)) if lines[i].upper() == "END:VEVENT")
        except StopIteration:
            return None
        return cls(lines, start, end)

    def props(self, name: str) -> list[tuple[str, str]]:
        out = []
        for ln in self.lines[self.start + 1 : self.end]:
            n, params, value = _split(ln)
            if n == name:
                out.append((params, value))
        return out

    def value(self, name: str) -> str | None:
        found = self.props(name)
        return found[0][1] if found else None

    def marks(self) -> list[str]:
        return [v for _, v in self.props(MARK)]

    def moment(self, name: str) -> str | None:
        """DTSTART/DTEND in UTC text, or None when it cannot be placed in time."""
        found = self.props(name)
        if not found:
            return None
        params, value = found[0]
        if value.endswith("Z"):
            return value
        tzid = re.search(r"TZID=\"?([^;\":]+)", params, re.IGNORECASE)
        if tzid is None or "T" not in value:
            return None  # floating time or a whole day
        try:
            local = datetime.strptime(value, "%Y%m%dT%H%M%S").replace(
                tzinfo=ZoneInfo(tzid.group(1))
            )
        except (ValueError, ZoneInfoNotFoundError):
            return None
        return _utc(local)

    def rewrite(self, drop: set[str], add: list[str]) -> str:
        """The object with ``drop`` properties removed from the event, ``add`` lines
        appended to it, and SEQUENCE/DTSTAMP brought forward."""
        body = self.lines[self.start + 1 : self.end]
        seq = 0
        kept = []
        for ln in body:
            name = _split(ln)[0]
            if name == "SEQUENCE":
                seq = int(_split(ln)[2]) if _split(ln)[2].isdigit() else 0
            if name in drop or name in ("SEQUENCE", "DTSTAMP"):
                continue
            kept.append(ln)
        kept += [f"SEQUENCE:{seq + 1}", f"DTSTAMP:{_utc(utcnow())}", *add]
        lines = self.lines[: self.start + 1] + kept + self.lines[self.end :]
        return "\r\n".join(_fold(ln) for ln in lines) + "\r\n"


def _new_event(uid: str, params: Mapping[str, Any]) -> str:
    lines = [
        "BEGIN:VCALENDAR",
        "VERSION:2.0",
        "PRODID:-//settled//caldav provider//EN",
        "BEGIN:VEVENT",
        f"UID:{uid}",
        f"DTSTAMP:{_utc(utcnow())}",
        f"DTSTART:{_utc(_when(params['start']))}",
        f"DTEND:{_utc(_when(params['end']))}",
        f"SUMMARY:{_escape(params['summary'])}",
    ]
    for key, prop in (("description", "DESCRIPTION"), ("location", "LOCATION")):
        if isinstance(params.get(key), str):
            lines.append(f"{prop}:{_escape(params[key])}")
    lines += [f"{MARK}:{uid}", "END:VEVENT", "END:VCALENDAR"]
    return "\r\n".join(_fold(ln) for ln in lines) + "\r\n"


def _when(text: str) -> datetime:
    return datetime.fromisoformat(text)


# -- the provider -----------------------------------------------------------------------------


class CalDavProvider(BaseProvider):
    def __init__(
        self, name: str, conf: Mapping[str, Any], client: httpx.Client, env: Mapping[str, str]
    ) -> None:
        self.name = name
        unknown = sorted(set(conf) - set(KEYS))
        if unknown:
            raise ConfigError(
                f"{unknown[0]}: unknown key; remove it or use one of {', '.join(KEYS)}"
            )
        url, hidden = expand_url("url", conf.get("url"), env)  # ${VAR}s read now, never stored
        example = (
            'set url to the calendar collection, e.g. url = "https://cal.example.com/alice/work/"'
        )
        shown = conf.get("url")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ConfigError(f"url: {'missing' if url is None else repr(shown)}; {example}")
        try:
            parsed = httpx.URL(url)
        except (httpx.InvalidURL, ValueError, TypeError) as exc:
            why = f" ({exc})" if shown == url else ""
            raise ConfigError(f"url: {shown!r} is not a valid URL{why}; {example}") from None
        if urlsplit(url).username is not None or parsed.userinfo:
            raise ConfigError("url: must not carry credentials; use username and password")
        if not parsed.host or parsed.query or parsed.fragment or "?" in url or "#" in url:
            raise ConfigError(f"url: {shown!r} needs a host and no query or fragment; {example}")
        self._url = url if url.endswith("/") else url + "/"
        secrets: list[str] = list(hidden)
        self._headers: dict[str, str] = {}
        if "username" in conf or "password" in conf:
            user, _ = expand_env("username", conf.get("username", ""), env)
            password, hidden = expand_env("password", conf.get("password", ""), env)
            if ":" in user:
                raise ConfigError("username: must not contain ':' (HTTP Basic)")
            token = base64.b64encode(f"{user}:{password}".encode()).decode()
            self._headers["Authorization"] = f"Basic {token}"
            secrets += [password, token, *hidden]
        self._redact = Redactor(secrets)
        timeout = number("timeout", conf.get("timeout", 5.0), positive=True)
        verify = conf.get("verify", {})
        if not isinstance(verify, Mapping) or set(verify) - {"interval", "deadline", "min_checks"}:
            raise ConfigError(
                "verify: must be a table like verify = { interval = 2, deadline = 300, "
                "min_checks = 3 }"
            )
        common: dict[str, Any] = {
            "consistency_window": number("consistency_window", conf.get("consistency_window", 0.0)),
            "attempts": int(number("attempts", conf.get("attempts", 3), whole=True)),
            "timeout": timeout,
            "verify_interval": number(
                "verify.interval", verify.get("interval", 2.0), positive=True
            ),
            "verify_deadline": number(
                "verify.deadline", verify.get("deadline", 300.0), positive=True
            ),
            "verify_min_checks": int(
                number("verify.min_checks", verify.get("min_checks", 3), whole=True)
            ),
            "predicate": True,  # every query reads this action's own mark
            "dedupes_keys": True,  # conditional writes: a repeat cannot apply twice
            "queryable": True,
            "carries_key": True,
        }
        self._ops = {
            "book": OperationSpec(
                "book",
                Tier.FULL,
                proof="201/204 to PUT with If-None-Match: * (a 412 is a conflict: the query decides)",
                verifies=f"GET {{uid}}.ics: the event exists with {MARK} of this action",
                conflict_statuses=(412,),
                **common,
            ),
            "move": OperationSpec(
                "move",
                Tier.FULL,
                proof="2xx to PUT with If-Match on the ETag just read",
                verifies=f"GET {{uid}}.ics: {MARK} of this action, at the new time",
                **common,
            ),
            "cancel": OperationSpec(
                "cancel",
                Tier.FULL,
                proof="2xx to PUT (STATUS:CANCELLED) with If-Match on the ETag just read",
                verifies=f"GET {{uid}}.ics: {MARK} of this action on a cancelled event",
                **common,
            ),
        }
        self._client = client

    def operations(self) -> Mapping[str, OperationSpec]:
        return self._ops

    # -- params ---------------------------------------------------------------------------

    def check_params(self, operation: str, params: Any) -> None:
        """Refuse, before anything is recorded, params no server could accept."""
        if operation not in self._ops:
            raise UnknownProvider(f"{self.name} has no operation {operation!r}")
        problem = _params_problem(operation, params)
        if problem:
            raise InvalidInput(f"{self.name}.{operation}: {problem}")

    def _resource(self, uid: str) -> str:
        """The event's URL; raises ShapeError for a UID that would address another
        resource (empty, ``.``, ``..``, a separator: rule 10 in docs/rules.md)."""
        return self._url + segment("uid", uid) + ".ics"

    def _call(
        self,
        method: str,
        url: str,
        timeout: float,
        headers: Mapping[str, str] | None = None,
        content: bytes | None = None,
        send_by: float | None = None,
    ) -> Exchange:
        return exchange(
            self._client,
            method,
            url,
            timeout=timeout,
            send_by=send_by,
            headers={**self._headers, **(headers or {})},
            content=content,
            redact=self._redact,
        )

    def render(
        self,
        operation: str,
        params: Any,
        *,
        action_id: str = "ACTION-ID",
        attempt: int = 1,
        reconciliation_key: str | None = None,
        provider_object_id: str | None = None,
    ) -> dict[str, Any]:
        """The request ``execute`` would send first (the PUT of a booking; the GET
        that a move or cancel reads the event with), and the query. Sends nothing."""
        self.check_params(operation, params)
        key = reconciliation_key or "stl-KEY"
        uid = key if operation == "book" else params["uid"]
        try:
            url = self._resource(uid)
        except ShapeError as exc:
            raise InvalidInput(f"{self.name}.{operation}: {exc}") from None
        if operation == "book":
            built = build(
                self._client,
                "PUT",
                url,
                headers={**self._headers, "If-None-Match": "*", "Content-Type": ICS},
                content=_new_event(uid, params).encode(),
            )
            notes = []
        else:
            built = build(self._client, "GET", url, headers=self._headers)
            notes = [
                "then PUT the event back with If-Match on its ETag, "
                + ("DTSTART/DTEND changed" if operation == "move" else "STATUS:CANCELLED")
                + f" and {MARK}:{key}"
            ]
        if isinstance(built, str):
            raise InvalidInput(f"{self.name}.{operation}: {built}")
        query = self._client.build_request("GET", url, headers=self._headers)
        return {
            "provider": self.name,
            "operation": operation,
            "tier": str(self._ops[operation].tier),
            "reconciliation_key": key,
            "idempotency_key": None,
            "request": {**show(built, self._redact), "notes": notes},
            "query": {**show(query, self._redact), "proves": self._ops[operation].verifies},
            "notes": ["stl-KEY stands for the key settled generates at dispatch"]
            if reconciliation_key is None
            else [],
        }

    # -- execute --------------------------------------------------------------------------

    def execute(self, request: Request) -> WireResult:
        if request.operation not in self._ops:
            raise UnknownProvider(f"{self.name} has no operation {request.operation!r}")
        problem = _params_problem(request.operation, request.params)
        if problem or not request.reconciliation_key:
            return WireResult(Wire.NOT_CONNECTED, detail=f"not sent: {problem or 'no key'}")
        if request.operation == "book":
            return self._book(request)
        return self._change(request)

    def _book(self, request: Request) -> WireResult:
        uid = request.reconciliation_key or ""
        try:
            url = self._resource(uid)
        except ShapeError as exc:
            return WireResult(Wire.NOT_CONNECTED, detail=f"not sent: {exc}")
        ex = self._call(
            "PUT",
            url,
            request.timeout,
            {"If-None-Match": "*", "Content-Type": ICS},
            _new_event(uid, request.params).encode(),
            send_by=request.send_by,
        )
        if ex.wire is Wire.NOT_CONNECTED:
            return WireResult(ex.wire, detail=ex.problem)
        if ex.wire is Wire.NO_ANSWER:
            # The UID names the event this try may have made: move and cancel need it.
            return WireResult(ex.wire, object_id=uid, detail=ex.problem, written_at=ex.written_at)
        code = ex.status_code
        if code in (200, 201, 204):
            return WireResult(
                Wire.ANSWERED, code, uid, True, f"HTTP {code}: created", written_at=ex.written_at
            )
        if code == 412:
            # Most likely an earlier try of this action made it; but a server may answer
            # 412 for other reasons, so the query must read the event (rule 10).
            detail = "HTTP 412: a resource with this UID exists already; the query decides whose"
            return WireResult(
                Wire.ANSWERED, code, uid, None, detail, conflict=True, written_at=ex.written_at
            )
        return WireResult(
            Wire.ANSWERED,
            code,
            None,
            None,
            self._answer(ex),
            written_at=ex.written_at,
            retry_after=ex.retry_after,
        )

    def _change(self, request: Request) -> WireResult:
        """move/cancel: GET, check for our own mark, conditional PUT; both within the
        try's one total deadline."""
        deadline = steady() + request.timeout
        key = request.reconciliation_key or ""
        uid = request.params["uid"]
        try:
            url = self._resource(uid)
        except ShapeError as exc:
            return WireResult(Wire.NOT_CONNECTED, detail=f"not sent: {exc}")
        got = self._call("GET", url, request.timeout, send_by=request.send_by)
        if got.wire is not Wire.ANSWERED or got.status_code not in (200, 404):
            # Nothing was written: the change itself never left this machine.
            why = got.problem or self._answer(got)
            return WireResult(
                Wire.NOT_CONNECTED, detail=f"not sent: reading the event failed: {why}"
            )
        if got.status_code == 404:
            return WireResult(
                Wire.ANSWERED, 404, None, None, f"HTTP 404: no event with UID {uid!r}"
            )
        event = _Event.parse((got.body or b"").decode("utf-8", "replace"))
        if event is None:
            return WireResult(Wire.NOT_CONNECTED, detail="not sent: the resource holds no VEVENT")
        if key in event.marks():
            return WireResult(
                Wire.ANSWERED, 200, uid, True, "an earlier try already applied this change"
            )
        etag = got.headers.get("etag")
        if not etag:
            return WireResult(
                Wire.NOT_CONNECTED,
                detail="not sent: the server gave no ETag, and an unconditional overwrite could lose others' changes",
            )
        if request.operation == "move":
            new = event.rewrite(
                {"DTSTART", "DTEND", "DURATION"},
                [
                    f"DTSTART:{_utc(_when(request.params['start']))}",
                    f"DTEND:{_utc(_when(request.params['end']))}",
                    f"{MARK}:{key}",
                ],
            )
        else:
            new = event.rewrite({"STATUS"}, ["STATUS:CANCELLED", f"{MARK}:{key}"])
        left = deadline - steady()
        if left <= 0:
            return WireResult(
                Wire.NOT_CONNECTED,
                detail="not sent: the try's deadline passed while reading the event",
            )
        ex = self._call(
            "PUT",
            url,
            left,
            {"If-Match": etag, "Content-Type": ICS},
            new.encode(),
            send_by=request.send_by,
        )
        if ex.wire is not Wire.ANSWERED:
            return WireResult(ex.wire, detail=ex.problem, written_at=ex.written_at)
        code = ex.status_code
        if code is not None and 200 <= code <= 299:
            return WireResult(
                Wire.ANSWERED, code, uid, True, f"HTTP {code}: stored", written_at=ex.written_at
            )
        if code == 412:
            # If-Match on the ETag just read: the event changed in between and the server
            # refused this write, so this change was provably not applied.
            return WireResult(
                Wire.ANSWERED,
                code,
                None,
                None,
                "HTTP 412: the event changed since it was read; this change was refused",
                written_at=ex.written_at,
            )
        return WireResult(
            Wire.ANSWERED,
            code,
            None,
            None,
            self._answer(ex),
            written_at=ex.written_at,
            retry_after=ex.retry_after,
        )

    def _answer(self, ex: Exchange) -> str:
        if ex.body:
            shown = f": {excerpt(ex.body, redact=self._redact)}"
        else:
            shown = f": {ex.problem}" if ex.problem else ""
        return self._redact.clean(f"HTTP {ex.status_code}{shown}")

    # -- query ----------------------------------------------------------------------------

    def query(self, target: QueryTarget) -> Observation:
        op = target.operation
        if op not in self._ops:
            return Observation(Seen.UNKNOWN, detail=f"{self.name}.{op} has no query")
        uid = target.reconciliation_key if op == "book" else (target.params or {}).get("uid")
        if not isinstance(uid, str) or not uid or not target.reconciliation_key:
            return Observation(Seen.UNKNOWN, detail="no UID or key to query")
        try:
            url = self._resource(uid)
        except ShapeError as exc:
            return Observation(Seen.UNKNOWN, detail=f"not queried: {exc}")
        got = self._call("GET", url, self._ops[op].timeout)
        evidence: dict[str, Any] = {"status_code": got.status_code}
        if got.wire is not Wire.ANSWERED:
            return Observation(Seen.UNKNOWN, detail=got.problem, evidence=evidence)
        if got.status_code == 404:
            if op == "book":
                return Observation(Seen.NOT_YET, detail="404: no such event yet", evidence=evidence)
            return Observation(
                Seen.AMBIGUOUS,
                detail="404: the event is gone; cannot tell who removed it",
                evidence=evidence,
            )
        if got.status_code != 200 or got.body is None:
            return Observation(Seen.UNKNOWN, detail=self._answer(got), evidence=evidence)
        event = _Event.parse(got.body.decode("utf-8", "replace"))
        if event is None or event.value("UID") != uid:
            return Observation(
                Seen.UNKNOWN, detail="the resource holds no event with this UID", evidence=evidence
            )
        status = (event.value("STATUS") or "").upper()
        evidence.update(
            start=event.moment("DTSTART"), end=event.moment("DTEND"), status=status or None
        )
        ours = target.reconciliation_key in event.marks()
        if op == "book":
            if not ours:
                # Only our own mark attributes it: a 412 from a server that holds another
                # client's event under this UID must not confirm the booking.
                return Observation(
                    Seen.AMBIGUOUS,
                    uid,
                    f"an event {uid} exists, but without this action's {MARK}",
                    evidence,
                )
            note = " (since cancelled)" if status == "CANCELLED" else ""
            return Observation(Seen.APPLIED, uid, f"event {uid} exists{note}", evidence)
        if op == "cancel":
            if status == "CANCELLED":
                if ours:
                    return Observation(Seen.APPLIED, uid, "cancelled by this action", evidence)
                return Observation(
                    Seen.AMBIGUOUS, detail="cancelled, but not by this action", evidence=evidence
                )
            return Observation(
                Seen.NOT_YET, detail=f"status is {status or 'unset'}", evidence=evidence
            )
        want = (_utc(_when(target.params["start"])), _utc(_when(target.params["end"])))
        now = (event.moment("DTSTART"), event.moment("DTEND"))
        if ours and now == want:
            return Observation(Seen.APPLIED, uid, f"moved to {want[0]}–{want[1]}", evidence)
        if ours:
            return Observation(
                Seen.APPLIED, uid, "moved by this action, since changed by someone else", evidence
            )
        if now == want:
            return Observation(
                Seen.AMBIGUOUS,
                detail="at the new time, but not moved by this action",
                evidence=evidence,
            )
        return Observation(Seen.NOT_YET, detail=f"still at {now[0]}", evidence=evidence)


def _params_problem(operation: str, params: Any) -> str:
    if not isinstance(params, Mapping):
        return "params must be a JSON object"
    need = {
        "book": ("summary", "start", "end"),
        "move": ("uid", "start", "end"),
        "cancel": ("uid",),
    }
    missing = [
        k for k in need.get(operation, ()) if not isinstance(params.get(k), str) or not params[k]
    ]
    if missing:
        return f"params need {', '.join(repr(k) for k in missing)} as non-empty strings"
    if "uid" in need.get(operation, ()):
        try:
            segment("uid", params["uid"])
        except ShapeError as exc:
            return str(exc)
    if "start" in need.get(operation, ()):
        try:
            start, end = _when(params["start"]), _when(params["end"])
        except ValueError:
            return 'start and end must be ISO-8601 times, e.g. "2026-03-01T10:00:00Z"'
        if start.tzinfo is None or end.tzinfo is None:
            return 'start and end need a UTC offset or Z, e.g. "2026-03-01T10:00:00+01:00"'
        if end <= start:
            return "end must be after start"
    return ""
