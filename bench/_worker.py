"""One dispatching process for the multi-process benchmark (``python -m bench._worker``).

It opens the ledger, says ``ready``, waits for ``go`` on stdin, submits its actions
through the null provider, and prints one JSON line: how many it dispatched, how many
errors reached it (a ``LedgerBusy`` would be one), and when it started and ended."""

from __future__ import annotations

import json
import sqlite3
import sys
import time

from settled import Ledger
from settled.dispatch import Dispatcher
from settled.errors import SettledError

from .fixtures import null_registry


def main() -> int:
    path, prefix, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    led = Ledger.open(path)
    d = Dispatcher(led, null_registry(), actor=prefix)
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return 1
    done = errors = 0
    kinds: dict[str, int] = {}
    t0 = time.time()
    for i in range(count):
        try:
            rep = d.submit("null", "do", {"n": i}, action_id=f"{prefix}-{i}")
        except (SettledError, sqlite3.Error) as exc:
            errors += 1
            kinds[type(exc).__name__] = kinds.get(type(exc).__name__, 0) + 1
            continue
        if rep.record is not None and rep.record.status == "CONFIRMED":
            done += 1
    t1 = time.time()
    led.close()
    print(
        json.dumps({"done": done, "errors": errors, "kinds": kinds, "t0": t0, "t1": t1}), flush=True
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
