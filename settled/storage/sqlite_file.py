"""The SQLite ledger's file itself: only a regular file or a new path is a ledger, a
new one is made 0600 and an existing one tightened to it (it holds every action's
params), and a backup is a new file of its own, 0600 before anything is written to it.

The header is never read here with ``open()``: closing any descriptor of the file
would drop the POSIX locks another connection of this process holds on it, mid-write
(SQLite's "How To Corrupt", 2.2); the backend reads it through SQLite.

What ``sqlite3``'s errors mean for the file is said here too (``map_error``): busy,
full, read-only, unreadable or corrupt, each in one line naming the path.
"""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path

from ..errors import InvalidInput, LedgerBusy, LedgerError, LedgerFull, LedgerReadOnly


def prepare(path: str, create: bool) -> bool:
    """Refuse what is not a regular file or a new path; create a missing ledger 0600
    (unless ``create`` is false); tighten an existing one to 0600. True when new."""
    p = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise LedgerError(f"cannot open ledger {path}: {exc.strerror}") from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise LedgerError(f"{path} is a directory, not a ledger file")
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise LedgerError(
            f"{path} is not a regular file (a device, FIFO or socket); a ledger must be a "
            "file or a new path"
        )
    if st is None:
        if not create:
            raise LedgerError(
                f"no ledger at {path}; nothing has been recorded there "
                "(check --db, SETTLED_DB or [ledger] path)"
            )
        if not p.parent.exists():
            raise LedgerError(f"cannot create ledger {path}: folder {p.parent} does not exist")
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            pass  # another process created it first; validate it below
        except OSError as exc:
            raise LedgerError(f"cannot create ledger {path}: {exc.strerror}") from None
        else:
            os.fchmod(fd, 0o600)
            os.close(fd)
        return True
    tighten(path, st)
    for side in ("-wal", "-shm"):
        try:
            tighten(path + side, os.stat(path + side))
        except OSError:
            pass
    return st.st_size == 0


def tighten(path: str, st: os.stat_result) -> None:
    """A ledger readable by others leaks every action's params: make it 0600 when it
    is ours (group/other bits off); leave someone else's file as it is."""
    if st.st_mode & 0o077 and st.st_uid == os.getuid():
        try:
            os.chmod(path, stat.S_IMODE(st.st_mode) & 0o600)
        except OSError:
            pass


def create_private(target: str, what: str) -> None:
    """A new, empty file at ``target``, 0600 (``what`` names the option it came from):
    ``InvalidInput`` when something is there already or it cannot be made."""
    if os.path.lexists(target):
        raise InvalidInput(f"{what} {target}: a file is already there; name a new file")
    try:
        fd = os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except OSError as exc:
        raise InvalidInput(f"{what} {target}: cannot create it: {exc.strerror}") from None
    os.fchmod(fd, 0o600)
    os.close(fd)


def remove(path: str) -> None:
    """Remove what a failed backup left (nothing to do when it is already gone)."""
    try:
        os.unlink(path)
    except OSError:
        pass


__all__ = ["create_private", "prepare", "remove", "tighten"]


# -- what sqlite3's errors mean ----------------------------------------------------------


def is_busy(exc: sqlite3.Error) -> bool:
    """Whether the error is another writer holding the file (busy or locked)."""
    name = getattr(exc, "sqlite_errorname", "") or ""
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
        return True
    msg = str(exc)
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in msg or "busy" in msg)


def map_error(exc: sqlite3.Error, path: str, doing: str) -> LedgerError:
    """The one place a ``sqlite3`` error becomes one of ``settled.errors``, in words
    that name the file and what did not happen."""
    name = getattr(exc, "sqlite_errorname", "") or ""
    text = " ".join(str(exc).split())
    if is_busy(exc):
        return LedgerBusy(f"ledger {path} is locked by another writer; {doing} did not happen")
    if name == "SQLITE_FULL" or "disk is full" in text:
        return LedgerFull(f"ledger {path}: the disk is full; {doing} did not happen ({text})")
    if name.startswith("SQLITE_READONLY") or "readonly" in text:
        return LedgerReadOnly(
            f"ledger {path} cannot be written (read-only file, folder or mount); "
            f"{doing} did not happen"
        )
    if name.startswith("SQLITE_CANTOPEN") or name.startswith("SQLITE_IOERR"):
        return LedgerError(
            f"ledger {path}: cannot read or write the file ({text}); {doing} did not happen"
        )
    if name in ("SQLITE_CORRUPT", "SQLITE_NOTADB") or (
        isinstance(exc, sqlite3.DatabaseError) and ("malformed" in text or "not a database" in text)
    ):
        return LedgerError(f"{path} is unreadable or corrupt: {text}")
    return LedgerError(f"ledger {path}: {text} ({doing})")
