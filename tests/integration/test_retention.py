"""Retention and erasure on both backends: `settled prune` archives settled records and
then removes them (never an open, held or contradicted one), every other DELETE or
UPDATE of history is still refused by the database, a SIGKILL anywhere in a prune
leaves every record in the ledger or in a sealed batch of a true archive, and `settled
redact` erases a settled record's params values, and their repetitions, for good."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import rawdb
from records import AT, new_record
from support import run_cli

from settled import Ledger
from settled.clock import to_text
from settled.model import Acceptance, Delivery, EventKind, Move, Status
from settled.retention import REDACTED, verify_archive

NOW = to_text(datetime.now(UTC))


def settle(
    led: Ledger,
    aid: str,
    params: Any = None,
    *,
    status: Status = Status.CONFIRMED,
    at: str = AT,
    provider: str = "p",
    reply: Any = None,
) -> None:
    """A record dispatched and settled at ``at``, as the dispatcher writes it."""
    led.record(new_record(aid, params, provider=provider), actor="t")
    claim = {"delivery": Delivery.IN_FLIGHT}
    led.move(Move(aid, Status.PENDING, Status.IN_FLIGHT, at, "t", EventKind.CLAIMED, values=claim))
    if status is Status.CONFIRMED:
        values: dict[str, Any] = {
            "delivery": Delivery.DELIVERED,
            "acceptance": Acceptance.APPLIED,
            "confirmed_by": "provider",
            "confirmed_at": at,
        }
    else:
        values = {"delivery": Delivery.FAILED, "acceptance": Acceptance.NOT_APPLIED}
    detail = {"reply": reply} if reply is not None else {}
    led.move(
        Move(
            aid, Status.IN_FLIGHT, status, at, "t", EventKind.OUTCOME, values=values, detail=detail
        )
    )


def cli(location: Any, *args: str, crash_at: str | None = None) -> Any:
    return run_cli("--db", str(location), *args, crash_at=crash_at)


def ids(location: Any) -> set[str]:
    return {r[0] for r in rawdb.execute(location, "SELECT action_id FROM actions")}


def a_ledger_to_prune(location: Any) -> set[str]:
    """Old settled records (returned), and what a prune must leave: an open one, a
    contradicted one, a recent one, one a pending callback is bound to."""
    with Ledger.open(location) as led:
        old = {f"old-{i}" for i in range(6)}
        for i, aid in enumerate(sorted(old)):
            settle(
                led,
                aid,
                {"to": f"person{i}@example.com"},
                status=[Status.CONFIRMED, Status.FAILED][i % 2],
            )
        led.record(new_record("open"), actor="t")
        settle(led, "contradicted")
        rec = led.get("contradicted")
        led.move(
            Move(
                "contradicted",
                Status.CONFIRMED,
                Status.CONFIRMED,
                AT,
                "t",
                EventKind.NOTE,
                values={"contradiction": "a late reply says it failed"},
            ),
            record=rec,
        )
        settle(led, "recent", at=NOW)
    return old


def test_prune_archives_then_removes_only_old_settled_records(
    location: Any, tmp_path: Path
) -> None:
    old = a_ledger_to_prune(location)
    archive = tmp_path / "a.jsonl"

    preview = cli(location, "prune", "--older-than", "90d", "--dry-run", "--json")
    assert preview.returncode == 0, preview.stderr
    assert json.loads(preview.stdout)["records"] == len(old)
    assert ids(location) >= old and not archive.exists()

    done = cli(
        location,
        "prune",
        "--older-than",
        "90d",
        "--archive",
        str(archive),
        "--batch",
        "4",
        "--yes",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["records"], report["batches"]) == (len(old), 2)
    assert ids(location) == {"open", "contradicted", "recent"}
    left = rawdb.execute(location, "SELECT DISTINCT action_id FROM events")
    assert {r[0] for r in left} == {"open", "contradicted", "recent"}

    verdict = verify_archive(archive)
    assert verdict.ok and verdict.complete, verdict.findings
    assert (verdict.records, verdict.events) == (len(old), 3 * len(old))
    lines = [json.loads(x) for x in archive.read_text().splitlines()]
    assert {x["record"]["action_id"] for x in lines if "record" in x} == old
    with Ledger.open(location) as led:
        audits = led.ledger_events("pruned")
        assert [a.detail["batch"] for a in audits] == [1, 2]
        assert {a.detail["run"] for a in audits} == {report["run"]}
        assert not led.verify(full=True).findings  # the kept counts lost what was pruned
        assert led.stats(now=to_text(datetime.now(UTC))).total == len(ids(location))
        assert led.integrity_check() == "ok"
        for sql in ("DELETE FROM ledger_events", "UPDATE ledger_events SET actor = 'x'"):
            with pytest.raises(rawdb.RAW_ERRORS, match="settled: events are append-only"):
                rawdb.execute(location, sql)
        checked = verify_archive(archive, led)
        assert checked.ok and checked.committed == [1, 2], checked.findings
    with Ledger.open(tmp_path / "other.db") as other:  # no audit of this run there
        alone = verify_archive(archive, other)
        assert alone.ok and alone.committed is None, alone.findings
    again = cli(location, "verify", "--archive", str(archive))
    assert again.returncode == 0, again.stderr
    assert "every digest true" in again.stdout


def test_a_changed_archive_is_found(location: Any, tmp_path: Path) -> None:
    a_ledger_to_prune(location)
    archive = tmp_path / "a.jsonl"
    assert (
        cli(location, "prune", "--older-than", "90d", "--archive", str(archive), "--yes").returncode
        == 0
    )
    text = archive.read_text()
    archive.write_text(text.replace("person1@example.com", "someone@example.com"))
    found = cli(location, "verify", "--archive", str(archive))
    assert found.returncode == 4
    assert "digest does not match" in found.stdout


def test_bad_input_is_one_line_and_changes_nothing(location: Any, tmp_path: Path) -> None:
    a_ledger_to_prune(location)
    before = rawdb.dump(location)
    taken = tmp_path / "taken.jsonl"
    taken.write_text("mine\n")
    for args, words in (
        (("--older-than", "90d", "--yes"), "--archive FILE is required"),
        (
            (
                "--older-than",
                "90d",
                "--status",
                "PENDING",
                "--archive",
                str(tmp_path / "x"),
                "--yes",
            ),
            "only settled",
        ),
        (("--older-than", "soon", "--archive", str(tmp_path / "x"), "--yes"), "bad duration"),
        (("--older-than", "90d", "--archive", str(taken), "--yes"), "exists already"),
        (("--older-than", "90d", "--provider", "nope", "--archive", str(tmp_path / "x")), "nope"),
        (("--older-than", "90d", "--archive", str(tmp_path / "x")), "without --yes"),
        (
            ("--older-than", "90d", "--archive", str(tmp_path / "x"), "--by", "a via b", "--yes"),
            "--by: a name must not contain ' via '",
        ),
    ):
        got = cli(location, "prune", *args)
        assert got.returncode == 1, (args, got.stderr)
        assert words in got.stderr and "Traceback" not in got.stderr
        errors = [x for x in got.stderr.splitlines() if x.startswith("settled: ")]
        assert len(errors) == 1 and words in errors[0], got.stderr  # after any preview
    assert rawdb.dump(location) == before
    assert taken.read_text() == "mine\n" and not (tmp_path / "x").exists()


def test_ordinary_deletes_and_updates_of_history_are_still_refused(location: Any) -> None:
    a_ledger_to_prune(location)
    before = rawdb.dump(location)
    for sql in (
        "DELETE FROM events WHERE action_id = 'old-0'",
        "UPDATE events SET detail = '{}' WHERE action_id = 'old-0'",
        "DELETE FROM actions WHERE action_id = 'old-0'",
        # an allowance for an open or contradicted record, or one no audit names
        "INSERT INTO erasing (action_id, purpose, run) VALUES ('open', 'prune', 1)",
        "INSERT INTO erasing (action_id, purpose, run) VALUES ('contradicted', 'prune', 1)",
        "INSERT INTO erasing (action_id, purpose, run) VALUES ('old-0', 'prune', 1)",
        "INSERT INTO erasing (action_id, purpose, run) VALUES ('old-0', 'redact', 1)",
    ):
        with pytest.raises(rawdb.RAW_ERRORS, match="settled: "):
            rawdb.execute(location, sql)
    assert rawdb.dump(location) == before


def test_an_allowance_never_outlives_its_transaction(location: Any) -> None:
    if not rawdb.is_pg(location):  # no deferred triggers: the integrity check finds it
        a_ledger_to_prune(location)
        rawdb.execute(
            location,
            "INSERT INTO ledger_events (at, actor, kind, detail) VALUES ('x', 'x', 'pruned', '{}')",
        )
        rawdb.execute(
            location,
            "INSERT INTO erasing (action_id, purpose, run) SELECT 'old-0', 'prune', max(id)"
            " FROM ledger_events",
        )
        with Ledger.open(location) as led:
            assert "erasure allowance(s) left behind" in led.integrity_check()
        return
    import psycopg

    a_ledger_to_prune(location)
    with psycopg.connect(str(location)) as conn:
        conn.execute(
            "INSERT INTO ledger_events (at, actor, kind, detail) VALUES (now(), 'x', 'pruned', '{}')"
        )
        run = conn.execute("SELECT max(id) FROM ledger_events").fetchone()[0]
        conn.execute(
            "INSERT INTO erasing (action_id, purpose, run) VALUES ('old-0', 'prune', %s)", (run,)
        )
        with pytest.raises(psycopg.Error, match="outlived its transaction"):
            conn.commit()
    assert "old-0" in ids(location)


@pytest.mark.slow(seconds=20)
@pytest.mark.parametrize(
    "point",
    ["prune:in_batch:2", "prune:sealed:2", "before_commit:pruned", "prune:sealed:3"],
)
def test_a_prune_killed_anywhere_leaves_nothing_half_pruned(
    location: Any, tmp_path: Path, point: str
) -> None:
    old = a_ledger_to_prune(location)
    with Ledger.open(location) as led:
        for i in range(6):
            settle(led, f"more-{i}")
    old |= {f"more-{i}" for i in range(6)}
    archive = tmp_path / "killed.jsonl"
    args = ("prune", "--older-than", "90d", "--archive", str(archive), "--batch", "4", "--yes")
    killed = cli(location, *args, crash_at=point)
    assert killed.returncode == -signal.SIGKILL, killed.stderr

    with Ledger.open(location) as led:
        verdict = verify_archive(archive, led)
        assert verdict.ok, verdict.findings
        assert not verdict.complete
        assert not led.verify().findings and led.integrity_check() == "ok"
        committed = {
            x["record"]["action_id"]
            for n, batch in enumerate(_batches(archive), 1)
            if n in (verdict.committed or [])
            for x in batch
        }
    remaining = ids(location)
    # every record is in the ledger, whole, or in a committed, sealed batch: never neither
    assert old <= remaining | committed and not (remaining & committed)
    for aid in old & remaining:
        n = rawdb.execute(location, "SELECT count(*) FROM events WHERE action_id = ?", (aid,))
        assert n[0][0] == 3  # recorded, claimed, outcome: none of its events went
    assert cli(location, "verify", "--archive", str(archive)).returncode == 0

    # a new run takes what the killed one left, and the two archives hold every record
    rest = tmp_path / "rest.jsonl"
    assert (
        cli(location, "prune", "--older-than", "90d", "--archive", str(rest), "--yes").returncode
        == 0
    )
    assert ids(location) == {"open", "contradicted", "recent"}
    with Ledger.open(location) as led:
        assert verify_archive(rest, led).complete
        assert not led.verify(full=True).findings  # counts true after a kill, too


def _batches(archive: Path) -> list[list[dict[str, Any]]]:
    out: list[list[dict[str, Any]]] = [[]]
    for raw in archive.read_text().splitlines():
        try:
            obj = json.loads(raw)
        except ValueError:
            break
        if "record" in obj:
            out[-1].append(obj)
        elif "seal" in obj:
            out.append([])
    return out[:-1]


def test_prune_is_refused_on_a_moved_ledger(location: Any, tmp_path: Path) -> None:
    a_ledger_to_prune(location)
    with Ledger.open(location) as led, led.still() as held:
        held.mark_moved("elsewhere.db", AT)
    got = cli(location, "prune", "--older-than", "90d", "--archive", str(tmp_path / "a"), "--yes")
    assert got.returncode == 1 and "moved" in got.stderr
    assert not (tmp_path / "a").exists()


# -- erasure ---------------------------------------------------------------------------------


def test_redact_erases_values_and_their_repetitions_and_verify_knows(
    location: Any, tmp_path: Path
) -> None:
    params = {"to": "ada@example.com", "name": "Ada Lovelace", "n": 3}
    with Ledger.open(location) as led:
        settle(led, "r-1", params, reply={"accepted": "ada@example.com", "id": "m-1"})
        led.record(new_record("open-1", {"to": "bob@example.com"}), actor="t")
    got = cli(
        location,
        "redact",
        "r-1",
        "--field",
        "/to",
        "--reason",
        "erasure request 7",
        "--by",
        "dpo",
        "--json",
    )
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["params"] == {"to": REDACTED, "name": "Ada Lovelace", "n": 3}
    dumped = json.dumps(rawdb.dump(location), default=str)
    assert "ada@example.com" not in dumped
    with Ledger.open(location) as led:
        last = led.events("r-1")[-1]
        assert (last.kind, last.actor, last.detail["reason"]) == (
            "redacted",
            "dpo",
            "erasure request 7",
        )
        assert last.detail["fields"] == ["/to"] and len(last.detail["removed_sha256"]) == 64
        assert not led.verify().findings
    everything = cli(location, "redact", "r-1", "--reason", "the rest", "--json")
    assert everything.returncode == 0, everything.stderr
    assert "Lovelace" not in json.dumps(rawdb.dump(location), default=str)
    assert cli(location, "verify").returncode == 0

    # an archive made afterwards never holds the values
    archive = tmp_path / "after.jsonl"  # the redaction was its last change: 0s ago
    pruned = cli(location, "prune", "--older-than", "0s", "--archive", str(archive), "--yes")
    assert pruned.returncode == 0, pruned.stderr
    assert archive.exists(), pruned.stderr
    assert "ada@example.com" not in archive.read_text() and "Lovelace" not in archive.read_text()
    assert verify_archive(archive).ok


def test_a_value_put_back_where_it_was_erased_is_a_finding(location: Any) -> None:
    with Ledger.open(location) as led:
        settle(led, "r-2", {"to": "eve@example.com"})
    assert cli(location, "redact", "r-2", "--reason", "request").returncode == 0
    rawdb.execute(
        location,
        "UPDATE actions SET params = ? WHERE action_id = 'r-2'",
        ('{"to": "eve@example.com"}',),
    )
    found = cli(location, "verify")
    assert found.returncode == 4 and "r-2: params" in found.stdout


def test_redact_refuses_what_it_must_and_writes_nothing(location: Any) -> None:
    with Ledger.open(location) as led:
        settle(led, "r-3", {"to": "x@example.com"})
        led.record(new_record("open-3", {"to": "y@example.com"}), actor="t")
    before = rawdb.dump(location)
    for args, code, words in (
        (("open-3", "--reason", "r"), 7, "only a settled"),
        (("nobody", "--reason", "r"), 6, "no action"),
        (("r-3", "--field", "/missing", "--reason", "r"), 1, "hold nothing there"),
        (("r-3", "--reason", " "), 1, "--reason is required"),
        # a name that would read as another surface's session, as every --by refuses it
        (("r-3", "--reason", "r", "--by", "ada via ui:token:x"), 1, "--by: a name must not"),
        (("r-3", "--reason", "r", "--by", "ada\x1b[2J"), 1, "--by: a name is"),
    ):
        got = cli(location, "redact", *args)
        assert got.returncode == code, (args, got.stderr)
        assert words in got.stderr and "Traceback" not in got.stderr
    assert rawdb.dump(location) == before


@pytest.mark.slow(seconds=5)
def test_a_redaction_killed_before_its_commit_leaves_the_record_whole(location: Any) -> None:
    with Ledger.open(location) as led:
        settle(led, "r-4", {"to": "kim@example.com"}, reply="sent to kim@example.com")
    before = rawdb.dump(location)
    killed = cli(location, "redact", "r-4", "--reason", "r", crash_at="before_commit:redacted")
    assert killed.returncode == -signal.SIGKILL
    assert rawdb.dump(location) == before


# -- who may forget, on PostgreSQL ----------------------------------------------------------

APP_GRANTS = (
    'GRANT USAGE ON SCHEMA "{s}" TO "{r}"',
    'GRANT SELECT ON "{s}".settled_ledger, "{s}"._migrations TO "{r}"',
    'GRANT SELECT, INSERT, UPDATE ON "{s}".actions TO "{r}"',
    'GRANT SELECT, INSERT ON "{s}".events TO "{r}"',
    'GRANT SELECT, INSERT, UPDATE, DELETE ON "{s}".action_counts TO "{r}"',
    'GRANT SELECT, INSERT, UPDATE ON "{s}".verify_checkpoint TO "{r}"',
)
# what docs/data-protection.md says prune and redact need besides
ERASER_GRANTS = (
    'GRANT SELECT ON "{s}".callbacks TO "{r}"',
    'GRANT DELETE ON "{s}".actions, "{s}".events TO "{r}"',
    'GRANT UPDATE (detail) ON "{s}".events TO "{r}"',
    'GRANT SELECT, INSERT, DELETE ON "{s}".erasing TO "{r}"',
    'GRANT SELECT, INSERT ON "{s}".ledger_events TO "{r}"',
)


@contextmanager
def _role(url: str, name: str, grants: tuple[str, ...]) -> Iterator[str]:
    import pg_schemas as pg

    schema = pg.schema_of(url)
    role = f"{schema}_{name}"
    admin = pg.admin()
    admin.execute(f'CREATE ROLE "{role}" LOGIN')
    try:
        for grant in grants:
            admin.execute(grant.format(s=schema, r=role))
        yield f"postgresql://{role}@/test?{url.split('?', 1)[1]}"
    finally:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,)
        )
        admin.execute(f'DROP OWNED BY "{role}"')
        admin.execute(f'DROP ROLE "{role}"')


@pytest.mark.postgres_only
def test_the_application_role_cannot_forget_and_the_documented_grants_can(
    location: Any, tmp_path: Path
) -> None:
    old = a_ledger_to_prune(location)
    with Ledger.open(location) as led:
        settle(led, "r-9", {"to": "zoe@example.com"})
    before = rawdb.dump(location)
    args = ("prune", "--older-than", "90d", "--yes", "--archive")
    with _role(location, "app", APP_GRANTS) as app:
        got = cli(app, *args, str(tmp_path / "app.jsonl"))
        assert got.returncode == 1 and "Traceback" not in got.stderr, got.stderr
        assert cli(app, "redact", "r-9", "--reason", "r").returncode == 1
        with pytest.raises(rawdb.RAW_ERRORS):
            rawdb.execute(app, "DELETE FROM events WHERE action_id = 'old-0'")
    assert rawdb.dump(location) == before
    with _role(location, "eraser", APP_GRANTS + ERASER_GRANTS) as eraser:
        assert cli(eraser, "redact", "r-9", "--reason", "request").returncode == 0
        done = cli(eraser, *args, str(tmp_path / "eraser.jsonl"))
        assert done.returncode == 0, done.stderr
        with pytest.raises(rawdb.RAW_ERRORS, match="settled: "):  # the guards hold for it too
            rawdb.execute(eraser, "DELETE FROM events WHERE action_id = 'open'")
    left = {"open", "contradicted", "recent", "r-9"}  # r-9: redacted just now
    assert ids(location) == left and not old & ids(location)


def _stopped(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


@pytest.mark.slow(seconds=10)
def test_a_redaction_racing_a_prune_waits_and_finds_the_record_gone(
    location: Any, tmp_path: Path
) -> None:
    """Two real processes: a prune stopped (SIGSTOP) with its batch sealed and its
    transaction open, and a redaction of a record in that batch. The redaction waits
    for the prune's lock, then finds no record (exit 6): it never rewrites a record
    the archive already holds as it was."""
    import time

    from support import popen_cli

    a_ledger_to_prune(location)
    archive = tmp_path / "race.jsonl"
    pruning = popen_cli(
        "--db",
        str(location),
        "prune",
        "--older-than",
        "90d",
        "--archive",
        str(archive),
        "--yes",
        pause_at="prune:sealed",
    )
    deadline = time.monotonic() + 30
    while not _stopped(pruning.pid):
        assert pruning.poll() is None, pruning.communicate()
        assert time.monotonic() < deadline, "the prune never reached its seal"
        time.sleep(0.02)
    redacting = popen_cli("--db", str(location), "redact", "old-0", "--reason", "request")
    if rawdb.is_pg(location):  # seen waiting for the prune's row lock, not merely late
        import pg_schemas as pg

        waiting = (
            "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND application_name = ?"
        )
        while not rawdb.execute(location, waiting, (pg.schema_of(location),)):
            assert redacting.poll() is None, redacting.communicate()
            assert time.monotonic() < deadline, "the redaction never waited for the prune"
            time.sleep(0.02)
    else:  # SQLite: the prune holds the write lock; the redaction cannot have gone first
        assert redacting.poll() is None or redacting.returncode != 0
    os.kill(pruning.pid, signal.SIGCONT)
    _, err = pruning.communicate(timeout=60)
    assert pruning.returncode == 0, err
    _, err = redacting.communicate(timeout=60)
    assert redacting.returncode == 6, err
    assert "person0@example.com" in archive.read_text()  # archived as it was, whole
    with Ledger.open(location) as led:
        assert verify_archive(archive, led).complete


@pytest.mark.postgres_only  # on SQLite the limit would meet the ledger's own file first
def test_an_archive_that_cannot_be_written_prunes_nothing_with_one_line(
    location: Any, tmp_path: Path
) -> None:
    """The archive's file may not grow past 3,000 bytes (RLIMIT_FSIZE, a real write
    failure): the first batch fails as it is archived, and its transaction, which had
    deleted nothing yet, is rolled back."""
    import resource
    import subprocess
    import sys

    a_ledger_to_prune(location)
    before = rawdb.dump(location)

    def small_files() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (3000, 3000))

    archive = tmp_path / "full.jsonl"
    args = ["--db", str(location), "prune", "--older-than", "90d", "--yes"]
    got = subprocess.run(
        [sys.executable, "-m", "settled", *args, "--archive", str(archive), "--batch", "50"],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=small_files,
    )
    assert got.returncode == 1, got.stderr
    assert "cannot write archive" in got.stderr and "Traceback" not in got.stderr
    assert rawdb.dump(location) == before


def _in_one_transaction(location: Any, statements: list[str]) -> None:
    """Raw statements in ONE transaction, rolled back at the end: what a person with a
    SQL shell could do between an allowance and its removal."""
    if rawdb.is_pg(location):
        import psycopg

        with psycopg.connect(str(location)) as conn:
            try:
                for sql in statements:
                    conn.execute(sql)
            finally:
                conn.rollback()
        return
    import sqlite3

    conn = sqlite3.connect(str(location), isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        for sql in statements:
            conn.execute(sql)
    finally:
        conn.execute("ROLLBACK")
        conn.close()


def test_a_redaction_allowance_lets_only_details_change(location: Any) -> None:
    """Even with a valid allowance (a `redacted` event newest, then its row), an event's
    kind, statuses, time or actor cannot change, and no event can be deleted: only its
    detail may be rewritten."""
    with Ledger.open(location) as led:
        settle(led, "g-1", {"to": "gus@example.com"})
    status = "'CONFIRMED', 'CONFIRMED'"
    allowance = [
        "INSERT INTO events (action_id, at, actor, kind, from_status, to_status, attempt, detail)"
        f" VALUES ('g-1', '2026-01-02T00:00:00.000000Z', 'x', 'redacted', {status}, 1, '{{}}')",
        "INSERT INTO erasing (action_id, purpose, run)"
        " SELECT 'g-1', 'redact', max(id) FROM events WHERE action_id = 'g-1'",
    ]
    _in_one_transaction(location, [*allowance, "UPDATE events SET detail = '{}'"])  # allowed
    before = rawdb.dump(location)
    for sql in (
        "UPDATE events SET kind = 'resolved' WHERE action_id = 'g-1'",
        "UPDATE events SET to_status = 'FAILED' WHERE action_id = 'g-1'",
        "UPDATE events SET actor = 'someone' WHERE action_id = 'g-1'",
        "DELETE FROM events WHERE action_id = 'g-1'",
    ):
        with pytest.raises(rawdb.RAW_ERRORS, match="settled: events are append-only"):
            _in_one_transaction(location, [*allowance, sql])
    assert rawdb.dump(location) == before


@pytest.mark.postgres_only
def test_a_prunes_audit_travels_with_migrate_ledger_both_ways(
    location: Any, tmp_path: Path
) -> None:
    """A copy carries the ledger's own events: the archive is still checked, batch by
    batch, against the ledger it now lives in (SQLite → PostgreSQL → SQLite)."""
    source = tmp_path / "source.db"
    a_ledger_to_prune(source)
    archive = tmp_path / "a.jsonl"
    args = ("prune", "--older-than", "90d", "--archive", str(archive), "--batch", "4", "--yes")
    assert cli(source, *args).returncode == 0
    with Ledger.open(source) as led:
        audit = [(e.at, e.actor, e.kind, e.detail) for e in led.ledger_events()]
    assert len(audit) == 2
    there = run_cli("migrate-ledger", str(source), str(location))
    assert there.returncode == 0, there.stderr
    back_to = tmp_path / "back.db"
    back = run_cli("migrate-ledger", str(location), str(back_to))
    assert back.returncode == 0, back.stderr
    for where in (location, back_to):
        with Ledger.open(where) as led:
            assert [(e.at, e.actor, e.kind, e.detail) for e in led.ledger_events()] == audit
            verdict = verify_archive(archive, led)
            assert verdict.ok and verdict.committed == [1, 2], verdict.findings
