"""Outages are loud: a provider that answers 503 (or cannot be reached) to every check
for longer than its ``outage_after`` is counted, logged, named in /healthz and
`settled stats`, listed by `queue --include-paused`, and fires the documented alert.
A real daemon process against the sim answering 503, scraped over HTTP; the alert
rules run by promtool on the very figures the daemon exported."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from support import popen_cli, run_cli, sim_conf, write_config
from test_daemon_service import fill, free_port, read_until, scrape, stop
from test_docs_operator import rules_file

from settled.outage import Outages
from settled.providers.sim_server import SimServer
from settled.reconcile import Change

PAUSED = "paused: mail answered HTTP 503; not checked until it recovers"


class Steady:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def change(provider: str = "mail", **over: Any) -> Change:
    ch = Change("a1", "AWAITING_VERIFICATION", "AWAITING_VERIFICATION", "waiting", "")
    ch.provider = provider
    for k, v in over.items():
        setattr(ch, k, v)
    return ch


@pytest.mark.ledger_free
def test_an_outage_is_said_once_when_it_lasts_and_once_when_it_ends() -> None:
    steady = Steady()
    out = Outages({"mail": 60.0}, default=300.0, steady=steady)
    out.saw(change(error=PAUSED, paused="HTTP 503"))
    assert out.pass_ended({"mail": 3}) == []  # trouble, not yet an outage
    steady.now += 59.0
    out.saw(change(error=PAUSED, paused="HTTP 503"))
    assert out.pass_ended({"mail": 3}) == []
    steady.now += 1.0
    out.saw(change(error=PAUSED, paused="HTTP 503"))
    (line,) = out.pass_ended({"mail": 3})
    assert line["event"] == "provider_outage" and line["level"] == "warning"
    assert (line["provider"], line["error"], line["records"]) == ("mail", "HTTP 503", 3)
    assert line["seconds"] == 60.0 and line["outage_after"] == 60.0
    steady.now += 30.0
    out.saw(change(error="ConnectError: refused"))  # a failed attempt: the same outage
    assert out.pass_ended({"mail": 3}) == []  # said once
    assert out.figures()["mail"][:3] == (90.0, True, "ConnectError")
    out.saw(change(seen="applied"))  # it answers again
    (back,) = out.pass_ended({"mail": 2})
    assert back["event"] == "provider_recovered" and back["seconds"] == 90.0
    assert out.figures() == {}


@pytest.mark.ledger_free
def test_trouble_shorter_than_outage_after_is_never_said() -> None:
    steady = Steady()
    out = Outages(default=300.0, steady=steady)
    out.saw(change(error=PAUSED, paused="HTTP 503"))
    steady.now += 299.0
    out.saw(change(seen="not_yet"))  # an answer: the trouble is over
    steady.now += 10.0
    assert out.pass_ended({}) == []
    assert out.figures() == {}


@pytest.mark.ledger_free
def test_records_that_no_longer_fail_end_the_outage() -> None:
    """A person settled every paused record (or none is open any more): nothing of the
    provider fails a check, so it is no longer in an outage."""
    steady = Steady()
    out = Outages(default=10.0, steady=steady)
    out.saw(change(error=PAUSED, paused="HTTP 503"))
    steady.now += 10.0
    assert [e["event"] for e in out.pass_ended({"mail": 1})] == ["provider_outage"]
    assert [e["event"] for e in out.pass_ended({"mail": 0})] == ["provider_recovered"]


@pytest.mark.ledger_free
def test_a_provider_that_answers_is_untouched_by_another_ones_outage() -> None:
    steady = Steady()
    out = Outages(default=1.0, steady=steady)
    out.saw(change("mail", error=PAUSED, paused="HTTP 503"))
    out.saw(change("sms", seen="applied"))
    steady.now += 5.0
    assert [e["provider"] for e in out.pass_ended({"mail": 1})] == ["mail"]
    assert set(out.figures()) == {"mail"}


# -- a real daemon against a provider answering 503 ---------------------------------------


def families(text: str) -> dict[str, Any]:
    from prometheus_client.parser import text_string_to_metric_families

    return {f.name: f for f in text_string_to_metric_families(text)}


def value(fams: dict[str, Any], name: str, **labels: str) -> float:
    for s in fams[name].samples:
        if all(s.labels.get(k) == v for k, v in labels.items()):
            return float(s.value)
    raise AssertionError((name, labels, fams[name].samples))


def wait_for(pred: Any, what: str, timeout: float = 60.0) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = pred()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"never: {what}")


@pytest.mark.ledger_incidental
def test_the_warning_is_written_once_healthz_and_the_gauge_say_it(
    sim: SimServer, db_path: Path
) -> None:
    """Whoever reads ``provider_outage`` (or ``provider_recovered``) and then asks the
    service finds the same there: the pass updates /healthz's body and the gauge
    before it writes either line (a monitor reading the log, then /healthz, once met
    the old state, as `serve --reconcile` did on a loaded machine)."""
    from prometheus_client import generate_latest

    from settled import Ledger
    from settled.metrics import Metrics
    from settled.providers import Registry
    from settled.sweep import Sweeper

    fill(db_path, sim, {"order-1": "ok"}, provider="mail")
    steady = Steady()
    board = Metrics()
    seen: dict[str, tuple[str, float]] = {}

    def log(line: dict[str, Any]) -> None:
        if line["event"] in ("provider_outage", "provider_recovered"):
            fams = families(generate_latest(board.registry).decode())
            gauge = value(fams, "settled_provider_outage", provider="mail")
            seen[line["event"]] = (board.health()[1], gauge)

    reg = Registry({"mail": sim_conf(sim, verify_deadline=600.0)}, source="test")
    try:
        with Ledger.open(db_path) as led:
            sweeper = Sweeper(
                led, reg, metrics=board, log=log, outages=Outages({"mail": 0.0}, steady=steady)
            )
            sim.unavailable(503)
            sweeper.run_pass()
            health, gauge = seen["provider_outage"]
            assert "outage: mail has failed every check for" in health
            assert gauge == 1
            sim.unavailable(None)

            def another_pass() -> bool:  # until the pass that checks it again
                steady.now += 1.0
                sweeper.run_pass()
                return "provider_recovered" in seen

            wait_for(another_pass, "provider_recovered once the provider answers")
            health, gauge = seen["provider_recovered"]
            assert "outage:" not in health
            assert gauge == 0
    finally:
        reg.close()


@pytest.mark.slow
def test_a_provider_stuck_on_503_pages_someone_and_its_recovery_is_said(
    tmp_path: Path, sim: SimServer, db_path: Path
) -> None:
    ids = [f"order-{n}" for n in range(5)]
    fill(db_path, sim, dict.fromkeys(ids, "ok"), provider="mail")  # sent; awaiting proof
    sim.unavailable(503)  # from now on every check of them answers 503
    write_config(
        tmp_path / "settled.toml",
        {"mail": {**sim_conf(sim, verify_deadline=600.0), "outage_after": 2}},
    )
    port = free_port()
    proc = popen_cli(
        "daemon", "--interval", "0.3", "--heartbeat", "1", "--metrics", f"127.0.0.1:{port}"
    )
    try:
        log = read_until(proc, "provider_outage", timeout=60)
        outage = log[-1]
        assert outage["level"] == "warning" and outage["provider"] == "mail"
        assert outage["error"] == "HTTP 503" and outage["records"] == 5
        assert outage["seconds"] >= 2 and outage["outage_after"] == 2
        beat = read_until(proc, "heartbeat", timeout=60)[-1]
        assert beat["failing_since"]["mail"] >= 2
        # a pause is not an attempt: no check_failed line per record, nothing spent
        assert not [e for e in log if e["event"] in ("check_failed", "transition")]

        code, text = scrape(port, "/metrics")
        assert code == 200
        fams = families(text)
        assert value(fams, "settled_checks_failing", provider="mail") == 5
        assert value(fams, "settled_provider_outage", provider="mail") == 1
        assert value(fams, "settled_provider_paused_seconds", provider="mail") >= 2
        during = text

        code, body = scrape(port, "/healthz")
        assert code == 200, body  # the daemon works; the provider is what is down
        assert "cannot be checked now: mail (5 records)" in body
        assert "outage: mail has failed every check for " in body and "HTTP 503" in body

        listed = run_cli("queue", "--fail-if-any", "-o", "name")
        assert listed.returncode == 0 and listed.stdout == ""  # none unresolved yet...
        paused = run_cli("queue", "--include-paused", "--fail-if-any", "-o", "name")
        assert paused.returncode == 4, paused.stderr  # ...but five cannot be checked
        assert sorted(paused.stdout.split()) == ids

        stats = json.loads(run_cli("stats", "--json").stdout)
        assert stats["checks_failing_now"] == 5
        assert stats["checks_failing_by_provider"] == [
            {"provider": "mail", "failing": 5, "paused": 5}
        ]
        table = run_cli("stats", env={"COLUMNS": "200"}).stdout
        assert "checks failing now: 5 (mail: 5 (all paused: it answers 429/503))" in table

        sim.unavailable(None)  # the provider is back
        log = read_until(proc, "provider_recovered", timeout=60)
        assert log[-1]["level"] == "warning" and log[-1]["provider"] == "mail"

        def settled_now() -> str | None:
            _code, text = scrape(port, "/metrics")
            f = families(text)
            done = value(f, "settled_checks_failing", provider="mail") == 0
            return text if done else None

        after = wait_for(settled_now, "the failing checks of mail back at 0")
    finally:
        err = stop(proc)
    assert proc.returncode == 0, err
    fams = families(after)
    assert value(fams, "settled_provider_outage", provider="mail") == 0
    assert value(fams, "settled_provider_paused_seconds", provider="mail") == 0
    moved = run_cli("queue", "--status", "CONFIRMED", "-o", "name").stdout.split()
    assert sorted(moved) == ids  # each one proven once the provider answered again
    if shutil.which("promtool") is not None:
        alerts_fire_on(tmp_path, during)


def alerts_fire_on(tmp_path: Path, exported: str) -> None:
    """promtool runs the documented rules on the gauges the daemon exported during the
    outage, held for 15 minutes: the outage pages at once, and the checks failing for
    10 minutes page too."""
    import yaml

    series = []
    for fam in families(exported).values():
        if fam.type != "gauge" or not fam.name.startswith("settled_"):
            continue
        if fam.name == "settled_last_successful_pass_timestamp_seconds":
            continue  # a wall-clock time: promtool's clock starts at 0
        for s in fam.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            series.append({"series": f"{s.name}{{{labels}}}", "values": f"{s.value:g}x15"})
    (tmp_path / "settled.yml").write_text(rules_file())
    summary = (
        "mail has failed every check for longer than its outage_after (429/503 or "
        "unreachable): settled stats --provider mail"
    )
    broken = (
        "5 mail action(s) cannot be checked: the provider is paused (429/503), unreachable "
        "or cannot be built (settled queue --include-paused --provider mail)"
    )
    test = {
        "rule_files": ["settled.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    {
                        "eval_time": "1m",
                        "alertname": "SettledProviderOutage",
                        "exp_alerts": [
                            {
                                "exp_labels": {"severity": "page", "provider": "mail"},
                                "exp_annotations": {"summary": summary},
                            }
                        ],
                    },
                    {
                        "eval_time": "12m",
                        "alertname": "SettledVerifierBroken",
                        "exp_alerts": [
                            {
                                "exp_labels": {"severity": "page", "provider": "mail"},
                                "exp_annotations": {"summary": broken},
                            }
                        ],
                    },
                ],
            }
        ],
    }
    (tmp_path / "test.yml").write_text(yaml.safe_dump(test, sort_keys=False))
    out = subprocess.run(
        ["promtool", "test", "rules", str(tmp_path / "test.yml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.ledger_free
@pytest.mark.parametrize("bad", ["0", "-5", "true", '"5m"', "1e9"])
def test_a_bad_outage_after_is_one_line_naming_the_key(tmp_path: Path, bad: str) -> None:
    (tmp_path / "settled.toml").write_text(
        f'[providers.mail]\ntype = "sim"\nbase_url = "http://127.0.0.1:9"\noutage_after = {bad}\n'
    )
    out = run_cli("stats")
    assert out.returncode == 1 and out.stdout == ""
    (line,) = out.stderr.splitlines()
    assert "providers.mail.outage_after must be a number of seconds > 0" in line, line
