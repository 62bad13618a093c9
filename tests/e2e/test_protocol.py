"""MQTT 3.1.1 server conformance over real sockets, one node, through the real Kafka.

Each test sends raw packets and expects exact packets (or a close) back, citing the normative
statement it checks.
"""

from __future__ import annotations

from frontend.node import Node
from mqttcore.codec import encode
from mqttcore.packets import (
    Connack,
    Connect,
    Disconnect,
    Pingreq,
    Pingresp,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Unsuback,
    Unsubscribe,
    Will,
)
from tests.e2e.conftest import eventually
from tests.e2e.rawmqtt import RawClient

# -- CONNECT --------------------------------------------------------------------------------


async def test_connect_accepted_without_session(node: Node) -> None:
    client = await RawClient.open(node.config.port)
    await client.send(Connect("c1", clean_session=True))
    assert await client.recv() == Connack(False, 0)  # [MQTT-3.2.2-1]
    await client.close()


async def test_first_packet_must_be_connect(node: Node) -> None:
    client = await RawClient.open(node.config.port)
    await client.send(Pingreq())  # [MQTT-3.1.0-1]
    await client.expect_closed()


async def test_second_connect_closes(node: Node) -> None:
    client = await RawClient.connected(node.config.port, "c2")
    await client.send(Connect("c2"))  # [MQTT-3.1.0-2]
    await client.expect_closed()


async def test_unacceptable_protocol_level_gets_connack_1(node: Node) -> None:
    client = await RawClient.open(node.config.port)
    await client.send(Connect("c3", protocol_level=5))  # [MQTT-3.1.2-2]
    assert await client.recv() == Connack(False, 1)
    await client.expect_closed()


async def test_wrong_protocol_name_closes_without_connack(node: Node) -> None:
    client = await RawClient.open(node.config.port)
    await client.send(Connect("c4", protocol_name="MQTX"))  # [MQTT-3.1.2-1]
    await client.expect_closed()
    assert client.received == []


async def test_mqtt_31_mqisdp_is_accepted(node: Node) -> None:
    client = await RawClient.open(node.config.port)
    await client.send(Connect("c5", protocol_name="MQIsdp", protocol_level=3))
    assert await client.recv() == Connack(False, 0)
    await client.close()


async def test_reserved_connect_flag_closes(node: Node) -> None:
    raw = bytearray(encode(Connect("c6")))
    raw[9] |= 0x01  # [MQTT-3.1.2-3] the reserved flag of the connect flags byte
    client = await RawClient.open(node.config.port)
    await client.send(bytes(raw))
    await client.expect_closed()


async def test_empty_client_id_with_clean_session_gets_assigned_id(node: Node) -> None:
    client = await RawClient.open(node.config.port)
    await client.send(Connect("", clean_session=True))  # [MQTT-3.1.3-6]
    assert await client.recv() == Connack(False, 0)
    await client.subscribe(("assigned/id", 0))
    await client.close()


async def test_empty_client_id_without_clean_session_gets_connack_2(node: Node) -> None:
    client = await RawClient.open(node.config.port)
    await client.send(Connect("", clean_session=False))  # [MQTT-3.1.3-8]
    assert await client.recv() == Connack(False, 2)
    await client.expect_closed()


async def test_session_present_for_resumed_session(node: Node) -> None:
    client = await RawClient.connected(node.config.port, "persist1", clean_session=False)
    await client.send(Disconnect())
    await client.expect_closed()
    again = await RawClient.open(node.config.port)
    await again.send(Connect("persist1", clean_session=False))
    assert await again.recv() == Connack(True, 0)  # [MQTT-3.2.2-2]
    await again.send(Disconnect())
    clean = await RawClient.open(node.config.port)
    await clean.send(Connect("persist1", clean_session=True))
    assert await clean.recv() == Connack(False, 0)  # [MQTT-3.2.2-1]
    await clean.close()


async def test_takeover_closes_the_old_connection(node: Node) -> None:
    old = await RawClient.connected(node.config.port, "dup-id")
    new = await RawClient.connected(node.config.port, "dup-id")  # [MQTT-3.1.4-2]
    await old.expect_closed()
    await new.send(Pingreq())
    assert await new.recv() == Pingresp()
    await new.close()


