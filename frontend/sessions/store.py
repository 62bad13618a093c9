"""Where sessions are kept: the interface every backend follows, and the in-memory backend.

The session manager talks to this interface only; ``frontend.sessions.redis`` is the cluster's
backend, and one contract test suite runs against both.  Ownership is a lease fenced by a token
that only grows: a node that lost a session, or let it go, can never write it again.

A session belongs to the identity that made it (``identity``: the proven user name, or the
certificate's; "" for anonymous clients, an identity of their own): an ``acquire`` by another
identity is answered :class:`NotOwner` and changes nothing, whether the session is connected or
parked, and whatever ``clean`` and ``force`` say.  The identity is kept while the session is (a
clean session's, until it ends).  A session stored before identities were kept has none: the
next acquire makes it its own.  This is the upgrade path: after a rolling restart the device
reconnecting first is, in practice, the one that made the session; "anonymous" instead would
lock every authenticated client out of its own session until it expired.

Sessions end: a persistent session released and not acquired again within the store's
``expiry`` seconds (0: never) is removed with everything kept for it, and counted in
``expired``.  In memory, one heap of deadlines and one timer serve the whole store; a deadline
whose session was resumed meanwhile is skipped when its time comes.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from mqttcore.session import StoredSession

DEFAULT_EXPIRY = 7200.0
"""Seconds a released persistent session is kept (EMQX's default); 0: forever."""


@dataclass(slots=True, frozen=True)
class Lease:
    """Ownership of a client id's session by one node, fenced by a token that only grows."""

    client_id: str
    node_id: str
    token: int
    listed: str = field(default="", compare=False)
    """How the node's list of its sessions names this acquisition (``frontend.sessions.redis``;
    none in memory): letting go unlists only that entry."""


@dataclass(slots=True, frozen=True)
class Acquired:
    """A session now owned: its lease, its stored state (None: none kept), and the will of a
    connection that died with its node (the record to publish before this one is accepted)."""

    lease: Lease
    state: StoredSession | None
    orphaned_will: bytes | None = None


@dataclass(slots=True, frozen=True)
class Busy:
    """The session is in use by a live connection on ``owner``."""

    owner: str


@dataclass(slots=True, frozen=True)
class NotOwner:
    """The session belongs to another identity: refused, nothing changed."""


class SessionStore(Protocol):
    """Sessions and their ownership.  Every write carries the writer's lease; a write whose
    lease is no longer current (the session was taken over, or let go) is refused, so a node
    that lost a session can never overwrite it afterwards."""

    expired: int
    """Sessions this store removed because they were not resumed within the expiry."""

    async def acquire(
        self, client_id: str, node_id: str, clean: bool, force: bool = False, identity: str = ""
    ) -> Acquired | Busy | NotOwner:
        """Own the session (a new token), or learn who does.  ``clean`` discards any stored
        state [MQTT-3.1.2-6]; ``force`` takes it from an owner that did not let go.  If the
        previous connection died with its node, its will comes back to be published.  A
        session of another ``identity`` is :class:`NotOwner`, untouched; a new session (or
        one without an identity) becomes ``identity``'s."""

    async def keep_will(self, lease: Lease, will: bytes) -> None:
        """Store the connection's will (a log record), so that another node publishes it if
        this node dies with the connection open [MQTT-3.1.2-8]; release drops it."""

    async def holds(self, lease: Lease) -> bool:
        """Whether ``lease`` is still the session's (no other connection took it since)."""

    async def save(self, lease: Lease, state: StoredSession) -> bool:
        """Store ``state``; False if the lease is no longer current."""

    async def save_many(self, saves: Sequence[tuple[Lease, StoredSession]]) -> list[bool]:
        """Store several sessions in one round trip; per session, False if its lease is no
        longer current."""

    async def release(self, lease: Lease, state: StoredSession | None) -> None:
        """Let go: keep ``state`` for the next connection (until the session expiry), or
        forget the session (None)."""

    async def checkpoint(self, node_id: str, seq: int, positions: dict[int, int]) -> None:
        """Store delivery checkpoint number ``seq`` (numbers only grow) of the node process
        named ``node_id`` (its ``Saver.checkpoint_id``): per partition, an offset at or below
        the next undelivered one of every session live in that process when it was taken."""

    async def read_checkpoint(self, node_id: str) -> tuple[int, dict[int, int]]:
        """The last checkpoint of ``node_id``: its number and positions; (0, {}) if none."""

    async def mark_received(self, lease: Lease, packet_id: int) -> None:
        """Record an inbound QoS 2 packet id awaiting PUBREL, before PUBREC is sent.  The marks
        are what ``acquire`` returns as ``awaiting_rel``; a saved state's own list is not."""

    async def unmark_received(self, lease: Lease, packet_id: int) -> None:
        """The PUBREL for ``packet_id`` arrived."""


class MemorySessionStore:
    """Sessions kept in this process: the single-node store (and the unit tests').

    As in Redis, the QoS 2 marks are kept apart from the saved state: they are the record of
    which inbound packet ids await PUBREL, whatever a save or release carries.  Tokens come
    from one counter for the whole store, so nothing of a forgotten session needs keeping."""

    def __init__(self, expiry: float = DEFAULT_EXPIRY) -> None:
        self.expiry = expiry
        self.expired = 0
        self._states: dict[str, StoredSession] = {}
        self._marks: dict[str, set[int]] = {}
        self._owners: dict[str, Lease] = {}
        self._identities: dict[str, str] = {}
        """Client id -> the identity its session belongs to, while the session exists."""
        self._tokens = itertools.count(1)
        self._parked: dict[str, float] = {}  # client id -> when it expires (loop time)
        self._deadlines: list[tuple[float, str]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._checkpoints: dict[str, tuple[int, dict[int, int]]] = {}

    async def acquire(
        self, client_id: str, node_id: str, clean: bool, force: bool = False, identity: str = ""
    ) -> Acquired | Busy | NotOwner:
        self._expire_due()
        if self._identities.get(client_id, identity) != identity:
            return NotOwner()
        owner = self._owners.get(client_id)
        if owner is not None and not force:
            return Busy(owner.node_id)
        lease = Lease(client_id, node_id, next(self._tokens))
        self._owners[client_id] = lease
        self._parked.pop(client_id, None)
        if clean:
            self._forget(client_id)
        self._identities[client_id] = identity
        state = self._states.get(client_id)
        if state is not None:
            marks = sorted(self._marks.get(client_id, ()))
            state = replace(state, awaiting_rel=marks)
        return Acquired(lease, state)

    async def keep_will(self, lease: Lease, will: bytes) -> None:
        """Nothing to do: in one process a will dies with the node that would publish it."""

    async def holds(self, lease: Lease) -> bool:
        return self._current(lease)

    def _current(self, lease: Lease) -> bool:
        return self._owners.get(lease.client_id) == lease

    def _forget(self, client_id: str) -> None:
        self._states.pop(client_id, None)
        self._marks.pop(client_id, None)
        self._identities.pop(client_id, None)

    async def save(self, lease: Lease, state: StoredSession) -> bool:
        if not self._current(lease):
            return False
        self._states[lease.client_id] = state
        return True

    async def save_many(self, saves: Sequence[tuple[Lease, StoredSession]]) -> list[bool]:
        return [await self.save(lease, state) for lease, state in saves]

    async def release(self, lease: Lease, state: StoredSession | None) -> None:
        if not self._current(lease):
            return
        del self._owners[lease.client_id]
        if state is None:
            self._forget(lease.client_id)
        else:
            self._states[lease.client_id] = state
            self._park(lease.client_id)

    async def checkpoint(self, node_id: str, seq: int, positions: dict[int, int]) -> None:
        stored = self._checkpoints.get(node_id)
        if stored is None or seq >= stored[0]:
            self._checkpoints[node_id] = (seq, dict(positions))

    async def read_checkpoint(self, node_id: str) -> tuple[int, dict[int, int]]:
        seq, positions = self._checkpoints.get(node_id, (0, {}))
        return seq, dict(positions)

    async def mark_received(self, lease: Lease, packet_id: int) -> None:
        if self._current(lease):
            self._marks.setdefault(lease.client_id, set()).add(packet_id)

    async def unmark_received(self, lease: Lease, packet_id: int) -> None:
        if self._current(lease):
            self._marks.get(lease.client_id, set()).discard(packet_id)

    # -- expiry: one heap, one timer ----------------------------------------------------------

    def _park(self, client_id: str) -> None:
        if not self.expiry:
            return
        deadline = asyncio.get_running_loop().time() + self.expiry
        self._parked[client_id] = deadline
        heapq.heappush(self._deadlines, (deadline, client_id))
        self._arm()

    def _arm(self) -> None:
        """Time the next deadline.  Deadlines only grow (now + a fixed expiry), so an armed
        timer is never later than a deadline pushed after it."""
        if self._timer is None and self._deadlines:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_at(self._deadlines[0][0], self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._expire_due()
        self._arm()

    def _expire_due(self) -> None:
        now = asyncio.get_running_loop().time()
        while self._deadlines and self._deadlines[0][0] <= now:
            deadline, client_id = heapq.heappop(self._deadlines)
            if self._parked.get(client_id) == deadline:  # not resumed since
                del self._parked[client_id]
                self._forget(client_id)
                self.expired += 1
