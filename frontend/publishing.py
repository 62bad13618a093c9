"""One connection's PUBLISH packets on their way to the log, and their acknowledgements.

The channel decides (``Produce``); this carries it out: the record goes to the producer, and the
PUBACK/PUBREC is released only once Kafka reports the write durable and, for a retained message
or a persistent session's QoS 2 packet id, once that is stored too.  The channel then sends the
replies in arrival order [MQTT-4.6.0-2].

A full producer queue holds this connection's later PUBLISHes back, in order, until the log is
writable again (the connection stops reading meanwhile).  A message of this client's own that
comes back from the log before its acknowledgement went out waits, so the PUBACK goes first.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Protocol

from frontend import outages
from frontend.metrics import Traffic
from frontend.sessions.manager import Owned, SessionManager
from mqttcore import channel as ch
from mqttcore.message import Message
from mqttcore.session import Outbound
from router.outbox import DeliveryCallback


class Log(Protocol):
    """The log, as a connection writes to it."""

    available: bool

    def produce(self, message: Message, on_delivery: DeliveryCallback | None) -> bool: ...

    def when_writable(self, callback: Callable[[], None]) -> None: ...


class Wiring(Protocol):
    """What the node hands every connection (``frontend.connection.Services``), as far as its
    PUBLISHes need it."""

    @property
    def log(self) -> Log: ...

    @property
    def sessions(self) -> SessionManager: ...

    @property
    def traffic(self) -> Traffic: ...


Run = Callable[[list[ch.Action]], None]
"""Carry out the channel's actions (the connection's ``run``)."""
Resume = Callable[[list[Outbound]], None]
"""An acknowledgement went out, or the producer has room again: deliver these messages held
back meanwhile (the client's own), and read from the socket again if nothing else holds it."""


class Publishing:
    """The PUBLISHes of one connection between the channel and the log: made with the
    connection's channel, its session and two callables, never the connection itself."""

    __slots__ = (
        "_own_deferred", "_qos2_ids", "_resume", "_run", "blocked", "channel", "log", "owned",
        "received", "sessions",
    )  # fmt: skip

    def __init__(
        self, channel: ch.Channel, owned: Owned, run: Run, resume: Resume, wiring: Wiring
    ) -> None:
        self.channel = channel
        self.owned = owned
        """The session the PUBLISHes are made in (closed once the connection let it go)."""
        self._run = run
        self._resume = resume
        self.log = wiring.log
        self.sessions = wiring.sessions
        self.received = wiring.traffic.received
        """PUBLISH packets accepted from clients, by QoS (the node's count)."""
        self.blocked: list[ch.Produce] = []
        """PUBLISHes held back, in order, while the producer queue is full."""
        self._qos2_ids: dict[int, int] = {}
        self._own_deferred: list[Outbound] = []

    def produce(self, action: ch.Produce) -> None:
        """A PUBLISH the channel accepted: to the log now, or behind those held back."""
        self.received[action.message.qos] += 1
        self._produce(action)

    def _produce(self, action: ch.Produce) -> None:
        if self.blocked:
            self.blocked.append(action)
            return
        message = action.message
        callback = None
        if action.packet_id is not None and action.ticket is not None:
            self._qos2_ids[action.ticket] = action.packet_id
        if action.ticket is not None or message.retain:
            # a partial, not a closure: mypyc keeps a nested function in its own environment,
            # a reference cycle per PUBLISH left to the cycle collector
            callback = partial(self._durable, action.ticket, message)
        try:
            written = self.log.produce(message, callback)
        except outages.LOG_ERRORS as exc:
            self._run(outages.publish_refused(self.channel, message.topic, exc))
            return
        if not written:
            self.blocked.append(action)
            self.log.when_writable(self._retry)

    def _retry(self) -> None:
        blocked, self.blocked = self.blocked, []
        for i, action in enumerate(blocked):
            if self.blocked:  # full again: the rest waits behind, in order
                self.blocked.extend(blocked[i:])
                break
            self._produce(action)
        self._resume([])

    def defer_own(self, out: Outbound) -> bool:
        """Hold back a message of this client's own still awaiting its acknowledgement."""
        if out.message.client_id == self.channel.client_id and self.channel.awaiting_log(
            out.message.message_id
        ):
            self._own_deferred.append(out)
            return True
        return False

    def take_deferred(self) -> list[Outbound]:
        deferred, self._own_deferred = self._own_deferred, []
        return deferred

    def _durable(
        self, ticket: int | None, message: Message, partition: int, offset: int, error: str | None
    ) -> None:
        if error is not None:
            self._run(outages.publish_lost(self.channel, message.topic, error, ticket is not None))
            return
        persistent = self.owned.persistent and not self.owned.closed
        if message.retain or (message.qos == 2 and persistent):
            work = self._store_then_acknowledge(ticket, message, partition, offset)
            outages.in_background(work, self.channel.client_id, "storing before acknowledging")
        elif ticket is not None:
            self._acknowledge(ticket)

    async def _store_then_acknowledge(
        self, ticket: int | None, message: Message, partition: int, offset: int
    ) -> None:
        """What must be stored before the PUBACK/PUBREC: the retained message, and for a
        persistent session the QoS 2 packet id awaiting PUBREL (so a move cannot repeat it)."""
        try:
            if message.retain:
                await self.sessions.retained.apply(message, partition, offset)
            packet_id = self._qos2_ids.pop(ticket, None) if ticket is not None else None
            if packet_id is not None and not self.owned.closed:
                await self.sessions.mark_received(self.owned, packet_id)
        except outages.STORE_ERRORS as exc:
            self._run(outages.publish_not_stored(self.channel, message.topic, exc))
            return
        if ticket is not None:
            self._acknowledge(ticket)

    def _acknowledge(self, ticket: int) -> None:
        self._qos2_ids.pop(ticket, None)
        self._run(self.channel.produced(ticket))
        self._resume(self.take_deferred())
