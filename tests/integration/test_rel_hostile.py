"""Hostile input: fuzzed command lines, ``--params``, config files and provider replies,
SQL injection in ids and filters, and replies larger than the cap.

Each must end in a clear error (documented exit code, one line on stderr) or an honest
record; never a traceback, never a false status, and a rejected command leaves the
ledger exactly as it was (compared row by row).

The command line is driven in process through ``settled.cli.main`` (the same code path
as ``python -m settled``, minus interpreter start-up), with a few real-process checks.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import threading
import tracemalloc
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from invariants import budget, check, dump, scaled, settle
from support import PATIENT, run_cli, sim_conf, write_config

from settled import Ledger
from settled.cli import main
from settled.dispatch import Dispatcher
from settled.model import Status
from settled.providers import Registry, sim
from settled.providers.base import QueryTarget, Request, Seen
from settled.providers.sim_server import SimServer

pytestmark = pytest.mark.slow(seconds=50)

EXIT_CODES = {0, 1, 2, 3, 4, 5, 6, 7}
REJECTED = {1, 2, 6, 7}  # a rejected command: the ledger must not change

FUZZ = settings(
    max_examples=scaled(150),
    deadline=None,
    derandomize=budget() <= 1,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def cli(*argv: str, stdin: str = "") -> tuple[int, str, str]:
    """``settled ARGV`` in process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    old_stdin = sys.stdin
    sys.stdin = io.StringIO(stdin)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main(list(argv))
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            else:
                code = 0
    finally:
        sys.stdin = old_stdin
    return code, out.getvalue(), err.getvalue()


def assert_clean(code: int, out: str, err: str, argv: tuple[str, ...] | list[str]) -> None:
    assert code in EXIT_CODES, (argv, code, err)
    assert "Traceback" not in err and "Traceback" not in out, (argv, err)
    assert "internal error" not in err, (argv, err)
    if code == 1:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("settled: "), (argv, err)


@pytest.fixture
def env(
    tmp_path: Path, sim: SimServer, monkeypatch: pytest.MonkeyPatch, location: Path
) -> dict[str, Any]:
    """A ledger with a few records in each state, a config pointing at the sim, and
    the working directory in tmp (so no fuzzed path lands in the repository)."""
    monkeypatch.chdir(tmp_path)
    # No request here is meant to hang: a lost reply to a fuzzed book would leave it
    # AWAITING_VERIFICATION instead of CONFIRMED.
    conf = sim_conf(sim, verify_deadline=0.3, timeout=PATIENT)
    config = write_config(tmp_path / "settled.toml", {"sim": conf})
    db = location
    monkeypatch.setenv("SETTLED_DB", str(db))
    monkeypatch.setenv("SETTLED_CONFIG", str(config))
    (tmp_path / "notadb.txt").write_text("hello, not a ledger\n")
    for aid, op, fault, later in [
        ("p-1", "send", "ok", True),
        ("c-1", "book", "ok", False),
        ("u-1", "notify", "ok", False),
        ("f-1", "book", "reject", False),
    ]:
        sim.plan(aid, fault)
        args = ["dispatch", "sim", op, "--action-id", aid] + (
            ["--needs-confirmation"] if later else []
        )
        code, _, err = cli(*args)
        assert code in (0, 3, 4, 5), err
    return {"db": db, "config": config, "sim": sim, "tmp": tmp_path}


# ------------------------------------------------------------------------ command lines

COMMANDS = [
    "dispatch",
    "confirm",
    "show",
    "queue",
    "providers",
    "reconcile",
    "resolve",
    "retry",
    "--help",
    "bogus",
    "",
]
FLAGS = [
    "--json",
    "--params",
    "--action-id",
    "--needs-confirmation",
    "--wait-timeout",
    "--status",
    "--provider",
    "--older-than",
    "--fail-if-any",
    "--limit",
    "--applied",
    "--not-applied",
    "--reason",
    "--by",
    "--due",
    "--evidence",
    "--object-id",
    "--help",
    "--",
    "-",
]
WORDS = [
    "sim",
    "book",
    "send",
    "notify",
    "deliver",
    "set",
    "nope",
    "p-1",
    "c-1",
    "u-1",
    "f-1",
    "{}",
    '{"a": 1}',
    "[1]",
    "null",
    '{"a":',
    "10m",
    "-1",
    "nan",
    "inf",
    "1e999",
    "0",
    "1e20",
    "99999999999999999999",
    "2e9d",
    "all",
    "PENDING",
    "pending,FAILED",
    "DENIED_UNRESOLVED",
    "@notadb.txt",
    "@missing.json",
    "' OR 1=1 --",
    "x'); DROP TABLE actions;--",
    "\x00",
    "é",
    "\udcff",
    " lead",
    "a" * 300,
]
TOKENS = st.one_of(
    st.sampled_from(FLAGS),
    st.sampled_from(WORDS),
    st.text(max_size=12),
    st.text(alphabet="-=@{}[]\"':,0123456789", max_size=8),
)
GLOBALS = st.sampled_from(
    [
        [],
        [],
        [],
        ["--db", "ledger.db"],
        ["--db", "notadb.txt"],
        ["--db", "/"],
        ["--db", "missing-dir/x.db"],
        ["--config", "/dev/null"],
        ["--config", "notadb.txt"],
        ["--config", "missing.toml"],
    ]
)


