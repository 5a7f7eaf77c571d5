"""One raw psycopg sweeper for the PostgreSQL sweep benchmark
(``python -m bench._pg_raw_sweeper URL BATCH``): the floor a daemon is compared with."""

from __future__ import annotations

import json
import os
import sys
import time

from .postgres import raw_sweep


def main() -> int:
    url, batch = sys.argv[1], int(sys.argv[2])
    t0 = time.time()
    settled = raw_sweep(url, batch, f"raw-{os.getpid()}")
    print(json.dumps({"settled": settled, "t0": t0, "t1": time.time()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
