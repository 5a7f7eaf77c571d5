"""A "Confirm" button wired to the real action, through `settled serve`'s HTTP API.

    python examples/confirm_button.py          # needs: pip install 'settled[serve]'

``on_confirm`` is what an app's button handler does: one POST to
``/api/v1/actions/{id}/confirm``, and a message for the user that says what really
happened (rule 8), never a blanket "done":

    dispatched + succeeded     "Done."                 the effect was observed
    dispatched + accepted      "Sent; not yet seen."   the provider took it, no proof yet
    dispatched + failed        "It did not go through." provably not applied
    dispatched + unresolved    "We don't know yet."     held for a person; do not press again
    already_completed          "Already done." / "Already failed."
    in_progress                "Already on its way."   another click or a background job has it
    blocked                    "On hold."              an earlier attempt is unresolved

The demo below starts the simulated provider and `settled serve` on loopback in a
temporary directory, records bookings that wait for confirmation, and presses the
button: once, twice, twice at the same moment (one booking is made), and on a
booking whose outcome nobody can know. It exits 1 if any promise is broken.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx


@dataclass(frozen=True)
class Message:
    """What the user is told, and whether the button stays active."""

    text: str
    done: bool = False  # the effect was observed: show it as done
    press_again: bool = False  # pressing again could help (it never sends twice anyway)


def on_confirm(api: httpx.Client, action_id: str) -> Message:
    """The button's handler: confirm ``action_id`` and say what really happened."""
    r = api.post(f"/api/v1/actions/{quote(action_id, safe='').replace('.', '%2E')}/confirm")
    if r.status_code == 404:
        return Message("This request no longer exists.")
    if r.status_code != 200:  # a problem document: 401/403 (token), 503 (try later), ...
        problem = r.json()
        return Message(
            f"Could not confirm now: {problem['detail']}", press_again=r.status_code == 503
        )
    report = r.json()
    outcome, result = report["outcome"], report["result"]
    if outcome == "dispatched":  # this click sent it: say what the provider's answer proved
        if result == "succeeded":
            return Message("Done.", done=True)
        if result == "accepted":
            return Message("Sent; the provider has not shown it yet. We will update this page.")
        if result == "failed":
            return Message(f"It did not go through, and nothing was changed: {report['reason']}")
        return Message(
            "We don't know yet whether it went through. It is held for review; "
            "please do not try again, we will tell you."
        )
    if outcome == "already_completed":
        if report["status"] == "CONFIRMED":
            return Message("Already done.", done=True)
        return Message("This already failed earlier; nothing was changed.")
    if outcome == "in_progress":
        return Message("Already on its way (confirmed a moment ago). We will update this page.")
    if outcome == "blocked":
        return Message(
            "On hold: an earlier attempt has an unknown outcome. Nothing new was sent; "
            "someone will settle it."
        )
    raise AssertionError(f"an outcome the API does not give: {outcome}")


# ------------------------------------------------------------------ the demo

TOKEN = "example-token-" + "0123456789abcdef"
CONFIG = """\
[providers.shop]
type = "sim"
base_url = "{url}"
timeout = 10

[serve.tokens.webapp]
secret = "${{SHOP_API_TOKEN}}"
roles = ["dispatch"]
"""


def start_service(workdir: Path) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "SETTLED_CONFIG": str(workdir / "settled.toml"),
           "SETTLED_DB": str(workdir / "settled.db"), "SHOP_API_TOKEN": TOKEN}  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "settled", "serve", "--listen", "127.0.0.1:0"],
        stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    assert proc.stderr is not None
    for line in proc.stderr:  # the service's JSON log: wait for the line that gives the URL
        entry = json.loads(line)
        if entry["event"] == "listening":
            threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep the pipe drained
            return proc, entry["url"]
    raise SystemExit(f"settled serve did not start (exit {proc.wait()})")


def record(api: httpx.Client, action_id: str, operation: str) -> None:
    r = api.post("/api/v1/actions", json={"provider": "shop", "operation": operation,
                                          "action_id": action_id, "needs_confirmation": True})  # fmt: skip
    assert r.status_code == 201 and r.json()["outcome"] == "recorded", r.text


def main() -> int:
    from settled.providers.sim_server import SimServer

    broken: list[str] = []

    def expect(what: str, got: Message, start: str) -> None:
        print(f"  {what:<44} -> {got.text}")
        if not got.text.startswith(start):
            broken.append(f"{what}: {got.text!r}")

    with tempfile.TemporaryDirectory() as tmp, SimServer() as sim:
        workdir = Path(tmp)
        (workdir / "settled.toml").write_text(CONFIG.format(url=sim.url))
        proc, url = start_service(workdir)
        headers = {"Authorization": f"Bearer {TOKEN}"}
        try:
            with httpx.Client(base_url=url, headers=headers, timeout=30) as api:
                print("settled serve at", url)
                record(api, "booking-1", "book")
                expect("press Confirm", on_confirm(api, "booking-1"), "Done.")
                expect("press Confirm again", on_confirm(api, "booking-1"), "Already done.")

                record(api, "booking-2", "book")
                sim.plan("booking-2", "latency:1")  # the provider is slow: both clicks meet
                got: list[Message] = []
                clicks = [threading.Thread(target=lambda: got.append(on_confirm(api, "booking-2")))
                          for _ in range(2)]  # fmt: skip
                for c in clicks:
                    c.start()
                for c in clicks:
                    c.join()
                texts = sorted(m.text for m in got)
                print(f"  {'two clicks at the same moment':<44} -> {texts}")
                if sorted(t.split()[0] for t in texts) != ["Already", "Done."]:
                    broken.append(f"double click: {texts}")
                made = len(sim.requests_for("booking-2"))
                print(f"  {'bookings sent to the provider':<44} -> {made}")
                if made != 1:
                    broken.append(f"double click sent {made} requests")

                record(api, "mail-5", "send")  # the provider only says "queued"
                expect(
                    "press Confirm (a queued mail)", on_confirm(api, "mail-5"), "Sent; the provider"
                )

                record(api, "note-3", "notify")  # the provider confirms nothing
                expect(
                    "press Confirm (no receipt possible)",
                    on_confirm(api, "note-3"),
                    "We don't know yet",
                )
                expect("press Confirm again", on_confirm(api, "note-3"), "On hold")
                expect(
                    "press Confirm on a deleted request",
                    on_confirm(api, "gone-4"),
                    "This request no",
                )
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    if broken:
        print("BROKEN:", *broken, sep="\n  ")
        return 1
    print("all promises kept")
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__: list[Any] = ["Message", "on_confirm"]
