"""Password checks off the event loop: a few threads, and a bounded wait for them.

A check costs a hash (up to ``passwords.MAX_ITERATIONS`` PBKDF2 iterations, about 0.14 s), far
too long to run on the loop that serves every other client.  :meth:`Hashing.run` hands it to a
pool of :data:`THREADS` threads (made on first use: a node without a password file has none) and
awaits it, so the loop keeps serving while logins wait.  At most ``threads + waiting`` checks are
admitted at once; one more is not queued but answered at once with None (the caller answers
CONNACK 3, server unavailable, counted in ``shed``): a flood of CONNECTs makes logins wait their
turn up to that bound, never makes the node hold an unbounded queue of them.

``hashlib``'s PBKDF2 and SHA-512 release the GIL, so two threads do two checks at once while the
loop runs.  Only the loop touches the counters.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

THREADS = 2
"""Checks running at once: a node's hashing never takes more than two cores."""

WAITING = 20_000
"""Checks waiting for a thread at most: as many as a node takes connections by default here
(``--max-connections`` from the file limit), so a storm of legitimate reconnects waits its turn
and is answered later, never refused (at ``mosquitto_passwd``'s 101 iterations a check costs
~0.1 ms: 20,000 take about a second on two threads); the bound only keeps the queue finite.
A guesser is stopped before it by the per-address throttle (``frontend.auth.throttle``)."""

_Result = TypeVar("_Result")


class Hashing:
    """A bounded pool for slow checks; see the module's docstring."""

    __slots__ = ("_pool", "limit", "pending", "shed", "threads")

    def __init__(self, threads: int = THREADS, waiting: int = WAITING) -> None:
        self.threads = threads
        self.limit = threads + waiting
        self.pending = 0
        """Checks running or waiting now."""
        self.shed = 0
        """Checks refused because ``limit`` were pending already."""
        self._pool: ThreadPoolExecutor | None = None

    async def run(self, check: Callable[[], _Result]) -> tuple[bool, _Result | None]:
        """``(True, check())`` computed on a pool thread, or ``(False, None)`` at once when
        ``limit`` checks are pending already."""
        if self.pending >= self.limit:
            self.shed += 1
            return False, None
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="headwater-hash")
        self.pending += 1
        try:
            return True, await asyncio.get_running_loop().run_in_executor(self._pool, check)
        finally:
            self.pending -= 1

    def close(self) -> None:
        """Stop the threads; checks not started are dropped (their clients are gone)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
