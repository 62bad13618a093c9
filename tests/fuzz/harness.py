"""The fuzz harness: :func:`run` takes any bytes and drives a ``Decoder`` and a ``Channel`` with
them, carrying out the channel's actions as ``frontend.connection`` does, minus the I/O.

The same function serves atheris (``fuzz_mqtt.py``), Hypothesis and the regression tests, so an
input is plain bytes laid out as follows (missing bytes read as zero):

=========== ===================================================================================
byte 0      options, :class:`Plan` (maximum packet size, how log writes are confirmed, ...)
byte 1      bits 0-3: ``n``, the number of chunk-size bytes; bits 4-6: see ``REFUSED``,
            ``NEVER_CONFIRM``, ``RESTRICTED``
n bytes     chunk sizes, used in turn (0: the rest of the stream)
the rest    the bytes the client sends
=========== ===================================================================================

Only :class:`ProtocolError` may come out of the code under test, and it ends the connection; any
other exception escapes :func:`run` and is a bug, and so is a failed oracle (an
``AssertionError``):

* decoding: every chunking gives the packets and the first error of decoding the stream whole;
  a fed error is raised again by the next ``feed``; ``decode(encode(p)) == p`` for every packet;
  so does a server's decoder (one that awaits a CONNECT within :data:`SERVER_BOUNDS`), whose
  packets are the first of the plain decoder's;
* the channel: ``handle_error`` ends in ``Close``; nothing follows a ``Close``; a closed channel
  answers nothing; write confirmations are counted as pending until confirmed or closed;
* the wire: everything sent decodes, as whole canonical packets, into server-to-client packets,
  CONNACK first and only once;
* the session: the in-flight window and the queue stay within their bounds.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from mqttcore import topics
from mqttcore.channel import (
    UNRESTRICTED,
    Action,
    AddSubscriptions,
    Authenticate,
    Channel,
    Close,
    ForgetQos2,
    Limits,
    OpenSession,
    Permissions,
    Produce,
    RemoveSubscriptions,
    Send,
    State,
)
from mqttcore.codec import (
    MAX_PACKET_SIZE,
    ConnectBounds,
    Decoder,
    PublishTemplate,
    Wire,
    encode,
    wire_bytes,
)
from mqttcore.errors import ProtocolError
from mqttcore.message import Message, MessageStamps
from mqttcore.packets import (
    Connack,
    Packet,
    Pingresp,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Unsuback,
)
from mqttcore.session import Outbound, Session

MAX_PACKET_SIZES = (MAX_PACKET_SIZE, 65536, 512, 64)
"""Options bits 0-1: the decoder's maximum packet size (0: the protocol's maximum)."""

HOLD_TICKETS = 0x04
"""Log writes are confirmed at the end of each chunk, newest first (else at once)."""
BACKED_UP = 0x08
"""The client's socket is backed up: deliveries queue, and drain at the end of each chunk."""
BUFFER_TYPES = (bytes, bytearray, memoryview, bytes)
"""Options bits 4-5: the type each chunk is fed to the decoder as."""
SMALL_LIMITS = 0x40
"""An in-flight window of 2, a queue of 3, 2 subscriptions, client ids of at most 23 bytes."""
RESUMED = 0x80
"""The session is present, with messages in flight (one of them released) and one queued."""

REFUSED = 0x10
"""Control byte (byte 1): the session is refused with CONNACK 5."""
NEVER_CONFIRM = 0x20
"""Control byte: no log write is confirmed while the connection lives."""
RESTRICTED = 0x40
"""Control byte: the client has :class:`Restricted` permissions."""

SERVER_BOUNDS = ConnectBounds(fields=96, will=32)
"""A server decoder's CONNECT bounds: small, so that fuzzed CONNECTs cross them."""

SERVER_TO_CLIENT = (Connack, Publish, Puback, Pubrec, Pubrel, Pubcomp, Suback, Unsuback, Pingresp)
STAMPS = MessageStamps("fuzz-node", lambda: 1_700_000_000_000, bytes(8))


class Restricted:
    """Permissions that refuse topics and filters whose first level is ``b`` and delivery of
    topics whose last level is ``c``."""

    def may_publish(self, topic: str) -> bool:
        return topic.split("/")[0] != "b"

    def may_subscribe(self, topic_filter: str) -> bool:
        return topic_filter.split("/")[0] != "b"

    def may_read(self, topic: str) -> bool:
        return topic.split("/")[-1] != "c"


