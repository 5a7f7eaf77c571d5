"""Sweep a ledger in a fresh process and report its peak memory
(``python -m bench._sweeper LEDGER BATCH [QUERY_SECONDS]``): what a daemon's pass costs
in RSS. Several at once on one PostgreSQL ledger are the daemons of the scaling rows."""

from __future__ import annotations

import json
import sys
import time

from .common import rss_mb_self


def main() -> int:
    path, batch = sys.argv[1], int(sys.argv[2])
    latency = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
    from settled import Ledger
    from settled.reconcile import Reconciler

    from .fixtures import null_registry

    before = rss_mb_self()
    settled = 0
    with Ledger.open(path) as led:
        reconciler = Reconciler(led, null_registry(latency), batch=batch, actor="bench-daemon")
        t = time.perf_counter()
        t0 = time.time()
        while True:  # a daemon's ticks: bounded passes until nothing is due
            report = reconciler.run_due(limit=batch * 10)
            settled += len(report.changes)
            if not report.examined:
                break
        dt = time.perf_counter() - t
        t1 = time.time()
    print(
        json.dumps(
            {
                "rss_before": before,
                "rss_peak": rss_mb_self(),
                "settled": settled,
                "seconds": dt,
                "t0": t0,
                "t1": t1,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
