"""One client's TCP connection: bytes in, the channel's actions out.

An ``asyncio.Protocol`` on the hot path.  ``data_received`` decodes and hands packets to the
channel strictly in order; when an action needs I/O the connection cannot do synchronously
(a login and the session it opens, registering subscriptions) it sets ``_busy`` and runs one
task, holding later packets back until it is done: packets of one connection are never handled
concurrently, and there is never a task per packet.

The connection decides nothing: the channel decides every protocol outcome (the login's CONNACK,
timeouts, how a takeover closes), the session manager every step of the session's life
(``frontend.sessions``: it is told as the connection closes, ``SessionManager.end``).  It is
handed what it uses at construction (:class:`Services`): the session manager, the log (through
``frontend.publishing``), authentication.
Kafka and Redis failures become wire behaviour in ``frontend.outages`` only.

Writes are coalesced: everything a connection is sent during one step goes out in one ``write``,
at the end of that step: the end of its own ``data_received`` (so a PUBACK that frees in-flight
slots has the next messages on the wire at once), the end of the log pump's turn (``Writes``,
for the deliveries and acknowledgements it made), else the end of the loop iteration.
Backpressure in both directions:

* inbound: reading pauses while too many PUBLISH packets await the log, while the producer queue is
  full, or while packets pile up behind a busy task; PUBLISHes wait, in order, while the node is
  saturated and a client is behind, until it delivers (``frontend.intake``);
* outbound: when the transport asks us to pause writing, deliveries go to the session queue
  (QoS 0 dropped, QoS 1/2 queued up to the limit), so a slow subscriber never stalls the node.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, cast

from frontend import events, outages
from frontend.auth import Auth, Credentials, Login
from frontend.buffers import Budget
from frontend.deadlines import Deadlines
from frontend.intake import Intake
from frontend.metrics import Traffic
from frontend.publishing import Log, Publishing
from frontend.sessions.manager import NotOwnerError, Owned, SessionManager
from mqttcore import channel as ch
from mqttcore.codec import ConnectBounds, Decoder, Wire
from mqttcore.errors import ProtocolError
from mqttcore.message import Message, MessageStamps
from mqttcore.packets import Connect, Packet, Publish
from mqttcore.session import Outbound

log = logging.getLogger("headwater.connection")

WRITE_BUFFER_HIGH = 1024 * 1024
"""Bytes waiting in a connection's transport before its messages are queued instead."""

DRAIN_BUDGET = 64
"""Packets handled in one go: a read that brings more (a flood) is handled in slices, with the
socket paused, so other connections and the Kafka pump get their turns in between.  Slices of
256 let four flooding publishers take in far more than the pump delivered in a turn: a QoS 0
fan-in (``python -m bench``, open loop) took in 139,000 msg/s and delivered 46,000; with 64,
89,000 and 84,000."""


class Writes:
    """The connections with output waiting, written out together: by whoever ends a step
    that wrote to many (the log's pump), else at the end of the loop iteration (one callback
    per iteration for the node, not one per connection)."""

    __slots__ = ("_loop", "_waiting")

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting: list[_Output] = []

    def add(self, output: _Output) -> None:
        if not self._waiting:
            if self._loop is None:
                self._loop = asyncio.get_running_loop()
            self._loop.call_soon(self.flush)
        self._waiting.append(output)

    def flush(self) -> None:
        waiting, self._waiting = self._waiting, []
        for output in waiting:
            output.flush()


