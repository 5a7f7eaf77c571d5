"""A ledger that can forget what it must, and only that, with proof of what it forgot.

- ``prune``: settled records (``CONFIRMED``/``FAILED``, no contradiction, nothing
  scheduled, no pending callback bound to them) whose last change is older than a
  cut-off leave the ledger with their events, in bounded batches, each batch written
  to the run's archive and made durable *inside* the transaction that then deletes
  it. A crash anywhere leaves every record either still in the ledger or in a sealed
  batch of the archive (or, when the crash fell between the seal and the commit,
  both: ``verify_archive`` with the ledger says which batches were committed).
- ``erasure``: what a redaction of one settled record writes: its params' values
  replaced by ``REDACTED`` (all of them, or those under the JSON pointers given),
  every repetition of a removed text in its reason, snapshot and events' details
  replaced too, and a ``redacted`` event with who, why, where and the SHA-256 of
  what was removed.
- ``verify_archive``: an archive's digests and counts, and every record in it
  replayed against its events, as ``settled verify`` replays the ledger.

The archive is JSON Lines, one file per run, created new (never overwritten)::

    {"format": "settled-archive/1", "run": ..., "ledger": ..., "by": ..., ...}   header
    {"record": {...the stored row...}, "events": [{...}, ...]}                  per record
    {"seal": 1, "records": 200, "events": 913, "sha256": "..."}                 per batch
    {"end": true, "records": ..., "events": ..., "batches": ..., "sha256": "..."}

Each seal's and the end's ``sha256`` is over every byte of the file before that line,
so a sealed batch cannot be changed, dropped or reordered without its seal, and every
seal after it, failing. Each batch's ``pruned`` ledger event names the run, the batch
and its seal's digest.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from .crashpoints import Probe, no_probe
from .errors import InvalidInput, LedgerFull, SettledError
from .model import REDACTED, ActionRecord, Event, canonical_json
from .storage.columns import EVENT_COLUMNS, from_row, json_text, to_row
from .storage.ledger import Erasure, History, Ledger, Prunable, Selection
from .storage.truth import leaves, pointer, replay

FORMAT = "settled-archive/1"
BATCH = 200  # records per transaction: a few ms of a held write lock, a bounded fsync
# A removed text shorter than this is not searched for in evidence text: "42" or "yes"
# would be replaced inside unrelated words and numbers; it is erased from params only.
MIN_REPEATED = 4


# -- the archive ---------------------------------------------------------------------------


def _line(obj: Mapping[str, Any]) -> bytes:
    return (json.dumps(obj, ensure_ascii=False, sort_keys=True, default=str) + "\n").encode()


def history_line(rec: ActionRecord, log: Sequence[Event]) -> dict[str, Any]:
    """One record with its events as an archive line: the row as stored, every event
    (its fields read directly: ``asdict``'s deep copy cost half of a prune's time)."""
    return {
        "record": to_row(rec),
        "events": [{n: getattr(e, n) for n in EVENT_COLUMNS} for e in log],
    }


class ArchiveWriter:
    """One run's archive, created new; each batch appended, sealed and made durable
    (``fsync``) before ``batch`` returns."""

    def __init__(self, path: Path, header: Mapping[str, Any], probe: Probe = no_probe) -> None:
        self.path = path
        self.probe = probe
        self.sha = hashlib.sha256()
        self.batches = self.records = self.events = 0
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            raise InvalidInput(f"archive {path} exists already: name a new file") from None
        except OSError as exc:
            raise InvalidInput(f"cannot create archive {path}: {exc.strerror}") from None
        self.file: IO[bytes] = os.fdopen(fd, "wb")
        self._write(_line({"format": FORMAT, **header}))
        self._sync()
        _sync_dir(path)

    def _write(self, data: bytes) -> None:
        try:
            self.file.write(data)
        except OSError as exc:
            raise self._failed(exc) from None
        self.sha.update(data)

    def _sync(self) -> None:
        try:
            self.file.flush()
            os.fsync(self.file.fileno())
        except OSError as exc:
            raise self._failed(exc) from None

    def _failed(self, exc: OSError) -> SettledError:
        """A write of the archive that failed: the batch in hand is rolled back with
        the transaction it was written in; the batches sealed before it stay true."""
        why = f"cannot write archive {self.path} ({exc.strerror}); its batch was not pruned"
        return LedgerFull(why) if exc.errno == errno.ENOSPC else SettledError(why)

    def batch(self, histories: Sequence[History]) -> dict[str, Any]:
        """Append one batch and its seal, durably; what its audit row records."""
        for n, (rec, log) in enumerate(histories):
            self._write(_line(history_line(rec, log)))
            if n == 0:  # a batch half written, not sealed
                self.probe("prune:in_batch")
                self.probe(f"prune:in_batch:{self.batches + 1}")
        self.batches += 1
        self.records += len(histories)
        self.events += sum(len(log) for _, log in histories)
        digest = self.sha.hexdigest()
        seal = {"seal": self.batches, "records": self.records, "events": self.events}
        self._write(_line({**seal, "sha256": digest}))
        self._sync()
        self.probe("prune:sealed")  # sealed and durable; its records not yet deleted
        self.probe(f"prune:sealed:{self.batches}")
        return {
            "archive": self.path.name,
            "batch": self.batches,
            "records": len(histories),
            "events": sum(len(log) for _, log in histories),
            "first": histories[0][0].action_id,
            "last": histories[-1][0].action_id,
            "sha256": digest,
        }

    def close(self) -> str:
        """Write the end line (the whole run's digest), durably; that digest."""
        digest = self.sha.hexdigest()
        end = {"end": True, "records": self.records, "events": self.events}
        self._write(_line({**end, "batches": self.batches, "sha256": digest}))
        self._sync()
        self.file.close()
        return digest

    def abandon(self) -> None:
        """Close the file as it is: an interrupted run's sealed batches stay true (a
        close that fails, as the write before it did, hides nothing that matters)."""
        with contextlib.suppress(OSError):
            self.file.close()


def _sync_dir(path: Path) -> None:
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- pruning -------------------------------------------------------------------------------


@dataclass
class PruneReport:
    """What one prune run did."""

    archive: str | None = None
    run: str = ""
    batches: int = 0
    records: int = 0
    events: int = 0
    sha256: str | None = None
    audits: list[int] = field(default_factory=list)  # its ``pruned`` ledger events

    def to_json(self) -> dict[str, Any]:
        return {
            "archive": self.archive,
            "run": self.run,
            "batches": self.batches,
            "records": self.records,
            "events": self.events,
            "sha256": self.sha256,
            "ledger_events": self.audits,
        }


def prune(
    ledger: Ledger,
    which: Prunable,
    archive: Path,
    *,
    actor: str,
    at: Callable[[], str],
    size: int = BATCH,
    probe: Probe = no_probe,
) -> PruneReport:
    """Archive and delete every record of ``which``, ``size`` at a time, each batch in
    its own transaction (``Ledger.prune_batch``). The archive is created new, and
    only once there is something to prune. ``at`` gives each batch's audit time."""
    if size < 1:
        raise InvalidInput(f"batch size must be at least 1; got {size}")
    report = PruneReport(run=uuid.uuid4().hex)
    first = ledger.prunable(which)
    if not first:
        return report
    header = {
        "run": report.run,
        "ledger": ledger.location,
        "created_at": at(),
        "by": actor,
        "before": which.before,
        "statuses": list(which.statuses),
        "provider": which.provider,
        "operation": which.operation,
    }
    writer = ArchiveWriter(archive, header, probe)
    report.archive = str(archive)

    def keep(histories: list[History]) -> Mapping[str, Any]:
        return {"run": report.run, "by": actor, **writer.batch(histories)}

    after = ""
    try:
        while True:
            batch = ledger.prune_batch(
                which, after=after, size=size, at=at(), actor=actor, keep=keep
            )
            if batch.last is None:
                break
            after = batch.last
            report.batches += 1
            report.records += len(batch.histories)
            report.events += batch.events
            if batch.run is not None:
                report.audits.append(batch.run)
    except BaseException:
        writer.abandon()
        raise
    report.sha256 = writer.close()
    return report


# -- verifying an archive ------------------------------------------------------------------


@dataclass
class ArchiveVerdict:
    """What ``verify_archive`` found."""

    path: str
    run: str | None = None
    records: int = 0
    events: int = 0
    batches: int = 0
    complete: bool = False  # its end line is there and true
    tail: int = 0  # lines after the last seal (a batch a crash cut short: never deleted)
    ledger: str | None = None  # where the run pruned from, as its header says
    committed: list[int] | None = None  # batches the ledger's audit says were pruned
    findings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.findings

    def to_json(self) -> dict[str, Any]:
        return {
            "archive": self.path,
            "run": self.run,
            "ledger": self.ledger,
            "records": self.records,
            "events": self.events,
            "batches": self.batches,
            "complete": self.complete,
            "unsealed_lines": self.tail,
            "committed_batches": self.committed,
            "ok": self.ok,
            "findings": self.findings,
        }

    def summary(self) -> str:
        head = (
            f"archive {self.path}: {self.records} records and {self.events} events in "
            f"{self.batches} sealed batch{'es' if self.batches != 1 else ''}"
        )
        if self.findings:
            n = len(self.findings)
            return f"{head}: {n} finding{'s' if n != 1 else ''}"
        state = "complete" if self.complete else "interrupted (no end line)"
        tail = f", {self.tail} unsealed line(s) after the last seal" if self.tail else ""
        return f"{head}, {state}{tail}: every digest true, every record agrees with its events"


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    try:
        with path.open("rb") as f:
            yield from enumerate(f, 1)
    except OSError as exc:
        raise InvalidInput(f"cannot read archive {path}: {exc.strerror}") from None


def verify_archive(path: Path, ledger: Ledger | None = None) -> ArchiveVerdict:
    """Check an archive: its header, every seal's and the end's digest and counts,
    and every record replayed against its events. With ``ledger`` (the one it was
    pruned from), also that each sealed batch is either committed (its ``pruned``
    audit names its digest, and none of its records is in the ledger) or not (all of
    them still are): no record is in neither."""
    v = ArchiveVerdict(str(path))
    sha = hashlib.sha256()
    batch_ids: list[list[str]] = []
    pending: list[str] = []
    seals: dict[int, str] = {}
    tail = events = 0
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise InvalidInput(f"cannot read archive {path}: {exc.strerror}") from None
    if not size:
        v.findings.append("the archive is empty: no header")
        return v
    for number, raw in _lines(path):
        try:
            obj = json.loads(raw)
        except ValueError:
            if not raw.endswith(b"\n"):  # the last line a crash cut short
                tail += 1
                continue
            v.findings.append(f"line {number} is not JSON")
            sha.update(raw)
            continue
        if not isinstance(obj, dict):
            v.findings.append(f"line {number} is not an object")
        elif number == 1:
            if obj.get("format") != FORMAT:
                v.findings.append(f"line 1 is not a {FORMAT} header")
            v.run = obj.get("run")
            v.ledger = obj.get("ledger")
        elif "seal" in obj or "end" in obj:
            if _closing(obj, number, sha.hexdigest(), v, (pending, events), seals):
                v.events += events
                batch_ids.append(pending)
                pending, tail, events = [], 0, 0
        else:
            tail += 1
            checked = _check_record(obj, number, v)
            if checked is not None:
                pending.append(checked[0])
                events += checked[1]
        sha.update(raw)
    v.tail = tail if not v.complete else 0
    if ledger is not None and v.run is not None:
        _against(ledger, v, seals, batch_ids)
    return v


def _closing(
    obj: Mapping[str, Any],
    number: int,
    digest: str,
    v: ArchiveVerdict,
    since: tuple[Sequence[str], int],
    seals: dict[int, str],
) -> bool:
    """A seal or the end line, checked against the lines before it: whether it sealed
    a batch (``since``: the records since the last seal, and their events)."""
    pending, events = since
    if obj.get("sha256") != digest:
        v.findings.append(f"line {number}: the digest does not match the lines before it")
    records = v.records + len(pending)
    if obj.get("records") != records:
        v.findings.append(f"line {number}: says {obj.get('records')} records, holds {records}")
    if obj.get("events") != v.events + events:
        v.findings.append(
            f"line {number}: says {obj.get('events')} events, holds {v.events + events}"
        )
    if "seal" not in obj:
        if pending:
            v.findings.append(f"line {number}: records after the last seal")
        v.complete = not v.findings
        return False
    v.records = records
    v.batches += 1
    if obj.get("seal") != v.batches:
        v.findings.append(f"line {number}: seal {obj.get('seal')} out of order")
    seals[v.batches] = digest
    return True


def _check_record(obj: Mapping[str, Any], number: int, v: ArchiveVerdict) -> tuple[str, int] | None:
    """One record line replayed against its events: its id and how many events."""
    try:
        rec = from_row(obj["record"])
        log = [Event(**e) for e in obj["events"]]
    except (KeyError, TypeError, ValueError) as exc:
        v.findings.append(f"line {number}: not a record with its events ({type(exc).__name__})")
        return None
    v.findings += [f"line {number}: {f.line()}" for f in replay(rec, log)]
    return rec.action_id, len(log)


def _against(
    ledger: Ledger, v: ArchiveVerdict, seals: Mapping[int, str], batch_ids: Sequence[list[str]]
) -> None:
    audits = {
        int(e.detail.get("batch", 0)): str(e.detail.get("sha256"))
        for e in ledger.ledger_events("pruned")
        if e.detail.get("run") == v.run
    }
    if not audits and v.ledger != ledger.location:
        return  # another ledger (or a copy of it): the archive stands on its own
    v.committed = []
    for n, ids in enumerate(batch_ids, 1):
        present = [r.action_id for r in ledger.records(Selection(ids=ids))] if ids else []
        if n in audits:
            if audits[n] != seals[n]:
                v.findings.append(f"batch {n}: the ledger's audit names another digest")
            v.committed.append(n)
            if present:
                v.findings.append(f"batch {n} was pruned, yet {len(present)} of its records remain")
        elif len(present) != len(ids):
            v.findings.append(
                f"batch {n} was never pruned, yet {len(ids) - len(present)} of its records "
                "are not in the ledger"
            )


# -- erasure -------------------------------------------------------------------------------


def _blank(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _blank(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_blank(v) for v in value]
    return value if value is None else REDACTED


def erase_params(params: Any, paths: Sequence[str]) -> tuple[Any, list[tuple[str, Any]]]:
    """``params`` with the values under ``paths`` (all of them when none) replaced by
    ``REDACTED``, keeping their keys and shape; and what was removed, as (pointer,
    value). A path that names nothing in the params is ``InvalidInput``."""
    if not paths:
        return _blank(params), list(leaves(params, ""))
    out = json.loads(json.dumps(params))
    removed: list[tuple[str, Any]] = []
    for path in paths:
        tokens = pointer(path)
        holder: Any = None
        node: Any = out
        key: Any = None
        for t in tokens:
            holder = node
            if isinstance(node, dict) and t in node:
                key, node = t, node[t]
            elif isinstance(node, list) and t.isdigit() and int(t) < len(node):
                key, node = int(t), node[int(t)]
            else:
                raise InvalidInput(f"--field {path}: the params hold nothing there")
        where = "/" + "/".join(t.replace("~", "~0").replace("/", "~1") for t in tokens)
        removed += list(leaves(node, where))
        holder[key] = _blank(node)
    return out, removed


def _texts(removed: Iterable[tuple[str, Any]]) -> list[str]:
    """The forms in which a removed value may be repeated in text, longest first."""
    forms: set[str] = set()
    for _, value in removed:
        if isinstance(value, bool):
            continue
        text = value if isinstance(value, str) else json.dumps(value)
        for form in (text, json.dumps(text)[1:-1], json.dumps(text, ensure_ascii=False)[1:-1]):
            if len(form) >= MIN_REPEATED:
                forms.add(form)
    return sorted(forms, key=lambda t: (-len(t), t))


def scrub(value: Any, texts: Sequence[str]) -> Any:
    """``value`` (JSON) with every occurrence of each of ``texts`` in its strings (keys
    included) replaced by ``REDACTED``."""
    if isinstance(value, str):
        for t in texts:
            if t in value:
                value = value.replace(t, REDACTED)
        return value
    if isinstance(value, dict):
        return {scrub(k, texts): scrub(v, texts) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub(v, texts) for v in value]
    return value


@dataclass(frozen=True)
class Redaction:
    """What a person asked to erase, and why (``erasure``)."""

    paths: tuple[str, ...]
    reason: str
    by: str
    at: str


def removed_digest(removed: Sequence[tuple[str, Any]]) -> str:
    """The SHA-256 of what a redaction removed: canonical JSON of its (pointer, value)
    pairs, in pointer order. Whoever holds the values can show they were these."""
    return hashlib.sha256(canonical_json(sorted(removed, key=lambda p: p[0])).encode()).hexdigest()


def erasure(rec: ActionRecord, log: Sequence[Event], ask: Redaction) -> Erasure | None:
    """The ``Erasure`` that carries out ``ask`` on ``rec`` and its events,
    or None when nothing under the paths still holds a value."""
    if not ask.reason.strip():
        raise InvalidInput("--reason must say why (a person's erasure request, its reference)")
    params, removed = erase_params(rec.params, ask.paths)
    if not removed:
        return None
    texts = _texts(removed)
    details = {}
    for e in log:
        clean = scrub(e.detail, texts)
        if clean != e.detail:
            details[e.id] = clean
    snapshot = None if rec.snapshot is None else scrub(rec.snapshot, texts)
    detail = {
        "by": ask.by,
        "reason": ask.reason,
        "fields": sorted({p for p, _ in removed}),
        "removed": len(removed),
        "removed_sha256": removed_digest(removed),
        "events_redacted": sorted(details),
    }
    return Erasure(
        at=ask.at,
        actor=ask.by,
        detail=detail,
        params=canonical_json(params),
        reason=None if rec.reason is None else scrub(rec.reason, texts),
        snapshot=json_text(snapshot),
        details=details,
    )


__all__ = [
    "BATCH",
    "FORMAT",
    "MIN_REPEATED",
    "REDACTED",
    "ArchiveVerdict",
    "ArchiveWriter",
    "PruneReport",
    "Redaction",
    "erase_params",
    "erasure",
    "history_line",
    "prune",
    "removed_digest",
    "scrub",
    "verify_archive",
]
