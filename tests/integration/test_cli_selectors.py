"""Every bulk verb selects as ``settled queue`` does: ``resolve``, ``retry`` and
``reconcile`` take --match, --search, --cause, --since, --older-than, --status,
--provider, --operation and --delivery, parsed by ``settled.selection`` into the same
``Selection``; each only narrows the verb's own default; a bad value is one line, exit
1, the ledger unchanged. Real CLI processes, a real provider on 127.0.0.1, both
backends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from invariants import dump
from support import ROOT, run_cli, sim_conf, write_config

from settled import Ledger
from settled.dispatch import Dispatcher
from settled.providers import Registry
from settled.providers.sim_server import SimServer

# id -> (provider, operation, the provider's answer to the first send)
SENT = {
    "m503-a": ("mail", "send", "http:503"),
    "m503-b": ("mail", "send", "http:503"),
    "m500": ("mail", "send", "http:500"),
    "c503": ("cal", "send", "http:503"),
}


@pytest.fixture
def held(tmp_path: Path, sim: SimServer, db_path: Any) -> Iterator[dict[str, Any]]:
    """Four sends the provider answered 5xx (unresolved, each with its cause), and
    one blind notify on mail whose params hold an order number."""
    conf = sim_conf(sim, verify_interval=0.1, verify_deadline=0.3)
    confs = {"mail": conf, "cal": conf}
    write_config(tmp_path / "settled.toml", confs)
    reg = Registry(confs, source="test")
    with Ledger.open(db_path) as led:
        d = Dispatcher(led, reg)
        for aid, (provider, operation, fault) in SENT.items():
            sim.plan(aid, fault)
            d.submit(provider, operation, {"to": aid}, action_id=aid)
        d.submit("mail", "notify", {"order": "10927", "to": "ana"}, action_id="blind-n")
        got = {r.action_id: (str(r.status), r.cause) for r in led.query()}
    reg.close()
    assert got == {
        "m503-a": ("DENIED_UNRESOLVED", "http_503"),
        "m503-b": ("DENIED_UNRESOLVED", "http_503"),
        "m500": ("DENIED_UNRESOLVED", "http_500"),
        "c503": ("DENIED_UNRESOLVED", "http_503"),
        "blind-n": ("DENIED_UNRESOLVED", "blind"),
    }
    yield confs


def statuses(db_path: Any) -> dict[str, str]:
    with Ledger.open(db_path, create=False) as led:
        return {r.action_id: str(r.status) for r in led.query()}


def checks(db_path: Any) -> dict[str, int]:
    """How many checks each record has had."""
    with Ledger.open(db_path, create=False) as led:
        return {r.action_id: r.checks for r in led.query()}


def sends(sim: SimServer) -> dict[str, list[str]]:
    return {a: [r["idempotency_key"] for r in sim.requests_for(a)] for a in SENT}


def fail_all_sends() -> None:
    """Every 5xx send FAILED by a person's verdict (what a retry needs first)."""
    out = run_cli(
        "resolve",
        "--cause",
        "http_503,http_500",
        "--not-applied",
        "--no-recheck",
        "--reason",
        "bounce reports",
        "--yes",
    )
    assert out.returncode == 0, out.stderr
    assert "recorded 4 verdict(s); 0 skipped" in out.stderr


def test_retry_by_provider_and_cause_resends_only_those(
    held: Any, db_path: Any, sim: SimServer
) -> None:
    fail_all_sends()
    out = run_cli("retry", "--provider", "mail", "--cause", "http_503", "--yes")
    assert out.returncode in (0, 3), out.stderr  # sent again; their checks come later
    assert "retried 2 action(s); 0 not retried" in out.stderr
    assert sends(sim) == {
        "m503-a": ["m503-a:1", "m503-a:2"],
        "m503-b": ["m503-b:1", "m503-b:2"],
        "m500": ["m500:1"],
        "c503": ["c503:1"],
    }
    now = statuses(db_path)
    assert now["m500"] == now["c503"] == "FAILED" and now["blind-n"] == "DENIED_UNRESOLVED"


def test_retry_preview_counts_the_records_a_check_comes_first_for(
    held: Any, db_path: Any, sim: SimServer
) -> None:
    fail_all_sends()
    blind = run_cli("resolve", "blind-n", "--not-applied", "--reason", "never arrived")
    assert blind.returncode == 0, blind.stderr
    before, asked = dump(db_path), sim.truth()
    out = run_cli("retry", "--provider", "mail", "--dry-run")
    assert out.returncode == 0, out.stderr
    rows = {line.split("\t")[0] for line in out.stdout.splitlines()[1:]}
    assert rows == {"m503-a", "m503-b", "m500", "blind-n"}
    assert "3 of the 4 would first be checked (their operation has a query)" in out.stderr
    js = run_cli("retry", "--provider", "mail", "--dry-run", "--json")
    first = {r["action_id"]: r["checked_first"] for r in json.loads(js.stdout)}
    assert first == {"m503-a": True, "m503-b": True, "m500": True, "blind-n": False}
    off = run_cli("retry", "--provider", "mail", "--dry-run", "--no-recheck")
    assert off.returncode == 0 and "would first be checked" not in off.stderr
    assert dump(db_path) == before and sim.truth() == asked  # the preview asked nobody