class _Output:
    """Coalesced writes (see the module's docstring).  Each ``write`` is one packet: a PUBLISH
    is counted by its QoS (fixed header type 3, QoS in bits 1-2), and the bytes when they go
    out.  The bytes held, in chunks and then in the transport's write buffer (``backlog``), are
    counted in the node's budget (``frontend.buffers``)."""

    __slots__ = ("_chunks", "backlog", "budget", "paused", "traffic", "transport", "writes")

    def __init__(self, writes: Writes, traffic: Traffic, budget: Budget) -> None:
        self.writes = writes
        self.traffic = traffic
        self.budget = budget
        self._chunks: list[bytes] | None = None
        self.transport: asyncio.Transport | None = None
        self.paused = False
        """The transport asked us to stop writing: messages wait in the session's queue."""
        self.backlog = 0
        """Bytes the transport's write buffer held after the last flush (or ``recount``)."""

    def write(self, data: Wire) -> None:
        if not isinstance(data, bytes):
            self._write_chunks(data)
            return
        if data[0] >> 4 == 3:  # a PUBLISH
            self.traffic.sent[(data[0] >> 1) & 3] += 1
        self.budget.held += len(data)  # an addition never resumes reading: no call needed
        if self._chunks is None:
            self._chunks = [data]
            self.writes.add(self)
        else:
            self._chunks.append(data)

    def _write_chunks(self, data: tuple[bytes, bytes]) -> None:
        """A large PUBLISH (``codec.Wire``): its header, then the payload every subscriber
        shares, kept apart until the flush joins this connection's output."""
        head, payload = data
        self.write(head)  # counts the PUBLISH, and its header's bytes
        self.budget.held += len(payload)
        assert self._chunks is not None
        self._chunks.append(payload)

    def flush(self) -> None:
        chunks, self._chunks = self._chunks, None
        if not chunks:
            return
        transport = self.transport
        if transport is None or transport.is_closing():
            self.budget.change(-sum(map(len, chunks)))
            return
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self.traffic.bytes_sent += len(data)
        transport.write(data)
        self.budget.change(self.recount() - len(data))

    def recount(self) -> int:
        """Read the transport's write buffer again: the change in bytes held there."""
        transport = self.transport
        backlog = transport.get_write_buffer_size() if transport is not None else 0
        change, self.backlog = backlog - self.backlog, backlog
        if backlog and change > 0:
            self.budget.backlogged.add(self)
        return change

    def release(self) -> None:
        """The connection is gone: its transport holds nothing of the node's any more."""
        self.budget.change(-self.backlog)
        self.backlog = 0
        self.budget.backlogged.discard(self)


@dataclass(slots=True)
class Services:
    """What every connection of a node uses, handed in by the node."""

    stamps: MessageStamps
    limits: ch.Limits
    max_packet_size: int
    connect_timeout: float
    auth: Auth
    log: Log
    sessions: SessionManager
    deadlines: Deadlines = field(default_factory=Deadlines)
    connections: set[MqttConnection] = field(default_factory=set)
    protocol_errors: int = 0
    subscriptions_refused: int = 0
    """SUBSCRIBE filters refused for ``Limits.max_subscriptions``."""
    draining: bool = False
    """The node is draining: no connection reads any more (``Node.stop``)."""
    connect_timeouts: int = 0
    """Connections closed for sending no CONNECT within ``connect_timeout``."""
    traffic: Traffic = field(default_factory=Traffic)
    """Connections made, bytes and PUBLISH packets in and out (``/metrics``)."""
    writes: Writes = field(default_factory=Writes)
    """The connections with output waiting; the log's pump writes them out after its turn."""
    connect_bounds: ConnectBounds = field(default_factory=ConnectBounds)
    """What a connection may send before it is known: one CONNECT, this big at most."""
    buffers: Budget = field(default_factory=Budget)
    """The bytes held in partial packets and output, node-wide (``--max-buffered-bytes``)."""
    intake: Intake = field(default_factory=Intake)
    """PUBLISHes taken in no faster than messages go out, while the node is saturated and a
    client is behind (``frontend.intake``)."""
    certificate_identity: Callable[[asyncio.BaseTransport], str | None] | None = None
    """Set with ``--use-identity-as-username`` (``frontend.listeners.certificate_identity``): a
    client's user name is its TLS certificate's identity and no password is checked; a client
    without one (any client of a plain listener among them) gets CONNACK 5."""


def _who(connection: MqttConnection) -> str:
    """The client id and address, for logs (the address looked up when needed, not kept)."""
    peer = connection.address()
    return f"{connection.channel.client_id or '-'} ({f'{peer[0]}:{peer[1]}' if peer else '?'})"


class _Input:
    """Packets in: decoded from the socket and held, in order, until handled, and when the
    client was last heard from.  The decoder is held, not inherited: it may run compiled
    (setup.py), and a compiled class has no interpreted subclasses."""

    __slots__ = ("decoder", "held", "last_seen", "opened", "paused")

    def __init__(self, services: Services, now: float) -> None:
        self.decoder = Decoder(services.max_packet_size, services.connect_bounds)
        self.held: list[Packet] | None = None
        """Decoded, not handled yet, in order (None when there are none)."""
        self.opened = self.last_seen = now
        """When the connection was made, and when the client was last heard from (the loop's
        clock)."""
        self.paused = False

    def take(self, data: bytes, now: float, buffers: Budget) -> None:
        """Hold the packets ``data`` completes; raises :class:`ProtocolError`.  What the
        decoder keeps of a packet not complete yet is counted in the node's ``buffers``."""
        self.last_seen = now
        decoder = self.decoder
        before = decoder.buffered()
        try:
            packets = decoder.feed(data)
        finally:
            if decoder.buffered() != before:
                buffers.change(decoder.buffered() - before)
        if self.held is None:
            self.held = packets
        else:
            self.held += packets

    def press(self, transport: asyncio.Transport, pressed: bool) -> None:
        """Stop reading ``transport`` while ``pressed``, read again once not."""
        if pressed != self.paused:
            self.paused = pressed
            if pressed:
                transport.pause_reading()
            else:
                transport.resume_reading()


