"""One connection's MQTT 3.1.1 protocol state machine, sans-IO.

The connection feeds decoded packets to :meth:`Channel.handle_in` and carries out the actions it
returns, in order.  Some actions need I/O whose outcome comes back as a call:
:class:`Authenticate` -> :meth:`Channel.logged_in` (which decides the login's CONNACK),
:class:`OpenSession` -> :meth:`Channel.session_opened`,
:class:`Produce` -> :meth:`Channel.produced`,
:class:`AddSubscriptions` -> :meth:`Channel.subscribed`.  The connection hands the channel no
further packet until an open/subscribe/unsubscribe action has completed, so a connection's packets
are handled strictly in order.

States and the packets allowed in each (anything else is a :class:`ProtocolError`):

=========== ===================================================================================
CONNECTING  CONNECT only [MQTT-3.1.0-1]
OPENING     nothing (the connection holds packets back while the client is authenticated and
            its session opened)
CONNECTED   PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP, SUBSCRIBE, UNSUBSCRIBE, PINGREQ, DISCONNECT;
            a second CONNECT is a violation [MQTT-3.1.0-2]
CLOSED      nothing is processed
=========== ===================================================================================

Replies that depend on the log (PUBACK, PUBREC) are sent only once the write is durable, and in
the order the PUBLISH packets arrived [MQTT-4.6.0-2, MQTT-4.6.0-3], whatever order Kafka confirms
them in.  One place, :meth:`Channel.handle_error`, decides the wire reaction to an error.

What a client may do is asked of its :class:`Permissions` (``frontend.auth``), given by the
login: a SUBSCRIBE filter it may not read gets 0x80 while the others in the packet are granted;
a PUBLISH it may not make is acknowledged as usual and never written (Mosquitto's behaviour for
MQTT 3.1.1, which has no way to say "denied"); a message it may no longer read is not sent
(the session asks the same permissions as the bytes are made, ``mqttcore.session``).

The channel also decides how a connection ends when the node, not the client, ends it: a
takeover by a new connection (:meth:`Channel.taken_over`, the will is published), the session
taken by force elsewhere (:meth:`Channel.session_lost`, it is not: the taker published it), and
a deadline passed (:meth:`Channel.due`, :meth:`Channel.timed_out`).
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from typing import Any, Protocol

from mqttcore import topics
from mqttcore.codec import Wire, encode
from mqttcore.errors import ConnectRefused, ProtocolError
from mqttcore.message import Message, MessageStamps
from mqttcore.packets import (
    SUBACK_FAILURE,
    Connack,
    ConnackCode,
    Connect,
    Disconnect,
    Packet,
    Pingreq,
    Pingresp,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
    Will,
)
from mqttcore.session import (
    DEFAULT_MAX_INFLIGHT,
    DEFAULT_MAX_QUEUED,
    DEFAULT_MAX_QUEUED_BYTES,
    Session,
)


class State(enum.Enum):
    CONNECTING = "connecting"
    OPENING = "opening"
    CONNECTED = "connected"
    CLOSED = "closed"


# -- actions --------------------------------------------------------------------------------


@dataclass(slots=True, init=False)
class Send:
    """Write these bytes to the client (a large PUBLISH in two chunks, ``codec.Wire``).  Made
    per packet: its own ``__init__`` (see ``mqttcore.message.Message``), as ``Produce``'s."""

    data: Wire

    def __init__(self, data: Wire) -> None:
        self.data = data


@dataclass(slots=True)
class Close:
    """Close the network connection; publish the will first if ``publish_will``."""

    reason: str
    publish_will: bool


@dataclass(slots=True)
class Authenticate:
    """Ask who the client is and what it may do; answer with ``logged_in``."""

    connect: Connect
    client_id: str


@dataclass(slots=True)
class OpenSession:
    """Open (or resume) the authenticated client's session; answer with ``session_opened``."""

    connect: Connect
    client_id: str
    identity: str = ""
    """Who the login proved the client is: a stored session of another identity is not its."""


