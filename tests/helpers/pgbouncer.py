"""A real PgBouncer (``/usr/sbin/pgbouncer``, Debian package ``pgbouncer``) in
transaction mode on a free 127.0.0.1 port, in front of the suite's PostgreSQL.

    Bouncer(schema, ...)  -> a context: ``.url`` reaches ``schema`` through it

Each test's schema is a database of its own in PgBouncer, whose server connections
set ``search_path`` to it when they are made (``connect_query``: PgBouncer passes no
``options`` startup parameter on). In transaction mode a server connection belongs
to a client for one transaction only: whatever a client set for its session is lost,
or leaks to the next client. ``show(...)`` reads PgBouncer's admin console
(``SHOW POOLS``, ``SHOW STATS``). Without the binary the test skips, with the reason,
unless ``SETTLED_REQUIRE_POSTGRES`` asks for every PostgreSQL test to run.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest

BINARY = "/usr/sbin/pgbouncer"
UPSTREAM = ("127.0.0.1", 5432)  # the local PostgreSQL over TCP (trust auth)


def require() -> str:
    if os.path.exists(BINARY):
        return BINARY
    why = f"{BINARY} is not installed (Debian package pgbouncer)"
    if os.environ.get("SETTLED_REQUIRE_POSTGRES") == "1":
        pytest.fail(f"{why}, and SETTLED_REQUIRE_POSTGRES=1 asks for every PostgreSQL test")
    pytest.skip(why)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Bouncer:
    """PgBouncer for ``url`` (a test schema's: its database, user and schema), at most
    ``max_db_connections`` server connections to it, ``max_client_conn`` clients."""

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 20,
        max_db_connections: int = 0,
        max_client_conn: int = 400,
        users: tuple[str, ...] = (),
        timezone: str = "",
    ) -> None:
        self.binary = require()
        parts = urlsplit(url)
        query = dict(parse_qsl(parts.query))
        self.schema = query["application_name"]
        self.dbname = parts.path.lstrip("/") or "test"
        user = parts.netloc.rpartition("@")[0] or os.environ.get("USER", "root")
        self.users = (user or "root", *users)
        self.pool_size = pool_size
        self.max_db_connections = max_db_connections
        self.max_client_conn = max_client_conn
        self.timezone = timezone  # the server connections' own zone, when not the server's
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        # PgBouncer refuses to run as root: it runs as nobody, in a directory of its own
        self.dir = Path(tempfile.mkdtemp(prefix="settled-pgb-"))
        self.dir.chmod(0o755)
        if os.geteuid() == 0:
            import pwd

            nobody = pwd.getpwnam("nobody")
            os.chown(self.dir, nobody.pw_uid, nobody.pw_gid)

    @property
    def url(self) -> str:
        return (
            f"postgresql://{self.users[0]}@127.0.0.1:{self.port}/ledger"
            f"?application_name={self.schema}"
        )

    def url_as(self, user: str) -> str:
        return self.url.replace(f"//{self.users[0]}@", f"//{user}@", 1)

    def _write(self) -> Path:
        (self.dir / "users.txt").write_text(
            "".join(f'"{u}" ""\n' for u in (*self.users, "pgbouncer"))
        )
        host, port = UPSTREAM
        connect = f"SET search_path TO {self.schema}"
        if self.timezone:
            connect += f"; SET TIME ZONE ''{self.timezone}''"
        ini = self.dir / "pgbouncer.ini"
        ini.write_text(
            "[databases]\n"
            f"ledger = host={host} port={port} dbname={self.dbname}"
            f" connect_query='{connect}'\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {self.dir / 'users.txt'}\n"
            "admin_users = pgbouncer\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {self.pool_size}\n"
            f"max_db_connections = {self.max_db_connections}\n"
            f"max_client_conn = {self.max_client_conn}\n"
            "server_reset_query =\n"
            "server_check_delay = 0\n"
            "query_wait_timeout = 60\n"
            f"logfile = {self.dir / 'pgbouncer.log'}\n"
            f"pidfile = {self.dir / 'pgbouncer.pid'}\n"
        )
        for f in self.dir.iterdir():
            f.chmod(0o644)
        return ini

    def __enter__(self) -> Bouncer:
        for _ in range(5):  # a free port taken between the probe and the bind: another
            self.port = _free_port()
            ini = self._write()
            argv = [self.binary, str(ini)]
            if os.geteuid() == 0:
                argv[1:1] = ["-u", "nobody"]
            self.proc = subprocess.Popen(
                argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=self.dir
            )
            if self._ready():
                return self
            self._stop()
        raise AssertionError(f"pgbouncer did not start: {self.log()[-2000:]}")

    def _ready(self, timeout: float = 20.0) -> bool:
        deadline = time.monotonic() + timeout
        assert self.proc is not None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return True
            except OSError:
                time.sleep(0.02)
        return False

    def log(self) -> str:
        path = self.dir / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def show(self, what: str) -> list[dict[str, Any]]:
        """``SHOW WHAT`` on PgBouncer's admin console, as dicts."""
        import psycopg
        from psycopg.rows import dict_row

        admin = f"postgresql://pgbouncer@127.0.0.1:{self.port}/pgbouncer"
        with psycopg.connect(admin, autocommit=True, prepare_threshold=None) as conn:
            cur = conn.cursor(row_factory=dict_row)
            cur.execute(f"SHOW {what}")
            return list(cur.fetchall())

    def _stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc is not None and self.proc.stderr is not None:
            self.proc.stderr.close()

    def __exit__(self, *exc: Any) -> None:
        self._stop()
        shutil.rmtree(self.dir, ignore_errors=True)
