"""`settled resolve --correct`: a person's verdict that later proved wrong is corrected
by a later verdict with evidence, an event that names the verdict it corrects; never
a status that evidence (not a person) set, never once a retry opened a new attempt,
never without evidence. Real `settled` processes on both backends."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from invariants import dump
from support import PATIENT, run_cli, sim_conf, write_config

from settled import Ledger
from settled.dispatch import Dispatcher
from settled.providers import Registry
from settled.providers.sim_server import SimServer


@pytest.fixture
def wrong(tmp_path: Path, sim: SimServer, db_path: Any) -> Iterator[None]:
    """A blind mail a person failed ("bounced"), and a send the provider rejected."""
    conf = sim_conf(sim, timeout=PATIENT)
    write_config(tmp_path / "settled.toml", {"sim": conf})
    reg = Registry({"sim": conf}, source="test")
    with Ledger.open(db_path) as led:
        d = Dispatcher(led, reg)
        d.submit("sim", "notify", {"to": "c"}, action_id="mail")
        sim.plan("rej", "reject")
        d.submit("sim", "send", {"to": "r"}, action_id="rej")
    reg.close()
    res = run_cli("resolve", "mail", "--not-applied", "--reason", "bounced", "--by", "bob")
    assert res.returncode == 0, res.stderr
    yield


def events(db_path: Any, aid: str) -> list[Any]:
    with Ledger.open(db_path) as led:
        return led.events(aid)


CORRECT = ["resolve", "mail", "--applied", "--correct", "--reason", "customer has it"]


@pytest.mark.usefixtures("wrong")
def test_a_wrong_verdict_is_corrected_with_evidence_and_names_what_it_corrects(
    db_path: Any,
) -> None:
    bobs = events(db_path, "mail")[-1]
    assert (bobs.kind, bobs.to_status, bobs.actor) == ("resolved", "FAILED", "operator:bob")
    before = dump(db_path)
    bare = run_cli(*CORRECT, "--by", "carol")
    assert bare.returncode == 1 and "--evidence" in bare.stderr, bare.stderr
    assert dump(db_path) == before
    res = run_cli(*CORRECT, "--evidence", "ticket 995", "--by", "carol", "--json")
    assert res.returncode == 0, res.stderr
    rec = json.loads(res.stdout)
    assert rec["status"] == "CONFIRMED" and rec["confirmed_by"] == "operator:carol"
    fix = events(db_path, "mail")[-1]
    assert (fix.kind, fix.from_status, fix.to_status) == ("resolved", "FAILED", "CONFIRMED")
    assert fix.detail["corrects"] == bobs.id and fix.detail["evidence"] == "ticket 995"
    assert run_cli("verify").returncode == 0  # the correction is in the transition table
    same = run_cli(*CORRECT, "--evidence", "ticket 996")
    assert same.returncode == 7, same.stderr  # it would change nothing
    log = json.loads(run_cli("log", "--action", "mail", "-o", "json").stdout)
    assert [r["person"] for r in log] == ["carol", "bob"]


@pytest.mark.usefixtures("wrong")
def test_only_a_persons_verdict_on_this_attempt_can_be_corrected(db_path: Any) -> None:
    before = dump(db_path)
    by_evidence = run_cli(
        "resolve", "rej", "--applied", "--correct", "--reason", "x", "--evidence", "y"
    )
    assert by_evidence.returncode == 7 and "only a person's verdict" in by_evidence.stderr
    assert len(by_evidence.stderr.strip().splitlines()) == 1
    chosen = run_cli(
        "resolve", "--provider", "sim", "--applied", "--correct", "--reason", "x", "--evidence", "y"
    )
    assert chosen.returncode == 1 and "exactly one" in chosen.stderr
    assert dump(db_path) == before
    retried = run_cli("retry", "mail")  # a new attempt: settled by its own evidence
    assert retried.returncode == 4, retried.stderr  # blind: unresolved until a person says
    after_retry = run_cli(*CORRECT, "--evidence", "ticket 995")
    assert after_retry.returncode == 7 and "only a settled verdict" in after_retry.stderr
