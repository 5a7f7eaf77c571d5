"""systemd's notify protocol (``Type=notify``, ``WatchdogSec``), spoken directly:
one datagram of ``KEY=VALUE`` lines to the unix socket named in ``$NOTIFY_SOCKET``
(a leading '@' is the abstract namespace). A dozen lines do not justify a dependency
on libsystemd or a binding; without ``$NOTIFY_SOCKET`` every call does nothing."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping


class Notifier:
    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        addr = env.get("NOTIFY_SOCKET", "")
        if addr.startswith("@"):
            addr = "\0" + addr[1:]
        self.address = addr if addr.startswith(("/", "\0")) else ""
        self.watchdog: float | None = None  # s between pings: half of WatchdogSec
        usec, pid = env.get("WATCHDOG_USEC", ""), env.get("WATCHDOG_PID", "")
        if (
            self.address
            and usec.isdigit()
            and int(usec) > 0
            and (not pid or pid == str(os.getpid()))
        ):
            self.watchdog = int(usec) / 1e6 / 2

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    def send(self, *lines: str) -> bool:
        """Send one notification; False when there is no socket or it failed (the
        service manager going away must not stop the daemon)."""
        if not self.address:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
                s.sendto("\n".join(lines).encode("utf-8", "replace"), self.address)
        except OSError:
            return False
        return True

    def ready(self, status: str = "") -> bool:
        return self.send(
            "READY=1", f"MAINPID={os.getpid()}", *([f"STATUS={status}"] if status else [])
        )

    def ping(self) -> bool:
        return self.send("WATCHDOG=1")

    def status(self, text: str) -> bool:
        return self.send(f"STATUS={' '.join(text.split())}")

    def stopping(self) -> bool:
        return self.send("STOPPING=1")


__all__ = ["Notifier"]