@dataclass(slots=True, init=False)
class Produce:
    """Write ``message`` to the log; call ``produced(ticket)`` once it is durable."""

    message: Message
    ticket: int | None
    """None for QoS 0: nothing waits for the write."""
    packet_id: int | None
    """For QoS 2: the packet id to record as awaiting PUBREL before PUBREC goes out."""

    def __init__(self, message: Message, ticket: int | None, packet_id: int | None = None) -> None:
        self.message = message
        self.ticket = ticket
        self.packet_id = packet_id


@dataclass(slots=True)
class AddSubscriptions:
    """Register ``granted`` filters; answer with ``subscribed(request, failed)``."""

    packet_id: int
    granted: list[tuple[str, int]]
    return_codes: tuple[int, ...]
    over_limit: int = 0
    """Filters refused because the session holds ``Limits.max_subscriptions`` already."""

    def refusing(self, refused: Collection[str]) -> AddSubscriptions:
        """This request with the ``refused`` granted filters answered 0x80 instead (a bound
        of the node's, such as its share groups')."""
        if not refused:
            return self
        kept = iter(self.granted)  # granted filters are the non-0x80 codes, in order
        codes = tuple(
            SUBACK_FAILURE if code != SUBACK_FAILURE and next(kept)[0] in refused else code
            for code in self.return_codes
        )
        granted = [(f, qos) for f, qos in self.granted if f not in refused]
        return replace(self, granted=granted, return_codes=codes)


@dataclass(slots=True)
class RemoveSubscriptions:
    """Drop ``filters``; UNSUBACK follows in the same action list [MQTT-3.10.4-4]."""

    filters: tuple[str, ...]


@dataclass(slots=True)
class ForgetQos2:
    """The client released an inbound QoS 2 message (PUBREL): a stored session forgets that
    ``packet_id`` awaits PUBREL, so a resend with it is a new message again."""

    packet_id: int


Action = (
    Send | Close | Authenticate | OpenSession | Produce | AddSubscriptions | RemoveSubscriptions
    | ForgetQos2
)  # fmt: skip

PINGRESP = encode(Pingresp())


class Permissions(Protocol):
    """What one client may do (``frontend.auth.Access``)."""

    def may_publish(self, topic: str) -> bool: ...

    def may_subscribe(self, topic_filter: str) -> bool: ...

    def may_read(self, topic: str) -> bool: ...


class Unrestricted:
    """Permissions of a channel given none: everything is allowed."""

    def may_publish(self, topic: str) -> bool:
        return True

    def may_subscribe(self, topic_filter: str) -> bool:
        return True

    def may_read(self, topic: str) -> bool:
        return True


UNRESTRICTED = Unrestricted()


@dataclass(slots=True, init=False)
class _PendingReply:
    packet: Packet
    message_id: bytes
    done: bool

    def __init__(self, packet: Packet, message_id: bytes, done: bool = False) -> None:
        self.packet = packet
        self.message_id = message_id
        self.done = done


@dataclass(slots=True)
class Limits:
    """Per-connection limits: the queue bound is Mosquitto's, the in-flight window EMQX's (32;
    Mosquitto's 20 caps one subscriber's QoS 1 rate at 20 messages per round trip)."""

    max_inflight: int = DEFAULT_MAX_INFLIGHT
    max_queued: int = DEFAULT_MAX_QUEUED
    max_queued_bytes: int = DEFAULT_MAX_QUEUED_BYTES
    """Payload and topic bytes a client's queue takes messages up to (one more message may
    cross it): beyond, as beyond ``max_queued``, QoS 1/2 messages are read back from the log
    when the queue has room again and QoS 0 ones are dropped (counted).  Mosquitto's
    ``max_queued_bytes`` has no bound by default, so 1,000 queued messages of a 16 MB
    maximum packet may hold 16 GB for one slow client.  16 MiB holds a thousand messages of the
    sizes a fleet sends (16 KB each) and still one message of the largest size the node accepts
    (``--max-packet-size``, just under 16 MiB), so no client is ever starved by the bound, while
    a client that does not read holds at most about 32 MiB of queue, and nothing is lost:
    the log is the queue."""
    max_client_id_length: int = 65535
    max_pending_publishes: int = 1000
    """PUBLISH packets awaiting the log before the connection stops reading."""
    max_subscriptions: int = 1000
    """Topic filters one session may hold; a SUBSCRIBE beyond is refused (0x80); 0: no bound.

    Mosquitto and EMQX have no bound by default (EMQX's ``max_subscriptions = infinity``), AWS
    IoT Core allows 50 per connection.  A device holds a handful and an application a few
    wildcards, so 1,000 refuses no real client, while it caps what one client can make a node
    hold: each filter costs its trie path (up to 200 levels, a node and a dict each) and its
    entry in the session, and ``bench --scenarios scale`` shows the cost per filter."""


