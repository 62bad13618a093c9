"""Every connection's deadline on one timer: the CONNECT timeout and the keep-alive.

A connection must send its CONNECT within the connect timeout, and then something at least every
1.5 x its keep-alive [MQTT-3.1.2-24].  Rather than a timer per connection, the node keeps one
wheel of one-second slots: a connection is filed under the second its deadline falls in, and one
timer, armed only while something is filed, visits the slot that is due.  A visited connection
says when it is due now (it may have been heard from since it was filed): past that, it expires;
otherwise it is filed again under its new deadline.  So a connection costs a set entry (the
slot it is filed under is kept on it), and a visit once per keep-alive period, never work per
packet.
"""

from __future__ import annotations

import asyncio
import math
from typing import Protocol

TICK = 1.0
"""Width of a slot, in seconds: a deadline is noticed at most this late."""


class Expiring(Protocol):
    slot: int | None
    """The slot it is filed under (None: not filed); the wheel's to set."""

    def due(self) -> float | None:
        """When this expires, on the loop's clock, as far as is known now (None: never)."""

    def expire(self) -> None:
        """The deadline passed."""


class Deadlines:
    """The wheel of one node's connections."""

    def __init__(self) -> None:
        self._slots: dict[int, set[Expiring]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._armed_for = 0
        """The slot the timer visits."""

    def watch(self, item: Expiring) -> None:
        """File ``item`` under its deadline (again, if it moved); forget it if it has none."""
        due = item.due()
        self.forget(item)
        if due is None:
            return
        slot = math.ceil(due / TICK)
        self._slots.setdefault(slot, set()).add(item)
        item.slot = slot
        if self._timer is None or slot < self._armed_for:
            self._arm()

    def forget(self, item: Expiring) -> None:
        slot, item.slot = item.slot, None
        if slot is not None:
            filed = self._slots[slot]
            filed.discard(item)
            if not filed:
                del self._slots[slot]

    def _arm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._armed_for = min(self._slots)
        self._timer = asyncio.get_running_loop().call_at(self._armed_for * TICK, self._visit)

    def _visit(self) -> None:
        self._timer = None
        now = asyncio.get_running_loop().time()
        current = math.floor(now / TICK)
        for slot in [s for s in self._slots if s <= current]:
            for item in self._slots.pop(slot):
                item.slot = None
                due = item.due()
                if due is not None and due <= now:
                    item.expire()
                else:
                    self.watch(item)
        if self._slots:
            self._arm()
