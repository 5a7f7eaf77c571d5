"""A closed stdout after a send: ``settled dispatch ... --json | head -n 1`` (or a
reader that is already gone) exits with the record's code and one line on stderr that
says what was sent and recorded; it never exits 1 in silence after requests left.
The same for ``--from``: no line is read once stdout is gone, every line read is
recorded (claimed lines that never started are FAILED, never sent), and the exit code
is the highest among them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support import ROOT, command

from settled import Ledger
from settled.providers.sim_server import SimServer

pytestmark = pytest.mark.slow

EXIT = {
    "CONFIRMED": 0,
    "AWAITING_VERIFICATION": 3,
    "IN_FLIGHT": 3,
    "PENDING": 3,
    "DENIED_UNRESOLVED": 4,
    "FAILED": 5,
}


def closed_stdout(*args: str, stdin: bytes = b"") -> tuple[int, str]:
    """``settled ARGS`` with a stdout whose reader is gone before it starts."""
    p = subprocess.Popen(
        command(args, None),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env=dict(os.environ),
    )
    assert p.stdout is not None
    p.stdout.close()
    _, err = p.communicate(stdin, timeout=120)
    return p.returncode, err.decode()


def head(shell_cmd: str, n: int) -> tuple[int, str, str]:
    """``SHELL_CMD | head -n N`` in a real shell; settled's own exit code."""
    script = f"{shell_cmd} | head -n {n}; exit ${{PIPESTATUS[0]}}"
    p = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    return p.returncode, p.stdout, p.stderr


def settled_cmd(*args: str) -> str:
    import shlex

    return " ".join(shlex.quote(a) for a in [sys.executable, "-m", "settled", *args])


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("settled: "), err
    assert "Traceback" not in err and "internal error" not in err, err
    return lines[0]


def status(aid: str) -> str:
    with Ledger.open(os.environ["SETTLED_DB"]) as led:
        return str(led.get(aid).status)


@pytest.mark.parametrize("as_json", [True, False], ids=["json", "human"])
def test_one_action_into_a_closed_stdout_exits_with_the_records_code(
    sim_config: Path, sim: SimServer, as_json: bool
) -> None:
    flag = ["--json"] if as_json else []
    code, err = closed_stdout("dispatch", "sim", "send", "--action-id", "c-1", *flag)
    line = one_line(err)
    assert code == 3 == EXIT[status("c-1")], err  # accepted, not yet verified
    assert "the request was sent and recorded" in line and "c-1" in line
    assert "stdout was closed" in line and "AWAITING_VERIFICATION" in line
    assert sim.effects_for("c-1") == 1
    code, err = closed_stdout("dispatch", "sim", "book", "--action-id", "c-2", *flag)
    assert code == 0 == EXIT[status("c-2")] and "stdout was closed" in one_line(err)


def test_one_action_into_head_exits_with_the_records_code(sim_config: Path, sim: SimServer) -> None:
    code, out, err = head(settled_cmd("dispatch", "sim", "send", "--action-id", "h-1", "--json"), 1)
    assert code == 3, err
    assert out.strip() == "{" and sim.effects_for("h-1") == 1
    assert err == "" or "stdout was closed" in one_line(err)
    code, out, err = head(settled_cmd("dispatch", "sim", "send", "--action-id", "h-2", "--json"), 0)
    assert code == 3 and out == "" and sim.effects_for("h-2") == 1, err
    assert "stdout was closed" in one_line(err)


def _lines(prefix: str, n: int) -> bytes:
    return b"".join(
        json.dumps({"action_id": f"{prefix}-{i}", "params": {}}).encode() + b"\n" for i in range(n)
    )


def test_from_into_head_exits_with_the_highest_code_of_its_lines(
    sim_config: Path, sim: SimServer, tmp_path: Path
) -> None:
    source = tmp_path / "lines.jsonl"
    source.write_bytes(_lines("f", 2))
    code, out, err = head(
        settled_cmd("dispatch", "sim", "send", "--from", str(source), "--json"), 1
    )
    assert code == 3, err
    assert json.loads(out)["action_id"] == "f-0"
    assert [status("f-0"), status("f-1")] == ["AWAITING_VERIFICATION"] * 2
    assert sim.effects_for("f-0") == sim.effects_for("f-1") == 1
    assert err == "" or "stdout was closed" in one_line(err)


@pytest.mark.parametrize("concurrency", ["1", "4"])
def test_from_into_a_closed_stdout_stops_reading_and_records_every_line_it_read(
    sim_config: Path, sim: SimServer, concurrency: str
) -> None:
    n = 150  # more than one claim group
    code, err = closed_stdout(
        "dispatch",
        "sim",
        "send",
        "--from",
        "-",
        "--json",
        "--concurrency",
        concurrency,
        stdin=_lines("b", n),
    )
    line = one_line(err)
    assert "stdout was closed after 0 of" in line, line
    with Ledger.open(os.environ["SETTLED_DB"]) as led:
        recs = {r.action_id: r for r in led.query()}
    assert 0 < len(recs) < n  # it stopped reading
    read = sorted(recs, key=lambda a: int(a.split("-")[1]))
    assert read == [f"b-{i}" for i in range(len(recs))]  # the first lines, no gap
    codes = {EXIT[str(r.status)] for r in recs.values()}
    assert code == max(codes), (code, codes)
    for aid, rec in recs.items():
        sent = sim.effects_for(aid)
        if str(rec.status) == "FAILED":  # claimed, never started: provably never sent
            assert sent == 0 and "never sent" in (rec.reason or ""), rec
        else:
            assert sent == 1 and str(rec.status) == "AWAITING_VERIFICATION", rec
    assert f"exit {code}" in line


def test_the_lines_a_closed_stdout_never_read_are_sent_by_a_rerun(
    sim_config: Path, sim: SimServer
) -> None:
    data = _lines("r", 150)
    closed_stdout("dispatch", "sim", "send", "--from", "-", "--json", stdin=data)
    p = subprocess.run(
        command(("dispatch", "sim", "send", "--from", "-", "--json"), None),
        input=data,
        capture_output=True,
        cwd=ROOT,
        timeout=120,
        env=dict(os.environ),
    )
    assert p.returncode in (3, 5), p.stderr
    out: list[dict[str, Any]] = [json.loads(x) for x in p.stdout.splitlines()]
    assert out[-1]["lines"] == 150
    assert all(sim.effects_for(f"r-{i}") <= 1 for i in range(150))  # never twice
    with Ledger.open(os.environ["SETTLED_DB"]) as led:
        assert len(led.query()) == 150
