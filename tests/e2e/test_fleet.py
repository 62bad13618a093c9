"""Fleet behaviour with real Kafka, real Redis and raw MQTT clients: the log is the queue for a
slow subscriber, a node killed under a live persistent subscriber loses nothing acknowledged (and
sends again at most about a second's worth), idle clients cost Redis nothing, and a storm of
CONNECTs larger than the Redis pool is absorbed, not refused."""

from __future__ import annotations

import asyncio
import contextlib
import signal

import pytest
import redis.asyncio as aioredis

from frontend.node import Node
from frontend.sessions.saver import SAVE_INTERVAL
from mqttcore.channel import Limits
from mqttcore.packets import Connack, Connect, Puback, Publish
from tests.conftest import free_port
from tests.e2e.conftest import NodeFactory, eventually, launch_node_process
from tests.e2e.rawmqtt import RawClient
from tests.e2e.test_resume_at_scale import http_json


async def publish_acked(client: RawClient, topic: str, payloads: range) -> None:
    """QoS 1 PUBLISHes of ``payloads`` (as decimal text), each PUBACKed before returning."""
    for n in payloads:
        await client.send(Publish(topic, b"%d" % n, 1, packet_id=n % 65535 + 1))
    acked = {(await client.recv(10)).packet_id for _ in payloads}  # type: ignore[attr-defined]
    assert acked == {n % 65535 + 1 for n in payloads}


async def take(client: RawClient, count: int, timeout: float = 15.0) -> list[int]:
    """Read ``count`` PUBLISHes, acknowledging each; their payloads as numbers."""
    got: list[int] = []
    while len(got) < count:
        packet = await client.recv(timeout)
        assert isinstance(packet, Publish) and packet.packet_id is not None, packet
        got.append(int(packet.payload))
        await client.send(Puback(packet.packet_id))
    return got


async def behind(start_node: NodeFactory, published: int) -> tuple[Node, RawClient, RawClient]:
    """A node (4 in flight, 10 queued per client), a subscriber of ``fan/#`` at QoS 1 that
    acknowledges nothing yet, and a publisher whose ``published`` QoS 1 messages (payloads 0,
    1, ...) put the subscriber behind: it reads on from the log."""
    node = await start_node(limits=Limits(max_inflight=4, max_queued=10), stats_host="127.0.0.1")
    slow = await RawClient.connected(node.config.port, "slow")
    await slow.subscribe(("fan/#", 1))
    publisher = await RawClient.connected(node.config.port, "fan-pub")
    await publish_acked(publisher, "fan/in", range(published))
    # PUBACKs come with Kafka's acknowledgement; the node reads the records back a moment later
    await eventually(
        lambda: node.dispatcher.backlog.clients, what="the subscriber falling behind", timeout=20
    )
    return node, slow, publisher


async def test_a_subscriber_whose_queue_fills_reads_on_from_the_log_and_loses_nothing(
    start_node: NodeFactory,
) -> None:
    node, slow, publisher = await behind(start_node, 2000)
    stats = await http_json(node.config.stats_port, "/stats")
    assert stats["clients_fell_behind"] == 1, stats
    got = await take(slow, 2000)
    assert got == list(range(2000))  # every one, in order, none twice
    await eventually(lambda: not node.dispatcher.backlog.clients, what="the subscriber live again")
    await publish_acked(publisher, "fan/in", range(2000, 2005))
    assert await take(slow, 5) == list(range(2000, 2005))
    await slow.expect_silence(0.3)
    stats = await http_json(node.config.stats_port, "/stats")
    assert stats["messages_dropped"] == 0 and stats["clients_fell_behind"] == 1, stats
    await slow.close()
    await publisher.close()


async def test_what_a_subscriber_behind_missed_is_read_from_the_log_once(
    start_node: NodeFactory,
) -> None:
    """Its only holder behind, the partition's live read is paused: the 3,000 records published
    meanwhile reach the subscriber through the catch-up alone, not through the live read too."""
    node, slow, publisher = await behind(start_node, 200)
    await eventually(lambda: node.log.reader.paused(), what="the live read paused", timeout=20)
    before = (await http_json(node.config.stats_port, "/stats"))["records_dispatched"]
    await publish_acked(publisher, "fan/in", range(200, 3200))
    stats = await http_json(node.config.stats_port, "/stats")
    assert stats["records_dispatched"] == before and stats["paused_partitions"], stats
    assert await take(slow, 3200) == list(range(3200))  # every one, in order, none twice
    await eventually(lambda: not node.dispatcher.backlog.clients, what="the subscriber live again")
    assert not node.log.reader.paused()
    await publish_acked(publisher, "fan/in", range(3200, 3205))
    assert await take(slow, 5) == list(range(3200, 3205))
    stats = await http_json(node.config.stats_port, "/stats")
    assert stats["records_dispatched"] < 1200, stats  # live: before the pause, at most a batch
    assert stats["messages_replayed"] >= 3000 and stats["messages_dropped"] == 0, stats
    await slow.close()
    await publisher.close()


