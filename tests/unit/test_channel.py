"""The channel, one connection's protocol state machine: every (state, packet) pair, then behaviour.

Replies are checked as the client would see them: every ``Send`` is decoded with the codec's
``Decoder``.  Tests named after a rule cite its normative statement in a comment.
"""

from __future__ import annotations

import typing
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

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
from mqttcore.codec import Decoder, PublishTemplate
from mqttcore.errors import ConnectRefused, MalformedPacket, ProtocolError
from mqttcore.message import Message, MessageStamps
from mqttcore.packets import (
    SUBACK_FAILURE,
    Connack,
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
from mqttcore.session import Outbound, Session

NODE = "node-7"
STAMPS = MessageStamps(NODE, lambda: 1_700_000_000_000, bytes(8))
WILL = Will("clients/c/status", b"gone", qos=1, retain=True)


def opening(connect: Connect | None = None, limits: Limits | None = None) -> Channel:
    channel = Channel(STAMPS, limits)
    (action,) = channel.handle_in(connect or Connect("c"))
    assert isinstance(action, Authenticate)
    (action,) = channel.logged_in(UNRESTRICTED)
    assert isinstance(action, OpenSession)
    assert channel.state is State.OPENING
    return channel


def connected(
    connect: Connect | None = None,
    session: Session | None = None,
    present: bool = False,
    permissions: Permissions = UNRESTRICTED,
    limits: Limits | None = None,
) -> Channel:
    channel = opening(connect, limits)
    clean = channel.connect is not None and channel.connect.clean_session
    channel.session_opened(session or Session(channel.client_id, clean), present, permissions)
    assert channel.state is State.CONNECTED
    return channel


def sent(actions: list[Action]) -> list[Packet]:
    """The packets the client receives from these actions, in order."""
    decoder = Decoder()
    packets: list[Packet] = []
    for action in actions:
        if isinstance(action, Send):
            packets += decoder.feed(action.data)
    return packets


def only_sent(actions: list[Action]) -> list[Packet]:
    assert all(isinstance(action, Send) for action in actions), actions
    return sent(actions)


def produce(actions: list[Action]) -> Produce:
    (action,) = actions
    assert isinstance(action, Produce)
    return action


def ticket(actions: list[Action]) -> int:
    t = produce(actions).ticket
    assert t is not None
    return t


# -- every (state, packet) pair ----------------------------------------------------------------

SAMPLES: dict[type, Packet] = {
    Connect: Connect("c"),
    Connack: Connack(False, 0),
    Publish: Publish("a/b", b"x", 1, packet_id=3),
    Puback: Puback(3),
    Pubrec: Pubrec(3),
    Pubrel: Pubrel(3),
    Pubcomp: Pubcomp(3),
    Subscribe: Subscribe(3, (("a/+", 1),)),
    Suback: Suback(3, (1,)),
    Unsubscribe: Unsubscribe(3, ("a/+",)),
    Unsuback: Unsuback(3),
    Pingreq: Pingreq(),
    Pingresp: Pingresp(),
    Disconnect: Disconnect(),
}
SERVER_TO_CLIENT = {Connack, Suback, Unsuback, Pingresp}

CONNECTED_ACTIONS: dict[type, tuple[type, ...]] = {
    Publish: (Produce,),
    Puback: (),  # unknown id: nothing to release
    Pubrec: (Send,),
    Pubrel: (ForgetQos2, Send),
    Pubcomp: (),
    Subscribe: (AddSubscriptions,),
    Unsubscribe: (RemoveSubscriptions, Send),
    Pingreq: (Send,),
    Disconnect: (Close,),
}
"""The action types each client-to-server packet gives in CONNECTED (sample packets above)."""


def closed_by_disconnect() -> Channel:
    channel = connected()
    channel.handle_in(Disconnect())
    return channel


def closed_before_connect() -> Channel:
    channel = Channel(STAMPS)
    channel.connection_lost("gone")
    return channel


def closed_by_error() -> Channel:
    channel = connected()
    channel.handle_error(MalformedPacket("MQTT-2.2.3", "bad"))
    return channel


def closed_by_refusal() -> Channel:
    channel = opening()
    channel.session_refused(5, "no")
    return channel


CLOSED_ROUTES: list[Callable[[], Channel]] = [
    closed_by_disconnect,
    closed_before_connect,
    closed_by_error,
    closed_by_refusal,
]


def test_the_samples_cover_all_fourteen_packet_types() -> None:
    assert set(SAMPLES) == set(typing.get_args(Packet))
    assert len(SAMPLES) == 14
    assert set(CONNECTED_ACTIONS) == set(SAMPLES) - SERVER_TO_CLIENT - {Connect}


@pytest.mark.parametrize("kind", SAMPLES, ids=lambda k: k.__name__)
def test_connecting(kind: type) -> None:
    channel = Channel(STAMPS)
    if kind is Connect:
        (action,) = channel.handle_in(SAMPLES[kind])
        assert action == Authenticate(Connect("c"), "c")
        assert channel.state is State.OPENING
        return
    # [MQTT-3.1.0-1] the first packet from the client must be CONNECT
    with pytest.raises(ProtocolError) as raised:
        channel.handle_in(SAMPLES[kind])
    assert raised.value.spec_id == "MQTT-3.1.0-1"
    assert raised.value.connack_code is None
    assert channel.state is State.CONNECTING  # handle_error decides what follows


@pytest.mark.parametrize("kind", SAMPLES, ids=lambda k: k.__name__)
def test_opening_takes_no_packet(kind: type) -> None:
    # The connection holds packets back while the session opens: feeding one is a bug.
    channel = opening()
    with pytest.raises(RuntimeError):
        channel.handle_in(SAMPLES[kind])
    assert channel.state is State.OPENING


@pytest.mark.parametrize("kind", SAMPLES, ids=lambda k: k.__name__)
def test_connected(kind: type) -> None:
    channel = connected()
    if kind is Connect:
        # [MQTT-3.1.0-2] a second CONNECT is a protocol violation
        with pytest.raises(ProtocolError) as raised:
            channel.handle_in(SAMPLES[kind])
        assert raised.value.spec_id == "MQTT-3.1.0-2"
        assert channel.state is State.CONNECTED
        return
    if kind in SERVER_TO_CLIENT:
        # [MQTT-4.8.0-1] a server-to-client packet from the client is a protocol violation
        with pytest.raises(ProtocolError) as raised:
            channel.handle_in(SAMPLES[kind])
        assert raised.value.spec_id == "MQTT-4.8.0-1"
        assert kind.__name__ in str(raised.value)
        assert channel.state is State.CONNECTED
        return
    actions = channel.handle_in(SAMPLES[kind])
    assert tuple(type(a) for a in actions) == CONNECTED_ACTIONS[kind]
    assert channel.state is (State.CLOSED if kind is Disconnect else State.CONNECTED)


@pytest.mark.parametrize("route", CLOSED_ROUTES, ids=lambda r: r.__name__)
@pytest.mark.parametrize("kind", SAMPLES, ids=lambda k: k.__name__)
def test_closed_ignores_everything(kind: type, route: Callable[[], Channel]) -> None:
    channel = route()
    assert channel.state is State.CLOSED
    assert channel.handle_in(SAMPLES[kind]) == []
    assert channel.state is State.CLOSED


@pytest.mark.parametrize("route", CLOSED_ROUTES, ids=lambda r: r.__name__)
def test_closed_ignores_late_events(route: Callable[[], Channel]) -> None:
    channel = route()
    assert channel.connection_lost("again") == []
    assert channel.keep_alive_expired() == []
    assert channel.produced(1) == []


# -- CONNECT: client identifiers ---------------------------------------------------------------


def test_open_session_carries_the_connect_and_client_id() -> None:
    connect = Connect("dev-1", clean_session=False, keep_alive=30, username="u", password=b"p")
    channel = Channel(STAMPS)
    assert channel.handle_in(connect) == [Authenticate(connect, "dev-1")]
    assert (channel.client_id, channel.keep_alive, channel.connect) == ("dev-1", 30, connect)


def test_empty_client_id_with_clean_session_is_assigned_a_unique_id() -> None:
    # [MQTT-3.1.3-6] the server assigns a unique ClientId to a zero-byte one with CleanSession=1
    ids = set()
    for _ in range(3):
        channel = Channel(STAMPS)
        (action,) = channel.handle_in(Connect("", clean_session=True))
        assert isinstance(action, Authenticate)
        assert action.client_id.startswith("headwater-")
        assert channel.client_id == action.client_id
        ids.add(action.client_id)
    assert len(ids) == 3


def test_empty_client_id_without_clean_session_is_rejected_with_code_2() -> None:
    # [MQTT-3.1.3-8] zero-byte ClientId with CleanSession=0: CONNACK 0x02, then close
    channel = Channel(STAMPS)
    with pytest.raises(ConnectRefused) as raised:
        channel.handle_in(Connect("", clean_session=False))
    assert raised.value.spec_id == "MQTT-3.1.3-8"
    assert raised.value.connack_code == 2
    actions = channel.handle_error(raised.value)
    assert sent(actions) == [Connack(False, 2)]
    assert isinstance(actions[-1], Close) and not actions[-1].publish_will
    assert channel.state is State.CLOSED


def test_mqtt31_client_id_longer_than_23_characters_is_rejected_with_code_2() -> None:
    channel = Channel(STAMPS)
    with pytest.raises(ConnectRefused) as raised:
        channel.handle_in(Connect("x" * 24, protocol_name="MQIsdp", protocol_level=3))
    assert raised.value.connack_code == 2
    assert sent(channel.handle_error(raised.value)) == [Connack(False, 2)]


def test_mqtt31_client_id_of_23_characters_is_accepted() -> None:
    opening(Connect("x" * 23, protocol_name="MQIsdp", protocol_level=3))


def test_mqtt311_client_id_may_be_longer_than_23_characters() -> None:
    # [MQTT-3.1.3-5] the server MAY allow more than 23 bytes
    opening(Connect("x" * 200))


def test_client_id_over_the_configured_limit_is_rejected_with_code_2() -> None:
    opening(Connect("x" * 8), Limits(max_client_id_length=8))
    with pytest.raises(ConnectRefused) as raised:
        opening(Connect("x" * 9), Limits(max_client_id_length=8))
    assert raised.value.connack_code == 2


# -- errors ------------------------------------------------------------------------------------


def test_handle_error_while_connecting_sends_the_connack_code_then_closes() -> None:
    # 3.2.2.3: a refused CONNECT is answered with its return code, then the connection closes
    channel = Channel(STAMPS)
    actions = channel.handle_error(ConnectRefused(1, "MQTT-3.1.2-2", "level 9"))
    assert sent(actions) == [Connack(False, 1)]
    assert isinstance(actions[-1], Close)
    assert actions[-1] == Close("[MQTT-3.1.2-2] level 9", publish_will=False)
    assert channel.state is State.CLOSED


def test_handle_error_without_a_connack_code_only_closes() -> None:
    # [MQTT-4.8.0-1] a protocol violation closes the connection without a reply
    channel = Channel(STAMPS)
    assert channel.handle_error(ProtocolError("MQTT-3.1.2-1", "bad name")) == [
        Close("[MQTT-3.1.2-1] bad name", publish_will=False)
    ]


def test_handle_error_once_connected_never_sends_a_connack() -> None:
    channel = connected()
    actions = channel.handle_error(ConnectRefused(1, "MQTT-3.1.2-2", "second connect"))
    assert actions == [Close("[MQTT-3.1.2-2] second connect", publish_will=False)]
    assert channel.state is State.CLOSED


def test_publish_with_a_wildcard_topic_is_a_protocol_error() -> None:
    # [MQTT-3.3.2-2] the topic name in a PUBLISH must not contain wildcards
    with pytest.raises(ProtocolError) as raised:
        connected().handle_in(Publish("a/+", b""))
    assert raised.value.spec_id == "MQTT-3.3.2-2"


def test_publish_to_a_topic_of_201_levels_is_a_protocol_error() -> None:
    channel = connected()
    produce(channel.handle_in(Publish("/".join("t" * 200), b"", 0)))
    with pytest.raises(ProtocolError) as raised:
        channel.handle_in(Publish("/".join("t" * 201), b"", 0))
    assert raised.value.connack_code is None  # the connection is closed


def test_a_will_topic_of_201_levels_is_a_protocol_error_without_connack() -> None:
    channel = Channel(STAMPS)
    with pytest.raises(ProtocolError) as raised:
        channel.handle_in(Connect("c", will=Will("/".join("w" * 201), b"gone")))
    assert raised.value.connack_code is None
    assert only_sent(channel.handle_error(raised.value)[:-1]) == []


def test_filters_of_201_levels_get_0x80() -> None:
    deep, deeper = "/".join("f" * 200), "/".join("f" * 201)
    (request,) = connected().handle_in(Subscribe(3, ((deep, 1), (deeper, 1))))
    assert isinstance(request, AddSubscriptions)
    assert request.granted == [(deep, 1)]
    assert request.return_codes == (1, SUBACK_FAILURE)


def test_the_default_subscription_bound_is_1000() -> None:
    assert Limits().max_subscriptions == 1000
    filters = tuple((f"f/{i}", 0) for i in range(1001))
    (request,) = connected().handle_in(Subscribe(3, filters))
    assert isinstance(request, AddSubscriptions)
    assert request.return_codes == (0,) * 1000 + (SUBACK_FAILURE,)


def test_session_refused_sends_the_code_then_closes() -> None:
    # [MQTT-3.2.2-5] a non-zero CONNACK is followed by closing the connection
    channel = opening(Connect("c", will=WILL))
    actions = channel.session_refused(4, "bad password")
    assert sent(actions) == [Connack(False, 4)]
    assert actions[-1] == Close("bad password", publish_will=False)
    assert channel.state is State.CLOSED
    assert channel.take_will() is None


# -- the will ----------------------------------------------------------------------------------


def _assert_is_the_will(message: Message | None, client_id: str = "c") -> None:
    assert message is not None
    assert (message.topic, message.payload, message.qos, message.retain) == (
        WILL.topic,
        WILL.payload,
        WILL.qos,
        WILL.retain,
    )
    assert (message.client_id, message.origin_node) == (client_id, NODE)


def test_a_will_whose_topic_the_rules_took_away_is_not_published() -> None:
    # the channel decides with the rules of now (a SIGHUP since the CONNECT), not the transport
    class TopicTakenAway:  # everything allowed but the will's topic
        def may_publish(self, topic: str) -> bool:
            return topic != WILL.topic

        def may_subscribe(self, topic_filter: str) -> bool:
            return True

        def may_read(self, topic: str) -> bool:
            return True

    channel = connected(Connect("c", will=WILL), permissions=TopicTakenAway())
    (close,) = channel.connection_lost("gone")
    assert isinstance(close, Close) and close.publish_will
    assert channel.take_will() is None


def test_pubrel_tells_a_stored_session_to_forget_the_packet_id() -> None:
    channel = connected()
    actions = channel.handle_in(Pubrel(7))
    assert actions[0] == ForgetQos2(7) and sent(actions) == [Pubcomp(7)]


@pytest.mark.parametrize(
    "end",
    [
        lambda ch: ch.connection_lost("reset by peer"),
        lambda ch: ch.keep_alive_expired(),
        lambda ch: ch.handle_error(MalformedPacket("MQTT-2.2.3", "bad")),
    ],
    ids=["connection_lost", "keep_alive_expired", "handle_error"],
)
def test_will_is_published_when_the_connection_ends_without_disconnect(
    end: Callable[[Channel], list[Action]],
) -> None:
    # [MQTT-3.1.2-8] the will is published when the network connection is closed, unless
    # it was deleted on receipt of a DISCONNECT
    channel = connected(Connect("c", will=WILL, keep_alive=10))
    (close,) = end(channel)
    assert isinstance(close, Close) and close.publish_will
    _assert_is_the_will(channel.take_will())
    assert channel.take_will() is None  # once only
    assert channel.state is State.CLOSED


def test_keep_alive_expiry_names_the_keep_alive() -> None:
    # [MQTT-3.1.2-24] nothing for 1.5 x keep-alive: the server disconnects
    (close,) = connected(Connect("c", keep_alive=10)).keep_alive_expired()
    assert isinstance(close, Close) and "10" in close.reason


def test_will_is_discarded_on_disconnect() -> None:
    # [MQTT-3.14.4-3] on DISCONNECT the server discards the will without publishing it
    channel = connected(Connect("c", will=WILL))
    assert channel.handle_in(Disconnect()) == [Close("client sent DISCONNECT", publish_will=False)]
    assert channel.take_will() is None
    assert channel.connection_lost("socket closed") == []


def test_no_will_no_publish() -> None:
    (close,) = connected().connection_lost("gone")
    assert isinstance(close, Close) and not close.publish_will


def test_will_is_not_published_before_the_session_is_open() -> None:
    channel = opening(Connect("c", will=WILL))
    (close,) = channel.connection_lost("gone")
    assert isinstance(close, Close) and not close.publish_will
    assert channel.take_will() is None


def test_will_of_an_assigned_client_id_names_that_id() -> None:
    channel = connected(Connect("", will=WILL))
    channel.connection_lost("gone")
    _assert_is_the_will(channel.take_will(), channel.client_id)


# -- PUBLISH from the client -------------------------------------------------------------------


def test_qos0_publish_is_produced_without_a_ticket_or_reply() -> None:
    channel = connected(Connect("pub"))
    action = produce(channel.handle_in(Publish("a/b", b"data", 0, retain=True)))
    assert action.ticket is None
    m = action.message
    assert (m.topic, m.payload, m.qos, m.retain, m.client_id, m.origin_node) == (
        "a/b",
        b"data",
        0,
        True,
        "pub",
        NODE,
    )
    assert len(m.message_id) == 16
    assert not channel.awaiting_log(m.message_id)
    assert channel.pending_publishes == 0


def test_puback_is_sent_only_once_the_write_is_durable() -> None:
    # [MQTT-4.3.2-2] PUBACK means the server took ownership: only once the log has the message
    channel = connected()
    actions = channel.handle_in(Publish("a/b", b"x", 1, packet_id=9))
    action = produce(actions)
    assert sent(actions) == []
    assert channel.awaiting_log(action.message.message_id)
    assert channel.pending_publishes == 1
    assert action.ticket is not None
    assert only_sent(channel.produced(action.ticket)) == [Puback(9)]
    assert not channel.awaiting_log(action.message.message_id)
    assert channel.pending_publishes == 0
    assert channel.produced(action.ticket) == []  # a ticket is used once


def test_pubrec_is_sent_only_once_the_write_is_durable() -> None:
    # [MQTT-4.3.3-2] PUBREC means ownership was taken
    channel = connected()
    actions = channel.handle_in(Publish("a/b", b"x", 2, packet_id=4))
    assert sent(actions) == []
    assert only_sent(channel.produced(ticket(actions))) == [Pubrec(4)]


def test_replies_are_released_in_arrival_order_whatever_order_the_log_confirms() -> None:
    # [MQTT-4.6.0-2] PUBACKs in the order the PUBLISH packets were received (QoS 1)
    # [MQTT-4.6.0-3] PUBRECs in the order the PUBLISH packets were received (QoS 2)
    channel = connected()
    t1 = ticket(channel.handle_in(Publish("a", b"1", 1, packet_id=10)))
    t2 = ticket(channel.handle_in(Publish("a", b"2", 2, packet_id=11)))
    t3 = ticket(channel.handle_in(Publish("a", b"3", 1, packet_id=12)))
    assert channel.produced(t3) == []
    assert channel.produced(t2) == []
    assert only_sent(channel.produced(t1)) == [Puback(10), Pubrec(11), Puback(12)]


@given(st.lists(st.tuples(st.integers(1, 2), st.booleans()), min_size=1, max_size=12), st.data())
def test_any_confirmation_order_releases_the_arrival_order(
    publishes: list[tuple[int, bool]], data: st.DataObject
) -> None:
    channel = connected()
    expected: list[Packet] = []
    tickets: list[int] = []
    for packet_id, (qos, retain) in enumerate(publishes, start=1):
        tickets.append(
            ticket(channel.handle_in(Publish("a", b"", qos, retain, packet_id=packet_id)))
        )
        expected.append(Puback(packet_id) if qos == 1 else Pubrec(packet_id))
    order = data.draw(st.permutations(range(len(tickets))))
    released: list[Packet] = []
    confirmed: set[int] = set()
    for index in order:
        released += only_sent(channel.produced(tickets[index]))
        confirmed.add(index)
        # exactly the longest confirmed prefix of the arrival order has been released
        prefix = 0
        while prefix in confirmed:
            prefix += 1
        assert released == expected[:prefix]
    assert released == expected


def test_qos0_publish_does_not_wait_behind_pending_replies() -> None:
    channel = connected()
    t = ticket(channel.handle_in(Publish("a", b"1", 1, packet_id=1)))
    assert produce(channel.handle_in(Publish("a", b"0", 0))).ticket is None
    assert only_sent(channel.produced(t)) == [Puback(1)]


def test_qos2_dup_after_the_write_is_acknowledged_again_not_published() -> None:
    # [MQTT-4.3.3-2] until PUBREL, a PUBLISH with the same id gets PUBREC and is not delivered
    # onwards a second time
    channel = connected()
    t = ticket(channel.handle_in(Publish("a", b"x", 2, packet_id=5)))
    assert only_sent(channel.produced(t)) == [Pubrec(5)]
    again = channel.handle_in(Publish("a", b"x", 2, dup=True, packet_id=5))
    assert only_sent(again) == [Pubrec(5)]


def test_qos2_dup_before_the_write_is_acknowledged_in_order_after_it() -> None:
    channel = connected()
    t = ticket(channel.handle_in(Publish("a", b"x", 2, packet_id=5)))
    assert channel.handle_in(Publish("a", b"x", 2, dup=True, packet_id=5)) == []
    assert only_sent(channel.produced(t)) == [Pubrec(5), Pubrec(5)]


def test_qos2_same_id_after_pubrel_is_a_new_message() -> None:
    channel = connected()
    t = ticket(channel.handle_in(Publish("a", b"x", 2, packet_id=5)))
    channel.produced(t)
    assert sent(channel.handle_in(Pubrel(5))) == [Pubcomp(5)]
    assert produce(channel.handle_in(Publish("a", b"y", 2, packet_id=5))).message.payload == b"y"


def test_pubrel_is_answered_with_pubcomp_even_for_an_unknown_id() -> None:
    # [MQTT-4.3.3-2] PUBREL -> PUBCOMP with the same packet identifier
    assert sent(connected().handle_in(Pubrel(321))) == [Pubcomp(321)]


def test_pubcomp_waits_behind_replies_still_awaiting_the_log() -> None:
    channel = connected()
    t = ticket(channel.handle_in(Publish("a", b"x", 1, packet_id=1)))
    assert channel.handle_in(Pubrel(2)) == [ForgetQos2(2)]  # the PUBCOMP waits
    assert only_sent(channel.produced(t)) == [Puback(1), Pubcomp(2)]


def test_nothing_is_released_after_the_connection_closed() -> None:
    channel = connected()
    t = ticket(channel.handle_in(Publish("a", b"x", 1, packet_id=1)))
    channel.connection_lost("gone")
    assert channel.produced(t) == []
    assert channel.pending_publishes == 0


def test_qos2_publish_not_yet_durable_is_written_again_after_a_reconnect() -> None:
    # The write was never confirmed (Kafka failed, or the connection died first), so no PUBREC
    # was sent.  The client resends on its next connection [MQTT-4.4.0-1]; answering that with
    # PUBREC alone would acknowledge a message the log may never have [MQTT-4.3.3-2].
    session = Session("c", clean=False)
    first = connected(Connect("c", clean_session=False), session)
    ticket(first.handle_in(Publish("a", b"x", 2, packet_id=5)))
    first.connection_lost("Kafka write failed")
    second = connected(Connect("c", clean_session=False), session, present=True)
    again = second.handle_in(Publish("a", b"x", 2, dup=True, packet_id=5))
    assert produce(again).message.payload == b"x"


def test_qos2_publish_made_durable_is_not_written_again_after_a_reconnect() -> None:
    # The log has it; only the PUBREC was lost with the connection.
    session = Session("c", clean=False)
    first = connected(Connect("c", clean_session=False), session)
    t1 = ticket(first.handle_in(Publish("a", b"1", 1, packet_id=4)))
    t2 = ticket(first.handle_in(Publish("a", b"2", 2, packet_id=5)))
    assert first.produced(t2) == []  # durable, but its PUBREC waits behind packet 4
    first.connection_lost("gone")
    assert first.produced(t1) == []
    second = connected(Connect("c", clean_session=False), session, present=True)
    assert only_sent(second.handle_in(Publish("a", b"2", 2, dup=True, packet_id=5))) == [Pubrec(5)]


# -- acknowledgements from the client ----------------------------------------------------------


def _outbound(qos: int, payload: bytes) -> Outbound:
    message = STAMPS.message("t", payload, qos, False, "other")
    return Outbound(message, qos, False, PublishTemplate("t", payload, qos))


def test_puback_from_the_client_releases_queued_deliveries() -> None:
    session = Session("c", clean=True, max_inflight=1)
    channel = connected(session=session)
    session.deliver(_outbound(1, b"first"), online=True)
    session.deliver(_outbound(1, b"second"), online=True)
    assert only_sent(channel.handle_in(Puback(1))) == [Publish("t", b"second", 1, packet_id=2)]


def test_pubrec_from_the_client_is_answered_with_pubrel_and_pubcomp_ends_it() -> None:
    session = Session("c", clean=True, max_inflight=1)
    channel = connected(session=session)
    session.deliver(_outbound(2, b"first"), online=True)
    session.deliver(_outbound(2, b"second"), online=True)
    assert only_sent(channel.handle_in(Pubrec(1))) == [Pubrel(1)]
    assert only_sent(channel.handle_in(Pubcomp(1))) == [Publish("t", b"second", 2, packet_id=2)]


# -- SUBSCRIBE / UNSUBSCRIBE / PINGREQ ---------------------------------------------------------


def test_subscribe_grants_the_requested_qos_and_suback_follows_registration() -> None:
    channel = connected()
    (request,) = channel.handle_in(Subscribe(7, (("a/+", 0), ("b/#", 2), ("$share/g/c", 1))))
    assert request == AddSubscriptions(7, [("a/+", 0), ("b/#", 2), ("$share/g/c", 1)], (0, 2, 1))
    # [MQTT-3.8.4-1] SUBACK with the same packet identifier; [MQTT-3.8.4-5] one code per filter
    assert only_sent(channel.subscribed(request)) == [Suback(7, (0, 2, 1))]


def test_subscribe_answers_0x80_for_each_invalid_filter() -> None:
    # [MQTT-3.9.3-2] 0x80 marks a failed filter; the valid ones are still granted
    channel = connected()
    filters = (("ok/+", 1), ("a/#/b", 1), ("x+", 0), ("", 2), ("fine", 2), ("$share//x", 1))
    (request,) = channel.handle_in(Subscribe(8, filters))
    assert isinstance(request, AddSubscriptions)
    assert request.granted == [("ok/+", 1), ("fine", 2)]
    codes = (1, SUBACK_FAILURE, SUBACK_FAILURE, SUBACK_FAILURE, 2, SUBACK_FAILURE)
    assert request.return_codes == codes
    assert only_sent(channel.subscribed(request)) == [Suback(8, codes)]


def test_failed_registration_answers_0x80_for_every_filter() -> None:
    channel = connected()
    (request,) = channel.handle_in(Subscribe(9, (("a", 1), ("b/+", 2), ("c#", 0))))
    assert isinstance(request, AddSubscriptions)
    assert only_sent(channel.subscribed(request, failed=True)) == [Suback(9, (SUBACK_FAILURE,) * 3)]


class OnlyUnder:
    """Permissions that allow topics and filters under one prefix (the ACL's own tests are in
    test_acl; here only how the channel answers them)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def may_publish(self, topic: str) -> bool:
        return topic.startswith(self.prefix)

    may_subscribe = may_read = may_publish


def test_a_filter_the_client_may_not_subscribe_gets_0x80_and_the_others_are_granted() -> None:
    channel = connected(permissions=OnlyUnder("mine/"))
    (request,) = channel.handle_in(Subscribe(3, (("mine/#", 1), ("#", 0), ("mine/a", 2))))
    assert isinstance(request, AddSubscriptions)
    assert request.granted == [("mine/#", 1), ("mine/a", 2)]
    assert only_sent(channel.subscribed(request)) == [Suback(3, (1, SUBACK_FAILURE, 2))]


def test_a_denied_publish_is_acknowledged_in_order_and_never_written() -> None:
    channel = connected(permissions=OnlyUnder("mine/"))
    allowed = produce(channel.handle_in(Publish("mine/a", b"1", 1, packet_id=1)))
    assert channel.handle_in(Publish("theirs/a", b"2", 1, packet_id=2)) == []  # after PUBACK 1
    assert channel.handle_in(Publish("theirs/b", b"3", 0)) == []
    assert allowed.ticket is not None
    assert only_sent(channel.produced(allowed.ticket)) == [Puback(1), Puback(2)]
    assert only_sent(channel.handle_in(Publish("theirs/c", b"4", 2, packet_id=3))) == [Pubrec(3)]
    assert sent(channel.handle_in(Pubrel(3))) == [Pubcomp(3)]


def test_the_subscription_bound_refuses_new_filters_beyond_it_only() -> None:
    channel = connected(limits=Limits(max_subscriptions=2))
    assert channel.session is not None
    channel.session.subscriptions["held"] = 1
    filters = (("held", 0), ("a", 1), ("a", 2), ("b", 1), ("bad#x", 0))
    (request,) = channel.handle_in(Subscribe(4, filters))
    assert isinstance(request, AddSubscriptions)
    # "held" is already held and "a" twice is one filter: only "b" is beyond the bound of two.
    assert request.granted == [("held", 0), ("a", 1), ("a", 2)]
    assert request.return_codes == (0, 1, 2, SUBACK_FAILURE, SUBACK_FAILURE)
    assert request.over_limit == 1


def test_unsubscribe_removes_then_acknowledges() -> None:
    # [MQTT-3.10.4-4] UNSUBACK with the same packet identifier, after the removal
    actions = connected().handle_in(Unsubscribe(12, ("a/+", "b")))
    assert actions[0] == RemoveSubscriptions(("a/+", "b"))
    assert sent(actions[1:]) == [Unsuback(12)]
    assert len(actions) == 2


def test_pingreq_is_answered_with_pingresp() -> None:
    # [MQTT-3.12.4-1]
    assert only_sent(connected().handle_in(Pingreq())) == [Pingresp()]


# -- opening the session -----------------------------------------------------------------------


@pytest.mark.parametrize("present", [False, True])
def test_session_opened_sends_connack_with_session_present(present: bool) -> None:
    # [MQTT-3.2.2-2], [MQTT-3.2.2-3] the session present flag as the session store says
    channel = opening(Connect("c", clean_session=not present))
    actions = channel.session_opened(Session("c", clean=not present), present)
    assert only_sent(actions) == [Connack(present, 0)]
    assert channel.state is State.CONNECTED


def test_session_opened_resends_the_sessions_in_flight_messages_after_connack() -> None:
    # [MQTT-4.4.0-1] unacknowledged PUBLISH (DUP=1 [MQTT-3.3.1-1]) and PUBREL, original ids,
    # then what queued while the client was away
    session = Session("c", clean=False, max_inflight=2)
    session.deliver(_outbound(1, b"one"), online=True)
    session.deliver(_outbound(2, b"two"), online=True)
    session.pubrec(2)
    session.deliver(_outbound(1, b"three"), online=False)
    channel = opening(Connect("c", clean_session=False))
    assert only_sent(channel.session_opened(session, True)) == [
        Connack(True, 0),
        Publish("t", b"one", 1, dup=True, packet_id=1),
        Pubrel(2),
    ]
    assert only_sent(channel.handle_in(Puback(1))) == [Publish("t", b"three", 1, packet_id=3)]


def test_session_opened_keeps_the_session_and_keep_alive() -> None:
    session = Session("c", clean=True)
    channel = opening(Connect("c", keep_alive=45))
    channel.session_opened(session, False)
    assert channel.session is session
    assert channel.keep_alive == 45


# -- the login, takeovers and deadlines: decided here, carried out by the connection -----------


def authenticating(connect: Connect | None = None) -> Channel:
    channel = Channel(STAMPS)
    (action,) = channel.handle_in(connect or Connect("c", will=WILL, keep_alive=10))
    assert isinstance(action, Authenticate)
    return channel


@pytest.mark.parametrize("code", [2, 3, 4, 5])
def test_a_refused_login_sends_its_connack_code_then_closes_without_the_will(code: int) -> None:
    # [MQTT-3.2.2-5] a non-zero CONNACK is followed by closing the connection
    channel = authenticating()
    actions = channel.logged_in(None, code, "why")
    assert sent(actions) == [Connack(False, code)]
    assert actions[-1] == Close("why", publish_will=False)
    assert channel.state is State.CLOSED and channel.take_will() is None


def test_a_login_refused_without_a_code_is_not_authorized() -> None:
    assert sent(authenticating().logged_in(None)) == [Connack(False, 5)]


def test_an_accepted_login_opens_the_session_of_its_identity_under_its_permissions() -> None:
    connect = Connect("c", will=WILL)
    channel = authenticating(connect)
    assert channel.logged_in(OnlyUnder("mine/"), identity="alice") == [
        OpenSession(connect, "c", "alice")
    ]
    assert channel.logged_in(UNRESTRICTED) == []  # answered once
    channel.session_opened(Session("c", clean=True), False)
    assert only_sent(channel.handle_in(Publish("theirs/x", b"", 1, packet_id=4))) == [Puback(4)]
    assert produce(channel.handle_in(Publish("mine/x", b"", 1, packet_id=5))).message.topic == (
        "mine/x"
    )


def test_a_login_answered_after_the_connection_closed_opens_nothing() -> None:
    channel = authenticating()
    channel.connection_lost("gone")
    assert channel.logged_in(UNRESTRICTED) == [] and channel.logged_in(None, 4) == []


def test_a_takeover_closes_with_the_will_and_a_session_lost_elsewhere_without_it() -> None:
    taken = connected(Connect("c", will=WILL))
    (close,) = taken.taken_over()
    assert close == Close("session taken over [MQTT-3.1.4-2]", publish_will=True)
    _assert_is_the_will(taken.take_will())
    lost = connected(Connect("c", will=WILL))
    (close,) = lost.session_lost()
    assert isinstance(close, Close) and not close.publish_will
    assert lost.take_will() is None and lost.state is State.CLOSED


def test_deadlines_are_the_connect_timeout_then_one_and_a_half_keep_alives() -> None:
    channel = Channel(STAMPS)
    assert channel.due(opened=100.0, last_seen=150.0, connect_timeout=10.0) == 110.0
    assert channel.timed_out() == [Close("no CONNECT in time", publish_will=False)]
    channel = authenticating()
    assert channel.due(100.0, 150.0, 10.0) is None  # no deadline while being opened
    assert channel.timed_out() == []
    channel.logged_in(UNRESTRICTED)
    channel.session_opened(Session("c", clean=True), False)
    assert channel.due(100.0, 150.0, 10.0) == 165.0  # [MQTT-3.1.2-24]
    assert channel.timed_out() == [Close("keep-alive of 10s expired", publish_will=True)]
    idle = connected(Connect("c", keep_alive=0))
    assert idle.due(100.0, 150.0, 10.0) is None