async def test_keep_alive_expiry_closes_and_publishes_will(node: Node) -> None:
    watcher = await RawClient.connected(node.config.port, "watcher")
    await watcher.subscribe(("wills/ka", 1))
    quiet = await RawClient.connected(
        node.config.port, "quiet", keep_alive=1, will=Will("wills/ka", b"gone", 1)
    )
    await quiet.expect_closed(timeout=4)  # [MQTT-3.1.2-24] 1.5 x keep-alive
    will = await watcher.recv()
    assert isinstance(will, Publish) and will.payload == b"gone" and will.qos == 1
    await watcher.close()


async def test_pingreq_gets_pingresp(node: Node) -> None:
    client = await RawClient.connected(node.config.port, "pinger", keep_alive=30)
    await client.send(Pingreq())
    assert await client.recv() == Pingresp()  # [MQTT-3.12.4-1]
    await client.close()


# -- will -----------------------------------------------------------------------------------


async def test_will_published_on_socket_close_not_after_disconnect(node: Node) -> None:
    watcher = await RawClient.connected(node.config.port, "w-watch")
    await watcher.subscribe(("wills/#", 0))
    dropper = await RawClient.connected(node.config.port, "w1", will=Will("wills/w1", b"x"))
    await dropper.close()  # no DISCONNECT: [MQTT-3.1.2-8]
    will = await watcher.recv()
    assert isinstance(will, Publish) and will.topic == "wills/w1"
    polite = await RawClient.connected(node.config.port, "w2", will=Will("wills/w2", b"y"))
    await polite.send(Disconnect())  # [MQTT-3.1.2-10], [MQTT-3.14.4-3]
    await polite.expect_closed()
    await watcher.expect_silence(1.0)
    await watcher.close()


async def test_will_published_on_protocol_error(node: Node) -> None:
    watcher = await RawClient.connected(node.config.port, "pe-watch")
    await watcher.subscribe(("wills/pe", 0))
    bad = await RawClient.connected(node.config.port, "pe", will=Will("wills/pe", b"bad"))
    await bad.send(b"\x30\x03\x00\x01#")  # PUBLISH to "#": [MQTT-3.3.2-2]
    await bad.expect_closed()
    will = await watcher.recv()
    assert isinstance(will, Publish) and will.payload == b"bad"
    await watcher.close()


async def test_will_published_on_server_shutdown(start_node) -> None:  # type: ignore[no-untyped-def]
    a = await start_node("a")
    b = await start_node("b")
    watcher = await RawClient.connected(b.config.port, "sd-watch")
    await watcher.subscribe(("wills/sd", 0))
    await RawClient.connected(a.config.port, "sd", will=Will("wills/sd", b"down"))
    await a.stop()
    will = await watcher.recv()
    assert isinstance(will, Publish) and will.payload == b"down"
    await watcher.close()


# -- PUBLISH / QoS --------------------------------------------------------------------------


async def test_qos0_round_trip(node: Node) -> None:
    sub = await RawClient.connected(node.config.port, "s0")
    assert await sub.subscribe(("q/0", 0)) == Suback(1, (0,))
    pub = await RawClient.connected(node.config.port, "p0")
    await pub.send(Publish("q/0", b"hello"))
    assert await sub.recv() == Publish("q/0", b"hello")
    await sub.close()
    await pub.close()


async def test_qos1_puback_and_delivery(node: Node) -> None:
    sub = await RawClient.connected(node.config.port, "s1")
    await sub.subscribe(("q/1", 1))
    pub = await RawClient.connected(node.config.port, "p1")
    await pub.send(Publish("q/1", b"m", qos=1, packet_id=7))
    assert await pub.recv() == Puback(7)  # [MQTT-4.3.2-2]
    got = await sub.recv()
    assert got == Publish("q/1", b"m", qos=1, packet_id=1)  # ids start at 1 in a new session
    await sub.send(Puback(1))
    await sub.close()
    await pub.close()