@given(
    globals_=GLOBALS,
    command=st.sampled_from(COMMANDS),
    rest=st.lists(TOKENS, max_size=6),
    stdin=st.text(max_size=40),
)
@FUZZ
def test_fuzzed_command_lines(
    env: dict[str, Any], globals_: list[str], command: str, rest: list[str], stdin: str
) -> None:
    argv = [*globals_, command, *rest] if command else [*globals_, *rest]
    if any(t.startswith("--wait") and t != "--wait-timeout" for t in argv):
        return  # --wait blocks by design; covered elsewhere
    before = dump(env["db"])
    code, out, err = cli(*argv, stdin=stdin)
    assert_clean(code, out, err, argv)
    if code in REJECTED:
        assert dump(env["db"]) == before, (argv, code, err)
    if (
        code in (0, 3, 4, 5)
        and "--json" in argv
        and "--help" not in argv
        and command in ("dispatch", "confirm", "show", "queue", "providers")
    ):
        json.loads(out)
    with Ledger.open(env["db"]) as led:
        check(led, env["sim"], final=False)


# ------------------------------------------------------------------------ --params


@given(
    raw=st.one_of(
        st.text(max_size=60),
        st.sampled_from(
            [
                "{",
                "}",
                "[]",
                "1",
                '"x"',
                "null",
                "true",
                "{'a': 1}",
                '{"a": NaN}',
                '{"a": 1e999}',
                '{"a": "\\ud800"}',
                "[" * 5000 + "]" * 5000,
                '{"a": ' * 3000 + "1" + "}" * 3000,
                "\ufeff{}",
            ]
        ),
        st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=3).map(
            json.dumps
        ),
    )
)
@FUZZ
def test_fuzzed_params(env: dict[str, Any], raw: str) -> None:
    before = dump(env["db"])
    n = len(before)
    code, out, err = cli(
        "dispatch", "sim", "book", "--params", raw, "--action-id", f"pp-{n}", "--json"
    )
    assert_clean(code, out, err, ["--params", raw])
    if code in REJECTED:
        assert dump(env["db"]) == before
        assert "--params" in err
    else:
        record = json.loads(out)
        assert isinstance(record["params"], dict) and record["status"] == "CONFIRMED"


@pytest.mark.ledger_incidental
@pytest.mark.parametrize("content", [b"\xff\xfe{}", b'{"a": "\xc3\x28"}', b"", b"\x00" * 10])
def test_params_file_that_is_not_utf8_json(env: dict[str, Any], content: bytes) -> None:
    (env["tmp"] / "p.json").write_bytes(content)
    before = dump(env["db"])
    code, out, err = cli("dispatch", "sim", "book", "--params", "@p.json")
    assert_clean(code, out, err, ["@p.json"])
    assert code == 1 and dump(env["db"]) == before


def test_params_from_stdin_real_process(env: dict[str, Any]) -> None:
    before = dump(env["db"])
    done = run_cli("dispatch", "sim", "book", "--params", "-", input="{not json")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and dump(env["db"]) == before


# ------------------------------------------------------------------------ config files

CONFIG_LINES = st.lists(
    st.one_of(
        st.sampled_from(
            [
                "[ledger]",
                "[dispatch]",
                "[reconcile]",
                "[daemon]",
                "[providers.sim]",
                "[providers]",
                "[bogus]",
                "[providers.x]",
                'type = "sim"',
                'type = "nope"',
                "type = 5",
                "path = 5",
                'path = ""',
                "busy_timeout = -1",
                "busy_timeout = 'x'",
                "lease_grace = true",
                "lease_grace = -5",
                "batch = 0",
                "batch = 1.5",
                "lease = nan",
                "interval = 0",
                "interval = inf",
                'base_url = "ftp://x"',
                "base_url = 1",
                "timeout = 0",
                "dedupe = 'yes'",
                "attempts = 0",
                "attempts = 2",
                "providers = 1",
                "ledger = 'x'",
                "x = [1, 2",
                "= 1",
                "[[providers.sim]]",
                "headers = { a = 1 }",
                "verify_deadline = -1",
            ]
        ),
        st.text(max_size=20),
    ),
    max_size=8,
)


