"""Publishers wait for delivery while the node is saturated and one of its clients is behind.

A node takes in PUBLISHes as fast as its publishers send them; its subscribers get theirs one
in-flight window per round trip.  When publishers offer more than the node can both take in
and deliver, intake wins every turn of the loop: four publishers paced at 20,000 msg/s in all
took in 9,000-25,000 msg/s while the one subscriber they fed, behind and catching up from the
log (``router.backlog``), got 350-1,300 (``python -m bench throughput --scenarios
fanin-qos1-paced``): about 80% of the node's CPU went to intake (py-spy), its loop ran 12-50 ms
turns, and once the publishers stopped the same catch-up delivered 20,000-50,000 msg/s.

So while a client of the node is behind *and* the loop runs late (a :data:`TICK` timer fires
more than :data:`LATE` after its time: the node has no CPU to spare), the node takes in no more
PUBLISHes than it delivers: each admitted PUBLISH spends a credit, each PUBLISH sent to a
client earns one.  A connection without credit keeps its packets, in order, and stops
reading once it holds ``DRAIN_BUDGET`` (``frontend.connection``): its publisher sees TCP
backpressure and later PUBACKs.  Everything taken in is still acknowledged only once it is in
Kafka; nothing is dropped; what waits is in the publisher's socket, not the node's memory.

Invariants:

* a node whose loop is on time is never held back, whoever is behind: a subscriber slow on its
  own (a device on a poor link) costs the publishers nothing while the node has CPU to spare;
* once held back, the node keeps coupling intake to delivery until no client is behind or no
  tick has run late for :data:`QUIET` seconds;
* a held connection waits :data:`MAX_HOLD` at most: then :data:`SLACK` more PUBLISHes are
  admitted, so intake never stops while delivery does;
* the cost is one timer for the node, armed by a PUBLISH while a client is behind, and stopped
  at the first tick with no PUBLISH since the one before and no connection waiting; O(1) per
  PUBLISH.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final, Protocol

TICK: Final = 0.005
"""Seconds between two looks at the loop's lateness (and at held connections)."""

LATE: Final = 0.010
"""A tick this many seconds late: the loop's turns are long, the node is saturated."""

QUIET: Final = 1.0
"""Seconds without a late tick after which intake is free again."""

SLACK: Final = 64
"""PUBLISHes admitted beyond what was delivered when the coupling begins, and each time a
held connection has waited ``MAX_HOLD``."""

MAX_HOLD: Final = 0.1
"""Seconds a held connection waits at most before ``SLACK`` more are admitted."""


class Reader(Protocol):
    """A connection holding PUBLISHes back for the intake."""

    def resume_intake(self) -> None:
        """Handle the packets held back (it asks :meth:`Intake.admits` again for each)."""
        ...


def _never() -> bool:
    return False


def _none() -> int:
    return 0


class Intake:
    """The credit of PUBLISHes the node may take in while it couples intake to delivery."""

    __slots__ = (
        "_active", "_delivered", "_held_since", "_lagging", "_late_at", "_loop", "_spent",
        "_timer", "coupled", "holds", "late", "waiting",
    )  # fmt: skip

    def __init__(
        self,
        lagging: Callable[[], bool] = _never,
        delivered: Callable[[], int] = _none,
        late: float = LATE,
    ) -> None:
        self._lagging = lagging
        """Whether some client of the node is behind (``router.backlog``)."""
        self._delivered = delivered
        """PUBLISH packets sent to clients so far (a counter that only grows)."""
        self.late = late
        """Seconds late a tick must run to show the node saturated (``LATE``)."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.coupled = False
        """Intake is bounded by delivery now."""
        self._spent = 0
        """What the admitted PUBLISHes since the coupling began cost, on the scale of
        ``delivered()`` (which stood there when it began): the credit is what was delivered
        beyond it, plus ``SLACK``."""
        self._late_at = 0.0
        self._held_since = 0.0
        self._active = False
        """A PUBLISH asked since the last tick (the timer runs only while PUBLISHes come)."""
        self.waiting: dict[Reader, None] = {}
        """The held connections, in the order they are served: one served and held again goes
        last, so each grant goes round them."""
        self.holds = 0
        """Times a connection was held back (``/stats``: ``intake_holds``)."""

    def admits(self, reader: Reader) -> bool:
        """Whether ``reader`` may handle its next PUBLISH now; if not, it is resumed later."""
        self._active = True
        if self._timer is None and (self.coupled or self._lagging()):
            self._watch()
        if not self.coupled:
            return True
        if self._credit() > 0:
            self._spent += 1
            return True
        if reader not in self.waiting:
            if not self.waiting:
                self._held_since = self._now()
            self.waiting[reader] = None
            self.holds += 1
        return False

    def forget(self, reader: Reader) -> None:
        """``reader`` closed: it waits no more."""
        self.waiting.pop(reader, None)

    def _credit(self) -> int:
        return self._delivered() - self._spent + SLACK

    def _now(self) -> float:
        assert self._loop is not None
        return self._loop.time()

    def _watch(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        due = loop.time() + TICK
        self._timer = loop.call_at(due, self._tick, due)

    def _tick(self, due: float) -> None:
        loop = self._loop
        assert loop is not None
        now = loop.time()
        lagging = self._lagging()
        if lagging and now - due > self.late:
            self._late_at = now
            if not self.coupled:
                self.coupled = True
                self._spent = self._delivered()
        if self.coupled and (not lagging or now - self._late_at > QUIET):
            self.coupled = False
        if self.waiting and self.coupled and now - self._held_since >= MAX_HOLD:
            self._spent -= SLACK
        if self.waiting and (not self.coupled or self._credit() > 0):
            self._resume()
        active, self._active = self._active, False
        if self.waiting or (active and (lagging or self.coupled)):
            self._timer = loop.call_at(now + TICK, self._tick, now + TICK)
        else:  # no PUBLISH came since the last tick: the next one looks again
            self._timer = None

    def _resume(self) -> None:
        """Serve the held connections in turn while there is credit (all of them once intake is
        free); one held again goes last."""
        waiting = self.waiting
        while waiting and (not self.coupled or self._credit() > 0):
            reader = next(iter(waiting))
            del waiting[reader]
            reader.resume_intake()  # held again: back in ``waiting``, last, and no credit left
        if waiting:  # the next grant in MAX_HOLD
            self._held_since = self._now()


__all__ = ["Intake"]
