"""An incident worked end to end with one command per step, as real processes on both
backends, against the sim's ground truth.

Three hundred sends on two providers, with the sim's fault plan: replies lost after the
provider accepted them (never applied), effects that show up long after the
verification budget ran out (lag), replies lost to a 5xx after the effect was applied,
and a provider whose query API was unreachable while the budgets ran. The passes of
that time leave a few hundred records unresolved. Then, as an operator would:

1. `settled stats` names the groups: budgets spent on "not yet" (sim), records that
   could not be checked for connection errors (mail), and the blind notices only a person can settle;
2. `settled queue --match ConnectError -o name | settled reconcile - --yes` checks the
   outage's records again, once the query API is back: all of them were applied;
3. once the lagged effects are visible, a selector reconcile of the sim's sends
   confirms those and leaves the lost ones;
4. `settled resolve` by selectors records the rest as not applied (after a dry run).

At the end the sim's truth agrees with every record: nothing was sent twice, nothing
is CONFIRMED that was not applied, nothing FAILED that was, and every record's history
replays to its status."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from invariants import check_events
from support import run_cli, sim_conf, write_config

from settled import Ledger
from settled.providers.sim_server import SimServer

pytestmark = pytest.mark.slow(seconds=30)

PLAN = {  # (provider, fault): how many, in the order they are dispatched
    ("mail", "ok"): 60,
    ("mail", "5xx_after"): 40,
    ("sim", "ok"): 80,
    ("sim", "lost_after_accept"): 70,
    ("sim", "lag:12"): 50,  # visible 12 s after it applied: long after its 1 s budget
}
BLIND = 5
BOUND = 180.0  # s for the whole outage phase (a loaded machine, two workers)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed when this returns: connections are refused


def configure(tmp: Path, sim: SimServer, *, mail_reachable: bool) -> None:
    fast = {"verify_interval": 0.1, "verify_deadline": 1.0, "timeout": 2.0}
    mail_url = sim.url if mail_reachable else f"http://127.0.0.1:{closed_port()}"
    write_config(
        tmp / "settled.toml",
        {"sim": sim_conf(sim, **fast), "mail": sim_conf(sim, base_url=mail_url, **fast)},
    )


def ok(out: Any) -> Any:
    assert out.returncode == 0, (out.returncode, out.stdout[-2000:], out.stderr[-2000:])
    return out


def stats(*args: str) -> dict[str, Any]:
    return json.loads(ok(run_cli("stats", *args, "--json")).stdout)  # type: ignore[no-any-return]


def test_an_incident_triaged_one_command_at_a_time(
    tmp_path: Path, sim: SimServer, location: Any
) -> None:
    configure(tmp_path, sim, mail_reachable=True)
    groups: dict[str, list[str]] = {}
    for (provider, fault), n in PLAN.items():
        name = fault.split(":")[0]
        lines = []
        for i in range(n):
            aid = f"{provider}-{name}-{i:03}"
            sim.plan(aid, fault)
            groups.setdefault(f"{provider}-{name}", []).append(aid)
            lines.append(json.dumps({"action_id": aid, "params": {"to": f"u{i}@example.com"}}))
        (tmp_path / f"{provider}-{name}.jsonl").write_text("\n".join(lines) + "\n")
    for i in range(BLIND):
        assert run_cli("dispatch", "sim", "notify", "--action-id", f"notice-{i}").returncode == 4
    for (provider, fault), _n in PLAN.items():  # the lagged ones last: their clock runs first
        file = tmp_path / f"{provider}-{fault.split(':')[0]}.jsonl"
        out = run_cli(
            "dispatch",
            provider,
            "send",
            "--from",
            str(file),
            "--concurrency",
            "8",
            "--json",
            timeout=BOUND,
        )
        assert out.returncode in (0, 3, 4), out.stderr[-2000:]  # pending and unresolved lines

    # -- the outage: mail's query API is unreachable while every budget runs out -------
    configure(tmp_path, sim, mail_reachable=False)
    end = time.monotonic() + BOUND
    for _ in range(200):  # bounded in count and in time
        ok(run_cli("reconcile", "--due", "--concurrency", "8", "--json", timeout=BOUND))
        rows = json.loads(ok(run_cli("queue", "--status", "all", "--json")).stdout)
        if all(r["next_check_at"] is None for r in rows if r["status"] != "CONFIRMED"):
            break
        assert time.monotonic() < end, "the outage's passes never ran the budgets out"

    # -- 1. the first screen ---------------------------------------------------------------
    first = stats()
    assert first["total"] == sum(PLAN.values()) + BLIND
    reasons = {r["reason"]: r for r in first["reasons"]}
    not_yet = [
        r
        for g, r in reasons.items()
        if g.startswith("verification budget spent after #") and "last: not_yet" in g
    ]
    # rule 15: the mail sends were never checked at all, and say so (not "not yet")
    refused = [
        r
        for g, r in reasons.items()
        if g.startswith("could not be checked after #") and "ConnectError" in g
    ]
    assert len(refused) == 1 and refused[0]["count"] == 100, list(reasons)  # one group
    assert refused[0]["by_status"] == {"DENIED_UNRESOLVED": 100}
    lag_left = sum(r["count"] for r in not_yet) - 70  # lost ones, and lagged ones not seen yet
    assert len(not_yet) == 1 and 0 <= lag_left <= 50
    blind = [r for g, r in reasons.items() if g.startswith("blind operation")]
    assert blind and blind[0]["count"] == BLIND
    assert first["by_status"]["DENIED_UNRESOLVED"] == 100 + 70 + lag_left + BLIND
    assert first["age_seconds"]["n"] == first["open"] and first["checks_failing_now"] == 100
    by_provider = {g["key"]: g for g in stats("--by", "provider")["groups"]}
    assert by_provider["mail"]["open"] == 100

    # -- 2. the outage's records, once the query API is back --------------------------------
    configure(tmp_path, sim, mail_reachable=True)
    outage = ok(run_cli("queue", "--match", "connecterror", "-o", "name")).stdout
    assert sorted(outage.split()) == sorted(groups["mail-ok"] + groups["mail-5xx_after"])
    checked = ok(
        run_cli(
            "reconcile", "-", "--yes", "--concurrency", "8", "--json", input=outage, timeout=BOUND
        )
    )
    moved = {c["action_id"]: c["to"] for c in json.loads(checked.stdout)["changes"]}
    assert moved == dict.fromkeys(outage.split(), "CONFIRMED")  # every one had applied

    # -- 3. the lagged effects, once they show ------------------------------------------
    lagged = groups["sim-lag"]
    with Ledger.open(location, create=False) as led:
        keys = [str(led.get(a).reconciliation_key) for a in lagged]
    end = time.monotonic() + BOUND
    while any(sim.effect_view(k) is None for k in keys):  # the provider's own view
        assert time.monotonic() < end, "the lagged effects never showed"
        time.sleep(0.2)
    preview = ok(run_cli("reconcile", "--provider", "sim", "--operation", "send", "--dry-run"))
    planned = [line.split("\t") for line in preview.stdout.splitlines()[1:]]
    assert {p[0] for p in planned} >= set(groups["sim-lost_after_accept"])
    assert all(p[4] == "checked now" for p in planned)
    swept = ok(
        run_cli(
            "reconcile",
            "--provider",
            "sim",
            "--operation",
            "send",
            "--yes",
            "--concurrency",
            "8",
            "--json",
            timeout=BOUND,
        )
    )
    report = json.loads(swept.stdout)
    confirmed = {c["action_id"] for c in report["changes"] if c["to"] == "CONFIRMED"}
    assert confirmed <= set(lagged) and len(confirmed) == lag_left

    # -- 4. what no evidence will settle: a person's verdict, by selectors ---------------------
    left = ok(run_cli("queue", "--provider", "sim", "--operation", "send", "-o", "name")).stdout
    assert sorted(left.split()) == sorted(groups["sim-lost_after_accept"])
    dry = ok(
        run_cli(
            "resolve",
            "--provider",
            "sim",
            "--operation",
            "send",
            "--not-applied",
            "--reason",
            "lost by the provider after accepting it",
            "--dry-run",
        )
    )
    assert "--dry-run: nothing recorded (70 would be)" in dry.stderr
    done = ok(
        run_cli(
            "resolve",
            "--provider",
            "sim",
            "--operation",
            "send",
            "--not-applied",
            "--reason",
            "lost by the provider after accepting it",
            "--yes",
        )
    )
    assert "recorded 70 verdict(s); 0 skipped" in done.stderr

    # -- the truth ------------------------------------------------------------------------
    last = stats()
    assert last["checks_failing_now"] == 0  # the outage's failed checks were made again
    assert last["by_status"] == {
        "PENDING": 0,
        "IN_FLIGHT": 0,
        "AWAITING_VERIFICATION": 0,
        "CONFIRMED": 230,
        "FAILED": 70,
        "DENIED_UNRESOLVED": BLIND,
    }
    with Ledger.open(location, create=False) as led:
        for group, aids in groups.items():
            applied = group != "sim-lost_after_accept"
            for aid in aids:
                rec = led.get(aid)
                assert len(sim.requests_for(aid)) == 1, aid  # sent once, never re-sent
                assert sim.effects_for(aid) == (1 if applied else 0), aid  # never twice
                assert str(rec.status) == ("CONFIRMED" if applied else "FAILED"), (aid, rec.status)
                check_events(led, rec)
    assert len(json.loads(ok(run_cli("queue", "--json")).stdout)) == BLIND