async def test_qos2_exactly_once_with_dup_before_pubrel(node: Node) -> None:
    sub = await RawClient.connected(node.config.port, "s2")
    await sub.subscribe(("q/2", 2))
    pub = await RawClient.connected(node.config.port, "p2")
    await pub.send(Publish("q/2", b"once", qos=2, packet_id=9))
    assert await pub.recv() == Pubrec(9)
    await pub.send(Publish("q/2", b"once", qos=2, packet_id=9, dup=True))  # [MQTT-4.3.3-2]
    assert await pub.recv() == Pubrec(9)
    await pub.send(Pubrel(9))
    assert await pub.recv() == Pubcomp(9)
    got = await sub.recv()
    assert isinstance(got, Publish) and got.qos == 2 and got.payload == b"once"
    await sub.send(Pubrec(got.packet_id or 0))
    assert await sub.recv() == Pubrel(got.packet_id or 0)
    await sub.send(Pubcomp(got.packet_id or 0))
    await sub.expect_silence(1.0)  # delivered once only
    await sub.close()
    await pub.close()


async def test_outbound_qos_is_min_of_published_and_granted(node: Node) -> None:
    sub = await RawClient.connected(node.config.port, "smin")
    await sub.subscribe(("q/min", 1))
    pub = await RawClient.connected(node.config.port, "pmin")
    await pub.send(Publish("q/min", b"x", qos=2, packet_id=1))
    assert await pub.recv() == Pubrec(1)
    got = await sub.recv()
    assert isinstance(got, Publish) and got.qos == 1  # [MQTT-3.8.4-6]
    await sub.close()
    await pub.close()


async def test_own_puback_precedes_own_message(node: Node) -> None:
    client = await RawClient.connected(node.config.port, "echo")
    await client.subscribe(("echo/t", 1))
    await client.send(Publish("echo/t", b"me", qos=1, packet_id=3))
    assert await client.recv() == Puback(3)
    got = await client.recv()
    assert isinstance(got, Publish) and got.payload == b"me"
    await client.close()


async def test_publish_qos3_closes(node: Node) -> None:
    client = await RawClient.connected(node.config.port, "q3")
    await client.send(b"\x36\x05\x00\x01a\x00\x01")  # [MQTT-3.3.1-4]
    await client.expect_closed()


async def test_publish_with_wildcard_topic_closes(node: Node) -> None:
    client = await RawClient.connected(node.config.port, "wild")
    await client.send(encode(Publish("a/b", b"")).replace(b"a/b", b"a/+"))  # [MQTT-3.3.2-2]
    await client.expect_closed()


async def test_malformed_packet_closes_only_that_connection(node: Node) -> None:
    good = await RawClient.connected(node.config.port, "good")
    bad = await RawClient.connected(node.config.port, "bad")
    await bad.send(b"\x82\x00")  # SUBSCRIBE with no payload: [MQTT-3.8.3-3]
    await bad.expect_closed()
    await good.send(Pingreq())
    assert await good.recv() == Pingresp()
    await good.close()


async def test_inflight_resent_with_dup_on_resume(node: Node) -> None:
    sub = await RawClient.connected(node.config.port, "resume", clean_session=False)
    await sub.subscribe(("r/t", 1))
    pub = await RawClient.connected(node.config.port, "rp")
    await pub.send(Publish("r/t", b"one", qos=1, packet_id=1))
    assert await pub.recv() == Puback(1)
    first = await sub.recv()
    assert isinstance(first, Publish) and not first.dup
    await sub.close()  # never acknowledged
    back = await RawClient.open(node.config.port)
    await back.send(Connect("resume", clean_session=False))
    assert await back.recv() == Connack(True, 0)
    again = await back.recv()
    assert again == Publish("r/t", b"one", qos=1, packet_id=first.packet_id, dup=True)
    await back.send(Puback(first.packet_id or 0))  # [MQTT-4.4.0-1]
    await back.close()
    await pub.close()


