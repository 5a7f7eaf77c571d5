"""Where ``settled serve`` listens: parsing ``HOST:PORT`` and telling loopback apart.

Below the service, and kept free of heavy imports: ``settled.config`` checks
``[serve] listen`` with it while loading any config, for every command."""

from __future__ import annotations

import ipaddress

from .errors import InvalidInput

DEFAULT_PORT = 8780
DEFAULT_LISTEN = f"127.0.0.1:{DEFAULT_PORT}"
LOOPBACK_NAMES = ("localhost",)


def parse_listen(text: str, where: str = "--listen") -> tuple[str, int]:
    """``'127.0.0.1:8780'``, ``'[::1]:8780'``, ``'localhost:8780'``, ``'0.0.0.0:8780'``
    → (host, port). Port 0 takes a free one (the ``listening`` line says which). A
    bare ``':PORT'`` is refused: every interface must be asked for by its address."""
    host, sep, port = text.rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")
    host = host[1:-1] if bracketed else host
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InvalidInput(f"{where} {text!r}: use HOST:PORT, e.g. {DEFAULT_LISTEN}")
    if ":" in host and not bracketed:
        raise InvalidInput(f"{where} {text!r}: write an IPv6 address in brackets, e.g. [::1]:8780")
    if not _valid_host(host):
        raise InvalidInput(f"{where} {text!r}: {host!r} is not an IP address or a host name")
    return host, int(port)


def _valid_host(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    labels = host.rstrip(".").split(".")
    return all(
        0 < len(label) <= 63 and label.replace("-", "").isalnum() and label.isascii()
        for label in labels
    )


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 and ``localhost``: reachable from this machine only."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_wildcard(host: str) -> bool:
    """0.0.0.0 or ::, every interface."""
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


def shown(host: str, port: int) -> str:
    """``host:port`` as a URL writes it (an IPv6 address in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


__all__ = [
    "DEFAULT_LISTEN",
    "DEFAULT_PORT",
    "is_loopback",
    "is_wildcard",
    "parse_listen",
    "shown",
]
