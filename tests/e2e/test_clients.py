"""End to end with real client libraries, through the real Kafka.

paho-mqtt, aiomqtt, the amqtt client and the mosquitto command-line clients, mixed in each test,
against front-end nodes running in the test's event loop.  Assertions are on what users observe:
payload bytes, QoS, the retain flag, order, and which client gets what.
"""

from __future__ import annotations

import asyncio
import random

import aiomqtt
import pytest

from frontend.node import Node
from tests.e2e.conftest import NodeFactory
from tests.e2e.realclients import (
    HOST,
    Clients,
    PahoClient,
    Received,
    aiomqtt_next,
    amqtt_next,
    mosquitto_pub,
)

pytestmark = pytest.mark.timeout(45)

BINARY = bytes(range(256)) * 4
"""Every byte value, NUL and invalid UTF-8 included."""


async def silent(queue: asyncio.Queue[Received], seconds: float = 0.5) -> None:
    """Nothing more arrives on a paho client's queue for ``seconds``."""
    await asyncio.sleep(seconds)
    assert queue.empty(), queue.get_nowait()


async def aiomqtt_silent(client: aiomqtt.Client, seconds: float = 0.5) -> None:
    try:
        extra = await aiomqtt_next(client, seconds)
    except TimeoutError:
        return
    raise AssertionError(f"unexpected {extra}")


# -- QoS and payload integrity --------------------------------------------------------------


async def test_every_qos_from_paho_reaches_aiomqtt_intact(node: Node, clients: Clients) -> None:
    sub = await clients.aiomqtt(node.config.port, "qos-sub")
    await sub.subscribe("qos/#", qos=2)
    pub = await clients.paho(node.config.port, "qos-pub")
    sent = {
        "qos/0": (BINARY, 0),
        "qos/1": (BINARY[::-1], 1),
        "qos/2": (b"\x00" * 100 + b"\xff", 2),
        "qos/empty": (b"", 1),
    }
    for topic, (payload, qos) in sent.items():
        await pub.publish(topic, payload, qos)
    got = {m.topic: m for m in [await aiomqtt_next(sub) for _ in sent]}
    assert got == {t: Received(t, p, q) for t, (p, q) in sent.items()}


async def test_amqtt_publishes_each_qos_to_mosquitto_sub(node: Node, clients: Clients) -> None:
    sub = await clients.mosquitto_sub(node.config.port, "am/#", qos=2)
    pub = await clients.amqtt(node.config.port, "am-pub")
    for qos in (0, 1, 2):
        await pub.publish(f"am/{qos}", BINARY[qos:] + bytes([qos]), qos=qos)
    got = {m.topic: m for m in await sub.messages(3)}
    assert got == {f"am/{q}": Received(f"am/{q}", BINARY[q:] + bytes([q]), q) for q in (0, 1, 2)}


async def test_delivery_qos_is_the_lower_of_published_and_granted(
    node: Node, clients: Clients
) -> None:
    at0 = await clients.amqtt(node.config.port, "down-0")
    assert await at0.subscribe([("down/t", 0)]) == [0]
    at1 = await clients.paho(node.config.port, "down-1")
    assert await at1.subscribe(("down/t", 1)) == [1]
    status, output = await mosquitto_pub(node.config.port, "-t", "down/t", "-q", "2", "-m", "x")
    assert status == 0, output
    assert await amqtt_next(at0) == Received("down/t", b"x", 0)  # [MQTT-3.8.4-6]
    assert await at1.next_message() == Received("down/t", b"x", 1)


async def test_qos2_stream_from_amqtt_arrives_exactly_once_at_paho(
    node: Node, clients: Clients
) -> None:
    sub = await clients.paho(node.config.port, "once-sub")
    await sub.subscribe(("once/t", 2))
    pub = await clients.amqtt(node.config.port, "once-pub")
    for i in range(20):
        await pub.publish("once/t", b"%d" % i, qos=2)
    got = [await sub.next_message() for _ in range(20)]
    assert sorted(int(m.payload) for m in got) == list(range(20))
    assert {m.qos for m in got} == {2}
    await silent(sub.messages)