def will_message(will: Will, client_id: str, stamps: MessageStamps) -> Message:
    """The application message a will becomes, to publish now or to keep in case this node dies."""
    return stamps.message(will.topic, will.payload, will.qos, will.retain, client_id)


class Channel:
    """The protocol state of one client connection."""

    __slots__ = (
        "_logged_in",
        "_next_ticket",
        "_replies",
        "_tickets",
        "_will",
        "client_id",
        "connect",
        "keep_alive",
        "limits",
        "permissions",
        "session",
        "stamps",
        "state",
    )

    def __init__(self, stamps: MessageStamps, limits: Limits | None = None) -> None:
        self.stamps = stamps
        self.limits = limits or Limits()
        self.state = State.CONNECTING
        self.client_id = ""
        self.connect: Connect | None = None
        self.session: Session | None = None
        self.permissions: Permissions = UNRESTRICTED
        self.keep_alive = 0
        self._will: Will | None = None
        self._replies: deque[_PendingReply] | None = None
        """Made at the first PUBLISH: an empty deque takes 760 bytes."""
        self._tickets: dict[int, _PendingReply] = {}
        self._next_ticket = 0
        self._logged_in = False

    # -- input --------------------------------------------------------------------------------

    def handle_in(self, packet: Packet) -> list[Action]:
        """The actions answering one packet from the client; raises :class:`ProtocolError`."""
        if self.state is State.CONNECTED:
            handler = _HANDLERS.get(type(packet))
            if handler is not None:
                return handler(self, packet)
            if isinstance(packet, Connect):
                raise ProtocolError("MQTT-3.1.0-2", "a second CONNECT packet")
            raise ProtocolError("MQTT-4.8.0-1", f"{type(packet).__name__} is server-to-client")
        if self.state is State.CONNECTING:
            if not isinstance(packet, Connect):
                raise ProtocolError("MQTT-3.1.0-1", "the first packet must be CONNECT")
            return self._on_connect(packet)
        if self.state is State.OPENING:
            raise RuntimeError("a packet was fed while the session was being opened")
        return []

    def handle_error(self, error: ProtocolError) -> list[Action]:
        """The only place that turns a protocol error into what goes on the wire."""
        if self.state is State.CLOSED:
            return []
        actions: list[Action] = []
        if self.state is State.CONNECTING and error.connack_code is not None:
            actions.append(Send(encode(Connack(False, error.connack_code))))
        actions.append(Close(str(error), publish_will=self._will is not None))
        self._enter_closed()
        return actions

    def connection_lost(self, reason: str) -> list[Action]:
        """The network connection ended without DISCONNECT: the will is published [MQTT-3.1.2-8]."""
        if self.state is State.CLOSED:
            return []
        will = self._will is not None
        self._enter_closed()
        return [Close(reason, publish_will=will)]

    def keep_alive_expired(self) -> list[Action]:
        """Nothing received for 1.5 x keep-alive [MQTT-3.1.2-24]."""
        return self.connection_lost(f"keep-alive of {self.keep_alive}s expired")

    def due(self, opened: float, last_seen: float, connect_timeout: float) -> float | None:
        """When the connection times out, on the caller's clock: ``connect_timeout`` after it
        was ``opened`` while no CONNECT came, 1.5 x keep-alive after the client was
        ``last_seen`` once connected [MQTT-3.1.2-24] (never with a keep-alive of 0, nor while
        the session is being opened)."""
        if self.state is State.CONNECTING:
            return opened + connect_timeout
        if self.state is State.CONNECTED and self.keep_alive > 0:
            return last_seen + self.keep_alive * 1.5
        return None

    def timed_out(self) -> list[Action]:
        """The time :meth:`due` gave has passed: no CONNECT in time, or the keep-alive."""
        if self.state is State.CONNECTING:
            return self.connection_lost("no CONNECT in time")
        if self.state is State.CONNECTED:
            return self.keep_alive_expired()
        return []

    def taken_over(self) -> list[Action]:
        """A new connection takes this client id's session [MQTT-3.1.4-2]: close, publishing
        the will (this client did not send DISCONNECT)."""
        return self.connection_lost("session taken over [MQTT-3.1.4-2]")

    def session_lost(self) -> list[Action]:
        """Another node took the session by force (this one did not answer in time): close
        without the will, which the node that took the session published."""
        self._will = None
        return self.connection_lost("session taken by force by another node [MQTT-3.1.4-2]")

    def take_will(self) -> Message | None:
        """The will message to publish now, at most once, if the client may still publish it
        (the rules of now: a SIGHUP may have taken its topic away since the CONNECT)."""
        will, self._will = self._will, None
        if will is None or not self.permissions.may_publish(will.topic):
            return None
        return will_message(will, self.client_id, self.stamps)

    # -- CONNECT ------------------------------------------------------------------------------

    def _on_connect(self, connect: Connect) -> list[Action]:
        _check_will_topic(connect.will)
        client_id = connect.client_id
        if not client_id and connect.protocol_level == 3:
            raise ConnectRefused(
                ConnackCode.IDENTIFIER_REJECTED, "MQTT-3.1.3-5",
                "MQTT 3.1 requires a client identifier of 1 to 23 characters",
            )  # fmt: skip
        if not client_id:
            if not connect.clean_session:
                raise ConnectRefused(
                    ConnackCode.IDENTIFIER_REJECTED,
                    "MQTT-3.1.3-8",
                    "zero-length client id requires cleanSession=1",
                )
            client_id = f"headwater-{self.stamps.new_id().hex()}"  # [MQTT-3.1.3-6]
        elif len(client_id.encode()) > self.limits.max_client_id_length or (
            connect.protocol_level == 3 and len(client_id.encode()) > 23
        ):
            raise ConnectRefused(
                ConnackCode.IDENTIFIER_REJECTED, "MQTT-3.1.3-5", "client identifier too long"
            )
        self.connect = connect
        self.client_id = client_id
        self.keep_alive = connect.keep_alive
        self.state = State.OPENING
        return [Authenticate(connect, client_id)]

    def logged_in(
        self,
        permissions: Permissions | None,
        code: int = ConnackCode.ACCEPTED,
        reason: str = "",
        identity: str = "",
    ) -> list[Action]:
        """The answer to :class:`Authenticate`: ``permissions`` None refuses the CONNECT with
        CONNACK ``code`` (``frontend.auth`` says which and why) and closes [MQTT-3.2.2-5];
        otherwise they hold from now on, and the session of ``identity`` is opened next."""
        if self.state is not State.OPENING or self._logged_in or self.connect is None:
            return []
        if permissions is None:
            refused = ConnackCode.NOT_AUTHORIZED if code == ConnackCode.ACCEPTED else code
            return self.session_refused(refused, reason or "refused")
        self._logged_in = True
        self.permissions = permissions
        return [OpenSession(self.connect, self.client_id, identity)]

    def session_opened(
        self, session: Session, present: bool, permissions: Permissions | None = None
    ) -> list[Action]:
        """The session is ours: CONNACK 0, then whatever the resumed session owes the client.
        The permissions are the login's (``permissions`` replaces them: for tests)."""
        if self.state is not State.OPENING:
            return []
        assert self.connect is not None
        if permissions is not None:
            self.permissions = permissions
        self.session = session
        session.permissions = self.permissions  # the read rules, asked at each send
        self._will, self.connect = self.connect.will, None  # what else it said is not kept
        self.state = State.CONNECTED
        connack = Send(encode(Connack(present, ConnackCode.ACCEPTED)))
        return [connack, *(Send(data) for data in session.resume())]

    def session_refused(self, code: int, reason: str) -> list[Action]:
        """The session could not be opened: CONNACK ``code``, then close [MQTT-3.2.2-5]."""
        if self.state is not State.OPENING:
            return []
        self._enter_closed()
        return [Send(encode(Connack(False, code))), Close(reason, publish_will=False)]

    def session_not_owned(self, reason: str) -> list[Action]:
        """The client id's session belongs to another identity: CONNACK 5, and the session is
        left as it is (a client proves nothing it claims)."""
        return self.session_refused(ConnackCode.NOT_AUTHORIZED, reason)

    # -- PUBLISH from the client ----------------------------------------------------------------

    def _on_publish(self, publish: Publish) -> list[Action]:
        topics.validate_topic_name(publish.topic)
        if not self.permissions.may_publish(publish.topic):
            return self._drop(publish)
        message = self.stamps.message(
            publish.topic, publish.payload, publish.qos, publish.retain, self.client_id
        )
        if publish.qos == 0:
            return [Produce(message, None)]
        assert publish.packet_id is not None
        if publish.qos == 1:
            return [Produce(message, self._await_log(Puback(publish.packet_id), message))]
        assert self.session is not None
        if not self.session.receive_qos2(publish.packet_id, publish.dup):
            return self._reply_again(Pubrec(publish.packet_id))
        ticket = self._await_log(Pubrec(publish.packet_id), message)
        return [Produce(message, ticket, publish.packet_id)]

    def _await_log(self, reply: Packet, message: Message) -> int:
        pending = _PendingReply(reply, message.message_id)
        self._next_ticket += 1
        self._tickets[self._next_ticket] = pending
        if self._replies is None:
            self._replies = deque()
        self._replies.append(pending)
        return self._next_ticket

    def _drop(self, publish: Publish) -> list[Action]:
        """A PUBLISH the client may not make: acknowledged, in order, never written."""
        if publish.qos == 0 or publish.packet_id is None:
            return []
        return self._reply_again((Puback if publish.qos == 1 else Pubrec)(publish.packet_id))

    def _reply_again(self, reply: Packet) -> list[Action]:
        """A reply owed without a write (DUP QoS 2, PUBREL, denied): sent after any awaiting one."""
        if not self._replies:
            return [Send(encode(reply))]
        self._replies.append(_PendingReply(reply, b"", done=True))
        return []

    def produced(self, ticket: int) -> list[Action]:
        """The log confirmed a write: release every reply now due, in arrival order."""
        pending = self._tickets.pop(ticket, None)
        if pending is None or self.state is State.CLOSED:
            return []
        pending.done = True
        sent: list[Action] = []
        replies = self._replies
        while replies and replies[0].done:
            sent.append(Send(encode(replies.popleft().packet)))
        return sent

    def awaiting_log(self, message_id: bytes) -> bool:
        """True while this client's own PUBLISH is not yet acknowledged to it."""
        return any(p.message_id == message_id for p in self._replies or ())

    @property
    def pending_publishes(self) -> int:
        return len(self._tickets)

    # -- acknowledgements from the client --------------------------------------------------------

    def _on_puback(self, puback: Puback) -> list[Action]:
        assert self.session is not None
        return [Send(data) for data in self.session.puback(puback.packet_id)]

    def _on_pubrec(self, pubrec: Pubrec) -> list[Action]:
        assert self.session is not None
        return [Send(self.session.pubrec(pubrec.packet_id))]

    def _on_pubrel(self, pubrel: Pubrel) -> list[Action]:
        assert self.session is not None
        self.session.release_qos2(pubrel.packet_id)
        forget = ForgetQos2(pubrel.packet_id)
        return [forget, *self._reply_again(Pubcomp(pubrel.packet_id))]  # [MQTT-4.3.3-2]

    def _on_pubcomp(self, pubcomp: Pubcomp) -> list[Action]:
        assert self.session is not None
        return [Send(data) for data in self.session.pubcomp(pubcomp.packet_id)]

    # -- SUBSCRIBE / UNSUBSCRIBE ------------------------------------------------------------------

    def _on_subscribe(self, subscribe: Subscribe) -> list[Action]:
        assert self.session is not None
        return [_grant(subscribe, self.session, self.limits, self.permissions)]

    def subscribed(self, request: AddSubscriptions, failed: bool = False) -> list[Action]:
        """The SUBACK for ``request``; the connection sends matching retained messages after it
        [MQTT-3.3.1-6].  ``failed``: the subscriptions could not be registered, every code is
        0x80."""
        codes = (SUBACK_FAILURE,) * len(request.return_codes) if failed else request.return_codes
        return [Send(encode(Suback(request.packet_id, codes)))]

    def _on_unsubscribe(self, unsubscribe: Unsubscribe) -> list[Action]:
        return [
            RemoveSubscriptions(unsubscribe.topics),
            Send(encode(Unsuback(unsubscribe.packet_id))),  # [MQTT-3.10.4-4], [MQTT-3.10.4-5]
        ]

    # -- the rest -----------------------------------------------------------------------------

    def _on_pingreq(self, _: Pingreq) -> list[Action]:
        return [Send(PINGRESP)]  # [MQTT-3.12.4-1]

    def _on_disconnect(self, _: Disconnect) -> list[Action]:
        self._will = None  # [MQTT-3.14.4-3]
        self._enter_closed()
        return [Close("client sent DISCONNECT", publish_will=False)]

    def _enter_closed(self) -> None:
        self.state = State.CLOSED
        if self.session is not None:
            for pending in self._tickets.values():
                if isinstance(pending.packet, Pubrec):
                    # Never written: a resend must be produced again, not only acknowledged.
                    self.session.release_qos2(pending.packet.packet_id)
        self._tickets.clear()
        self._replies = None


