"""Every command that changes a record names its person: `--by`, else
`SETTLED_OPERATOR`, else the OS user, as `operator:NAME` in the events it writes
(resolve, retry, confirm, reconcile); a name that would read as a surface (`` via ``)
or hold a control character is refused before anything is written. Real `settled`
processes against the sim server, on both backends."""

from __future__ import annotations

import getpass
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from invariants import dump
from support import PATIENT, popen_cli, run_cli, sim_conf, write_config
from test_rel_edges import wait_stopped

from settled import Ledger, policy
from settled.dispatch import Dispatcher
from settled.model import Status
from settled.providers import Registry
from settled.providers.sim_server import SimServer


@pytest.fixture
def staged(tmp_path: Path, sim: SimServer, db_path: Any) -> Iterator[None]:
    """One record for each command: an unresolved blind notify (resolve), a rejected
    send (retry), a held send (confirm) and an accepted send not yet verified
    (reconcile)."""
    conf = sim_conf(sim, timeout=PATIENT, verify_interval=0.1, verify_deadline=30.0)
    write_config(tmp_path / "settled.toml", {"sim": conf})
    reg = Registry({"sim": conf}, source="test")
    with Ledger.open(db_path) as led:
        d = Dispatcher(led, reg)
        d.submit("sim", "notify", {"to": "n"}, action_id="blind")
        sim.plan("rej", "reject")
        d.submit("sim", "send", {"to": "r"}, action_id="rej")
        d.submit("sim", "send", {"to": "h"}, action_id="held", needs_confirmation=True)
        d.submit("sim", "send", {"to": "w"}, action_id="wait")
        assert [led.get(a).status for a in ("blind", "rej", "held", "wait")] == [
            Status.DENIED_UNRESOLVED,
            Status.FAILED,
            Status.PENDING,
            Status.AWAITING_VERIFICATION,
        ]
    reg.close()
    yield


def without_operator(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "SETTLED_OPERATOR"}
    env.update(extra)
    return env


def actors(db_path: Any, aid: str, *kinds: str) -> list[str]:
    with Ledger.open(db_path) as led:
        return [e.actor for e in led.events(aid) if e.kind in kinds]


COMMANDS = {
    "resolve": ["resolve", "blind", "--applied", "--reason", "customer replied"],
    "retry": ["retry", "rej"],
    "confirm": ["confirm", "held"],
    "reconcile": ["reconcile", "wait"],
}


@pytest.mark.usefixtures("staged")
def test_by_then_the_environment_name_the_person_of_every_command(db_path: Any) -> None:
    env = {"SETTLED_OPERATOR": "erin"}
    res = run_cli(*COMMANDS["resolve"], env=env)
    assert res.returncode == 0, res.stderr
    assert actors(db_path, "blind", "resolved") == ["operator:erin"]
    with Ledger.open(db_path) as led:
        assert led.get("blind").confirmed_by == "operator:erin"
    res = run_cli(*COMMANDS["retry"], "--by", "frank", env=env)  # --by wins over the env
    assert res.returncode in (0, 3), res.stderr
    assert actors(db_path, "rej", "retry", "claimed")[-2:] == ["operator:frank"] * 2
    res = run_cli(*COMMANDS["confirm"], env=env)
    assert res.returncode in (0, 3), res.stderr
    assert actors(db_path, "held", "claimed", "outcome") == ["operator:erin"] * 2
    res = run_cli(*COMMANDS["reconcile"], "--by", "gus")
    assert res.returncode == 0, res.stderr
    assert actors(db_path, "wait", "reconciled") == ["operator:gus"]  # no longer `reconciler`


@pytest.mark.usefixtures("staged")
def test_without_by_or_the_environment_the_os_user_is_named(db_path: Any) -> None:
    res = run_cli(*COMMANDS["resolve"], env=without_operator())
    assert res.returncode == 0, res.stderr
    assert actors(db_path, "blind", "resolved") == [f"operator:{getpass.getuser()}"]


BAD_NAMES = ["alice via api:ops", "a\x1b[31mb", "tab\there", "zero\u200bwidth", "", "  "]


@pytest.mark.usefixtures("staged")
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_name_that_reads_as_a_surface_or_hides_text_is_refused(
    db_path: Any, command: str
) -> None:
    before = dump(db_path)
    for bad in BAD_NAMES:
        res = run_cli(*COMMANDS[command], "--by", bad, env=without_operator())
        assert res.returncode == 1, (bad, res.stderr)
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and "--by" in lines[0] and "Traceback" not in res.stderr
        assert res.stdout == ""
    res = run_cli(*COMMANDS[command], env=without_operator(SETTLED_OPERATOR="bob via ui:x"))
    assert res.returncode == 1 and "SETTLED_OPERATOR" in res.stderr, res.stderr
    assert dump(db_path) == before  # nothing written, nothing sent


def test_a_verdict_that_loses_a_race_names_what_won(
    tmp_path: Path, sim: SimServer, db_path: Any
) -> None:
    """Amy's "not applied" waits for its check (stopped there: SIGSTOP, a slow provider);
    meanwhile Bob's "applied" is recorded. Amy's verdict is refused with exit 7 and one
    line naming what won: the status, who and when; her claim is kept as a note."""
    conf = sim_conf(sim, timeout=10.0)
    write_config(tmp_path / "settled.toml", {"sim": conf})
    reg = Registry({"sim": conf}, source="test")
    with Ledger.open(db_path) as led:
        sim.plan("race", "lost_after_accept")
        Dispatcher(led, reg).submit("sim", "send", {"to": "x"}, action_id="race")
        now = led.clock().now()
        led.move(policy.unresolved(led.get("race"), now, "given up", {}, owner=None, actor="t"))
    reg.close()
    amy = popen_cli(
        "resolve",
        "race",
        "--not-applied",
        "--reason",
        "bounced",
        "--by",
        "amy",
        pause_at="before_check",
    )
    try:
        wait_stopped(amy.pid)
        bob = run_cli("resolve", "race", "--applied", "--reason", "customer has it", "--by", "bob")
        assert bob.returncode == 0, bob.stderr
    finally:
        os.kill(amy.pid, signal.SIGCONT)
    _out, err = amy.communicate(timeout=60)
    assert amy.returncode == 7, err
    line = err.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in err
    with Ledger.open(db_path) as led:
        rec = led.get("race")
        won = next(e for e in led.events("race") if e.kind == "resolved")
        claim = led.events("race")[-1]
    assert rec.status.value == "CONFIRMED" and rec.confirmed_by == "operator:bob"
    assert f"changed to CONFIRMED (by operator:bob at {won.at}, resolved)" in line
    assert (claim.kind, claim.actor, claim.detail["reason"]) == ("note", "operator:amy", "bounced")