@dataclass(frozen=True, slots=True)
class Plan:
    """What the leading bytes of an input ask for."""

    options: int
    control: int
    chunk_sizes: tuple[int, ...]
    stream: bytes

    @classmethod
    def parse(cls, data: bytes) -> Plan:
        options = data[0] if data else 0
        control = data[1] if len(data) > 1 else 0
        n = control & 0x0F
        sizes = tuple(data[2 : 2 + n])
        return cls(options, control, sizes, bytes(data[2 + n :]))

    @property
    def max_packet_size(self) -> int:
        return MAX_PACKET_SIZES[self.options & 0x03]

    def option(self, bit: int) -> bool:
        return bool(self.options & bit)

    def chunks(self) -> Iterator[bytes | bytearray | memoryview]:
        """The stream in the chunks asked for, each of the buffer type asked for."""
        as_type = BUFFER_TYPES[(self.options >> 4) & 0x03]
        stream, pos, turn = self.stream, 0, 0
        while pos < len(stream):
            size = self.chunk_sizes[turn % len(self.chunk_sizes)] if self.chunk_sizes else 0
            end = pos + size if size else len(stream)
            yield as_type(stream[pos:end])
            pos, turn = end, turn + 1


def make_input(
    stream: bytes, options: int = 0, chunk_sizes: tuple[int, ...] = (), control: int = 0
) -> bytes:
    """The input that :meth:`Plan.parse` reads back as these settings (chunk sizes < 256)."""
    if len(chunk_sizes) > 15:
        raise ValueError("at most 15 chunk sizes")
    return bytes((options, (control & 0xF0) | len(chunk_sizes), *chunk_sizes)) + stream


def run(data: bytes) -> None:
    """Feed one input through a decoder and a channel; raises only on a bug."""
    plan = Plan.parse(data)
    batches, error = decode_chunked(plan)
    whole, whole_error = decode_whole(plan)
    assert [p for batch in batches for p in batch] == whole, "chunking changed the packets"
    assert _describe(error) == _describe(whole_error), "chunking changed the error"
    check_server_decoder(plan, whole)
    _Connection(plan).serve(batches, error)


# -- decoding --------------------------------------------------------------------------------


def check_server_decoder(plan: Plan, plain: list[Packet]) -> None:
    """A server's decoder: chunking changes nothing, and it decodes what a plain one does, up
    to the first packet that is no CONNECT within bounds."""
    batches, error = decode_chunked(plan, SERVER_BOUNDS)
    whole, whole_error = decode_whole(plan, SERVER_BOUNDS)
    assert [p for batch in batches for p in batch] == whole, "chunking changed a server's packets"
    assert _describe(error) == _describe(whole_error), "chunking changed a server's error"
    assert whole == plain[: len(whole)], "a server's decoder decoded another packet"


def decode_chunked(
    plan: Plan, first: ConnectBounds | None = None
) -> tuple[list[list[Packet]], ProtocolError | None]:
    """The packets each chunk completes, and the error that ended the stream (if one did)."""
    decoder = Decoder(plan.max_packet_size, first)
    batches: list[list[Packet]] = []
    for chunk in plan.chunks():
        try:
            packets = decoder.feed(chunk)
        except ProtocolError:
            assert decoder.error is not None, "a raised decoding error must be kept"
            packets = []
        batches.append([_round_trip(p) for p in packets])
        if decoder.error is not None:
            _check_error_is_final(decoder)
            return batches, decoder.error
    return batches, None


def decode_whole(
    plan: Plan, first: ConnectBounds | None = None
) -> tuple[list[Packet], ProtocolError | None]:
    decoder = Decoder(plan.max_packet_size, first)
    try:
        packets = decoder.feed(plan.stream)
    except ProtocolError:
        packets = []
    return packets, decoder.error


def _check_error_is_final(decoder: Decoder) -> None:
    try:
        decoder.feed(b"\xc0\x00")
    except ProtocolError as again:
        assert again is decoder.error, "a later feed must raise the error found"
    else:
        raise AssertionError("a feed after a decoding error must raise it")


def _round_trip(packet: Packet) -> Packet:
    """The packet decoded again from its own encoding, which must be equal to it."""
    data = encode(packet)
    try:
        again = Decoder().feed(data)
    except ProtocolError as error:
        raise AssertionError(f"{packet!r} does not decode from its encoding: {error}") from None
    assert again == [packet], f"decode(encode(p)) != p for {packet!r}"
    assert encode(again[0]) == data, "encoding is not canonical"
    return again[0]


def _describe(error: ProtocolError | None) -> tuple[type, str] | None:
    return None if error is None else (type(error), str(error))


# -- the client's side -------------------------------------------------------------------------


