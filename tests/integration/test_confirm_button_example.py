"""The confirm-button example: its handler maps every answer of the API to what a user
is told (each outcome and result, and the errors), and the demo runs as a user would run
it, against a real `settled serve` and the sim, and keeps its promises."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from typing import Any

import httpx
import pytest
from support import ROOT

# The demo keeps a ledger of its own in a temporary directory.
pytestmark = pytest.mark.ledger_incidental

spec = importlib.util.spec_from_file_location(
    "confirm_button", ROOT / "examples" / "confirm_button.py"
)
assert spec is not None and spec.loader is not None
example = importlib.util.module_from_spec(spec)
sys.modules["confirm_button"] = example  # a dataclass looks its module up there
spec.loader.exec_module(example)


def answering(status: int, body: dict[str, Any]) -> httpx.Client:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.method == "POST" and request.url.path.endswith("/confirm")
        return httpx.Response(status, content=json.dumps(body).encode())

    return httpx.Client(base_url="http://settled.test", transport=httpx.MockTransport(handler))


@pytest.mark.parametrize(
    ("status", "body", "start", "done"),
    [
        (
            200,
            {"outcome": "dispatched", "result": "succeeded", "status": "CONFIRMED"},
            "Done.",
            True,
        ),
        (
            200,
            {"outcome": "dispatched", "result": "accepted", "status": "AWAITING_VERIFICATION"},
            "Sent;",
            False,
        ),
        (
            200,
            {
                "outcome": "dispatched",
                "result": "failed",
                "status": "FAILED",
                "reason": "card declined",
            },
            "It did not go through",
            False,
        ),
        (
            200,
            {"outcome": "dispatched", "result": "unresolved", "status": "DENIED_UNRESOLVED"},
            "We don't know",
            False,
        ),
        (
            200,
            {"outcome": "already_completed", "result": "succeeded", "status": "CONFIRMED"},
            "Already done.",
            True,
        ),
        (
            200,
            {"outcome": "already_completed", "result": "failed", "status": "FAILED"},
            "This already failed",
            False,
        ),
        (
            200,
            {"outcome": "in_progress", "result": None, "status": "IN_FLIGHT"},
            "Already on its way",
            False,
        ),
        (
            200,
            {"outcome": "blocked", "result": "unresolved", "status": "DENIED_UNRESOLVED"},
            "On hold",
            False,
        ),
        (404, {"status": 404, "detail": "no action 'x'"}, "This request no longer exists", False),
        (503, {"status": 503, "detail": "the ledger is busy"}, "Could not confirm now", False),
    ],
)
def test_every_answer_becomes_what_the_user_is_told(
    status: int, body: dict[str, Any], start: str, done: bool
) -> None:
    msg = example.on_confirm(answering(status, body), "a/b")
    assert msg.text.startswith(start) and msg.done is done
    if body.get("reason"):
        assert body["reason"] in msg.text


@pytest.mark.slow
def test_the_demo_runs_against_a_real_service_and_books_once() -> None:
    p = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "confirm_button.py")],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=str(ROOT),
        check=False,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    assert "press Confirm                                -> Done." in out
    assert "-> Already done." in out and "bookings sent to the provider                -> 1" in out
    assert "-> Sent; the provider has not shown it yet" in out
    assert "-> We don't know yet" in out and "-> On hold" in out
    assert out.rstrip().endswith("all promises kept")
    assert "Traceback" not in p.stderr
