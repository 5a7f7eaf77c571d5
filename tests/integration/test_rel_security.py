"""Security: the ledger is private (0600, with its WAL and shared-memory files), the
event log cannot be altered through SQL, ``resolve`` records who resolved, and secrets
from ``${VAR}`` headers never reach the ledger, the events, the logs or ``--json``.
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import rawdb
from support import run_cli, write_config
from test_migrate_checks import ERASURE_UNDO_SQLITE, UNDO_SQLITE

from settled import Ledger
from settled.clock import utcnow
from settled.dispatch import Dispatcher
from settled.model import Status
from settled.providers import Registry
from settled.providers.sim_server import SimServer
from settled.resolve import resolve

pytestmark = pytest.mark.slow


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


# ------------------------------------------------------------------------ file modes


@pytest.mark.sqlite_only
@pytest.mark.parametrize("umask", [0o000, 0o022, 0o077])
def test_ledger_and_its_wal_are_0600_whatever_the_umask(
    tmp_path: Path, umask: int, registry: Registry
) -> None:
    old = os.umask(umask)
    try:
        path = tmp_path / "private.db"
        with Ledger.open(path) as ledger:
            Dispatcher(ledger, registry).submit("sim", "book", {}, action_id="a")
            for suffix in ("", "-wal", "-shm"):
                f = Path(f"{path}{suffix}")
                assert f.exists(), suffix
                assert _mode(f) == 0o600, f"{f.name}: {oct(_mode(f))} under umask {oct(umask)}"
    finally:
        os.umask(old)


@pytest.mark.sqlite_only
def test_cli_creates_a_private_ledger_and_folder(tmp_path: Path, sim_config: Path) -> None:
    xdg = tmp_path / "xdg"
    env = {"SETTLED_DB": "", "XDG_DATA_HOME": str(xdg)}
    done = run_cli("dispatch", "sim", "book", "--action-id", "a", env=env)
    assert done.returncode == 0, done.stderr
    db = xdg / "settled" / "settled.db"
    assert _mode(db) == 0o600
    assert _mode(db.parent) & 0o077 == 0  # the folder is not readable by others


# ------------------------------------------------------------------------ the event log


@pytest.fixture
def populated(db_path: Path, registry: Registry) -> Path:
    with Ledger.open(db_path) as ledger:
        Dispatcher(ledger, registry).submit("sim", "book", {}, action_id="a")
    return db_path


EVENT_COLUMNS = "id, action_id, at, actor, kind, from_status, to_status, attempt, detail"
FORGED = "'a', 'x', 'mallory', 'recorded', NULL, 'CONFIRMED', 1, '{}'"


PG_FORGED = "'a', '2026-01-01T00:00:00Z', 'mallory', 'recorded', NULL, 'CONFIRMED', 1, '{}'"
PG_UPSERT = (
    f"INSERT INTO events ({EVENT_COLUMNS}) OVERRIDING SYSTEM VALUE VALUES (1, {PG_FORGED})"
    " ON CONFLICT (id) DO UPDATE SET actor = 'mallory'"
)


@pytest.mark.parametrize(
    ("sql", "pg_sql"),
    [
        ("UPDATE events SET actor = 'mallory'", None),
        ("UPDATE events SET to_status = 'CONFIRMED' WHERE id = 1", None),
        ("DELETE FROM events", None),
        ("DELETE FROM events WHERE id = 1", None),
        ("DELETE FROM actions", None),
        (f"INSERT OR REPLACE INTO events ({EVENT_COLUMNS}) VALUES (1, {FORGED})", PG_UPSERT),
        (f"REPLACE INTO events ({EVENT_COLUMNS}) VALUES (1, {FORGED})", "TRUNCATE events"),
        (
            f"INSERT INTO events ({EVENT_COLUMNS}) VALUES (1, {FORGED})"
            " ON CONFLICT(id) DO UPDATE SET actor = 'mallory'",
            PG_UPSERT,
        ),
        (
            "UPDATE OR REPLACE events SET id = 2 WHERE id = 1",
            "UPDATE events SET attempt = 2 WHERE id = 1",
        ),
        ("DELETE FROM actions WHERE action_id = 'a'", "TRUNCATE actions CASCADE"),
    ],
)
def test_the_event_log_cannot_be_altered_through_sql(
    populated: Path, sql: str, pg_sql: str | None
) -> None:
    if rawdb.is_pg(populated):
        sql = pg_sql or sql
    before = rawdb.execute(populated, "SELECT * FROM events ORDER BY id")
    with pytest.raises(rawdb.RAW_ERRORS, match="settled: "):
        rawdb.execute(populated, sql)
    assert rawdb.execute(populated, "SELECT * FROM events ORDER BY id") == before
    assert rawdb.execute(populated, "SELECT count(*) FROM actions") == [(1,)]


@pytest.mark.sqlite_only
def test_replacing_an_action_row_does_not_delete_it(populated: Path) -> None:
    conn = sqlite3.connect(populated, isolation_level=None)
    try:
        before = conn.execute("SELECT * FROM actions").fetchall()
        conn.execute(
            "INSERT OR REPLACE INTO actions (action_id, provider, operation, params, params_hash,"
            " tier, requires_manual_verification, attempt, idempotency_key, status, delivery,"
            " acceptance, created_at, updated_at, checks) VALUES ('a', 'p', 'o', '{}', 'h',"
            " 'full', 0, 1, 'a:1', 'CONFIRMED', 'DELIVERED', 'ACCEPTED', 't', 't', 0)"
        )
        assert conn.execute("SELECT * FROM actions").fetchall() == before
    finally:
        conn.close()


def test_appending_events_still_works(populated: Path, registry: Registry, sim: SimServer) -> None:
    with Ledger.open(populated) as ledger:
        d = Dispatcher(ledger, registry)
        again = d.submit("sim", "book", {}, action_id="a")  # the existing row, no insert
        assert again.record is not None and again.record.status is Status.CONFIRMED
        d.submit("sim", "send", {}, action_id="b")
        assert [e.kind for e in ledger.events("b")][:2] == ["recorded", "claimed"]
    assert sim.effects_for("a") == 1


# ------------------------------------------------------------------------ resolve


def test_resolve_records_its_actor(ledger: Ledger, registry: Registry) -> None:
    d = Dispatcher(ledger, registry)
    d.submit("sim", "notify", {}, action_id="n")  # blind: unresolved at once
    assert ledger.get("n").status is Status.DENIED_UNRESOLVED
    done = resolve(
        ledger,
        "n",
        applied=True,
        reason="customer confirmed by phone",
        by="alice",
        now=utcnow(),
        evidence="call 17",
    )
    assert done.status is Status.CONFIRMED and done.confirmed_by == "operator:alice"
    last = ledger.events("n")[-1]
    assert (last.kind, last.actor) == ("resolved", "operator:alice")
    assert last.detail["by"] == "alice" and last.detail["reason"] == "customer confirmed by phone"
    assert last.detail["evidence"] == "call 17"


def test_cli_resolve_records_its_actor(sim_config: Path, sim: SimServer) -> None:
    assert run_cli("dispatch", "sim", "notify", "--action-id", "n").returncode == 4
    done = run_cli(
        "resolve", "n", "--applied", "--reason", "seen in the inbox", "--by", "bob", "--json"
    )
    assert done.returncode == 0, done.stderr
    shown = json.loads(run_cli("show", "n", "--json").stdout)
    assert shown["confirmed_by"] == "operator:bob"
    assert shown["events"][-1]["actor"] == "operator:bob"


# ------------------------------------------------------------------------ secrets

SECRET = "s3cr3t-token-4f9a1c0e"


class _Capture:
    """A loopback API that records request headers and can echo them back."""

    def __init__(self, echo: bool) -> None:
        self.headers: list[dict[str, str]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                return None

            def _reply(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(n)
                outer.headers.append(dict(self.headers))
                if echo:  # some APIs echo the request in their errors
                    self._reply(
                        401, {"error": "bad token", "got": self.headers.get("Authorization")}
                    )
                else:
                    self._reply(202, {"id": "m-1", "status": "queued"})

            def do_GET(self) -> None:
                outer.headers.append(dict(self.headers))
                self._reply(
                    200,
                    {"status": "delivered", "auth": self.headers.get("Authorization")}
                    if echo
                    else {"status": "delivered"},
                )

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> _Capture:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"


@pytest.mark.parametrize("echo", [False, True], ids=["plain", "api-echoes-the-header"])
def test_header_secrets_never_reach_ledger_events_logs_or_json(
    tmp_path: Path, db_path: Path, echo: bool
) -> None:
    with _Capture(echo) as api:
        config = write_config(
            tmp_path / "settled.toml",
            {
                "mail": {
                    "type": "http",
                    "base_url": api.url,
                    "timeout": 2.0,
                    "headers": {"Authorization": "Bearer ${MAIL_TOKEN}"},
                    "operations": {
                        "send": {
                            "tier": "reconcilable",
                            "consistency_window": 0,
                            "attempts": 1,
                            "request": {"method": "POST", "path": "/messages"},
                            "reconciliation_key_field": "client_reference",
                            "object_id": "/id",
                            "query": {"method": "GET", "path": "/delivered/{reconciliation_key}"},
                            "status": "/status",
                            "applied": ["delivered"],
                            "not_applied": ["bounced"],
                            "verify": {"interval": 0.05, "deadline": 1},
                        }
                    },
                }
            },
        )
        env = {"MAIL_TOKEN": SECRET, "SETTLED_CONFIG": str(config), "SETTLED_DEBUG": ""}
        outputs = [
            run_cli(
                "dispatch",
                "mail",
                "send",
                "--params",
                '{"to": "a@example.com"}',
                "--action-id",
                "m",
                "--json",
                env=env,
            ),
            run_cli(
                "dispatch",
                "mail",
                "send",
                "--params",
                '{"to": "b@example.com"}',
                "--action-id",
                "m2",
                env=env,
            ),
            run_cli("show", "m", "--json", env=env),
            run_cli("show", "m", env=env),
            run_cli("queue", "--status", "all", "--json", env=env),
            run_cli("providers", "--json", env=env),
            run_cli("providers", env=env),
        ]
        assert any(f"Bearer {SECRET}" == h.get("Authorization") for h in api.headers), (
            "the secret must reach the API, or this test proves nothing"
        )
    for done in outputs:
        assert SECRET not in done.stdout and SECRET not in done.stderr, done.args
    if rawdb.is_pg(db_path):
        assert SECRET not in str(rawdb.dump(db_path))
    for suffix in ("", "-wal"):
        f = Path(f"{db_path}{suffix}")
        if not rawdb.is_pg(db_path) and f.exists():
            assert SECRET.encode() not in f.read_bytes(), f.name
    assert SECRET.encode() not in config.read_bytes()


@pytest.mark.sqlite_only
def test_a_ledger_from_before_the_replace_guard_is_upgraded(populated: Path) -> None:
    conn = sqlite3.connect(populated, isolation_level=None)
    try:  # make it look like a ledger written before migration 002
        # the steps after 008 undone, newest first, as the migration tests undo them
        for statement in UNDO_SQLITE[: UNDO_SQLITE.index(ERASURE_UNDO_SQLITE[-1]) + 1]:
            conn.execute(statement)
        conn.execute("DROP TABLE callbacks")  # 005 and its triggers
        conn.execute("DROP INDEX actions_object")
        conn.execute("DROP INDEX actions_key")
        conn.execute("DROP TRIGGER events_no_replace")
        conn.execute("DROP TRIGGER actions_no_replace")
        conn.execute("DROP INDEX actions_same_change")
        conn.execute("DROP TABLE clock_anchors")
        conn.execute("DROP INDEX actions_check_error")
        conn.execute("DROP TRIGGER actions_status_has_event")  # 007
        for table, verb in (("actions", "insert"), ("actions", "update"), ("events", "insert")):
            conn.execute(f"DROP TRIGGER {table}_not_moved_{verb}")  # 008 (callbacks' went above)
        conn.execute("DROP TABLE ledger_moved")
        for column in ("lands_by", "contradiction", "declared", "counted_checks", "check_error"):
            conn.execute(f"ALTER TABLE actions DROP COLUMN {column}")
        conn.execute("DELETE FROM _migrations WHERE name != '001_initial'")
        conn.execute("PRAGMA user_version = 1")
    finally:
        conn.close()
    with Ledger.open(populated) as ledger:
        assert ledger.integrity_check() == "ok"
    conn = sqlite3.connect(populated, isolation_level=None)
    try:
        triggers = {
            r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='trigger'")
        }
        assert {"events_no_replace", "actions_no_replace"} <= triggers
        with pytest.raises(sqlite3.IntegrityError):
            conn.execute(f"REPLACE INTO events ({EVENT_COLUMNS}) VALUES (1, {FORGED})")
    finally:
        conn.close()