@pytest.mark.fault
async def test_a_node_killed_under_a_live_persistent_subscriber_loses_nothing_acknowledged(
    start_node: NodeFactory, kafka_bootstrap: str, log_topic: str, redis_url: str, redis_prefix: str
) -> None:
    """What the node had stored of the session when it died (its last save, or its delivery
    checkpoint, each at most a second old) bounds what comes twice; nothing acknowledged is
    lost."""
    store = {"redis_url": redis_url, "redis_prefix": redis_prefix}
    survivor = await start_node(**store)
    port = free_port()
    options = ("--redis-url", redis_url, "--redis-prefix", redis_prefix)
    doomed = await launch_node_process("doomed", port, kafka_bootstrap, log_topic, *options)
    try:
        sub = await RawClient.connected(port, "meter", clean_session=False, keep_alive=60)
        await sub.subscribe(("crash/#", 1))
        publisher = await RawClient.connected(survivor.config.port, "crash-pub")
        before = 0
        for _ in range(16):  # 4 s of traffic the subscriber takes and acknowledges live
            await publish_acked(publisher, "crash/x", range(before, before + 50))
            assert await take(sub, 50) == list(range(before, before + 50))
            before += 50
            await asyncio.sleep(SAVE_INTERVAL / 4)
        doomed.send_signal(signal.SIGKILL)
        await doomed.wait()
        await publish_acked(publisher, "crash/x", range(before, before + 100))
        back = await RawClient.open(survivor.config.port)
        await back.send(Connect("meter", clean_session=False, keep_alive=60))
        assert await back.recv(15) == Connack(True, 0)
        got = await take(back, 100)  # at least the 100 published after the kill
        while (extra := await _maybe(back)) is not None:
            got.append(extra)
        assert set(range(before, before + 100)) <= set(got)
        replayed = [n for n in got if n < before]
        print(f"after the crash {len(replayed)} of {before} messages came again")
        # At most about a second's worth comes again, not all 800.
        assert len(replayed) <= 400, f"{len(replayed)} of {before} delivered before came again"
        await back.close()
        await publisher.close()
    finally:
        with contextlib.suppress(ProcessLookupError):
            doomed.kill()


async def _maybe(client: RawClient) -> int | None:
    """One more PUBLISH within half a second (acknowledged), or None."""
    try:
        packet = await client.recv(0.5)
    except TimeoutError:
        return None
    assert isinstance(packet, Publish) and packet.packet_id is not None, packet
    await client.send(Puback(packet.packet_id))
    return int(packet.payload)


async def test_idle_clients_cost_redis_nothing(
    start_node: NodeFactory, redis_url: str, redis_prefix: str
) -> None:
    node = await start_node(redis_url=redis_url, redis_prefix=redis_prefix)
    port = node.config.port

    async def idle(i: int) -> RawClient:
        client = await RawClient.connected(port, f"idle-{i}", clean_session=i % 2 == 0)
        await client.subscribe((f"fleet/{i}/cmd", 1))
        return client

    clients = [await idle(i) for i in range(200)]
    saved = node.sessions.saver
    await eventually(  # each persistent session stored once since it went live, then never
        lambda: saved.sessions_saved >= 100 and not saved.active, what="the sessions settled"
    )
    redis = aioredis.Redis.from_url(redis_url)
    try:
        first = (await redis.info("stats"))["total_commands_processed"]
        await asyncio.sleep(3 * SAVE_INTERVAL)  # the quiet is what is measured
        spent = (await redis.info("stats"))["total_commands_processed"] - first - 1
    finally:
        await redis.aclose()
    # The node's own heartbeat and sweeps only: nothing per client (200 would be 600 here).
    assert spent <= 15, f"{spent} Redis commands in 3 s for 200 idle clients"
    for client in clients:
        await client.close()


async def test_a_connect_storm_larger_than_the_redis_pool_is_absorbed(
    start_node: NodeFactory, redis_url: str, redis_prefix: str
) -> None:
    node: Node = await start_node(
        redis_url=redis_url, redis_prefix=redis_prefix, redis_connections=4
    )

    async def connect(i: int) -> int:
        client = await RawClient.open(node.config.port)
        try:
            await client.send(Connect(f"storm-{i}", clean_session=i % 2 == 0, keep_alive=60))
            connack = await client.recv(30)
            assert isinstance(connack, Connack)
            return connack.return_code
        finally:
            await client.close()

    codes = await asyncio.gather(*(connect(i) for i in range(2000)))
    assert codes == [0] * 2000
    assert node.sessions.opening_waited > 0  # the storm was bigger than the admission bound
