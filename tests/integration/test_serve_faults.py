"""The service when something below it fails: a ledger locked by another process
answers 503 with Retry-After and changes nothing (the provider is never called); a bug
in a route is one 500 problem and one log line, never a traceback."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from serving import auth, in_process, token_env, write_serve_config

from settled.providers.sim_server import SimServer


@pytest.mark.sqlite_only
def test_a_locked_ledger_is_a_503_that_changes_nothing(
    tmp_path: Path, sim: SimServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    for k, v in token_env().items():
        monkeypatch.setenv(k, v)
    cfg = write_serve_config(tmp_path / "settled.toml", sim)
    cfg.write_text("[ledger]\nbusy_timeout = 0.2\n" + cfg.read_text())
    with in_process(mcp=False) as (c, lines):
        other = sqlite3.connect(os.environ["SETTLED_DB"], isolation_level=None, timeout=0)
        try:
            other.execute("BEGIN EXCLUSIVE")  # another process holds the write lock
            r = c.post(
                "/api/v1/actions",
                headers=auth("sender"),
                json={"provider": "sim", "operation": "book", "action_id": "busy-1"},
            )
            assert r.status_code == 503, r.text
            assert r.headers["content-type"].startswith("application/problem+json")
            assert r.headers["retry-after"] == "1" and "nothing was changed" in r.json()["detail"]
            assert (
                os.environ["SETTLED_DB"] not in r.text
            )  # the ledger's location stays on the server
        finally:
            other.execute("ROLLBACK")
            other.close()
        assert sim.requests_for("busy-1") == []
        assert c.get("/api/v1/actions/busy-1", headers=auth("reader")).status_code == 404
        errors = [e for e in lines.entries if e["event"] == "error"]
        assert (
            errors
            and errors[0]["error"] == "LedgerBusy"
            and errors[0]["route"] == "/api/v1/actions"
        )
        again = c.post(
            "/api/v1/actions",
            headers=auth("sender"),
            json={"provider": "sim", "operation": "book", "action_id": "busy-1"},
        )
        assert again.status_code == 201 and len(sim.requests_for("busy-1")) == 1


@pytest.mark.ledger_incidental
def test_a_bug_is_one_500_problem_and_one_log_line(
    tmp_path: Path,
    sim: SimServer,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """A route that raises (a stand-in for a bug), mounted where provider callbacks are
    (``hook_routes``): the client gets a problem, the log one line, nobody a traceback."""
    from starlette.routing import Route

    from settled.serve import asgi as service_app

    async def broken(request: Any) -> Any:
        raise RuntimeError("a bug\nwith two lines")

    monkeypatch.setattr(
        service_app, "hook_routes", lambda: [Route("/hooks/{provider}", broken, methods=["POST"])]
    )
    for k, v in token_env().items():
        monkeypatch.setenv(k, v)
    write_serve_config(tmp_path / "settled.toml", sim)
    with in_process(mcp=False) as (c, lines):
        r = c.post("/hooks/secret-thing", content=b"{}")
    assert r.status_code == 500 and r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["detail"] == "internal error; see the server's log" and "a bug" not in r.text
    (line,) = lines.requests()
    assert (
        line["status"] == 500 and line["level"] == "error" and line["route"] == "/hooks/{provider}"
    )
    assert line["error"] == "RuntimeError: a bug with two lines" and "secret-thing" not in str(line)
    assert "Traceback" not in capfd.readouterr().err
