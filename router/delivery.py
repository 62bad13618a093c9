"""What every path of delivery shares: the QoS rule, the client as delivery sees it, counters.

``router.dispatch`` decides who gets a record live, retained or shared; ``router.backlog`` hands
clients what they missed from the log.  Both deliver through the same :class:`Client` with the
QoS of :func:`delivery_qos`, and count in the same :class:`Counters`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from mqttcore.codec import PublishTemplate
from mqttcore.message import Message
from mqttcore.session import Outbound, Session


def delivery_qos(granted: int, message_qos: int) -> int:
    """The QoS a client gets a message at: the highest QoS its matching subscriptions granted
    (``granted``), capped by the message's own [MQTT-3.3.5-1]."""
    return granted if granted < message_qos else message_qos


def template_for(message: Message, qos: int, cache: dict[int, PublishTemplate]) -> PublishTemplate:
    """The PUBLISH of ``message`` at ``qos``, encoded once per record and QoS (``cache``)."""
    template = cache.get(qos)
    if template is None:
        template = cache[qos] = PublishTemplate(message.topic, message.payload, qos)
    return template


def lower(positions: dict[int, int], other: Mapping[int, int]) -> None:
    """Per partition, the lower of the two offsets into ``positions`` (``other``'s where it has
    none): where a stream resumes is the earliest of what its parts still need."""
    for partition, offset in other.items():
        if offset < positions.get(partition, offset + 1):
            positions[partition] = offset


class Subscriber(Protocol):
    """A connected client, as the dispatcher sees it."""

    def deliver(self, out: Outbound) -> None:
        """Send (or queue) one message for the client."""

    def stream_failed(self, error: BaseException) -> None:
        """What the client missed could not be read from the log: close, keeping the stored
        positions for the next connection."""


@dataclass(slots=True)
class Counters:
    records_dispatched: int = 0
    messages_delivered: int = 0
    messages_dropped: int = 0
    messages_replayed: int = 0
    retention_lost: int = 0
    fell_behind: int = 0
    """Times a connected client's queue was full for a QoS 1/2 record: it read on from the log."""


@dataclass(slots=True, eq=False)
class Client:
    """A connected client's session, or one of its history streams (``router.history``)."""

    session: Session
    subscriber: Subscriber
    owner: Session | None = None
    """The session whose queue takes what is delivered, if not ``session``: a history
    stream's client's."""
    keeps_qos0: bool = False
    """Reads QoS 0 messages back from the log too (a history stream), never drops them."""
    prefix: str = ""
    """What a message's topic goes out under (a history stream's ``$history/<since>/``)."""
    behind: dict[int, int] | None = None
    """While it catches up from the log: per partition, the next offset it needs."""
    rewind: dict[int, int] | None = None
    """Offsets below ``behind`` found needed during a round (records that waited for a pending
    subscription): the next round starts there."""
    catching_up: asyncio.Task[None] | None = None
    """The task reading what it missed from the log, while it is behind."""

    @property
    def queue(self) -> Session:
        """The session whose queue takes what is delivered: ``owner``, else its own."""
        return self.session if self.owner is None else self.owner
