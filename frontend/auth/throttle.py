"""Failed logins throttled per client address: a leaky bucket per address, in a bounded table.

Each address (the client's as the load balancer's PROXY header gave it, else the socket's peer;
an IPv6 address counts as its /64, which one host usually holds whole) has one float, the time
at which its failures are all forgiven (GCRA, the leaky bucket as a virtual clock): a failed
login moves it :data:`FORGIVE` seconds later, starting from now if it was in the past.  While it
is more than ``(BURST - 1) * FORGIVE`` seconds ahead, the address has failed :data:`BURST` times
faster than one each ``FORGIVE`` seconds, and its CONNECTs are refused without a hash until it
is not: a guesser gets BURST tries, then one each FORGIVE seconds, and costs the node nothing
more.  A success changes nothing (a correct password does not buy more guesses).

The table holds at most :data:`MAX_ADDRESSES` addresses, in the order of their last failure: an
address whose failures are all forgiven is dropped when next seen, and when the table is full the
one that failed least recently makes room (O(1)).  An address forgotten that way starts afresh:
more addresses than that guessing at once cannot all be throttled, but cannot grow the node.
"""

from __future__ import annotations

import functools
import ipaddress
import time
from collections.abc import Callable

BURST = 10
"""Failed logins an address may make in a row before it is throttled."""

FORGIVE = 6.0
"""Seconds after which one failure is forgiven: a throttled address gets ten tries a minute."""

MAX_ADDRESSES = 10_000
"""Addresses the table remembers at most (about 1 MB)."""


def address_key(host: str | None) -> str | None:
    """What ``host`` is counted as: itself, its /64 for IPv6, None when unknown (not counted)."""
    if not host:
        return None
    return _address_key(host)


@functools.lru_cache(maxsize=4096)
def _address_key(host: str) -> str:
    """(Parsing an address costs more than the rest of a login without a password: cached.)"""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return host


class LoginThrottle:
    """The failed logins of recent addresses; see the module's docstring."""

    __slots__ = ("_clock", "_forgiven_at", "burst", "forgive", "max_addresses", "throttled")

    def __init__(
        self,
        burst: int = BURST,
        forgive: float = FORGIVE,
        max_addresses: int = MAX_ADDRESSES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.burst = burst
        self.forgive = forgive
        self.max_addresses = max_addresses
        self._clock = clock
        self._forgiven_at: dict[str, float] = {}
        self.throttled = 0
        """CONNECTs refused because their address had failed too often."""

    def __len__(self) -> int:
        return len(self._forgiven_at)

    def allows(self, key: str | None) -> bool:
        """Whether a CONNECT from ``key`` may be checked now (counted when not)."""
        if key is None or key not in self._forgiven_at:
            return True
        ahead = self._forgiven_at[key] - self._clock()
        if ahead <= 0:
            del self._forgiven_at[key]  # all forgiven
            return True
        if ahead <= (self.burst - 1) * self.forgive:
            return True
        self.throttled += 1
        return False

    def failed(self, key: str | None) -> None:
        """A login from ``key`` failed."""
        if key is None:
            return
        now = self._clock()
        table = self._forgiven_at
        forgiven_at = table.pop(key, now)
        if len(table) >= self.max_addresses:
            del table[next(iter(table))]  # the least recent failure
        table[key] = max(forgiven_at, now) + self.forgive  # re-inserted: the most recent
