"""Catch-up at scale and under a tight queue bound: many persistent sessions resuming on one node at
once each get what they are owed without the node growing a thread (or a consumer) per session,
and a session owed more than its queue holds gets all of it, nothing dropped.

The node runs as its own process (``python -m frontend``) with real Kafka and Redis, so its
thread count (``/proc/<pid>/task``: Python threads and librdkafka's native ones alike) is the
node's alone.  Catch-up reads go through the node's one catch-up consumer, whatever the number
of sessions (``router.catchup``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os

from mqttcore.channel import Limits
from mqttcore.packets import Connack, Connect, Disconnect, Puback, Publish
from tests.conftest import free_port
from tests.e2e.conftest import NodeFactory, launch_node_process
from tests.e2e.rawmqtt import RawClient

SESSIONS = 500
OWED = 2
"""QoS 1 messages each session is owed when it comes back."""


def threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


async def in_batches(work: list[asyncio.Future[object]] | list[object], size: int = 100) -> None:
    for start in range(0, len(work), size):
        await asyncio.gather(*work[start : start + size])  # type: ignore[arg-type]


async def subscribe_and_leave(port: int, i: int) -> None:
    client = await RawClient.connected(port, f"fleet-{i}", clean_session=False)
    await client.subscribe((f"fleet/{i}/cmd", 1))
    await client.send(Disconnect())
    await client.close()


async def publish_owed(port: int) -> None:
    """``OWED`` QoS 1 commands to every device, each acknowledged by the node (durable)."""
    publisher = await RawClient.connected(port, "dispatcher")
    packet_id = 0
    for round_ in range(OWED):
        for i in range(SESSIONS):
            packet_id += 1
            await publisher.send(Publish(f"fleet/{i}/cmd", b"%d" % round_, 1, packet_id=packet_id))
    acked = {p.packet_id for p in [await publisher.recv(10) for _ in range(packet_id)]}
    assert acked == set(range(1, packet_id + 1))
    await publisher.close()


async def come_back(port: int, i: int) -> list[bytes]:
    """Reconnect device ``i`` and take what it is owed, acknowledging each message."""
    client = await RawClient.open(port)
    try:
        await client.send(Connect(f"fleet-{i}", clean_session=False, keep_alive=60))
        connack = await client.recv(30)
        assert isinstance(connack, Connack) and connack.return_code == 0, connack
        assert connack.session_present
        got: list[bytes] = []
        while len(got) < OWED:
            packet = await client.recv(30)
            assert isinstance(packet, Publish) and packet.topic == f"fleet/{i}/cmd", packet
            got.append(packet.payload)
            assert packet.packet_id is not None
            await client.send(Puback(packet.packet_id))
        await client.expect_silence(0.2)  # nothing twice
        return got
    finally:
        await client.close()


async def test_500_persistent_sessions_resume_at_once_with_a_flat_thread_count(
    kafka_bootstrap: str, log_topic: str, redis_url: str, redis_prefix: str
) -> None:
    port = free_port()
    store = ("--redis-url", redis_url, "--redis-prefix", redis_prefix)
    node = await launch_node_process("bulk", port, kafka_bootstrap, log_topic, *store)
    try:
        await in_batches([subscribe_and_leave(port, i) for i in range(SESSIONS)])
        await publish_owed(port)
        before = threads(node.pid)
        peak = before
        resumed = asyncio.gather(*(come_back(port, i) for i in range(SESSIONS)))
        while not resumed.done():
            peak = max(peak, threads(node.pid))
            await asyncio.sleep(0.02)
        owed = await resumed
        assert owed == [[b"%d" % r for r in range(OWED)] for _ in range(SESSIONS)]
        print(f"node threads: {before} before, {peak} at most while {SESSIONS} sessions resumed")
        assert peak <= before + 1, f"threads {before} -> {peak} while sessions resumed"
    finally:
        node.terminate()
        with contextlib.suppress(ProcessLookupError):
            await asyncio.wait_for(node.wait(), 30)


async def test_catch_up_obeys_the_queue_bound_without_dropping_and_stats_say_so(
    start_node: NodeFactory, redis_url: str, redis_prefix: str
) -> None:
    """A session owed 300 QoS 1 messages, on a node whose clients may queue 5: it gets every
    one, in order; nothing is counted as dropped, and /stats shows the replay."""
    limits = Limits(max_inflight=2, max_queued=5)
    store = {"redis_url": redis_url, "redis_prefix": redis_prefix}
    node = await start_node(limits=limits, stats_host="127.0.0.1", **store)
    sub = await RawClient.connected(node.config.port, "slowpoke", clean_session=False)
    await sub.subscribe(("owed/#", 1))
    await sub.send(Disconnect())
    await sub.close()
    pub = await RawClient.connected(node.config.port, "owed-pub")
    for i in range(300):
        await pub.send(Publish(f"owed/{i % 7}", b"%d" % i, 1, packet_id=i + 1))
    assert {(await pub.recv()).packet_id for _ in range(300)} == set(range(1, 301))  # type: ignore[attr-defined]
    back = await RawClient.open(node.config.port)
    await back.send(Connect("slowpoke", clean_session=False))
    assert await back.recv() == Connack(True, 0)
    got: list[int] = []
    while len(got) < 300:
        packet = await back.recv(10)
        assert isinstance(packet, Publish) and packet.packet_id is not None
        got.append(int(packet.payload))
        await back.send(Puback(packet.packet_id))
    by_topic = {t: [i for i in got if i % 7 == t] for t in range(7)}
    assert sorted(got) == list(range(300))
    assert all(order == sorted(order) for order in by_topic.values())  # log order per topic
    stats = await http_json(node.config.stats_port, "/stats")
    assert stats["messages_dropped"] == 0 and stats["messages_replayed"] == 300
    await back.close()
    await pub.close()


async def http_json(port: int, path: str) -> dict[str, object]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.0\r\n\r\n".encode())
    body = (await reader.read()).split(b"\r\n\r\n", 1)[1]
    writer.close()
    return json.loads(body)  # type: ignore[no-any-return]
