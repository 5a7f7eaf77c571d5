"""A ledger's write lock, held from outside settled (as another writer would hold it),
and a sim provider that takes it while it handles a request: settled's outcome commit
then meets a locked ledger after the provider applied the request.

    Locker(location)        hold() / release() / close(): SQLite's one write lock; on
                            PostgreSQL, a lock on the actions table every write waits
                            for and no read does
    LockingServer(...)      a SimServer that calls ``on_request()`` after it has
                            processed each request, before it answers
"""

from __future__ import annotations

import sqlite3
from typing import Any

import rawdb

from settled.providers.sim_server import SimServer


class Locker:
    def __init__(self, db: Any) -> None:
        self.conn: Any
        if rawdb.is_pg(db):
            self.conn = rawdb.psycopg.connect(str(db), autocommit=True)
            self.begin = ["BEGIN", "LOCK TABLE actions IN EXCLUSIVE MODE"]
        else:
            self.conn = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
            self.begin = ["BEGIN IMMEDIATE"]
        self.held = False

    def hold(self) -> None:
        for sql in self.begin:
            self.conn.execute(sql)
        self.held = True

    def release(self) -> None:
        if self.held:
            self.conn.execute("ROLLBACK")
            self.held = False

    def close(self) -> None:
        self.release()
        self.conn.close()


class LockingServer(SimServer):
    on_request: Any = None

    def _process(self, *args: Any, **kw: Any) -> Any:
        out = super()._process(*args, **kw)
        if self.on_request is not None:
            self.on_request()
        return out


__all__ = ["Locker", "LockingServer"]
