"""settled_queue_depth reads 0 instead of vanishing: a real daemon with --metrics,
scraped over HTTP and parsed with prometheus_client's parser. Known providers are the
configured ones and those with records; every open status of each is a series."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from ledger_rows import add
from support import popen_cli, run_cli, sim_conf, write_config

from settled import Ledger
from settled.model import Status
from settled.providers.sim_server import SimServer

OPEN = ("PENDING", "IN_FLIGHT", "AWAITING_VERIFICATION", "DENIED_UNRESOLVED")
BOUND = 60.0


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def depth(port: int) -> dict[tuple[str, str], float] | None:
    """The queue depth series, or None before the first pass has finished."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as r:
            if r.status != 200:
                return None
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
    except (urllib.error.URLError, ConnectionError):
        return None
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    return {
        (s.labels["status"], s.labels["provider"]): s.value
        for s in fams["settled_queue_depth"].samples
    }


def wait_for(port: int, what: str, ok: Any) -> dict[tuple[str, str], float]:
    end = time.monotonic() + BOUND
    while True:
        got = depth(port)
        if got is not None and ok(got):
            return got
        assert time.monotonic() < end, f"never {what}: {got}"
        time.sleep(0.1)


def test_an_emptied_queue_reads_0_for_every_known_provider(
    tmp_path: Path, sim: SimServer, db_path: Any
) -> None:
    conf = sim_conf(sim)
    write_config(tmp_path / "settled.toml", {"sim": dict(conf), "idle": dict(conf)})
    with Ledger.open(db_path) as led:
        add(led, "blind-1", provider="sim", operation="notify")  # waits for a person
        add(led, "old", provider="retired", operation="send", status=Status.CONFIRMED)
    port = free_port()
    proc = popen_cli("daemon", "--interval", "0.2", "--metrics", f"127.0.0.1:{port}")
    try:
        first = wait_for(port, "a finished pass", lambda d: ("DENIED_UNRESOLVED", "sim") in d)
        assert first[("DENIED_UNRESOLVED", "sim")] == 1
        for provider in ("sim", "idle", "retired"):  # configured, or known from records
            for status in OPEN:
                assert (status, provider) in first, (status, provider, first)
        assert first[("DENIED_UNRESOLVED", "idle")] == 0
        assert first[("AWAITING_VERIFICATION", "retired")] == 0
        assert not [k for k in first if k[0] in ("CONFIRMED", "FAILED")]  # open statuses only

        done = run_cli("resolve", "blind-1", "--applied", "--reason", "seen")
        assert done.returncode == 0, done.stderr
        after = wait_for(
            port,
            "the resolved record to leave the queue",
            lambda d: d.get(("DENIED_UNRESOLVED", "sim")) == 0,
        )
        assert set(after) == set(first)  # no series vanished
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=BOUND)
    assert proc.returncode == 0, err


@pytest.mark.ledger_incidental
def test_the_collector_fills_zeros_from_config_and_counts() -> None:
    from prometheus_client.exposition import generate_latest

    from settled.metrics import Metrics

    board = Metrics(providers=["mail", "cal"])
    assert b"settled_queue_depth{" not in generate_latest(board.registry)  # before a pass
    board.queue({("DENIED_UNRESOLVED", "mail"): 2, ("CONFIRMED", "sms"): 5})
    text = generate_latest(board.registry).decode()
    assert 'settled_queue_depth{provider="mail",status="DENIED_UNRESOLVED"} 2.0' in text
    assert 'settled_queue_depth{provider="cal",status="PENDING"} 0.0' in text
    assert 'settled_queue_depth{provider="sms",status="IN_FLIGHT"} 0.0' in text  # from records
    assert 'status="CONFIRMED"' not in text
    assert text.count("settled_queue_depth{") == 4 * 3
