"""Where sessions are kept: the interface every backend follows, and the in-memory backend.

The session manager talks to this interface only; ``frontend.sessions.redis`` is the cluster's
backend, and one contract test suite runs against both.  Ownership is a lease fenced by a token
that only grows: a node that lost a session can never write it again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from frontend.mqtt.session import StoredSession


@dataclass(slots=True, frozen=True)
class Lease:
    """Ownership of a client id's session by one node, fenced by a token that only grows."""

    client_id: str
    node_id: str
    token: int


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


class SessionStore(Protocol):
    """Sessions and their ownership.  Every write carries the writer's lease; a write with a
    token older than the session's is refused, so a node that lost a session can never
    overwrite it afterwards."""

    async def acquire(
        self, client_id: str, node_id: str, clean: bool, force: bool = False
    ) -> Acquired | Busy:
        """Own the session (a new token), or learn who does.  ``clean`` discards any stored
        state [MQTT-3.1.2-6]; ``force`` takes it from an owner that did not let go.  If the
        previous connection died with its node, its will comes back to be published."""

    async def keep_will(self, lease: Lease, will: bytes) -> None:
        """Store the connection's will (a log record), so that another node publishes it if
        this node dies with the connection open [MQTT-3.1.2-8]; release drops it."""

    async def save(self, lease: Lease, state: StoredSession) -> bool:
        """Store ``state``; False if the lease is no longer current."""

    async def save_many(self, saves: Sequence[tuple[Lease, StoredSession]]) -> list[bool]:
        """Store several sessions in one round trip; per session, False if its lease is no
        longer current."""

    async def release(self, lease: Lease, state: StoredSession | None) -> None:
        """Let go: keep ``state`` for the next connection (until the session expiry), or
        forget the session (None)."""

    async def checkpoint(self, node_id: str, seq: int, positions: dict[int, int]) -> None:
        """Store ``node_id``'s delivery checkpoint number ``seq`` (numbers only grow): per
        partition, an offset at or below the next undelivered one of every session live on
        that node when it was taken."""

    async def read_checkpoint(self, node_id: str) -> tuple[int, dict[int, int]]:
        """``node_id``'s last checkpoint: its number and positions; (0, {}) if none."""

    async def mark_received(self, lease: Lease, packet_id: int) -> None:
        """Record an inbound QoS 2 packet id awaiting PUBREL, before PUBREC is sent.  The marks
        are what ``acquire`` returns as ``awaiting_rel``; a saved state's own list is not."""

    async def unmark_received(self, lease: Lease, packet_id: int) -> None:
        """The PUBREL for ``packet_id`` arrived."""


class MemorySessionStore:
    """Sessions kept in this process: the single-node store (and the unit tests').

    As in Redis, the QoS 2 marks are kept apart from the saved state: they are the record of
    which inbound packet ids await PUBREL, whatever a save or release carries."""

    def __init__(self) -> None:
        self._states: dict[str, StoredSession] = {}
        self._marks: dict[str, set[int]] = {}
        self._owners: dict[str, tuple[str, int]] = {}
        self._tokens: dict[str, int] = {}

    async def acquire(
        self, client_id: str, node_id: str, clean: bool, force: bool = False
    ) -> Acquired | Busy:
        owner = self._owners.get(client_id)
        if owner is not None and not force:
            return Busy(owner[0])
        token = self._tokens.get(client_id, 0) + 1
        self._tokens[client_id] = token
        self._owners[client_id] = (node_id, token)
        if clean:
            self._forget(client_id)
        state = self._states.get(client_id)
        if state is not None:
            marks = sorted(self._marks.get(client_id, ()))
            state = replace(state, awaiting_rel=marks)
        return Acquired(Lease(client_id, node_id, token), state)

    async def keep_will(self, lease: Lease, will: bytes) -> None:
        """Nothing to do: in one process a will dies with the node that would publish it."""

    def _current(self, lease: Lease) -> bool:
        return self._tokens.get(lease.client_id) == lease.token

    def _forget(self, client_id: str) -> None:
        self._states.pop(client_id, None)
        self._marks.pop(client_id, None)

    async def save(self, lease: Lease, state: StoredSession) -> bool:
        if not self._current(lease):
            return False
        self._states[lease.client_id] = state
        return True

    async def release(self, lease: Lease, state: StoredSession | None) -> None:
        if not self._current(lease):
            return
        self._owners.pop(lease.client_id, None)
        if state is None:
            self._forget(lease.client_id)
        else:
            self._states[lease.client_id] = state

    async def mark_received(self, lease: Lease, packet_id: int) -> None:
        if self._current(lease):
            self._marks.setdefault(lease.client_id, set()).add(packet_id)

    async def unmark_received(self, lease: Lease, packet_id: int) -> None:
        if self._current(lease):
            self._marks.get(lease.client_id, set()).discard(packet_id)