class _Client:
    """What the client receives: whole, canonical, server-to-client packets, CONNACK first, and
    the acknowledgements of its own QoS 1/2 flows in the order it sent them [MQTT-4.6.0-2,3]."""

    __slots__ = ("awaited", "received")

    def __init__(self) -> None:
        self.received = 0
        self.awaited: deque[Packet] = deque()
        """PUBACK, PUBREC, PUBCOMP the client is owed, in the order it is owed them."""

    def sends(self, packet: Packet) -> None:
        """Note the acknowledgement ``packet`` is owed, before the server sees it."""
        if isinstance(packet, Publish) and packet.packet_id is not None:
            self.awaited.append((Puback if packet.qos == 1 else Pubrec)(packet.packet_id))
        elif isinstance(packet, Pubrel):
            self.awaited.append(Pubcomp(packet.packet_id))

    def receive(self, wire: Wire) -> list[Packet]:
        data = wire_bytes(wire)  # a large PUBLISH comes in chunks
        decoder = Decoder()
        try:
            packets = decoder.feed(data)
        except ProtocolError as error:
            raise AssertionError(f"the server sent malformed bytes {data!r}: {error}") from None
        assert decoder.error is None, f"the server sent malformed bytes {data!r}"
        assert b"".join(encode(p) for p in packets) == data, f"not whole packets: {data!r}"
        for packet in packets:
            assert isinstance(packet, SERVER_TO_CLIENT), f"the server sent {packet!r}"
            is_connack = isinstance(packet, Connack)
            assert is_connack == (self.received == 0), "CONNACK must come first, and once"
            self.received += 1
            if isinstance(packet, Puback | Pubrec | Pubcomp):
                owed = self.awaited.popleft() if self.awaited else None
                assert packet == owed, f"the server sent {packet!r}, the client is owed {owed!r}"
        return packets


# -- the connection's side ---------------------------------------------------------------------


