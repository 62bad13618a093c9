"""Where sessions and retained messages are kept: the interfaces and their in-memory stores.

The broker talks to these two interfaces only, so the store can move (to Redis, or a compacted
log) without the broker changing.

Retained messages are applied in log order: each carries the (partition, offset) the log gave it,
and a store keeps, per topic, the message with the highest offset.  One topic always lands in one
partition, so offsets of one topic are comparable, and the retained message everywhere is the
one later in the log, whichever node wrote it and in whatever order the writes reach the store.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from frontend.mqtt import topics
from frontend.record import Message
from frontend.session import StoredSession


@dataclass(slots=True, frozen=True)
class Retained:
    message: Message
    partition: int
    offset: int


class RetainedStore(Protocol):
    async def apply(self, message: Message, partition: int, offset: int) -> None:
        """Store ``message`` as its topic's retained message, or clear it (empty payload)."""

    async def match(self, topic_filter: str) -> list[Retained]:
        """Every retained message whose topic matches ``topic_filter``."""


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

    async def release(self, lease: Lease, state: StoredSession | None) -> None:
        """Let go: keep ``state`` for the next connection, or forget the session (None)."""

    async def mark_received(self, lease: Lease, packet_id: int) -> None:
        """Record an inbound QoS 2 packet id awaiting PUBREL, before PUBREC is sent."""

    async def unmark_received(self, lease: Lease, packet_id: int) -> None:
        """The PUBREL for ``packet_id`` arrived."""


class MemoryRetainedStore:
    """Retained messages of one node, in a dict by topic."""

    def __init__(self) -> None:
        self._by_topic: dict[str, Retained] = {}

    async def apply(self, message: Message, partition: int, offset: int) -> None:
        current = self._by_topic.get(message.topic)
        if current is not None and current.offset >= offset:
            return
        # An empty payload stays as a tombstone, so an older write arriving late cannot
        # resurrect the topic [MQTT-3.3.1-10], [MQTT-3.3.1-11].
        self._by_topic[message.topic] = Retained(message, partition, offset)

    async def match(self, topic_filter: str) -> list[Retained]:
        if "+" not in topic_filter and "#" not in topic_filter:
            found = self._by_topic.get(topic_filter)
            candidates = [found] if found else []
        else:
            candidates = [r for t, r in self._by_topic.items() if topics.matches(topic_filter, t)]
        return [r for r in candidates if r.message.payload]


class MemorySessionStore:
    """Sessions kept in this process: the single-node store (and the unit tests')."""

    def __init__(self) -> None:
        self._states: dict[str, StoredSession] = {}
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
            self._states.pop(client_id, None)
        return Acquired(Lease(client_id, node_id, token), self._states.get(client_id))

    async def keep_will(self, lease: Lease, will: bytes) -> None:
        """Nothing to do: in one process a will dies with the node that would publish it."""

    def _current(self, lease: Lease) -> bool:
        return self._tokens.get(lease.client_id) == lease.token

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
            self._states.pop(lease.client_id, None)
        else:
            self._states[lease.client_id] = state

    async def mark_received(self, lease: Lease, packet_id: int) -> None:
        state = self._states.get(lease.client_id)
        if self._current(lease) and state is not None and packet_id not in state.awaiting_rel:
            state.awaiting_rel.append(packet_id)

    async def unmark_received(self, lease: Lease, packet_id: int) -> None:
        state = self._states.get(lease.client_id)
        if self._current(lease) and state is not None and packet_id in state.awaiting_rel:
            state.awaiting_rel.remove(packet_id)
