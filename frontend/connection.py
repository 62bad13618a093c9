"""One client's TCP connection: bytes in, the channel's actions out.

An ``asyncio.Protocol`` on the hot path.  ``data_received`` decodes and hands packets to the
channel strictly in order; when an action needs I/O the connection cannot do synchronously
(opening a session, registering subscriptions) it sets ``_busy`` and runs one task, holding later
packets back until it is done: packets of one connection are never handled concurrently, and there
is never a task per packet.

Writes are coalesced: everything sent during one loop iteration goes out in one ``write``.
Backpressure in both directions:

* inbound: reading pauses while too many PUBLISH packets await the log, while the producer queue is
  full, or while packets pile up behind a busy task;
* outbound: when the transport asks us to pause writing, deliveries go to the session queue
  (QoS 0 dropped, QoS 1/2 queued up to the limit), so a slow subscriber never stalls the node.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections import deque
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, cast

from confluent_kafka import KafkaException
from redis.exceptions import RedisError

from frontend import record
from frontend.mqtt import channel as ch
from frontend.mqtt.codec import Decoder
from frontend.mqtt.errors import ProtocolError
from frontend.mqtt.packets import ConnackCode, Packet, Pubrel
from frontend.record import Message
from frontend.session import Outbound, Session, StoredSession
from frontend.stores import Lease

if TYPE_CHECKING:
    from frontend.server import Node

log = logging.getLogger("headwater.connection")

WRITE_BUFFER_HIGH = 1024 * 1024
"""Bytes waiting in a connection's transport before its messages are queued instead."""

DRAIN_BUDGET = 256
"""Packets handled in one go: a read that brings more (a flood) is handled in slices, with the
socket paused, so other connections and the Kafka pump get their turns in between."""