class _Connection:
    """Carries out a channel's actions as ``frontend.connection.MqttConnection`` does."""

    __slots__ = ("channel", "client", "closed", "held", "permissions", "plan", "session")

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        small = plan.option(SMALL_LIMITS)
        limits = Limits(2, 3, max_client_id_length=23, max_subscriptions=2) if small else None
        self.channel = Channel(STAMPS, limits)
        self.permissions: Permissions = Restricted() if plan.control & RESTRICTED else UNRESTRICTED
        self.client = _Client()
        self.session: Session | None = None
        self.held: list[int] = []
        """Tickets of log writes not confirmed yet."""
        self.closed = False

    def serve(self, batches: list[list[Packet]], error: ProtocolError | None) -> None:
        """Every packet in order, the end of each chunk, then the error or the end of input."""
        packets = iter(batches)
        while not self.closed and (batch := next(packets, None)) is not None:
            for packet in batch:
                self.handle(packet)
                if self.closed:
                    break
            else:
                self.end_of_chunk()
        if not self.closed and error is not None:
            self.fail(error)
        elif not self.closed:
            self.carry_out(self.channel.connection_lost("end of input"))
        assert self.closed, "every run ends with a Close"
        self.after_close()

    def handle(self, packet: Packet) -> None:
        assert self.channel.state in (State.CONNECTING, State.CONNECTED)
        self.client.sends(packet)
        try:
            actions = self.channel.handle_in(packet)
        except ProtocolError as error:
            self.fail(error)
        else:
            self.carry_out(actions)

    def fail(self, error: ProtocolError) -> None:
        actions = self.channel.handle_error(error)
        assert actions and isinstance(actions[-1], Close), f"{error!r} gave {actions!r}"
        self.carry_out(actions)

    def carry_out(self, actions: list[Action]) -> None:
        for action in actions:
            assert not self.closed, f"{action!r} after a Close"
            _ACTIONS[type(action)](self, action)
        self.check_invariants()

    def send(self, action: Send) -> None:
        self.client.receive(action.data)

    def close(self, action: Close) -> None:
        self.closed = True
        assert self.channel.state is State.CLOSED, "a Close leaves the channel closed"
        will = self.channel.take_will() if action.publish_will else None
        if will is not None:
            topics.validate_topic_name(will.topic)

    def authenticate(self, action: Authenticate) -> None:
        assert self.channel.state is State.OPENING
        self.carry_out(self.channel.logged_in(self.permissions))

    def open_session(self, action: OpenSession) -> None:
        assert self.channel.state is State.OPENING
        if self.plan.control & REFUSED:
            self.carry_out(self.channel.session_refused(5, "refused by the harness"))
        else:
            self.session = self.new_session(action)
            present = self.plan.option(RESUMED)
            opened = self.channel.session_opened(self.session, present, self.permissions)
            self.carry_out(opened)

    def new_session(self, action: OpenSession) -> Session:
        limits = self.channel.limits
        session = Session(
            action.client_id, action.connect.clean_session, limits.max_inflight, limits.max_queued
        )
        if self.plan.option(RESUMED):
            for qos in (1, 2):
                session.deliver(_outbound("old/inflight", qos), online=True)
            session.pubrec(2)  # that QoS 2 message now awaits PUBCOMP
            session.deliver(_outbound("old/queued", 1), online=False)
        return session

    def produce(self, action: Produce) -> None:
        message = action.message
        assert (action.ticket is None) == (message.qos == 0)
        assert message.client_id == self.channel.client_id
        if action.ticket is not None:
            self.held.append(action.ticket)
            if not self.plan.option(HOLD_TICKETS) and not self.never_confirm:
                self.confirm()
        self.deliver(message)

    def deliver(self, message: Message) -> None:
        """The message back to this client, if one of its subscriptions matches (loopback)."""
        session = self.session
        assert session is not None
        assert self.permissions.may_publish(message.topic), "a denied PUBLISH was written"
        if not self.permissions.may_read(message.topic):
            return
        for topic_filter, granted in list(session.subscriptions.items()):
            shared = topics.parse_shared(topic_filter)
            plain = shared[1] if shared else topic_filter
            if topics.matches(plain, message.topic):
                out = _outbound(message.topic, min(granted, message.qos), message.payload)
                data = session.deliver(out, True, writable=not self.plan.option(BACKED_UP))
                if data is not None:
                    self.client.receive(data)

    def add_subscriptions(self, action: AddSubscriptions) -> None:
        assert self.session is not None
        assert len(action.granted) <= len(action.return_codes)
        assert all(self.permissions.may_subscribe(f) for f, _ in action.granted)
        self.session.subscriptions.update(action.granted)
        bound = self.channel.limits.max_subscriptions
        assert not bound or len(self.session.subscriptions) <= bound, "too many subscriptions"
        (suback,) = self.channel.subscribed(action)
        assert isinstance(suback, Send)
        (packet,) = self.client.receive(suback.data)
        assert packet == Suback(action.packet_id, action.return_codes)

    def remove_subscriptions(self, action: RemoveSubscriptions) -> None:
        assert self.session is not None
        for topic_filter in action.filters:
            self.session.subscriptions.pop(topic_filter, None)

    def forget_qos2(self, action: ForgetQos2) -> None:
        assert self.session is not None
        assert action.packet_id not in (self.session.awaiting_rel or ()), "forgotten once released"

    @property
    def never_confirm(self) -> bool:
        return bool(self.plan.control & NEVER_CONFIRM)

    def confirm(self) -> None:
        """Confirm the held log writes, newest first; the channel answers in arrival order."""
        while self.held and not self.closed:
            self.carry_out(self.channel.produced(self.held.pop()))

    def end_of_chunk(self) -> None:
        if not self.never_confirm:
            self.confirm()
            if not self.closed:
                assert not self.client.awaited, "every write is confirmed, yet replies wait"
        if self.session is not None and not self.closed:
            for data in self.session.drain():  # resume_writing
                self.client.receive(data)
        self.check_invariants()

    def after_close(self) -> None:
        """Late events find the channel closed: confirmations and a lost connection are no-ops."""
        for ticket in self.held:
            assert self.channel.produced(ticket) == []
        assert self.channel.pending_publishes == 0
        assert self.channel.connection_lost("late") == []
        assert self.channel.take_will() is None

    def check_invariants(self) -> None:
        if not self.closed:
            assert self.channel.pending_publishes == len(self.held), "tickets went missing"
        session = self.session
        if session is not None:
            assert len(session.inflight) <= session.max_inflight
            assert len(session.queue) <= max(session.max_queued, 1)
            assert 0 not in session.inflight


def _outbound(topic: str, qos: int, payload: bytes = b"x") -> Outbound:
    message = STAMPS.message(topic, payload, qos, False, "other")
    return Outbound(message, qos, False, PublishTemplate(topic, payload, qos))


_ACTIONS = {
    Send: _Connection.send,
    Close: _Connection.close,
    Authenticate: _Connection.authenticate,
    OpenSession: _Connection.open_session,
    Produce: _Connection.produce,
    AddSubscriptions: _Connection.add_subscriptions,
    RemoveSubscriptions: _Connection.remove_subscriptions,
    ForgetQos2: _Connection.forget_qos2,
}
