"""One raw psycopg dispatching process (``python -m bench._pg_raw_worker URL PREFIX N``):
the floor of the PostgreSQL dispatch rows, with ``bench._worker``'s protocol (``ready``,
then ``go`` on stdin, then one JSON line)."""

from __future__ import annotations

import json
import sys
import time

from .postgres import raw_conn, raw_dispatch


def main() -> int:
    url, prefix, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    conn = raw_conn(url)
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return 1
    t0 = time.time()
    for i in range(count):
        raw_dispatch(conn, f"{prefix}-{i}")
    t1 = time.time()
    conn.close()
    print(json.dumps({"done": count, "errors": 0, "kinds": {}, "t0": t0, "t1": t1}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
