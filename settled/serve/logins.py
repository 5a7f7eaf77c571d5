"""The console's login throttle and its single-use login nonces.

A wrong token costs its sender time: per client address (an IPv6 address by its /64,
which one host usually holds whole) and per name typed in the login form, the first
``FREE`` wrong tokens are answered at once; after that each key must wait
``FIRST_WAIT`` seconds, doubling with every further wrong token up to ``MAX_WAIT``
(one guess per 15 minutes), and a login tried sooner is answered 429 with
``Retry-After`` without its token being looked at (so the answer says nothing about
the token). A key's failures are forgotten after ``FORGET`` seconds without one, and a
login that succeeds clears its keys. Time is the monotonic clock: a step of the wall
clock neither lifts nor lengthens a wait.

A login form's nonce (signed by ``Sessions``, with its expiry and a random id) is taken
once: ``take`` refuses an id it has seen. Used ids are kept until their nonce expires,
at most ``MAX_NONCES`` of them; past that the oldest are dropped and every nonce that
expires no later than a dropped one is refused too, so a replay never gets through.

**This state is in the process's memory**, unlike sessions and CSRF tokens, which are
signed. Why that is acceptable: a token is a secret of at least 16 characters (64 hex
digits as the docs make them), so no online guessing reaches one, throttled or not;
the throttle keeps guessers and scanners from hammering the ledger-free login path and
their noise out of the log. What an attacker gains against N processes behind one load
balancer: N times the guesses (each process keeps its own count; with the doubling
that is about log2(N) steps of delay), and a nonce may be replayed once per process,
N times at most. A restart forgets the counts. Keeping the counts in the ledger would
cost a write per failed login on the path an attacker controls.
"""

from __future__ import annotations

import ipaddress
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

FREE = 5  # wrong tokens a key may send before it must wait
FIRST_WAIT = 1.0  # s to wait after the first wrong token past FREE, doubling after each
MAX_WAIT = 900.0  # s: at most one guess per 15 minutes per key, however long it keeps on
FORGET = 3600.0  # s without a wrong token after which a key's count is forgotten
MAX_KEYS = 20_000  # keys held at once; the least recently failed are forgotten first
MAX_NONCES = 100_000  # used nonce ids held until their expiry (about 10 MB at most)


@dataclass
class _Failures:
    count: int
    last: float  # monotonic time of the last wrong token
    until: float  # monotonic time before which this key must wait


def address_key(host: str | None) -> str:
    """The throttle's key for a client address: IPv4 as it is, IPv6 by its /64."""
    if not host:
        return "addr:-"
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return f"addr:{host}"
    if addr.version == 6:
        return f"addr:{ipaddress.ip_network(f'{addr}/64', strict=False)}"
    return f"addr:{addr}"


def keys_for(host: str | None, name: str | None) -> list[str]:
    """The keys one login attempt counts against: its address, and the name it typed."""
    keys = [address_key(host)]
    if name:
        keys.append(f"name:{name.casefold()}")
    return keys


class Logins:
    """Failed logins by key, and the nonces already used (see the module)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._failures: OrderedDict[str, _Failures] = OrderedDict()
        self._nonces: OrderedDict[str, float] = OrderedDict()  # id -> expiry (wall, s)
        self._floor = 0.0  # a nonce expiring no later than this is refused

    # ------------------------------------------------------------ the throttle

    def wait(self, keys: Iterable[str]) -> int:
        """Whole seconds before a login counted against ``keys`` may be tried (0: now)."""
        now = self.clock()
        left = 0.0
        for key in keys:
            f = self._failures.get(key)
            if f is not None and now - f.last <= FORGET:
                left = max(left, f.until - now)
        return math.ceil(left) if left > 0 else 0

    def failed(self, keys: Iterable[str]) -> None:
        """A wrong token was sent: each key's count grows, and past ``FREE`` its wait."""
        now = self.clock()
        for key in keys:
            f = self._failures.pop(key, None)
            if f is None or now - f.last > FORGET:
                f = _Failures(0, now, now)
            f.count += 1
            f.last = now
            if f.count >= FREE:
                f.until = now + min(FIRST_WAIT * 2 ** (f.count - FREE), MAX_WAIT)
            self._failures[key] = f  # the most recently failed last
        while len(self._failures) > MAX_KEYS:
            self._failures.popitem(last=False)

    def succeeded(self, keys: Iterable[str]) -> None:
        for key in keys:
            self._failures.pop(key, None)

    # ------------------------------------------------------------ nonces

    def take(self, nonce_id: str, expires: float, now: float | None = None) -> bool:
        """Use the nonce ``nonce_id`` (valid until ``expires``, wall-clock seconds):
        False when it was used before (or may have been: see the module)."""
        now = time.time() if now is None else now
        while self._nonces:  # forget the expired ones, the oldest first
            oldest, until = next(iter(self._nonces.items()))
            if until >= now:
                break
            del self._nonces[oldest]
        if nonce_id in self._nonces or expires <= self._floor:
            return False
        self._nonces[nonce_id] = expires
        while len(self._nonces) > MAX_NONCES:
            _old, until = self._nonces.popitem(last=False)
            self._floor = max(self._floor, until)
        return True


__all__ = [
    "FIRST_WAIT",
    "FORGET",
    "FREE",
    "MAX_KEYS",
    "MAX_NONCES",
    "MAX_WAIT",
    "Logins",
    "address_key",
    "keys_for",
]