def test_resolve_by_search_and_cause_settles_only_that_record(held: Any, db_path: Any) -> None:
    out = run_cli(
        "resolve", "--search", "10927", "--cause", "blind", "--applied", "--reason", "CRM", "--yes"
    )
    assert out.returncode == 0, out.stderr
    assert "recorded 1 verdict(s)" in out.stderr
    assert statuses(db_path) == {
        "m503-a": "DENIED_UNRESOLVED",
        "m503-b": "DENIED_UNRESOLVED",
        "m500": "DENIED_UNRESOLVED",
        "c503": "DENIED_UNRESOLVED",
        "blind-n": "CONFIRMED",
    }
    # --search keeps resolve's default statuses: the confirmed record is not selected again
    again = run_cli("resolve", "--search", "10927", "--applied", "--reason", "x", "--dry-run")
    assert again.returncode == 0 and "nothing recorded (0 would be)" in again.stderr


def test_reconcile_by_cause_match_and_since_checks_only_those(
    held: Any, db_path: Any, sim: SimServer
) -> None:
    args = ("reconcile", "--cause", "http_503", "--match", "scripted", "--since", "1h")
    js = run_cli(*args, "--operation", "send", "--dry-run", "--json")
    assert js.returncode == 0, js.stderr
    assert sorted(r["action_id"] for r in json.loads(js.stdout)) == ["c503", "m503-a", "m503-b"]
    asked = checks(db_path)
    out = run_cli(*args, "--provider", "cal", "--yes")
    assert out.returncode == 0, out.stderr
    assert "examined 1" in out.stderr
    after = checks(db_path)
    assert after.pop("c503") == asked.pop("c503") + 1
    assert after == asked
    old = run_cli("reconcile", "--cause", "http_503", "--older-than", "1h", "--dry-run")
    assert old.returncode == 0 and "nothing checked (0 would be)" in old.stderr


def test_selectors_narrow_ids_from_stdin(held: Any, db_path: Any) -> None:
    ids = "action\tstatus\n" + "".join(f"{a}\tDENIED_UNRESOLVED\n" for a in [*SENT, "blind-n"])
    out = run_cli(
        "resolve", "-", "--cause", "http_500", "--not-applied", "--no-recheck", "--reason", "r",
        "--yes", input=ids,
    )  # fmt: skip
    assert out.returncode == 7, out.stderr  # the others: not selected, each says so
    assert "recorded 1 verdict(s); 4 skipped" in out.stderr
    assert out.stderr.count("not selected by the filters") == 4
    assert statuses(db_path)["m500"] == "FAILED"
    assert sum(s == "DENIED_UNRESOLVED" for s in statuses(db_path).values()) == 4


VERBS = {
    "resolve": ("resolve", "--applied", "--reason", "x", "--yes"),
    "retry": ("retry", "--yes"),
    "reconcile": ("reconcile", "--yes"),
}
BAD = {
    "cause": (("--cause", "http_5"), "unknown cause 'http_5'"),
    "search": (("--search", "ab"), "each word of a search needs at least 3 characters"),
    "match": (("--match", " "), "--match needs some text"),
    "since": (("--since", "soon"), "bad duration 'soon'"),
    "older-than": (("--older-than", "-1h"), "bad duration '-1h'"),
    "status": (("--status", "DONE"), "--status DONE: unknown status"),
    "delivery": (("--delivery", "SENT"), "--delivery SENT: unknown delivery"),
    "provider": (("--provider", "billing"), "--provider billing: no such provider"),
    "operation": (("--operation", "nope"), "--operation nope: no such operation"),
}


@pytest.mark.parametrize("verb", sorted(VERBS))
@pytest.mark.parametrize("bad", sorted(BAD))
def test_a_bad_selector_is_one_line_exit_1_and_changes_nothing(
    held: Any, db_path: Any, verb: str, bad: str
) -> None:
    args, says = BAD[bad]
    before = dump(db_path)
    out = run_cli(*VERBS[verb], *args)
    assert out.returncode == 1, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("settled: error:"), out.stderr
    assert says in lines[0] and "Traceback" not in out.stderr
    assert dump(db_path) == before


@pytest.mark.ledger_free
def test_the_cause_and_delivery_selectors_complete_in_the_shell(tmp_path: Path) -> None:
    def complete(line: str) -> list[str]:
        env = {
            **os.environ,
            "_SETTLED_COMPLETE": "complete_bash",
            "COMP_LINE": line,
            "COMP_POINT": str(len(line)),
            "COMP_WORDBREAKS": "\"'><=;|&(:",
            "SETTLED_DB": str(tmp_path / "none.db"),
        }
        out = subprocess.run(
            [sys.executable, "-m", "settled"], env=env, capture_output=True, text=True, cwd=ROOT
        )
        return [x for x in out.stdout.split("\n") if x]

    assert complete("settled retry --cause reply") == ["reply_lost"]
    assert complete("settled reconcile --cause http_503,bl") == ["http_503,blind"]
    assert complete("settled resolve --delivery UNK") == ["UNKNOWN"]
    assert complete("settled queue --cause http") == ["http_503"]
    assert not (tmp_path / "none.db").exists()  # completing opens no ledger
