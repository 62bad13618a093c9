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
from frontend.session import Session


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


class SessionStore(Protocol):
    async def load(self, client_id: str) -> Session | None:
        """The session kept for ``client_id``, if any."""

    async def save(self, session: Session) -> None:
        """Keep ``session`` for its client's next connection."""

    async def discard(self, client_id: str) -> None:
        """Forget any session of ``client_id`` [MQTT-3.1.2-6]."""


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
    """Sessions of one node, kept in memory across its clients' reconnects."""

    def __init__(self) -> None:
        self._sessions: dict[str, Session] = {}

    async def load(self, client_id: str) -> Session | None:
        return self._sessions.get(client_id)

    async def save(self, session: Session) -> None:
        self._sessions[session.client_id] = session

    async def discard(self, client_id: str) -> None:
        self._sessions.pop(client_id, None)
