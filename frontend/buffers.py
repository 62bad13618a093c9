"""The node-wide budget on the bytes a node holds for its clients (``--max-buffered-bytes``).

A client makes a node hold bytes in two places: a packet it has begun and not finished (its
decoder's buffer, up to the maximum packet size, or the CONNECT bound before it is known), and
what the node wrote to it that it has not read yet (the chunks coalesced in a step, then the
transport's write buffer).  One :class:`Budget` counts both for every connection of the node.

Invariants:

* the count changes where the bytes do, once per read and once per flush of a connection, and
  when it closes: O(1), never a walk over the connections, no timer or task per connection;
* past ``limit`` the node stops reading.  A connection that finds the budget spent when it reads
  (``frontend.connection``) pauses and is kept in ``waiting``: none reads more than once
  past the limit, and an idle one is never touched.  Once the count is back under ``low`` (three
  quarters of the limit) every waiting connection is resumed, and the pause is counted
  (``pauses``, ``paused_seconds``);
* a transport's write buffer drains without telling: a connection's share is read when it writes
  (``get_write_buffer_size``), and the budget reads those with a share again before it declares
  itself spent, and every :data:`RECHECK` seconds while it is (one timer for the node, armed only
  while spent), so a stale figure can delay a resume, never prevent it;
* decoded packets waiting for their turn are not counted: a connection holds at most
  ``DRAIN_BUDGET`` of them and stops reading past that (``frontend.connection``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Final, Protocol

log = logging.getLogger("headwater.buffers")

DEFAULT_MAX_BUFFERED_BYTES: Final = 256 * 1024 * 1024
"""Bytes held in partial packets and output buffers across a node's clients: a fleet's devices
hold nothing at rest, a busy node tens of MB (a thousand subscribers a little behind); past a
quarter GiB a node is being made to hold what it cannot afford, and stops reading."""

LOW_WATER: Final = 0.75
"""The share of the limit the count must fall under for reading to resume."""

RECHECK: Final = 0.05
"""Seconds between two readings of the transports' write buffers while the budget is spent."""


class Reader(Protocol):
    """A connection that stopped reading for the budget, and resumes when asked."""

    def update_reading(self) -> None: ...


class Backlog(Protocol):
    """A connection's output with bytes left in its transport's write buffer."""

    backlog: int
    """Those bytes, as last read (and counted in the budget)."""

    def recount(self) -> int:
        """Read the write buffer again; the change to ``backlog``."""
        ...


class Budget:
    """The bytes held, the limit, and the connections waiting for the count to fall."""

    __slots__ = (
        "_paused_seconds",
        "_timer",
        "backlogged",
        "held",
        "limit",
        "low",
        "pauses",
        "spent_since",
        "waiting",
    )

    def __init__(self, limit: int = DEFAULT_MAX_BUFFERED_BYTES) -> None:
        self.limit = limit
        self.low = int(limit * LOW_WATER)
        self.held = 0
        """Bytes counted now; writes add to it directly, on the hot path."""
        self.spent_since: float | None = None
        """When reading stopped (the monotonic clock); None while the budget is not spent."""
        self.pauses = 0
        self._paused_seconds = 0.0
        self.waiting: set[Reader] = set()
        self.backlogged: set[Backlog] = set()
        self._timer: asyncio.TimerHandle | None = None

    @property
    def paused_seconds(self) -> float:
        """Time spent with reading stopped, the current pause included."""
        ongoing = 0.0 if self.spent_since is None else time.monotonic() - self.spent_since
        return self._paused_seconds + ongoing

    def change(self, delta: int) -> None:
        """Count ``delta`` more bytes held (fewer when negative), resuming once under ``low``."""
        self.held += delta
        if delta < 0 and self.spent_since is not None and self.held < self.low:
            self._resume()

    def spent(self) -> bool:
        """Whether a connection must stop reading now (asked after each read)."""
        if self.spent_since is not None:
            return True
        if self.held <= self.limit:
            return False
        self._recount()
        if self.held <= self.limit:
            return False
        self.spent_since = time.monotonic()
        self.pauses += 1
        self._timer = asyncio.get_running_loop().call_later(RECHECK, self._recheck)
        log.warning(
            "clients' buffers hold %d bytes, over the budget of %d (--max-buffered-bytes): "
            "reading stops until they hold less than %d",
            self.held, self.limit, self.low,
        )  # fmt: skip
        return True

    def wait(self, reader: Reader) -> None:
        self.waiting.add(reader)

    def _recount(self) -> None:
        for output in list(self.backlogged):
            self.held += output.recount()
            if not output.backlog:
                self.backlogged.discard(output)

    def _recheck(self) -> None:
        self._timer = None
        self._recount()
        if self.held < self.low:
            self._resume()
        elif self.spent_since is not None:
            self._timer = asyncio.get_running_loop().call_later(RECHECK, self._recheck)

    def _resume(self) -> None:
        assert self.spent_since is not None
        paused = time.monotonic() - self.spent_since
        self._paused_seconds += paused
        self.spent_since = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        waiting, self.waiting = self.waiting, set()
        log.info("clients' buffers hold %d bytes: %d connections read again after %.2f s",
                 self.held, len(waiting), paused)  # fmt: skip
        for reader in waiting:
            reader.update_reading()


__all__ = ["DEFAULT_MAX_BUFFERED_BYTES", "Budget"]