async def test_empty_payload_from_mosquitto_pub(node: Node, clients: Clients) -> None:
    sub = await clients.amqtt(node.config.port, "empty-sub")
    await sub.subscribe([("empty/t", 1)])
    status, output = await mosquitto_pub(node.config.port, "-t", "empty/t", "-q", "1", "-n")
    assert status == 0, output
    assert await amqtt_next(sub) == Received("empty/t", b"", 1)


async def test_large_binary_payload_reaches_paho_and_mosquitto_sub(
    node: Node, clients: Clients
) -> None:
    payload = random.Random(7).randbytes(900_000)
    sub = await clients.paho(node.config.port, "big-sub")
    await sub.subscribe(("big/t", 1))
    mosq = await clients.mosquitto_sub(node.config.port, "big/t")
    pub = await clients.aiomqtt(node.config.port, "big-pub")
    await pub.publish("big/t", payload, qos=1)
    assert await sub.next_message() == Received("big/t", payload, 1)
    assert await mosq.next_message() == Received("big/t", payload, 1)


async def test_one_mebibyte_payload_is_delivered(node: Node, clients: Clients) -> None:
    payload = random.Random(8).randbytes(1 << 20)
    sub = await clients.aiomqtt(node.config.port, "mib-sub")
    await sub.subscribe("mib/t", qos=1)
    pub = await clients.paho(node.config.port, "mib-pub")
    acked = pub.publish_nowait("mib/t", payload, qos=1)
    dropped = asyncio.ensure_future(pub.disconnected.wait())
    await asyncio.wait([acked, dropped], timeout=10, return_when=asyncio.FIRST_COMPLETED)
    dropped.cancel()
    assert acked.done(), "no PUBACK: the node closed the publisher's connection"
    assert await aiomqtt_next(sub) == Received("mib/t", payload, 1)


# -- topic filters ----------------------------------------------------------------------------


async def test_wildcard_filters_across_libraries(node: Node, clients: Clients) -> None:
    port = node.config.port
    plus_score = await clients.aiomqtt(port, "w-aio")
    await plus_score.subscribe("sport/+/score", qos=1)
    hash_sport = await clients.amqtt(port, "w-amqtt")
    await hash_sport.subscribe([("sport/#", 1)])
    plus_tennis = await clients.paho(port, "w-paho")
    await plus_tennis.subscribe(("+/tennis/#", 1))
    plus_one = await clients.mosquitto_sub(port, "sport/+")
    topics = [
        "sport",
        "sport/",
        "sport/tennis",
        "sport/tennis/score",
        "sport/golf/score",
        "sport/tennis/player1/score",
        "news/tennis",
        "news/golf",
    ]
    pub = await clients.paho(port, "w-pub")
    for topic in topics:
        await pub.publish(topic, topic.encode(), 1)
    expected = {
        "aiomqtt sport/+/score": {"sport/tennis/score", "sport/golf/score"},
        "amqtt sport/#": {t for t in topics if t.startswith("sport")},  # [MQTT-4.7.1-2]
        "paho +/tennis/#": {
            "sport/tennis",
            "sport/tennis/score",
            "sport/tennis/player1/score",
            "news/tennis",
        },
        "mosquitto_sub sport/+": {"sport/", "sport/tennis"},
    }
    received = {
        "aiomqtt sport/+/score": [await aiomqtt_next(plus_score) for _ in range(2)],
        "amqtt sport/#": [await amqtt_next(hash_sport) for _ in range(6)],
        "paho +/tennis/#": [await plus_tennis.next_message() for _ in range(4)],
        "mosquitto_sub sport/+": await plus_one.messages(2),
    }
    assert {k: {m.topic for m in v} for k, v in received.items()} == expected
    assert all(m.payload == m.topic.encode() for v in received.values() for m in v)
    await aiomqtt_silent(plus_score, 0.3)
    await silent(plus_tennis.messages, 0.1)
    with pytest.raises(TimeoutError):
        await amqtt_next(hash_sport, 0.1)
    with pytest.raises(TimeoutError):
        await plus_one.next_message(0.1)