async def test_offline_qos1_messages_queued_for_persistent_session(node: Node) -> None:
    sub = await RawClient.connected(node.config.port, "offline", clean_session=False)
    await sub.subscribe(("off/t", 1))
    await sub.send(Disconnect())
    pub = await RawClient.connected(node.config.port, "offpub")
    for i in range(3):
        await pub.send(Publish("off/t", str(i).encode(), qos=1, packet_id=i + 1))
        assert await pub.recv() == Puback(i + 1)
    partition = node.router.partition_for_topic("off/t")

    async def log_end() -> int:
        return (await node.log.high_watermarks([partition]))[partition]

    before = await log_end()
    await pub.send(Publish("off/t", b"q0", qos=0))

    async def q0_in_log() -> bool:
        return await log_end() == before + 1

    await eventually(q0_in_log, what="the QoS 0 message in the log before the client is back")
    back = await RawClient.open(node.config.port)
    await back.send(Connect("offline", clean_session=False))
    assert await back.recv() == Connack(True, 0)
    payloads = []
    for _ in range(3):
        got = await back.recv()
        assert isinstance(got, Publish)
        payloads.append(got.payload)
        await back.send(Puback(got.packet_id or 0))
    assert payloads == [b"0", b"1", b"2"]
    await back.expect_silence(0.5)  # QoS 0 is not queued for an absent client
    await back.close()
    await pub.close()


# -- SUBSCRIBE / UNSUBSCRIBE ----------------------------------------------------------------


async def test_suback_code_per_filter_and_failure_for_invalid(node: Node) -> None:
    client = await RawClient.connected(node.config.port, "multi")
    suback = await client.subscribe(("a/+", 0), ("b/#", 1), ("c/#/d", 2), ("d", 2))
    assert suback == Suback(1, (0, 1, 0x80, 2))  # [MQTT-3.8.4-5], [MQTT-3.9.3-2]
    await client.close()


async def test_overlapping_subscriptions_deliver_once_at_highest_qos(node: Node) -> None:
    sub = await RawClient.connected(node.config.port, "overlap")
    await sub.subscribe(("o/+", 0), ("o/#", 2))
    pub = await RawClient.connected(node.config.port, "opub")
    await pub.send(Publish("o/x", b"z", qos=2, packet_id=1))
    assert await pub.recv() == Pubrec(1)
    await pub.send(Pubrel(1))
    got = await sub.recv()
    assert isinstance(got, Publish) and got.qos == 2
    await sub.send(Pubrec(got.packet_id or 0))
    assert await sub.recv() == Pubrel(got.packet_id or 0)
    await sub.expect_silence(0.5)
    await sub.close()
    await pub.close()


async def test_unsubscribe_stops_delivery(node: Node) -> None:
    sub = await RawClient.connected(node.config.port, "unsub")
    await sub.subscribe(("u/t", 0))
    await sub.send(Unsubscribe(2, ("u/t", "never/subscribed")))
    assert await sub.recv() == Unsuback(2)  # [MQTT-3.10.4-4], [MQTT-3.10.4-5]
    pub = await RawClient.connected(node.config.port, "upub")
    await pub.send(Publish("u/t", b"gone", qos=1, packet_id=1))
    assert await pub.recv() == Puback(1)
    await sub.expect_silence(0.5)
    await sub.close()
    await pub.close()


async def test_a_topic_delivered_before_follows_each_later_subscription_change(
    node: Node,
) -> None:
    """The node keeps a topic's subscribers once matched: a new QoS, an unsubscribe and a new
    subscriber after the topic's first delivery each show at once."""
    sub = await RawClient.connected(node.config.port, "kept-sub")
    await sub.subscribe(("kept/t", 0))
    pub = await RawClient.connected(node.config.port, "kept-pub")
    await pub.send(Publish("kept/t", b"first", qos=1, packet_id=1))
    assert await pub.recv() == Puback(1)
    assert await sub.recv() == Publish("kept/t", b"first", qos=0)
    assert await sub.subscribe(("kept/+", 1), packet_id=2) == Suback(2, (1,))
    await pub.send(Publish("kept/t", b"second", qos=1, packet_id=2))
    assert await pub.recv() == Puback(2)
    assert await sub.recv() == Publish("kept/t", b"second", qos=1, packet_id=1)
    await sub.send(Puback(1))
    await sub.send(Unsubscribe(3, ("kept/t", "kept/+")))
    assert await sub.recv() == Unsuback(3)
    late = await RawClient.connected(node.config.port, "kept-late")
    await late.subscribe(("kept/#", 0))
    await pub.send(Publish("kept/t", b"third", qos=1, packet_id=3))
    assert await pub.recv() == Puback(3)
    assert await late.recv() == Publish("kept/t", b"third", qos=0)
    await sub.expect_silence(0.5)
    for c in (sub, pub, late):
        await c.close()