async def _login(connection: MqttConnection, connect: Connect, client_id: str) -> Login:
    """What a client may do, or the CONNACK code refusing it and why: ``frontend.auth`` decides,
    given the CONNECT's credentials, the client's address (the PROXY header's when there is one)
    and, with ``certificate_identity``, its certificate's identity."""
    services, transport = connection.services, connection.transport
    reader = services.certificate_identity
    peer = connection.address()
    credentials = Credentials(
        client_id,
        connect.username,
        connect.password,
        address=peer[0] if peer else None,
        certificate=reader(transport) if reader is not None and transport is not None else None,
        will_topic=connect.will.topic if connect.will is not None else None,
    )
    return await services.auth.login(credentials)


class MqttConnection(asyncio.Protocol):
    __slots__ = (
        "_busy",
        "_closed",
        "_input",
        "_loop",
        "_output",
        "channel",
        "login",
        "owned",
        "peer",
        "publishing",
        "services",
        "slot",
        "transport",
    )

    def __init__(self, services: Services) -> None:
        self.services = services
        self.channel = ch.Channel(services.stamps, services.limits)
        self.publishing: Publishing | None = None
        """Made at the first PUBLISH (or PUBREL): most devices of a fleet only listen."""
        self.transport: asyncio.Transport | None = None
        self.owned: Owned | None = None
        self.login: Login | None = None
        """The login of a client that proved itself by a password: what a reload checks again
        (SIGHUP).  Kept only then: an idle fleet without passwords holds none."""
        self.peer: tuple[str, int] | None = None
        """The client's address when a load balancer's PROXY header gave it
        (``frontend.listeners``); else the socket's peer is."""
        self._loop = asyncio.get_running_loop()
        self._busy = False
        self._output = _Output(services.writes, services.traffic, services.buffers)
        self._input = _Input(services, self._loop.time())
        services.traffic.connections_opened += 1
        self.slot: int | None = None
        """Where the node's deadline wheel filed this connection (``frontend.deadlines``)."""
        self._closed = False

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._output.transport = self.transport
        # asyncio's default 64 KiB would count one large message as a backed-up client.
        self.transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH)
        self.services.connections.add(self)
        self.services.deadlines.watch(self)

    def data_received(self, data: bytes) -> None:
        self.services.traffic.bytes_received += len(data)
        try:
            self._input.take(data, self._loop.time(), self.services.buffers)
        except ProtocolError as error:
            # kept by the decoder: its traceback would keep ``data`` (a read) until a rare GC
            self._fail(error.with_traceback(None))
            return
        self._drain()
        self._output.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        reason = f"socket error: {exc}" if exc else "connection closed by the client"
        self.run(self.channel.connection_lost(reason), events.CONNECTION_LOST)
        self._closed = True
        self.services.deadlines.forget(self)
        self.services.connections.discard(self)
        buffers = self.services.buffers  # its partial packet leaves the budget; it waits no more
        buffers.change(-self._input.decoder.buffered())
        buffers.waiting.discard(self)
        self.services.intake.forget(self)
        self._output.release()
        self._let_go(None)

    def pause_writing(self) -> None:
        self._output.paused = True

    def resume_writing(self) -> None:
        self._output.paused = False
        if self.channel.session is not None:
            for data in self.channel.session.drain():
                self._output.write(data)

    def due(self) -> float | None:
        """When the channel says this connection times out (the loop's clock)."""
        inputs = self._input
        return self.channel.due(inputs.opened, inputs.last_seen, self.services.connect_timeout)

    def expire(self) -> None:
        self.services.connect_timeouts += self.channel.state is ch.State.CONNECTING
        self.run(self.channel.timed_out(), events.KEEP_ALIVE_TIMEOUT)

    def address(self) -> tuple[str, int] | None:
        """The client's address: as the load balancer saw it, or the socket's peer."""
        if self.peer is not None:
            return self.peer
        peer = self.transport.get_extra_info("peername") if self.transport else None
        return (peer[0], peer[1]) if peer else None

    # -- the dispatcher's and the session manager's view ----------------------------------------

    def deliver(self, out: Outbound) -> None:
        session = self.channel.session
        publishing = self.publishing
        if session is None or (publishing is not None and publishing.defer_own(out)):
            return
        if self._closed:  # queued for the stored session (QoS 0 dropped and counted)
            session.deliver(out, online=False)
            return
        data = session.deliver(out, online=True, writable=not self._output.paused)
        if data is not None:
            self._output.write(data)

    def takeover(self) -> None:
        self.run(self.channel.taken_over(), events.TAKEN_OVER)

    def lose_session(self) -> None:
        self.run(self.channel.session_lost(), events.TAKEN_OVER)

    def stream_failed(self, error: BaseException) -> None:
        self.run(outages.catch_up_failed(self.channel, error))

    def shutdown(
        self, reason: str = "server shutting down", cause: str = events.NODE_DRAIN
    ) -> None:
        """Close as the node decided, for ``cause`` (``frontend.events.REASONS``)."""
        self.run(self.channel.connection_lost(reason), cause)

    # -- packets in ---------------------------------------------------------------------------

    def _drain(self) -> None:
        held = self._input.held or []
        intake = self.services.intake
        done = 0
        try:
            while done < len(held) and not self._busy and not self._closed:
                if done == DRAIN_BUDGET:  # the rest after other connections and the pump
                    self._loop.call_soon(self._drain)
                    break
                packet = held[done]
                if type(packet) is Publish and not intake.admits(self):
                    break  # the intake resumes it (resume_intake)
                done += 1
                try:
                    actions = self.channel.handle_in(packet)
                except ProtocolError as error:
                    self._fail(error)
                    return
                self.run(actions, events.CLIENT_DISCONNECT)  # its only Close: DISCONNECT's
        finally:
            del held[:done]
            if not held:
                self._input.held = None
        fault = self._input.decoder.error
        if not held and not self._busy and fault is not None:
            self._fail(fault)  # after the packets that came before it
            return
        self.update_reading()

    def resume_intake(self) -> None:
        """The node delivered enough for this connection's PUBLISHes held back to go on."""
        if not self._closed:
            self._drain()
            self._output.flush()

    def _fail(self, error: ProtocolError) -> None:
        if self._closed:
            return
        log.warning("client %s: %s", _who(self), error)
        self.services.protocol_errors += 1
        self.run(self.channel.handle_error(error), events.PROTOCOL_ERROR)

    def run(self, actions: list[ch.Action], cause: str = events.CONNECTION_LOST) -> None:
        """Carry out the channel's ``actions``; a Close among them is for ``cause`` (why, in the
        words of ``frontend.events.REASONS``: the connection knows what it asked the channel)."""
        for action in actions:
            if isinstance(action, ch.Send):
                self._output.write(action.data)
            elif isinstance(action, ch.Produce):
                publishing = self._publisher()
                publishing.produce(action)
                if publishing.blocked:
                    self.update_reading()
            elif isinstance(action, ch.Close):
                self._close(action, cause)
            elif isinstance(action, ch.Authenticate):
                self._start(self._authenticate(action))
            elif isinstance(action, ch.AddSubscriptions):
                self._start(self._subscribe(action))
            elif isinstance(action, ch.RemoveSubscriptions):
                assert self.owned is not None
                self.services.sessions.unsubscribe(self.owned, action.filters)
            elif isinstance(action, ch.ForgetQos2) and self.owned is not None:
                self.services.sessions.forget_qos2(self.owned, action.packet_id)

    def _publisher(self) -> Publishing:
        if self.publishing is None:
            assert self.owned is not None  # a PUBLISH is handled only once connected
            self.publishing = Publishing(
                self.channel, self.owned, self.run, self._acknowledged, self.services
            )
        return self.publishing

    def _acknowledged(self, deferred: list[Outbound]) -> None:
        """An acknowledgement went out (or the log has room again): the client's own messages
        held back meanwhile go now, and reading may resume."""
        for out in deferred:
            self.deliver(out)
        self.update_reading()

    def _start(self, work: Coroutine[Any, Any, None]) -> None:
        self._busy = True
        self._loop.create_task(work).add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._busy = False
        if not task.cancelled() and task.exception() is not None:
            log.error("client %s: %r", self.channel.client_id, task.exception())
            self.run(self.channel.connection_lost("internal error"))
            return
        self._drain()

    def update_reading(self) -> None:
        """Read while nothing holds the connection back: too many PUBLISHes awaiting the log,
        packets piled up, the producer full, the node draining, or its buffer budget spent
        (``frontend.buffers``: it resumes the connection)."""
        if self.transport is None or self._closed:
            return
        buffers = self.services.buffers
        spent = buffers.spent()
        if spent:
            buffers.wait(self)
        self._input.press(
            self.transport,
            spent
            or self.channel.pending_publishes >= self.services.limits.max_pending_publishes
            or len(self._input.held or ()) >= DRAIN_BUDGET
            or bool(self.publishing and self.publishing.blocked)
            or self.services.draining,
        )

    # -- CONNECT and SUBSCRIBE ------------------------------------------------------------------

    async def _authenticate(self, action: ch.Authenticate) -> None:
        login = await _login(self, action.connect, action.client_id)
        if login.proof is not None:  # a password a reload may take away (nothing else to keep)
            self.login = login
        answer = self.channel.logged_in(login.access, login.code, login.reason, login.identity)
        for step in answer:
            if isinstance(step, ch.OpenSession):  # in this task: later packets still wait
                await self._open_session(step)
            else:
                self.run([step])

    async def _open_session(self, action: ch.OpenSession) -> None:
        services, connect = self.services, action.connect
        if not services.log.available:
            self.run(outages.kafka_unavailable_at_connect(self.channel))
            return
        try:
            opened = await services.sessions.open(
                action.client_id, connect, self, lambda: self._closed, action.identity
            )
        except outages.STORE_ERRORS as exc:
            self.run(outages.store_failed_at_connect(self.channel, exc))
            return
        except NotOwnerError as refused:  # logged once, with the address, as it closes
            self.run(self.channel.session_not_owned(str(refused)))
            return
        if opened is None:
            return
        self.owned = opened.owned
        self.run(self.channel.session_opened(opened.owned.session, opened.present))
        services.deadlines.watch(self)  # the keep-alive from now on
        services.sessions.serve(opened)  # after the CONNACK

    async def _subscribe(self, action: ch.AddSubscriptions) -> None:
        owned = self.owned  # kept while the connection closes meanwhile: its session is stored
        assert owned is not None
        sessions = self.services.sessions
        action = action.refusing(sessions.admit(owned, action.granted))  # 0x80 beyond bounds
        try:
            starts, new = await sessions.subscribe(owned, action.granted)
        except outages.STORE_ERRORS as exc:
            self.run(outages.subscription_not_stored(self.channel, exc))
            return
        except outages.LOG_ERRORS as exc:
            self.run(outages.subscribe_failed(self.channel, action, exc))
            return
        self.services.subscriptions_refused += action.over_limit
        self.run(self.channel.subscribed(action))
        try:
            await sessions.subscribed(owned, action.granted, new, starts)
        except outages.STORE_ERRORS as exc:
            self.run(outages.retained_unavailable(self.channel, exc))

    # -- packets out --------------------------------------------------------------------------

    def _close(self, action: ch.Close, cause: str) -> None:
        will = self.channel.take_will() if action.publish_will else None
        # a client's own DISCONNECT is the usual end, a line at DEBUG (as EMQX; the client
        # event records it): at INFO it was 9% of the loop at 2,800 cycles a second
        level = logging.DEBUG if cause == events.CLIENT_DISCONNECT else logging.INFO
        if log.isEnabledFor(level):  # the address looked up only for a line written
            log.log(level, "client %s closed: %s", _who(self), action.reason)
        self._output.flush()
        self._closed = True
        if self.transport is not None:
            self.transport.close()
        self._let_go(will, cause)

    def _let_go(self, will: Message | None, cause: str = events.CONNECTION_LOST) -> None:
        """Hand the session back as the connection closes, with the will to publish, not a loop
        turn later when the transport reports it: whoever closed it (a takeover) finds it
        released.  A will is the channel's only once connected, so only with a session."""
        owned, self.owned = self.owned, None
        if owned is not None:
            deferred = self.publishing.take_deferred() if self.publishing else []
            self.services.sessions.end(owned, will, deferred, cause)


__all__ = ["MqttConnection", "Services"]