async def test_unsubscribe_stops_one_filter_only(node: Node, clients: Clients) -> None:
    sub = await clients.amqtt(node.config.port, "un-sub")
    assert await sub.subscribe([("un/a", 1), ("un/b", 1)]) == [1, 1]
    await sub.unsubscribe(["un/a"])
    pub = await clients.aiomqtt(node.config.port, "un-pub")
    await pub.publish("un/a", b"dropped", qos=1)
    await pub.publish("un/b", b"kept", qos=1)
    assert await amqtt_next(sub) == Received("un/b", b"kept", 1)
    with pytest.raises(TimeoutError):
        await amqtt_next(sub, 0.5)


# -- order ------------------------------------------------------------------------------------


async def test_per_topic_order_of_200_qos1_messages(node: Node, clients: Clients) -> None:
    aio = await clients.aiomqtt(node.config.port, "ord-aio")
    await aio.subscribe("ord/#", qos=1)
    mosq = await clients.mosquitto_sub(node.config.port, "ord/a")
    pub = await clients.paho(node.config.port, "ord-pub")
    acks = [pub.publish_nowait("ord/a" if i % 2 else "ord/b", b"%d" % i, qos=1) for i in range(200)]
    await asyncio.wait_for(asyncio.gather(*acks), 20)
    got = [await aiomqtt_next(aio) for _ in range(200)]
    by_topic = {t: [int(m.payload) for m in got if m.topic == t] for t in ("ord/a", "ord/b")}
    assert by_topic == {"ord/a": list(range(1, 200, 2)), "ord/b": list(range(0, 200, 2))}
    assert [int(m.payload) for m in await mosq.messages(100)] == list(range(1, 200, 2))


# -- retained ---------------------------------------------------------------------------------


async def test_retained_message_for_later_subscribers(node: Node, clients: Clients) -> None:
    port = node.config.port
    pub = await clients.paho(port, "ret-pub")
    await pub.publish("ret/door", b"open", qos=1, retain=True)
    late = await clients.mosquitto_sub(port, "ret/#")
    assert await late.next_message() == Received("ret/door", b"open", 1, retain=True)
    status, output = await mosquitto_pub(port, "-t", "ret/door", "-q", "1", "-r", "-m", "shut")
    assert status == 0, output
    # [MQTT-3.3.1-9] a live message is forwarded with RETAIN 0, even if it was published retained
    assert await late.next_message() == Received("ret/door", b"shut", 1, retain=False)
    aio = await clients.aiomqtt(port, "ret-aio")
    await aio.subscribe("ret/door", qos=0)
    assert await aiomqtt_next(aio) == Received("ret/door", b"shut", 0, retain=True)
    status, output = await mosquitto_pub(port, "-t", "ret/door", "-q", "1", "-r", "-n")
    assert status == 0, output  # [MQTT-3.3.1-10] an empty retained message clears it
    cleared = await clients.mosquitto_sub(port, "ret/#")
    with pytest.raises(TimeoutError):
        await cleared.next_message(0.5)


# -- wills ------------------------------------------------------------------------------------


async def test_will_of_a_dropped_paho_client_reaches_aiomqtt(node: Node, clients: Clients) -> None:
    watcher = await clients.aiomqtt(node.config.port, "will-watch")
    await watcher.subscribe("wills/#", qos=1)
    polite = await clients.paho(
        node.config.port, "will-polite", will=("wills/polite", b"never", 1, False)
    )
    await polite.close()  # DISCONNECT: the will is discarded [MQTT-3.1.2-10]
    dropped = await clients.paho(
        node.config.port, "will-drop", will=("wills/drop", b"lost \x00\xff", 1, False)
    )
    dropped.drop_connection()  # no DISCONNECT [MQTT-3.1.2-8]
    assert await aiomqtt_next(watcher) == Received("wills/drop", b"lost \x00\xff", 1)
    await aiomqtt_silent(watcher, 0.5)