@pytest.mark.ledger_incidental
@given(lines=CONFIG_LINES)
@FUZZ
def test_fuzzed_config_files(env: dict[str, Any], lines: list[str]) -> None:
    bad = env["tmp"] / "fuzz.toml"
    bad.write_text("\n".join(lines) + "\n", encoding="utf-8", errors="surrogateescape")
    before = dump(env["db"])
    for argv in (
        ["providers", "--json"],
        ["dispatch", "sim", "book", "--json"],
        ["queue", "--json"],
    ):
        code, out, err = cli("--config", str(bad), "--db", str(env["db"]), *argv)
        assert_clean(code, out, err, [*argv, *lines])
        if code in REJECTED:
            assert dump(env["db"]) == before, (argv, lines, err)
        before = dump(env["db"])


@pytest.mark.ledger_incidental
@pytest.mark.parametrize(
    "content",
    [
        b"\xff\xfe\x00garbage",
        b'[providers.sim]\ntype = "sim"\n',
        b'[ledger]\npath = "/"\n',
        b"\x00" * 64,
    ],
)
def test_config_files_real_process(env: dict[str, Any], content: bytes) -> None:
    bad = env["tmp"] / "bad.toml"
    bad.write_bytes(content)
    before = dump(env["db"])
    done = run_cli("--config", str(bad), "dispatch", "sim", "book")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert dump(env["db"]) == before


# ------------------------------------------------------------------------ SQL injection

INJECTIONS = [
    "x'); DROP TABLE actions;--",
    "' OR '1'='1",
    "1; DELETE FROM events",
    '" OR ""="',
    "a' UNION SELECT * FROM events --",
    "%",
    "_",
]


@pytest.mark.parametrize("evil", INJECTIONS)
def test_sql_injection_in_ids_and_filters(env: dict[str, Any], evil: str) -> None:
    with Ledger.open(env["db"]) as led:
        rows_before = len(led.query())
    # an unknown id is just not found, whatever it contains
    before = dump(env["db"])
    for argv in (["show", evil], ["confirm", evil, "--json"]):
        code, out, err = cli(*argv)
        assert_clean(code, out, err, argv)
        assert code == 6 and dump(env["db"]) == before
    # filters match literally: a provider nobody has is an error that lists the real names
    code, out, err = cli("queue", "--status", "all", "--provider", evil, "--json")
    assert code == 1 and out == "" and "known: sim" in err and dump(env["db"]) == before
    code, _, err = cli("queue", "--status", evil)
    assert code == 1 and dump(env["db"]) == before
    # an id is stored and found literally
    code, out, err = cli("dispatch", "sim", "book", "--action-id", evil, "--json")
    assert code == 0, err
    assert json.loads(out)["action_id"] == evil
    code, out, _ = cli("show", evil, "--json")
    assert code == 0 and json.loads(out)["action_id"] == evil
    with Ledger.open(env["db"]) as led:
        assert len(led.query()) == rows_before + 1
        assert led.integrity_check() == "ok"
        check(led, env["sim"], final=False)


# ------------------------------------------------------------------------ provider replies


@pytest.mark.ledger_incidental
def test_status_codes_in_and_outside_rfc_ranges(sim: SimServer, ledger: Ledger) -> None:
    """Every code the sim can answer (200..999) on a full and a reconcilable operation:
    no false status; FAILED exactly for the validation rejections (4xx but 408/429)."""
    registry = Registry({"sim": sim_conf(sim, verify_deadline=0.2, attempts=1)}, source="test")
    try:
        d = Dispatcher(ledger, registry)
        codes = (
            list(range(200, 1000))
            if budget() > 1
            else sorted(
                {
                    200,
                    201,
                    202,
                    204,
                    226,
                    299,
                    300,
                    301,
                    304,
                    399,
                    400,
                    401,
                    404,
                    408,
                    409,
                    418,
                    422,
                    429,
                    451,
                    499,
                    500,
                    501,
                    502,
                    503,
                    504,
                    511,
                    599,
                    600,
                    799,
                    999,
                }
            )
        )
        ids = []
        for code in codes:
            for op in ("book", "send"):
                aid = f"h-{code}-{op}"
                ids.append(aid)
                sim.plan(aid, f"http:{code}")
                d.submit("sim", op, {}, action_id=aid)
        settle(ledger, registry)
        check(ledger, sim, ids=ids)
        for code in codes:
            want = (
                Status.FAILED
                if 400 <= code <= 499 and code not in (408, 429)
                else Status.DENIED_UNRESOLVED
            )
            for op in ("book", "send"):
                assert ledger.get(f"h-{code}-{op}").status is want, (code, op)
    finally:
        registry.close()