async def test_dollar_topics_not_matched_by_leading_wildcard(node: Node) -> None:
    sub = await RawClient.connected(node.config.port, "dollar")
    await sub.subscribe(("#", 0), ("+/x", 0))
    pub = await RawClient.connected(node.config.port, "dpub")
    await pub.send(Publish("$data/x", b"hidden", qos=1, packet_id=1))  # [MQTT-4.7.2-1]
    assert await pub.recv() == Puback(1)
    await sub.expect_silence(0.5)
    await sub.close()
    await pub.close()


# -- retained -------------------------------------------------------------------------------


async def test_retained_store_replace_clear(node: Node) -> None:
    pub = await RawClient.connected(node.config.port, "rpub")
    await pub.send(Publish("ret/a", b"v1", qos=1, retain=True, packet_id=1))
    assert await pub.recv() == Puback(1)
    await pub.send(Publish("ret/a", b"v2", qos=1, retain=True, packet_id=2))
    assert await pub.recv() == Puback(2)
    sub = await RawClient.connected(node.config.port, "rsub")
    assert await sub.subscribe(("ret/#", 1)) == Suback(1, (1,))  # SUBACK first
    got = await sub.recv()
    assert got == Publish("ret/a", b"v2", qos=1, retain=True, packet_id=1)  # [MQTT-3.3.1-8]
    await sub.send(Puback(1))
    await pub.send(Publish("ret/a", b"live", qos=0, retain=True))
    live = await sub.recv()
    assert isinstance(live, Publish) and live.payload == b"live" and not live.retain  # [-3.3.1-9]
    await pub.send(Publish("ret/a", b"", qos=1, retain=True, packet_id=3))  # [MQTT-3.3.1-10]
    assert await pub.recv() == Puback(3)
    await sub.recv()  # the empty message itself is forwarded
    late = await RawClient.connected(node.config.port, "rlate")
    await late.subscribe(("ret/#", 1))
    await late.expect_silence(0.5)
    for c in (pub, sub, late):
        await c.close()


async def test_resubscribe_replaces_qos_and_resends_retained(node: Node) -> None:
    pub = await RawClient.connected(node.config.port, "rs-pub")
    await pub.send(Publish("rs/t", b"keep", qos=1, retain=True, packet_id=1))
    assert await pub.recv() == Puback(1)
    sub = await RawClient.connected(node.config.port, "rs-sub")
    await sub.subscribe(("rs/t", 0))
    assert await sub.recv() == Publish("rs/t", b"keep", qos=0, retain=True)
    assert await sub.subscribe(("rs/t", 1), packet_id=2) == Suback(2, (1,))  # [MQTT-3.8.4-3]
    again = await sub.recv()
    assert isinstance(again, Publish) and again.retain and again.qos == 1
    await sub.close()
    await pub.close()


async def test_subscription_sees_nothing_published_before_it(node: Node) -> None:
    pub = await RawClient.connected(node.config.port, "before-pub")
    await pub.send(Publish("before/t", b"old", qos=1, packet_id=1))
    assert await pub.recv() == Puback(1)
    sub = await RawClient.connected(node.config.port, "before-sub")
    await sub.subscribe(("before/t", 1))
    await pub.send(Publish("before/t", b"new", qos=1, packet_id=2))
    assert await pub.recv() == Puback(2)
    got = await sub.recv()
    assert isinstance(got, Publish) and got.payload == b"new"
    await sub.expect_silence(0.5)
    await sub.close()
    await pub.close()