async def test_retained_will_of_killed_mosquitto_sub(node: Node, clients: Clients) -> None:
    port = node.config.port
    watcher = await clients.amqtt(port, "kill-watch")
    await watcher.subscribe([("wills/mosq", 1)])
    will = ["--will-topic", "wills/mosq", "--will-payload", "gone", "--will-qos", "1"]
    victim = await clients.mosquitto_sub(port, "any/t", extra=[*will, "--will-retain"])
    victim.kill()  # SIGKILL
    assert await amqtt_next(watcher) == Received("wills/mosq", b"gone", 1)
    late = await clients.paho(port, "kill-late")
    await late.subscribe(("wills/mosq", 1))
    assert await late.next_message() == Received("wills/mosq", b"gone", 1, retain=True)


# -- sessions ---------------------------------------------------------------------------------


async def test_aiomqtt_persistent_session_gets_missed_messages_in_order(
    node: Node, clients: Clients
) -> None:
    port = node.config.port

    def keeper() -> aiomqtt.Client:
        return aiomqtt.Client(HOST, port, identifier="keeper", clean_session=False, timeout=10)

    async with keeper() as sub:
        await sub.subscribe("inbox/keeper", qos=1)
    pub = await clients.paho(port, "keeper-pub")
    for i in range(30):
        await pub.publish("inbox/keeper", b"%d" % i, qos=1)
    async with keeper() as sub:
        got = [await aiomqtt_next(sub) for _ in range(30)]
        assert got == [Received("inbox/keeper", b"%d" % i, 1) for i in range(30)]
        await pub.publish("inbox/keeper", b"live", qos=1)
        assert await aiomqtt_next(sub) == Received("inbox/keeper", b"live", 1)


async def test_paho_session_survives_a_dropped_connection(node: Node, clients: Clients) -> None:
    port = node.config.port
    first = await clients.paho(port, "dropper", clean_session=False)
    await first.subscribe(("inbox/dropper", 1))
    first.drop_connection()
    await asyncio.wait_for(first.disconnected.wait(), 5)
    for i in range(10):
        status, output = await mosquitto_pub(port, "-t", "inbox/dropper", "-q", "1", "-m", str(i))
        assert status == 0, output
    again = PahoClient(port, "dropper", clean_session=False)
    try:
        assert await again.connect() is True  # session present [MQTT-3.2.2-2]
        got = [await again.next_message() for _ in range(10)]
        assert [m.payload for m in got] == [b"%d" % i for i in range(10)]
    finally:
        await again.close()
    fresh = PahoClient(port, "dropper", clean_session=True)
    try:
        assert await fresh.connect() is False  # [MQTT-3.2.2-1]
        status, output = await mosquitto_pub(port, "-t", "inbox/dropper", "-q", "1", "-m", "x")
        assert status == 0, output
        await silent(fresh.messages)  # the clean session has no subscription
    finally:
        await fresh.close()


async def test_new_connection_with_same_id_takes_over(node: Node, clients: Clients) -> None:
    old = await clients.paho(node.config.port, "twin")
    new = await clients.paho(node.config.port, "twin")
    await asyncio.wait_for(old.disconnected.wait(), 5)  # [MQTT-3.1.4-2]
    await new.subscribe(("twin/t", 0))
    await new.publish("twin/t", b"still here", 0)
    assert await new.next_message() == Received("twin/t", b"still here", 0)