@pytest.mark.ledger_incidental
@pytest.mark.parametrize("fault", ["garbage", "badutf8", "huge"])
def test_garbled_replies_after_applying(sim: SimServer, ledger: Ledger, fault: str) -> None:
    registry = Registry({"sim": sim_conf(sim, attempts=1)}, source="test")
    try:
        d = Dispatcher(ledger, registry)
        for op in ("book", "send", "notify"):
            sim.plan(f"{fault}-{op}", fault)
            d.submit("sim", op, {}, action_id=f"{fault}-{op}")
        settle(ledger, registry)
        check(ledger, sim)
        got = {op: ledger.get(f"{fault}-{op}").status for op in ("book", "send", "notify")}
        # the garbled reply proves nothing; the effect query observes what it can
        assert got == {
            "book": Status.CONFIRMED,
            "send": Status.CONFIRMED,
            "notify": Status.DENIED_UNRESOLVED,
        }
    finally:
        registry.close()


class Scripted:
    """A loopback HTTP server whose replies the test scripts: a body (bytes or a
    generator for streaming), a status, and whether it sends Content-Length."""

    def __init__(self) -> None:
        self.replies: dict[str, tuple[int, Any, bool]] = {}
        self.written: dict[str, int] = {}
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                return None

            def _reply(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                if n:
                    self.rfile.read(n)
                key = (
                    f"{self.command} {self.path.split('/')[2] if self.path.count('/') > 1 else ''}"
                )
                code, body, length = outer.replies.get(key, (404, b"{}", True))
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                sent = 0
                try:
                    if isinstance(body, bytes):
                        self.send_header("Content-Length", str(len(body)))
                        self.end_headers()
                        self.wfile.write(body)
                        sent = len(body)
                    elif length:
                        self.send_header("Content-Length", str(64 * 1024 * 1024))
                        self.end_headers()
                        for chunk in body():
                            self.wfile.write(chunk)
                            sent += len(chunk)
                    else:
                        self.send_header("Transfer-Encoding", "chunked")
                        self.end_headers()
                        for chunk in body():
                            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                            sent += len(chunk)
                        self.wfile.write(b"0\r\n\r\n")
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True
                finally:
                    outer.written[key] = sent

            do_GET = do_POST = _reply

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> Scripted:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


HUGE = 64 * 1024 * 1024


def _endless() -> Iterator[bytes]:
    chunk = b"x" * (64 * 1024)
    yield b'{"pad": "'
    for _ in range(HUGE // len(chunk)):
        yield chunk


def _request(aid: str, op: str = "send") -> Request:
    return Request(aid, op, {}, f"{aid}:1", f"rk-{aid}", 1, 5.0)


@pytest.mark.ledger_incidental
@pytest.mark.parametrize("declared", [False, True], ids=["chunked", "content-length"])
def test_huge_reply_is_refused_without_reading_it(declared: bool) -> None:
    with Scripted() as server, httpx.Client() as client:
        server.replies["POST send"] = (200, _endless, declared)
        server.replies["GET effects"] = (200, _endless, declared)
        p = sim.create("sim", {"base_url": server.url}, client)
        tracemalloc.start()
        try:
            wire = p.execute(_request("a1"))
            seen = p.query(QueryTarget("a1", "send", {}, "rk-a1", None, None, 1))
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert "reply larger than 1048576 bytes, not read" in wire.detail
        assert wire.applied is None and wire.object_id is None
        assert seen.seen is Seen.UNKNOWN and "larger than" in seen.detail
        assert peak < 16 * 1024 * 1024, f"peak {peak} bytes for a {HUGE}-byte reply"
        assert server.written.get("POST send", 0) < HUGE // 2


@pytest.mark.ledger_incidental
@pytest.mark.parametrize(
    ("reply", "query"),
    [
        (b'{"id": 5, "status": "queued"}', b'{"status": 5}'),
        (b"[]", b"[]"),
        (b'"just a string"', b'{"id": {"nested": true}}'),
        (b'{"status": ["booked"]}', b"not json at all"),
        (b"\xff\xfe\xfd", b'{"status": null}'),
        (b"", b'{"status": "applied", "id": 7}'),
    ],
)
def test_replies_with_wrong_types_or_missing_fields(
    db_path: Path, reply: bytes, query: bytes
) -> None:
    """Bodies the provider cannot read prove nothing: never CONFIRMED by the reply,
    never a traceback; the action ends unresolved (or confirmed by a query that says
    applied, the provider's own word)."""
    with Scripted() as server:
        server.replies["POST book"] = (200, reply, True)
        server.replies["POST send"] = (202, reply, True)
        server.replies["GET effects"] = (200, query, True)
        registry = Registry(
            {
                "s": {
                    "type": "sim",
                    "base_url": server.url,
                    "timeout": 0.5,
                    "consistency_window": 0.0,
                    "verify_interval": 0.05,
                    "verify_deadline": 0.2,
                    "attempts": 1,
                }
            },
            source="test",
        )
        try:
            with Ledger.open(db_path) as ledger:
                d = Dispatcher(ledger, registry)
                for op in ("book", "send"):
                    rep = d.submit("s", op, {}, action_id=op)
                    assert rep.record is not None and rep.record.status is not Status.CONFIRMED
                    assert rep.record.confirmed_by is None
                settle(ledger, registry)
                for op in ("book", "send"):
                    rec = ledger.get(op)
                    applied_by_query = b'"applied"' in query
                    assert rec.status is (
                        Status.CONFIRMED if applied_by_query else Status.DENIED_UNRESOLVED
                    )
                    if rec.status is Status.CONFIRMED:
                        assert rec.confirmed_by == "reconciliation"
        finally:
            registry.close()


@pytest.mark.ledger_incidental
def test_huge_reply_through_the_command_line(env: dict[str, Any]) -> None:
    """The sim's ``huge`` fault (8 MiB with Content-Length) through a real process."""
    env["sim"].plan("huge-1", "huge")
    done = run_cli("dispatch", "sim", "send", "--action-id", "huge-1", "--json")
    assert done.returncode == 3 and "Traceback" not in done.stderr
    assert json.loads(done.stdout)["status"] == "AWAITING_VERIFICATION"
    shown = run_cli("show", "huge-1", "--json")
    outcome = [e for e in json.loads(shown.stdout)["events"] if e["kind"] == "outcome"]
    assert "reply larger than 1048576 bytes, not read" in outcome[0]["detail"]["tries"][0]["detail"]


@pytest.mark.ledger_incidental
@pytest.mark.parametrize(
    ("reply", "query"),
    [
        (b"{}", b"{}"),  # the pointers /id and /status point at nothing
        (b'{"id": 5}', b'{"status": 5}'),  # wrong types
        (b'{"id": null}', b'{"status": null}'),
        (b"[]", b'"delivered"'),  # not an object at all
        (b"not json", b"not json"),
        (b"\xff\xfe", b"\xff\xfe"),  # invalid UTF-8
    ],
)
def test_http_provider_replies_that_miss_their_pointers(
    db_path: Path, reply: bytes, query: bytes
) -> None:
    """The declarative http provider (docs/providers.md): replies whose JSON pointers find
    nothing, or find the wrong type, prove nothing and raise nothing."""
    with Scripted() as server:
        server.replies["POST send"] = (202, reply, True)
        server.replies["GET effects"] = (200, query, True)
        conf = {
            "type": "http",
            "base_url": server.url,
            "timeout": 1.0,
            "operations": {
                "send": {
                    "tier": "reconcilable",
                    "consistency_window": 0,
                    "attempts": 1,
                    "request": {"method": "POST", "path": "/v1/send"},
                    "reconciliation_key_field": "client_reference",
                    "object_id": "/id",
                    "query": {"method": "GET", "path": "/v1/effects/{reconciliation_key}"},
                    "status": "/status",
                    "applied": ["delivered"],
                    "not_applied": ["bounced"],
                    "verify": {"interval": 0.05, "deadline": 0.3},
                }
            },
        }
        registry = Registry({"api": conf}, source="test")
        try:
            with Ledger.open(db_path) as ledger:
                rep = Dispatcher(ledger, registry).submit("api", "send", {"to": "x"}, action_id="a")
                assert rep.record is not None and rep.record.status is not Status.CONFIRMED
                settle(ledger, registry)
                rec = ledger.get("a")
                assert rec.status is Status.DENIED_UNRESOLVED, rec.reason
                check(ledger, None)
        finally:
            registry.close()
