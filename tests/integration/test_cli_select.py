"""Commands that act on many records, as real processes: ids on stdin (the header of
`queue -o tsv` skipped, `-o name` read as is), show of several, reconcile by
selectors (a preview, the question, --dry-run, --yes, --concurrency), and an empty
stdin that selects nothing."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from invariants import dump
from ledger_rows import add
from support import run_cli, sim_conf, write_config

from settled import Ledger
from settled.cli.select import ids_from_lines, read_ids
from settled.dispatch import Dispatcher
from settled.errors import InvalidInput
from settled.model import Status
from settled.providers import Registry
from settled.providers.sim_server import SimServer

# -- reading ids ----------------------------------------------------------------------


@pytest.mark.ledger_incidental
def test_ids_on_stdin_skip_the_tsv_header_and_read_whole_lines_to_the_first_tab() -> None:
    assert ids_from_lines(["action", "a-1", "", "  b-2  ", "a-1"]) == ["a-1", "b-2", "a-1"]
    whole = "action\tstatus\tcreated\nx 1\tDENIED_UNRESOLVED\t2026\ny\tFAILED\n"
    assert ids_from_lines(whole.splitlines()) == ["x 1", "y"]  # an id may hold a space
    assert ids_from_lines(["a-1", "action"]) == ["a-1", "action"]  # only a first line is a header
    assert ids_from_lines([]) == []
    got = read_ids(["-", "z", "-"], stdin=io.StringIO("action\na\nz\n"))
    assert (got.ids, got.from_stdin) == (["a", "z"], True)
    assert read_ids(["-"], stdin=io.StringIO("")).given  # "-" was given, even with no id
    with pytest.raises(InvalidInput):
        read_ids(["-"], stdin=io.StringIO("ok\nbad\x1bid\n"))


# -- fixtures ---------------------------------------------------------------------------


@pytest.fixture
def unresolved(db_path: Any) -> Ledger:
    """Three unresolved blind records (mail, mail, sim) and one confirmed."""
    with Ledger.open(db_path) as led:
        add(led, "m-1", provider="mail", operation="send", age=300)
        add(led, "m-2", provider="mail", operation="send", age=200)
        add(led, "s-1", provider="sim", operation="notify", age=100)
        add(led, "done", provider="sim", operation="notify", status=Status.CONFIRMED)
        return led


def tsv_of_queue(*args: str) -> str:
    out = run_cli("queue", *args, "-o", "tsv")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("action\t")
    return out.stdout


# -- show ---------------------------------------------------------------------------------


def test_queue_tsv_with_its_header_pipes_into_show_and_resolve(unresolved: Ledger) -> None:
    tsv = tsv_of_queue("--provider", "mail")
    shown = run_cli("show", "-", "--json", input=tsv)
    assert shown.returncode == 0, shown.stderr
    assert [r["action_id"] for r in json.loads(shown.stdout)] == ["m-1", "m-2"]
    cut = "\n".join(line.split("\t")[0] for line in tsv.splitlines()) + "\n"  # `cut -f1`
    done = run_cli("resolve", "-", "--not-applied", "--reason", "bounced", "--yes", input=cut)
    assert done.returncode == 0, done.stderr
    assert "recorded 2 verdict(s); 0 skipped" in done.stderr
    after = json.loads(run_cli("show", "m-1", "m-2", "s-1", "--json").stdout)
    assert [r["status"] for r in after] == ["FAILED", "FAILED", "DENIED_UNRESOLVED"]


def test_queue_names_pipe_into_show(unresolved: Ledger) -> None:
    names = run_cli("queue", "-o", "name")
    assert names.returncode == 0 and names.stdout == "m-1\nm-2\ns-1\n"
    human = run_cli("show", "-", input=names.stdout, env={"COLUMNS": "200"})
    assert human.returncode == 0, human.stderr
    blocks = [line for line in human.stdout.splitlines() if line and line[0] not in " e"]
    assert blocks == ["m-1  DENIED_UNRESOLVED", "m-2  DENIED_UNRESOLVED", "s-1  DENIED_UNRESOLVED"]
    assert human.stdout.count("events") == 3


def test_show_of_several_names_the_missing_and_exits_by_the_worst(unresolved: Ledger) -> None:
    out = run_cli("show", "m-1", "nope", "done", "--json")
    assert out.returncode == 6
    assert [r["action_id"] for r in json.loads(out.stdout)] == ["m-1", "done"]
    assert out.stderr.count("\n") == 1 and "no action 'nope'" in out.stderr
    assert run_cli("show", "done", "m-1", "--exit-status").returncode == 4
    assert run_cli("show", "done", "done").returncode == 0  # repeats shown once
    one = json.loads(run_cli("show", "m-1", "--json").stdout)
    assert isinstance(one, dict) and one["events"]  # one id as an argument: the object
    piped = json.loads(run_cli("show", "-", "--json", input="m-1\n").stdout)
    assert isinstance(piped, list) and len(piped) == 1  # from stdin: always an array
    empty = run_cli("show", "-", "--json", input="")
    assert (empty.returncode, json.loads(empty.stdout)) == (0, [])


# -- resolve ------------------------------------------------------------------------------


def test_an_empty_stdin_settles_nothing(unresolved: Ledger, db_path: Any) -> None:
    """`settled queue --older-than 1h -o name | settled resolve - ... --yes` on an empty
    queue used to settle every unresolved record the default selection held."""
    before = dump(db_path)
    for stdin in ("", "action\n", "\n\n"):
        out = run_cli("resolve", "-", "--applied", "--reason", "x", "--yes", input=stdin)
        assert out.returncode == 0, out.stderr
        assert "recorded 0 verdict(s)" in out.stderr
    assert dump(db_path) == before


def test_ids_on_stdin_are_never_settled_without_yes(unresolved: Ledger, db_path: Any) -> None:
    before = dump(db_path)
    out = run_cli("resolve", "-", "--applied", "--reason", "x", input="m-1\n")
    assert out.returncode == 1 and "without --yes" in out.stderr
    assert dump(db_path) == before


# -- reconcile by selectors ---------------------------------------------------------------


@pytest.fixture
def checkable(sim: SimServer, tmp_path: Path, db_path: Any) -> list[str]:
    """Six unresolved sends on two providers (lost replies the query will find:
    5xx after applying), one blind notify (a person's), and one confirmed."""
    conf = sim_conf(sim, verify_deadline=600.0)
    write_config(tmp_path / "settled.toml", {"sim": dict(conf), "mail": dict(conf)})
    ids = []
    with Registry({"sim": conf, "mail": conf}, source="test") as reg, Ledger.open(db_path) as led:
        d = Dispatcher(led, reg)
        for i in range(6):
            aid = f"{'sim' if i % 2 else 'mail'}-{i}"
            sim.plan(aid, "5xx_after")
            d.submit("sim" if i % 2 else "mail", "send", {"n": i}, action_id=aid)
            ids.append(aid)
        d.submit("sim", "notify", {}, action_id="blind-1")
        d.submit("sim", "book", {}, action_id="booked")
    return ids


def test_reconcile_by_selectors_previews_asks_and_checks(
    checkable: list[str], sim: SimServer, db_path: Any
) -> None:
    before = dump(db_path)
    dry = run_cli("reconcile", "--provider", "sim", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    rows = [line.split("\t") for line in dry.stdout.splitlines()]
    assert rows[0] == ["action", "status", "age", "operation", "becomes", "why"]
    plan = {r[0]: r[4] for r in rows[1:]}
    assert plan == {
        "sim-1": "checked now",
        "sim-3": "checked now",
        "sim-5": "checked now",
        "blind-1": "(skipped)",
    }
    assert "needs a person" in next(r[5] for r in rows if r[0] == "blind-1")
    assert "--dry-run: nothing checked (3 would be)" in dry.stderr
    js = json.loads(run_cli("reconcile", "--provider", "sim", "--dry-run", "--json").stdout)
    assert {(r["action_id"], r["checked"], bool(r["skipped"])) for r in js} == {
        ("sim-1", False, False),
        ("sim-3", False, False),
        ("sim-5", False, False),
        ("blind-1", False, True),
    }
    refused = run_cli("reconcile", "--provider", "sim")  # no terminal to ask, no --yes
    assert (
        refused.returncode == 1 and "refusing to check 3 action(s) without --yes" in refused.stderr
    )
    assert dump(db_path) == before  # previews and refusals change nothing
    assert sum(sim.queries_for(k) for k in sim.truth()["queries"]) == 0

    done = run_cli("reconcile", "--provider", "sim", "--yes", "--concurrency", "4", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert {c["action_id"]: c["to"] for c in report["changes"]} == {
        "sim-1": "CONFIRMED",
        "sim-3": "CONFIRMED",
        "sim-5": "CONFIRMED",
    }
    assert report["not_checked"] == [
        {"action_id": "blind-1", "why": "needs a person: `settled resolve`"}
    ]
    with Ledger.open(db_path) as led:
        assert [str(led.get(a).status) for a in ("mail-0", "mail-2", "mail-4")] == [
            "DENIED_UNRESOLVED"
        ] * 3  # not selected
    assert all(sim.effects_for(a) == 1 for a in checkable)  # checked, never re-sent


def test_reconcile_reads_ids_from_stdin_and_names_what_it_left(
    checkable: list[str], sim: SimServer, db_path: Any
) -> None:
    names = run_cli("queue", "--provider", "mail", "-o", "name").stdout
    assert names == "mail-0\nmail-2\nmail-4\n"
    out = run_cli("reconcile", "-", "--yes", input="action\n" + names + "nope\nbooked\n")
    assert out.returncode == 6, out.stderr  # a named id was not found; the others checked
    assert "nope: not checked: not found" in out.stderr
    assert "booked: not checked: nothing to reconcile: CONFIRMED" in out.stderr
    assert out.stdout.count("DENIED_UNRESOLVED → CONFIRMED") == 3
    narrowed = run_cli("reconcile", "-", "--provider", "sim", "--dry-run", input="mail-0\nsim-1\n")
    assert "not selected by the filters" in narrowed.stdout
    assert run_cli("reconcile", "-", input="").returncode == 0  # nothing named: nothing to do


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--due", "--provider", "sim"), "give no ACTION_IDs or selectors with it"),
        (("--due", "-"), "give no ACTION_IDs or selectors with it"),
        (("--due", "--dry-run"), "not --due"),
        (("sim-1", "--limit", "2"), "--limit applies to --due and to selectors"),
        (("--log", "xml", "--provider", "sim"), "--log 'xml'"),
    ],
)
def test_reconcile_usage(checkable: list[str], args: tuple[str, ...], needle: str) -> None:
    out = run_cli("reconcile", *args)
    assert out.returncode == 2 and needle in out.stderr, out.stderr


def test_reconcile_selection_honours_limit_and_unknown_names(
    checkable: list[str], db_path: Any
) -> None:
    out = run_cli("reconcile", "--status", "DENIED_UNRESOLVED", "--limit", "2", "--dry-run")
    assert [line.split("\t")[0] for line in out.stdout.splitlines()[1:]] == ["mail-0", "sim-1"]
    bad = run_cli("reconcile", "--provider", "smi", "--yes")
    assert bad.returncode == 1 and "known: mail, sim" in bad.stderr


def test_reconcile_ids_run_concurrently_and_keep_their_exit_codes(
    checkable: list[str], sim: SimServer
) -> None:
    one = run_cli("reconcile", "mail-0", "--concurrency", "4")
    assert one.returncode == 0, one.stderr  # one id: its status (CONFIRMED)
    many = run_cli("reconcile", *checkable[1:], "--concurrency", "4", "--json")
    assert many.returncode == 0, many.stderr
    assert len(json.loads(many.stdout)["changes"]) == 5
    assert run_cli("reconcile", "mail-0", "nope").returncode == 6  # before anything is checked


class Barrier:
    """A provider's query API that answers only once ``parties`` queries are in flight
    at the same moment (503 if that never happens within the bound): proof that the
    checks ran concurrently, with no timing in the test."""

    def __init__(self, parties: int) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.barrier = threading.Barrier(parties, timeout=30)
        self.broken = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                try:
                    outer.barrier.wait()
                    code, body = 200, b'{"status": "delivered", "id": "x"}'
                except threading.BrokenBarrierError:
                    outer.broken += 1
                    code, body = 503, b'{"error": "alone"}'
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.barrier.abort()
        self.httpd.shutdown()
        self.httpd.server_close()


def test_a_selector_reconcile_runs_its_checks_concurrently(
    sim: SimServer, tmp_path: Path, db_path: Any
) -> None:
    conf = sim_conf(sim, verify_deadline=600.0)
    with Registry({"sim": conf}, source="test") as reg, Ledger.open(db_path) as led:
        d = Dispatcher(led, reg)
        for i in range(4):
            sim.plan(f"c-{i}", "5xx_after")  # applied, reply lost: DENIED, queryable
            d.submit("sim", "send", {"n": i}, action_id=f"c-{i}")
    api = Barrier(4)
    try:
        write_config(
            tmp_path / "settled.toml",
            {"sim": sim_conf(sim, base_url=api.url, timeout=40.0, verify_deadline=600.0)},
        )
        out = run_cli("reconcile", "--provider", "sim", "--yes", "--concurrency", "4", "--json")
        assert out.returncode == 0, out.stderr
        moved = {c["action_id"]: c["to"] for c in json.loads(out.stdout)["changes"]}
        assert moved == {f"c-{i}": "CONFIRMED" for i in range(4)} and api.broken == 0
    finally:
        api.close()


def test_many_ids_on_stdin_with_selectors(unresolved: Ledger, db_path: Any) -> None:
    """Thousands of named ids narrowed by selectors: bound in slices, never one
    statement with more values than a database takes."""
    names = [f"x-{i}" for i in range(1500)] + ["m-2", "s-1"]
    out = run_cli(
        "resolve",
        "-",
        "--provider",
        "mail",
        "--applied",
        "--reason",
        "r",
        "--dry-run",
        input="\n".join(names) + "\n",
    )
    assert out.returncode == 0, out.stderr
    rows = [line.split("\t") for line in out.stdout.splitlines()[1:]]
    assert len(rows) == 1502
    assert {r[0]: r[4] for r in rows if r[4] != "(skipped)"} == {"m-2": "CONFIRMED"}
    assert sum(1 for r in rows if r[5] == "not found") == 1500
    assert "--dry-run: nothing recorded (1 would be)" in out.stderr