async def test_clients_without_id_get_distinct_ones(node: Node, clients: Clients) -> None:
    """mosquitto_sub without -i sends a zero-length client id; so does paho's default "" here.

    (``mosquitto_sub -i ''`` itself is refused by mosquitto_sub before connecting.)"""
    port = node.config.port
    first = await clients.mosquitto_sub(port, "anon/t")
    second = await clients.mosquitto_sub(port, "anon/t")
    paho_anon = await clients.paho(port, "")
    await paho_anon.subscribe(("anon/t", 1))
    status, output = await mosquitto_pub(port, "-t", "anon/t", "-q", "1", "-m", "hi")
    assert status == 0, output
    for sub in (first, second):  # both stay connected: no id collision [MQTT-3.1.3-6]
        assert await sub.next_message() == Received("anon/t", b"hi", 1)
    assert await paho_anon.next_message() == Received("anon/t", b"hi", 1)
    ids = {c.channel.client_id for c in node.connections}
    assert len(ids) == len(node.connections) == 3 and "" not in ids


# -- many clients -----------------------------------------------------------------------------


async def test_fan_out_to_50_clients_of_three_libraries(node: Node, clients: Clients) -> None:
    port = node.config.port
    aio = await asyncio.gather(*(clients.aiomqtt(port, f"fan-aio-{i}") for i in range(20)))
    amq = await asyncio.gather(*(clients.amqtt(port, f"fan-amq-{i}") for i in range(15)))
    pah = await asyncio.gather(*(clients.paho(port, f"fan-paho-{i}") for i in range(15)))
    await asyncio.gather(
        *(c.subscribe("fan/+", qos=1) for c in aio),
        *(c.subscribe([("fan/#", 1)]) for c in amq),
        *(c.subscribe(("fan/out", 1)) for c in pah),
    )
    status, output = await mosquitto_pub(port, "-t", "fan/out", "-q", "1", "-m", "all")
    assert status == 0, output
    expected = Received("fan/out", b"all", 1)
    got = await asyncio.gather(
        *(aiomqtt_next(c) for c in aio),
        *(amqtt_next(c) for c in amq),
        *(c.next_message() for c in pah),
    )
    assert got == [expected] * 50
    await asyncio.sleep(0.3)
    assert all(len(c.messages) == 0 for c in aio)
    assert all(c.messages.empty() for c in pah)


async def test_own_messages_come_back(node: Node, clients: Clients) -> None:
    port = node.config.port
    pah = await clients.paho(port, "echo-paho")
    await pah.subscribe(("echo/paho", 1))
    await pah.publish("echo/paho", b"p", 1)
    assert await pah.next_message() == Received("echo/paho", b"p", 1)
    aio = await clients.aiomqtt(port, "echo-aio")
    await aio.subscribe("echo/aio", qos=2)
    await aio.publish("echo/aio", b"a", qos=2)
    assert await aiomqtt_next(aio) == Received("echo/aio", b"a", 2)
    amq = await clients.amqtt(port, "echo-amqtt")
    await amq.subscribe([("echo/amqtt", 0)])
    await amq.publish("echo/amqtt", b"m", qos=0)
    assert await amqtt_next(amq) == Received("echo/amqtt", b"m", 0)


# -- several nodes ----------------------------------------------------------------------------


async def test_clients_on_two_nodes_exchange_messages(
    start_node: NodeFactory, clients: Clients
) -> None:
    one = await start_node("one")
    two = await start_node("two")
    sub_two = await clients.aiomqtt(two.config.port, "x-aio")
    await sub_two.subscribe("cross/#", qos=1)
    sub_one = await clients.mosquitto_sub(one.config.port, "cross/#")
    pub_one = await clients.paho(one.config.port, "x-pub1")
    pub_two = await clients.amqtt(two.config.port, "x-pub2")
    await pub_one.publish("cross/from-one", b"1", 1)
    await pub_two.publish("cross/from-two", b"2", qos=1)
    expected = {Received("cross/from-one", b"1", 1), Received("cross/from-two", b"2", 1)}
    assert {await aiomqtt_next(sub_two) for _ in range(2)} == expected
    assert set(await sub_one.messages(2)) == expected
