"""The node survives garbage: bad connections are closed, every other client carries on.

Random input comes from ``random.Random`` with fixed seeds, so a failure replays exactly.  Each
test also checks that nothing escaped the node's handlers: an exception out of an
``asyncio.Protocol`` callback reaches the loop's exception handler, which records it here.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import aiomqtt
import pytest

from frontend.node import Node
from mqttcore.codec import Decoder, encode
from mqttcore.errors import ProtocolError
from mqttcore.packets import Connack, Connect, Puback, Publish, Will
from tests.e2e.conftest import NodeFactory
from tests.e2e.rawmqtt import RawClient
from tests.e2e.realclients import (
    HOST,
    Clients,
    Received,
    aiomqtt_next,
    mosquitto_pub,
)

pytestmark = pytest.mark.timeout(45)

CONNECT_TIMEOUT = 1.0
"""The nodes here drop a connection that has not completed CONNECT within this."""

CLOSE_WITHIN = 5.0
"""A bad connection must be closed within this (connect timeout and 1.5 x keep-alive included)."""

INVALID_FIRST_BYTES = bytes([0x00, 0x0F, 0xF0, 0xFF, 0x80, 0x83, 0xA0, 0x60, 0x21, 0xC5, 0xE1])
"""Fixed-header first bytes no stream may start a packet with: reserved types 0 and 15
[MQTT-2.2.1], wrong flags on SUBSCRIBE, UNSUBSCRIBE, PUBREL, CONNACK, PINGREQ, DISCONNECT
[MQTT-2.2.2-1, MQTT-2.2.2-2]."""


@pytest.fixture
async def node(start_node: NodeFactory, loop_errors: list[dict[str, Any]]) -> Node:
    return await start_node(connect_timeout=CONNECT_TIMEOUT)


async def send_and_expect_close(port: int, data: bytes) -> None:
    """Send ``data`` on a new connection; the server must close it within CLOSE_WITHIN."""
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        async with asyncio.timeout(CLOSE_WITHIN):
            try:
                writer.write(data)
                await writer.drain()
                while await reader.read(65536):
                    pass
            except ConnectionError:
                pass  # reset by the server: closed as well
    finally:
        writer.close()


async def only_connections_left(node: Node, expected: int) -> None:
    """The node forgets closed connections (no leak): poll until ``expected`` remain."""
    async with asyncio.timeout(CLOSE_WITHIN):
        while len(node.connections) != expected:
            await asyncio.sleep(0.05)


async def ping_pong(client: aiomqtt.Client, rounds: int, topic: str) -> None:
    """A healthy aiomqtt client publishes to itself and gets each message back, in order."""
    for i in range(rounds):
        await client.publish(topic, b"%d" % i, qos=1)
        assert await aiomqtt_next(client) == Received(topic, b"%d" % i, 1)
        await asyncio.sleep(0.02)


# -- random bytes ----------------------------------------------------------------------------


def rejected_by_codec(data: bytes) -> bool:
    """True if ``data`` alone is a protocol error: undecodable, or not starting with CONNECT."""
    try:
        packets = Decoder().feed(data)
    except ProtocolError:
        return True
    return bool(packets) and not isinstance(packets[0], Connect)  # [MQTT-3.1.0-1]


async def send_and_hang_up(port: int, data: bytes) -> None:
    """For a stream that is only an incomplete packet: nothing to expect, just send it."""
    _, writer = await asyncio.open_connection(HOST, port)
    writer.write(data)
    await writer.drain()
    writer.close()


async def test_random_bytes_are_closed_while_a_healthy_client_carries_on(
    start_node: NodeFactory, clients: Clients, loop_errors: list[dict[str, Any]]
) -> None:
    # A long connect timeout: every close checked here is the node's answer to bad bytes.
    node = await start_node(connect_timeout=30.0)
    port = node.config.port
    healthy = await clients.aiomqtt(port, "healthy")
    await healthy.subscribe("health/t", qos=1)
    rng = random.Random(1883)
    streams = [rng.randbytes(rng.randint(1, 3000)) for _ in range(100)]
    # a CONNECT fixed header with a well-formed length and a random body
    streams += [b"\x10\x7f" + rng.randbytes(127) for _ in range(20)]
    bad = [data for data in streams if rejected_by_codec(data)]
    assert len(bad) > 100  # the rest look like the start of a packet: the node waits for more
    await asyncio.gather(
        ping_pong(healthy, 20, "health/t"),
        *(send_and_expect_close(port, data) for data in bad),
        *(send_and_hang_up(port, data) for data in streams if data not in bad),
    )
    await ping_pong(healthy, 3, "health/t")
    await only_connections_left(node, 1)
    assert node.services.protocol_errors >= len(bad)
    assert loop_errors == []


async def connect_then_garbage(port: int, i: int, garbage: bytes) -> None:
    """CONNECT with a will (and no keep-alive), CONNACK, then ``garbage``: the server closes."""
    will = Will(f"garbage/will/{i}", b"%d" % i, qos=1)
    client = await RawClient.connected(port, f"garbage-{i}", keep_alive=0, will=will)
    try:
        await client.send(garbage)
    except ConnectionError:
        return  # already reset by the server
    await client.expect_closed(CLOSE_WITHIN)


def invalid_packets(rng: random.Random, count: int) -> list[bytes]:
    """Random bytes behind a first byte that no packet may start with."""
    return [
        bytes([rng.choice(INVALID_FIRST_BYTES)]) + rng.randbytes(rng.randint(0, 500))
        for _ in range(count)
    ]


async def test_garbage_after_connect_closes_and_publishes_each_will(
    node: Node, clients: Clients, loop_errors: list[dict[str, Any]]
) -> None:
    port = node.config.port
    watcher = await clients.aiomqtt(port, "will-watch")
    await watcher.subscribe("garbage/will/+", qos=1)
    garbage = invalid_packets(random.Random(3883), 30)
    await asyncio.gather(*(connect_then_garbage(port, i, g) for i, g in enumerate(garbage)))
    wills = [await aiomqtt_next(watcher) for _ in garbage]  # [MQTT-3.1.2-8]
    assert sorted(wills, key=lambda m: int(m.payload)) == [
        Received(f"garbage/will/{i}", b"%d" % i, 1) for i in range(len(garbage))
    ]
    with pytest.raises(TimeoutError):
        await aiomqtt_next(watcher, 0.3)  # one will each
    await only_connections_left(node, 1)
    assert loop_errors == []


async def test_connect_and_garbage_in_one_segment_still_connects_and_publishes_will(
    node: Node, clients: Clients
) -> None:
    port = node.config.port
    watcher = await clients.aiomqtt(port, "seg-watch")
    await watcher.subscribe("seg/will", qos=1)
    will = Will("seg/will", b"seg", qos=1)
    reader, writer = await asyncio.open_connection(HOST, port)
    writer.write(encode(Connect("seg", will=will)) + b"\x00\x00")  # one write, one read
    answer = await asyncio.wait_for(reader.read(), 2.0)  # until the server closes
    writer.close()
    assert answer == encode(Connack(False, 0))  # the CONNECT was valid [MQTT-3.2.0-1]
    assert await aiomqtt_next(watcher, 2.0) == Received("seg/will", b"seg", 1)


# -- stalls ----------------------------------------------------------------------------------


async def test_half_a_packet_then_a_stall_holds_up_no_one(
    node: Node, clients: Clients, loop_errors: list[dict[str, Any]]
) -> None:
    port = node.config.port
    staller = await RawClient.connected(port, "staller")
    whole = encode(Publish("stall/t", b"s" * 200, qos=1, packet_id=5))
    await staller.send(whole[:60])  # the header and part of the body, then nothing
    half_connect = await RawClient.open(port)
    await half_connect.send(encode(Connect("half"))[:7])
    sub = await clients.aiomqtt(port, "stall-sub")
    await sub.subscribe("stall/#", qos=1)
    pub = await clients.paho(port, "stall-pub")
    for i in range(5):
        await pub.publish("stall/other", b"%d" % i, 1)
    got = [await aiomqtt_next(sub) for _ in range(5)]
    assert got == [Received("stall/other", b"%d" % i, 1) for i in range(5)]
    await half_connect.expect_closed(CONNECT_TIMEOUT + 2)  # the CONNECT never completed
    status, output = await mosquitto_pub(port, "-t", "stall/late", "-q", "1", "-m", "ok")
    assert status == 0, output  # new clients still get in
    assert await aiomqtt_next(sub) == Received("stall/late", b"ok", 1)
    await staller.send(whole[60:])  # the rest arrives: the packet completes
    assert await staller.recv() == Puback(5)
    assert await aiomqtt_next(sub) == Received("stall/t", b"s" * 200, 1)
    await staller.close()
    assert loop_errors == []


async def test_a_stalled_client_with_keep_alive_is_closed_with_its_will(
    node: Node, clients: Clients, loop_errors: list[dict[str, Any]]
) -> None:
    port = node.config.port
    watcher = await clients.paho(port, "ka-watch")
    await watcher.subscribe(("ka/will", 1))
    stalled = await RawClient.connected(
        port, "ka-stall", keep_alive=1, will=Will("ka/will", b"stalled", 1)
    )
    await stalled.send(encode(Publish("ka/x", b"y" * 50))[:10])
    await stalled.expect_closed(3.0)  # 1.5 x keep-alive [MQTT-3.1.2-24]
    assert await watcher.next_message() == Received("ka/will", b"stalled", 1)
    assert loop_errors == []


# -- oversized packets -----------------------------------------------------------------------


@pytest.fixture
async def small_node(start_node: NodeFactory, loop_errors: list[dict[str, Any]]) -> Node:
    return await start_node(max_packet_size=1024, connect_timeout=CONNECT_TIMEOUT)


def publish_of_size(size: int, topic: str = "big/t") -> bytes:
    """A QoS 1 PUBLISH (packet id 1) of exactly ``size`` bytes on the wire."""
    overhead = len(encode(Publish(topic, b"", qos=1, packet_id=1)))
    data = encode(Publish(topic, b"p" * (size - overhead - 1), qos=1, packet_id=1))
    assert len(data) == size, (len(data), size)  # a 2-byte remaining length for 128..16383
    return data


async def test_oversized_publish_is_refused_from_its_header(
    small_node: Node, clients: Clients, loop_errors: list[dict[str, Any]]
) -> None:
    port = small_node.config.port
    watcher = await clients.aiomqtt(port, "size-watch")
    await watcher.subscribe("big/#", qos=1)
    fits = await RawClient.connected(port, "fits")
    await fits.send(publish_of_size(1024))  # exactly the maximum: accepted
    assert await fits.recv() == Puback(1)
    assert (await aiomqtt_next(watcher)).topic == "big/t"
    big = await RawClient.connected(port, "big", will=Will("big/will", b"too big", 1))
    header = encode(Publish("big/t", b"x" * 10_000_000, qos=1, packet_id=1))[:600]
    await big.send(header)  # 600 of some 10 MB: the rest is never needed
    await big.expect_closed(2.0)  # [MQTT-2.2.3] over max_packet_size
    assert await aiomqtt_next(watcher) == Received("big/will", b"too big", 1)
    one_over = await RawClient.connected(port, "one-over")
    await one_over.send(publish_of_size(1025)[:100])
    await one_over.expect_closed(2.0)
    assert one_over.received == []  # no PUBACK
    await fits.close()
    assert loop_errors == []


async def test_oversized_connect_gets_no_connack(
    small_node: Node, loop_errors: list[dict[str, Any]]
) -> None:
    client = await RawClient.open(small_node.config.port)
    await client.send(encode(Connect("c", password=b"x" * 2000))[:200])
    await client.expect_closed(2.0)
    assert client.received == []
    assert loop_errors == []


async def test_real_clients_over_the_limit_are_disconnected_others_not(
    small_node: Node, clients: Clients, loop_errors: list[dict[str, Any]]
) -> None:
    port = small_node.config.port
    sub = await clients.aiomqtt(port, "lim-sub")
    await sub.subscribe("lim/#", qos=1)
    pub = await clients.paho(port, "lim-paho")
    await pub.publish("lim/ok", b"k" * 900, 1)
    assert await aiomqtt_next(sub) == Received("lim/ok", b"k" * 900, 1)
    pub.publish_nowait("lim/big", b"b" * 2000, 1)
    await asyncio.wait_for(pub.disconnected.wait(), 5)
    status, _ = await mosquitto_pub(port, "-t", "lim/big", "-q", "1", "-m", "m" * 1100)
    assert status != 0  # mosquitto_pub reports the lost connection
    status, output = await mosquitto_pub(port, "-t", "lim/small", "-q", "1", "-m", "fine")
    assert status == 0, output
    assert await aiomqtt_next(sub) == Received("lim/small", b"fine", 1)  # no big one before it
    assert loop_errors == []
