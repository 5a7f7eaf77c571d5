"""What the connection tests share: a login role of its own for one test's schema
(``CONNECTION LIMIT`` as the hard bound: the server refuses a connection past it), and
a sampler that counts, in ``pg_stat_activity``, the connections a process really holds.

    role(schema, limit)  -> a context: the URL of the schema as a role limited to ``limit``
    Peak(schema)         -> a context: ``.peak``, the most connections seen at once
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pg_schemas as pg


@contextmanager
def role(url: str, limit: int) -> Iterator[str]:
    """``url`` (a test schema's) as a new login role that owns the schema and may hold
    at most ``limit`` connections at once (not a superuser: the limit binds it)."""
    schema = pg.schema_of(url)
    name = f"{schema}_r"
    conn = pg.admin()
    conn.execute(f'CREATE ROLE "{name}" LOGIN CONNECTION LIMIT {int(limit)}')
    try:
        conn.execute(f'ALTER SCHEMA "{schema}" OWNER TO "{name}"')
        parts = urlsplit(url)
        host = parts.netloc.rpartition("@")[2]
        yield urlunsplit(parts._replace(netloc=f"{name}@{host}"))
    finally:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (name,)
        )
        conn.execute(f'ALTER SCHEMA "{schema}" OWNER TO CURRENT_USER')
        conn.execute(f'REASSIGN OWNED BY "{name}" TO CURRENT_USER')
        conn.execute(f'DROP OWNED BY "{name}"')
        conn.execute(f'DROP ROLE "{name}"')


class Peak:
    """Counts the server connections of ``application_name`` (the test schema's), as
    often as one query allows, from a thread with a connection of its own, until the
    block ends (bounded: it ends with the block)."""

    def __init__(self, schema: str, *, by: str = "application_name") -> None:
        self.schema = schema
        self.by = by
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import psycopg

        with psycopg.connect(pg.SERVER, autocommit=True) as conn:
            sql = f"SELECT count(*) FROM pg_stat_activity WHERE {self.by} = %s"
            while not self._stop.is_set():
                (n,) = conn.execute(sql, (self.schema,)).fetchone()  # type: ignore[misc]
                self.peak = max(self.peak, int(n))
                self.samples += 1

    def __enter__(self) -> Peak:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