class MqttConnection(asyncio.Protocol):
    def __init__(self, node: Node) -> None:
        self.node = node
        self.channel = ch.Channel(node.config.node_id, node.config.limits)
        self.decoder = Decoder(node.config.max_packet_size)
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self._loop = asyncio.get_running_loop()
        self._held: deque[Packet] = deque()
        self._busy = False
        self._drain_scheduled = False
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._write_paused = False
        self._read_paused = False
        self._blocked_produces: deque[ch.Produce] = deque()
        self._own_deferred: list[Outbound] = []
        self._last_seen = time.monotonic()
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False
        self.lease: Lease | None = None
        self._qos2_ids: dict[int, int] = {}
        self._replaying: StoredSession | None = None
        """The stored state being replayed; its positions are what a save writes meanwhile."""

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # asyncio's default 64 KiB would count one large message as a backed-up client.
        self.transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.node.connections.add(self)
        self._timer = self._loop.call_later(self.node.config.connect_timeout, self._connect_timeout)

    def data_received(self, data: bytes) -> None:
        self._last_seen = time.monotonic()
        try:
            self._held.extend(self.decoder.feed(data))
        except ProtocolError as error:
            self._fail(error)
            return
        self._drain()

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        reason = f"socket error: {exc}" if exc else "connection closed by the client"
        self._run(self.channel.connection_lost(reason))
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        self.node.connections.discard(self)
        session = self.channel.session
        if session is not None and self.lease is not None:
            state = None if session.clean else self._snapshot(session)
            self.node.broker.detach(session, self)
            self.node.release_session(self.lease, state)

    def _snapshot(self, session: Session) -> StoredSession:
        if self._replaying is not None:
            return self.node.snapshot(session, dict(self._replaying.positions))
        return self.node.snapshot(session)

    async def save_session(self) -> None:
        """Store a persistent session now (the node does so every second)."""
        session = self.channel.session
        if session is None or session.clean or self.lease is None or self._closed:
            return
        if not await self.node.sessions.save(self.lease, self._snapshot(session)):
            log.warning("client %s: session owned elsewhere now; closing", session.client_id)
            self.channel.take_will()  # the node that took the session published it
            self.takeover()

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        if self.channel.session is not None:
            self._send_all(self.channel.session.drain())

    # -- the broker's view (Subscriber) -------------------------------------------------------

    def deliver(self, out: Outbound) -> None:
        session = self.channel.session
        if session is None or self._closed:
            return
        message = out.message
        if message.client_id == self.channel.client_id and self.channel.awaiting_log(
            message.message_id
        ):
            self._own_deferred.append(out)  # our PUBACK/PUBREC goes first
            return
        data = session.deliver(out, online=True, writable=not self._write_paused)
        if data is not None:
            self._write(data)

    def takeover(self) -> None:
        log.info("client %s: session taken over by a new connection", self.channel.client_id)
        self._run(self.channel.connection_lost("session taken over [MQTT-3.1.4-2]"))

    def shutdown(self) -> None:
        self._run(self.channel.connection_lost("server shutting down"))

    # -- packets in ---------------------------------------------------------------------------

    def _drain(self) -> None:
        self._drain_scheduled = False
        budget = DRAIN_BUDGET
        while self._held and not self._busy and not self._closed:
            if budget == 0:  # the rest after other connections and the Kafka pump had a turn
                self._drain_scheduled = True
                self._loop.call_soon(self._drain)
                break
            budget -= 1
            packet = self._held.popleft()
            try:
                actions = self.channel.handle_in(packet)
            except ProtocolError as error:
                self._fail(error)
                return
            self._run(actions)
            if isinstance(packet, Pubrel) and self._persistent:
                self._background(self._unmark(packet.packet_id))
        if not self._held and not self._busy and self.decoder.error is not None:
            self._fail(self.decoder.error)  # after the packets that came before it
            return
        self._update_reading()

    @property
    def _persistent(self) -> bool:
        session = self.channel.session
        return session is not None and not session.clean and self.lease is not None

    async def _unmark(self, packet_id: int) -> None:
        assert self.lease is not None
        await self.node.sessions.unmark_received(self.lease, packet_id)

    def _background(self, work: Coroutine[Any, Any, None]) -> None:
        task = self._loop.create_task(work)
        task.add_done_callback(_log_failure)

    def _fail(self, error: ProtocolError) -> None:
        if self._closed:
            return
        log.warning("client %s (%s): %s", self.channel.client_id or "-", self.peer, error)
        self.node.counters.protocol_errors += 1
        self._run(self.channel.handle_error(error))

    def _run(self, actions: list[ch.Action]) -> None:
        for action in actions:
            if isinstance(action, ch.Send):
                self._write(action.data)
            elif isinstance(action, ch.Produce):
                self._produce(action)
            elif isinstance(action, ch.Close):
                self._close(action)
            elif isinstance(action, ch.OpenSession):
                self._start(self._open_session(action))
            elif isinstance(action, ch.AddSubscriptions):
                self._start(self._subscribe(action))
            elif isinstance(action, ch.RemoveSubscriptions):
                assert self.channel.session is not None
                self.node.broker.unsubscribe(self.channel.session, action.filters)
                if self._persistent:
                    self._background(self.save_session())

    def _start(self, work: Coroutine[Any, Any, None]) -> None:
        self._busy = True
        task = self._loop.create_task(work)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._busy = False
        if not task.cancelled() and task.exception() is not None:
            log.error("client %s: %r", self.channel.client_id, task.exception())
            self._run(self.channel.connection_lost("internal error"))
            return
        self._drain()

    def _update_reading(self) -> None:
        if self.transport is None or self._closed:
            return
        limit = self.node.config.limits.max_pending_publishes
        pressed = (
            self.channel.pending_publishes >= limit
            or len(self._held) >= DRAIN_BUDGET
            or bool(self._blocked_produces)
        )
        if pressed and not self._read_paused:
            self._read_paused = True
            self.transport.pause_reading()
        elif not pressed and self._read_paused:
            self._read_paused = False
            self.transport.resume_reading()

    # -- CONNECT ------------------------------------------------------------------------------

    async def _open_session(self, action: ch.OpenSession) -> None:
        connect = action.connect
        code = self.node.auth.check(connect.username, connect.password)
        if code != ConnackCode.ACCEPTED:
            self._run(self.channel.session_refused(code, "authentication failed"))
            return
        if not self.node.log.available:
            reason = "Kafka is unavailable"
            self._run(self.channel.session_refused(ConnackCode.SERVER_UNAVAILABLE, reason))
            return
        try:
            lease, stored = await self.node.acquire_session(action.client_id, connect.clean_session)
            if connect.will is not None:  # kept with the session, in case this node dies
                will = ch.will_message(connect.will, action.client_id, self.node.config.node_id)
                await self.node.sessions.keep_will(lease, record.encode(will))
        except (RedisError, OSError) as exc:
            reason = f"the session store is unavailable: {exc}"
            self._run(self.channel.session_refused(ConnackCode.SERVER_UNAVAILABLE, reason))
            return
        if self._closed:
            self.node.release_session(lease, stored)
            return
        session = self.node.new_session(action.client_id, connect.clean_session)
        if stored is not None:
            outbound = [self.node.restore_outbound(o) for o in stored.inflight]
            session.restore_inflight(stored, outbound)
        self.lease = lease
        self.node.broker.attach(session, self)
        self._run(self.channel.session_opened(session, stored is not None))
        self._restart_timer()
        if stored is not None and stored.subscriptions:
            self._replaying = stored
            self._background(self._resume(session, stored))

    async def _resume(self, session: Session, stored: StoredSession) -> None:
        """Subscribe again, replay what was missed from the log, then go live at the offsets
        where the replay ended: no gap and no duplicate at the switch."""
        broker = self.node.broker
        starts, new = await broker.subscribe(session, list(stored.subscriptions.items()))
        try:
            await self.node.replay(self._deliver_replayed, session, stored, starts)
        finally:
            broker.activate(session, new, starts)
            self._replaying = None

    def _deliver_replayed(self, out: Outbound | None) -> bool:
        """Deliver one replayed message (if any); False once the connection is gone."""
        if self._closed:
            return False
        if out is not None:
            self.deliver(out)
        return True

    # -- SUBSCRIBE ----------------------------------------------------------------------------

    async def _subscribe(self, action: ch.AddSubscriptions) -> None:
        session = self.channel.session
        assert session is not None
        broker = self.node.broker
        try:
            starts, new = await broker.subscribe(session, action.granted)
        except Exception as exc:
            log.warning("client %s: subscribe failed: %s", self.channel.client_id, exc)
            self._run(self.channel.subscribed(action, failed=True))
            return
        if self._persistent:
            await self.save_session()  # the subscription survives this node before its SUBACK
        self._run(self.channel.subscribed(action))
        try:
            await self._send_retained(action.granted, new, starts)
        finally:
            broker.activate(session, new, starts)

    async def _send_retained(
        self, granted: list[tuple[str, int]], new: list[str], starts: dict[int, int]
    ) -> None:
        """Retained messages after the SUBACK, each once at the highest QoS that matched it.

        For a new subscription only those before its start offsets: later ones arrive live.
        """
        found: dict[str, tuple[int, int, Message, int]] = {}
        for topic_filter, qos in granted:
            for retained in await self.node.retained.match(topic_filter):
                if topic_filter in new and retained.offset >= starts.get(retained.partition, 0):
                    continue
                topic = retained.message.topic
                if topic not in found or found[topic][3] < qos:
                    found[topic] = (retained.partition, retained.offset, retained.message, qos)
        for _, _, message, qos in sorted(found.values(), key=lambda f: (f[0], f[1])):
            self.node.broker.deliver_retained(self, message, qos)

    # -- PUBLISH to the log -------------------------------------------------------------------

    def _produce(self, action: ch.Produce) -> None:
        if self._blocked_produces:
            self._blocked_produces.append(action)
            return
        message = action.message
        callback = None
        if action.packet_id is not None and action.ticket is not None:
            self._qos2_ids[action.ticket] = action.packet_id
        if action.ticket is not None or message.retain:
            ticket = action.ticket

            def callback(partition: int, offset: int, error: str | None) -> None:
                self._durable(ticket, message, partition, offset, error)

        try:
            written = self.node.log.produce(message, callback)
        except KafkaException as exc:  # e.g. larger than the topic accepts: never durable
            log.error(
                "client %s: publish to %r refused by Kafka (%s); closing without acknowledging",
                self.channel.client_id,
                message.topic,
                exc,
            )
            self._run(self.channel.connection_lost("Kafka refused the message"))
            return
        if not written:
            self._blocked_produces.append(action)
            self.node.log.when_writable(self._retry_produces)
            self._update_reading()

    def _retry_produces(self) -> None:
        blocked, self._blocked_produces = self._blocked_produces, deque()
        while blocked and not self._blocked_produces:
            self._produce(blocked.popleft())
        self._blocked_produces.extend(blocked)
        self._update_reading()

    def _durable(
        self, ticket: int | None, message: Message, partition: int, offset: int, error: str | None
    ) -> None:
        if error is not None:
            log.error(
                "client %s: publish to %r not written to Kafka (%s); no acknowledgement "
                "sent, closing the connection",
                self.channel.client_id,
                message.topic,
                error,
            )
            if ticket is not None:
                self._run(self.channel.connection_lost("Kafka write failed"))
            return
        if message.retain or (message.qos == 2 and self._persistent):
            self._background(self._after_durable(ticket, message, partition, offset))
        elif ticket is not None:
            self._acknowledge(ticket)

    async def _after_durable(
        self, ticket: int | None, message: Message, partition: int, offset: int
    ) -> None:
        """What must be stored before the PUBACK/PUBREC: the retained message, and for a
        persistent session the QoS 2 packet id awaiting PUBREL (so a move cannot repeat it)."""
        try:
            if message.retain:
                await self.node.retained.apply(message, partition, offset)
            packet_id = self._qos2_ids.pop(ticket, None) if ticket is not None else None
            if packet_id is not None and self.lease is not None:
                await self.node.sessions.mark_received(self.lease, packet_id)
        except (RedisError, OSError) as exc:
            log.error(
                "client %s: %s not stored (%s); closing without acknowledging",
                self.channel.client_id,
                message.topic,
                exc,
            )
            self._run(self.channel.connection_lost("session store unavailable"))
            return
        if ticket is not None:
            self._acknowledge(ticket)

    def _acknowledge(self, ticket: int) -> None:
        self._run(self.channel.produced(ticket))
        if self._own_deferred:
            deferred, self._own_deferred = self._own_deferred, []
            for out in deferred:
                self.deliver(out)
        self._update_reading()

    # -- packets out --------------------------------------------------------------------------

    def _write(self, data: bytes) -> None:
        self._out.append(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _send_all(self, chunks: list[bytes]) -> None:
        for data in chunks:
            self._write(data)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._out and self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(self._out))
        self._out.clear()

    def _close(self, action: ch.Close) -> None:
        if action.publish_will:
            will = self.channel.take_will()
            if will is not None:
                self.node.publish_will(will)
        log.info(
            "client %s (%s) closed: %s", self.channel.client_id or "-", self.peer, action.reason
        )
        self._flush()
        self._closed = True
        if self.transport is not None:
            self.transport.close()

    # -- timers -------------------------------------------------------------------------------

    def _connect_timeout(self) -> None:
        if self.channel.state is ch.State.CONNECTING:
            self._run(self.channel.connection_lost("no CONNECT in time"))

    def _restart_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.channel.keep_alive > 0:
            self._timer = self._loop.call_later(self.channel.keep_alive * 1.5, self._keep_alive)

    def _keep_alive(self) -> None:
        limit = self.channel.keep_alive * 1.5
        idle = time.monotonic() - self._last_seen
        if idle >= limit:
            self._run(self.channel.keep_alive_expired())
        else:
            self._timer = self._loop.call_later(limit - idle, self._keep_alive)


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("background work failed: %r", task.exception())


__all__ = ["MqttConnection"]