def _check_will_topic(will: Will | None) -> None:
    """A will topic's levels (``topics.MAX_TOPIC_LEVELS``): the decoder checked the rest."""
    if will is not None:
        topics.validate_topic_name(will.topic)


def _grant(
    subscribe: Subscribe, session: Session, limits: Limits, permissions: Permissions
) -> AddSubscriptions:
    """Which filters of ``subscribe`` are granted: valid ones [MQTT-3.9.3-2] the client may
    subscribe to, while the session has room for them under ``Limits.max_subscriptions`` (filters
    it holds already take none); the others get 0x80."""
    held, bound = session.subscriptions, limits.max_subscriptions
    room = bound - len(held) if bound else None
    added: set[str] = set()  # new filters, counted against the room
    granted: list[tuple[str, int]] = []
    codes: list[int] = []
    over = 0
    for topic_filter, qos in subscribe.topics:
        if not topics.is_valid_filter(topic_filter) or not permissions.may_subscribe(
            topics.judged_filter(topic_filter)
        ):
            codes.append(SUBACK_FAILURE)
            continue
        if room is not None and topic_filter not in held and topic_filter not in added:
            if len(added) >= room:
                codes.append(SUBACK_FAILURE)
                over += 1
                continue
            added.add(topic_filter)
        granted.append((topic_filter, qos))
        codes.append(qos)
    return AddSubscriptions(subscribe.packet_id, granted, tuple(codes), over)


_HANDLERS: dict[type, Callable[[Channel, Any], list[Action]]] = {
    Publish: Channel._on_publish,
    Puback: Channel._on_puback,
    Pubrec: Channel._on_pubrec,
    Pubrel: Channel._on_pubrel,
    Pubcomp: Channel._on_pubcomp,
    Subscribe: Channel._on_subscribe,
    Unsubscribe: Channel._on_unsubscribe,
    Pingreq: Channel._on_pingreq,
    Disconnect: Channel._on_disconnect,
}
"""What a connected client's packet is handled by, by its type."""
