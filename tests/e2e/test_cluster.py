"""Several front-ends on one log: interest routing, dispatch, no loops, shared subscriptions.

Nodes run in the test's event loop (``start_node``) except where a node must die for real; they
share one fresh log topic of ``PARTITIONS`` partitions in the real Kafka.
"""

from __future__ import annotations

import asyncio
import signal
from collections import Counter

import pytest

from frontend.node import Node
from mqttcore.channel import Limits
from mqttcore.packets import Puback, Pubcomp, Publish, Pubrec, Pubrel
from router.partitioner import Router
from tests.conftest import free_port
from tests.e2e.conftest import PARTITIONS, NodeFactory, eventually, launch_node_process
from tests.e2e.rawmqtt import RawClient


async def publish_qos1(
    client: RawClient, topic: str, payloads: list[bytes], first_id: int = 1
) -> None:
    for i, payload in enumerate(payloads):
        await client.send(Publish(topic, payload, qos=1, packet_id=first_id + i))
    for i in range(len(payloads)):
        assert await client.recv() == Puback(first_id + i)


async def receive(client: RawClient, count: int, timeout: float = 10.0) -> list[Publish]:
    got: list[Publish] = []
    for _ in range(count):
        packet = await client.recv(timeout)
        assert isinstance(packet, Publish), packet
        if packet.qos == 1:
            await client.send(Puback(packet.packet_id or 0))
        got.append(packet)
    return got


def topics_on(partition: int, count: int, prefix: str = "dev") -> list[str]:
    """``count`` topics ``<prefix>/<n>/t`` whose routing key hashes to ``partition``."""
    router = Router(PARTITIONS, 2)
    found, n = [], 0
    while len(found) < count:
        topic = f"{prefix}/{n}/t"
        if router.partition_for_topic(topic) == partition:
            found.append(topic)
        n += 1
    return found


async def test_publish_on_one_node_reaches_subscribers_on_others(start_node: NodeFactory) -> None:
    n1, n2, n3 = [await start_node() for _ in range(3)]
    s2 = await RawClient.connected(n2.config.port, "s2")
    s3 = await RawClient.connected(n3.config.port, "s3")
    await s2.subscribe(("x/+/temp", 2))
    await s3.subscribe(("x/#", 1))
    pub = await RawClient.connected(n1.config.port, "pub")
    await pub.send(Publish("x/a/temp", b"q0", qos=0))
    await publish_qos1(pub, "x/b/temp", [b"q1"])
    await pub.send(Publish("x/c/temp", b"q2", qos=2, packet_id=50))
    assert await pub.recv() == Pubrec(50)
    await pub.send(Pubrel(50))
    assert await pub.recv() == Pubcomp(50)
    got2 = [await s2.recv() for _ in range(3)]  # three topics: no order across them
    assert sorted((p.payload, p.qos) for p in got2 if isinstance(p, Publish)) == [
        (b"q0", 0),
        (b"q1", 1),
        (b"q2", 2),
    ]
    got3 = [await s3.recv() for _ in range(3)]
    assert sorted((p.payload, p.qos) for p in got3 if isinstance(p, Publish)) == [
        (b"q0", 0),
        (b"q1", 1),
        (b"q2", 1),
    ]
    for c in (s2, s3, pub):
        await c.close()


async def test_per_topic_order_across_nodes(start_node: NodeFactory) -> None:
    n1, n2 = await start_node(), await start_node()
    sub = await RawClient.connected(n2.config.port, "order-sub")
    await sub.subscribe(("order/t", 1))
    pub = await RawClient.connected(n1.config.port, "order-pub")
    payloads = [str(i).encode() for i in range(300)]
    sender = asyncio.create_task(publish_qos1(pub, "order/t", payloads))
    got = await receive(sub, 300)
    await sender
    assert [p.payload for p in got] == payloads
    await sub.close()
    await pub.close()


async def test_no_duplicates_and_no_loops_with_subscribers_everywhere(
    start_node: NodeFactory,
) -> None:
    nodes = [await start_node() for _ in range(3)]
    subs = []
    for i, node in enumerate(nodes):
        sub = await RawClient.connected(node.config.port, f"loop-sub{i}")
        await sub.subscribe(("loop/#", 1))
        subs.append(sub)
    pubs = [await RawClient.connected(n.config.port, f"loop-pub{i}") for i, n in enumerate(nodes)]
    per_node = 20
    for i, pub in enumerate(pubs):
        await publish_qos1(pub, f"loop/{i}", [f"{i}-{k}".encode() for k in range(per_node)])
    expected = sorted(f"{i}-{k}".encode() for i in range(3) for k in range(per_node))
    for sub in subs:
        got = await receive(sub, 3 * per_node)
        assert sorted(p.payload for p in got) == expected  # each exactly once
        await sub.expect_silence(0.5)
    # Each message was written to the log once, by the node it entered: nothing re-produced.
    assert sum(n.log.produced for n in nodes) == 3 * per_node
    assert [n.log.produced for n in nodes] == [per_node] * 3
    for c in subs + pubs:
        await c.close()


async def test_idle_node_fetches_nothing(start_node: NodeFactory) -> None:
    busy, idle = await start_node(), await start_node()
    sub = await RawClient.connected(busy.config.port, "busy-sub")
    await sub.subscribe(("#", 0))
    pub = await RawClient.connected(idle.config.port, "idle-pub")
    await publish_qos1(pub, "idle/t", [b"a", b"b"])
    await receive(sub, 2)
    assert idle.log.reader.assigned() == []
    assert idle.log.reader.fetched_records == 0 and idle.log.reader.fetched_bytes == 0
    assert idle.log.reader.positions() == {}
    await sub.close()
    await pub.close()


async def test_node_reads_only_the_partitions_its_subscribers_need(
    start_node: NodeFactory,
) -> None:
    reader, writer = await start_node(), await start_node()
    wanted = topics_on(1, 2)
    sub = await RawClient.connected(reader.config.port, "k-sub")
    await sub.subscribe(*[(t, 1) for t in wanted])
    pub = await RawClient.connected(writer.config.port, "k-pub")
    for p in range(PARTITIONS):  # traffic on every partition
        for topic in topics_on(p, 2):
            await publish_qos1(pub, topic, [b"x" * 100])
    got = await receive(sub, 2)
    assert sorted(p.topic for p in got) == sorted(wanted)
    await sub.expect_silence(0.5)
    assert reader.log.reader.assigned() == [1]
    positions = reader.log.reader.positions()
    assert list(positions) == [1]
    assert reader.log.reader.fetched_records == 2  # the two records of partition 1 only
    await sub.close()
    await pub.close()


async def test_unsubscribe_and_disconnect_release_partitions(start_node: NodeFactory) -> None:
    node = await start_node()
    topic_a, topic_b = topics_on(2, 1)[0], topics_on(3, 1)[0]
    c1 = await RawClient.connected(node.config.port, "rel1")
    c2 = await RawClient.connected(node.config.port, "rel2")
    await c1.subscribe((topic_a, 0))
    await c2.subscribe((topic_a, 0), (topic_b, 0))
    assert node.log.reader.assigned() == [2, 3]
    await c1.close()
    await eventually(
        lambda: {c.channel.client_id for c in node.connections} == {"rel2"},
        what="the node to drop rel1's connection",
    )
    assert node.log.reader.assigned() == [2, 3]  # c2 still needs both
    from mqttcore.packets import Unsuback, Unsubscribe

    await c2.send(Unsubscribe(5, (topic_b,)))
    assert await c2.recv() == Unsuback(5)
    assert node.log.reader.assigned() == [2]
    await c2.close()
    await eventually(lambda: not node.connections, what="the node to drop rel2's connection")
    assert node.log.reader.assigned() == []


async def test_nodes_joining_and_leaving_under_traffic(start_node: NodeFactory) -> None:
    n1, n2, n3 = await start_node(), await start_node(), await start_node()
    steady = await RawClient.connected(n2.config.port, "steady")
    await steady.subscribe(("churn/t", 1))
    leaver = await RawClient.connected(n3.config.port, "leaver")
    await leaver.subscribe(("churn/t", 1))
    pub = await RawClient.connected(n1.config.port, "churn-pub")
    total = 200
    acked = 0

    async def publish_all() -> None:
        nonlocal acked
        for i in range(total):
            await publish_qos1(pub, "churn/t", [str(i).encode()], first_id=i % 60000 + 1)
            acked += 1
            await asyncio.sleep(0.005)

    sender = asyncio.create_task(publish_all())
    await eventually(lambda: acked >= total // 5, what="the first fifth of the traffic published")
    await n3.stop()  # a node leaves (its clients with it)
    n4 = await start_node()  # another joins
    joiner = await RawClient.connected(n4.config.port, "joiner")
    await joiner.subscribe(("churn/t", 1))
    got = await receive(steady, total, timeout=15)
    await sender
    assert [p.payload for p in got] == [str(i).encode() for i in range(total)]
    late = []
    while True:
        try:
            packet = await joiner.recv(timeout=1.0)
        except TimeoutError:
            break
        assert isinstance(packet, Publish)
        await joiner.send(Puback(packet.packet_id or 0))
        late.append(packet)
    payloads = [int(p.payload) for p in late if isinstance(p, Publish)]
    assert payloads and payloads == list(range(payloads[0], total))  # no gap after joining
    for c in (steady, pub, joiner):
        await c.close()


async def test_killed_node_restarts_and_serves(
    kafka_bootstrap: str, log_topic: str, start_node: NodeFactory
) -> None:
    other = await start_node()
    port = free_port()

    async def launch() -> asyncio.subprocess.Process:
        return await launch_node_process("victim", port, kafka_bootstrap, log_topic)

    proc = await launch()
    try:
        sub = await RawClient.connected(port, "victim-sub")
        await sub.subscribe(("kill/t", 1))
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        await sub.expect_closed()
        proc = await launch()
        sub = await RawClient.connected(port, "victim-sub")
        await sub.subscribe(("kill/t", 1))
        pub = await RawClient.connected(other.config.port, "kill-pub")
        await publish_qos1(pub, "kill/t", [b"after restart"])
        assert [p.payload for p in await receive(sub, 1)] == [b"after restart"]
        await sub.close()
        await pub.close()
    finally:
        proc.terminate()
        await proc.wait()


async def wait_for_share_balance(nodes: list[Node], group: str, topic_filter: str) -> None:
    """Until the group's leases have spread the log's partitions over every node."""
    for _ in range(200):
        groups = [n.dispatcher.share_group(group, topic_filter) for n in nodes]
        assigned = [set(g.positions) if g else set() for g in groups]
        if (
            all(assigned)
            and set().union(*assigned) == set(range(PARTITIONS))
            and sum(map(len, assigned)) == PARTITIONS
        ):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"share group never balanced: {assigned}")


async def test_shared_subscription_delivers_each_message_once_across_nodes(
    start_node: NodeFactory, redis_url: str, redis_prefix: str
) -> None:
    nodes = [await start_node(redis_url=redis_url, redis_prefix=redis_prefix) for _ in range(3)]
    members = []
    for i, node in enumerate(nodes):
        for k in range(2 if i == 0 else 1):
            member = await RawClient.connected(node.config.port, f"member{i}{k}")
            await member.subscribe(("$share/workers/jobs/+/run", 1))
            members.append(member)
    await wait_for_share_balance(nodes, "workers", "jobs/+/run")
    pub = await RawClient.connected(nodes[1].config.port, "jobs-pub")
    total = 120
    for i in range(total):
        await publish_qos1(pub, f"jobs/{i}/run", [str(i).encode()], first_id=i + 1)
    seen: Counter[bytes] = Counter()
    per_member = []
    for member in members:
        mine = []
        while True:
            try:
                packet = await member.recv(timeout=1.5)
            except TimeoutError:
                break
            assert isinstance(packet, Publish)
            await member.send(Puback(packet.packet_id or 0))
            mine.append(packet.payload)
        per_member.append(len(mine))
        seen.update(mine)
    assert sorted(seen) == sorted(str(i).encode() for i in range(total))
    assert set(seen.values()) == {1}  # exactly once across the cluster
    by_node = [per_member[0] + per_member[1], per_member[2], per_member[3]]
    assert all(by_node), by_node  # every node's members took a share
    assert per_member[0] and per_member[1]  # round-robin among one node's members
    for c in [*members, pub]:
        await c.close()


async def test_shared_member_leaving_loses_nothing(
    start_node: NodeFactory, redis_url: str, redis_prefix: str
) -> None:
    nodes = [await start_node(redis_url=redis_url, redis_prefix=redis_prefix) for _ in range(2)]
    stay = await RawClient.connected(nodes[0].config.port, "stay")
    await stay.subscribe(("$share/g2/work/+/x", 1))
    go = await RawClient.connected(nodes[1].config.port, "go")
    await go.subscribe(("$share/g2/work/+/x", 1))
    await wait_for_share_balance(nodes, "g2", "work/+/x")
    pub = await RawClient.connected(nodes[0].config.port, "g2-pub")
    total = 60
    for i in range(total):
        await publish_qos1(pub, f"work/{i}/x", [str(i).encode()], first_id=i + 1)
    await eventually(
        lambda: sum(n.dispatcher.counters.messages_delivered for n in nodes) >= total,
        what=f"all {total} messages handed to a member",
    )
    await go.close()  # leaves without acknowledging anything it got
    received: set[bytes] = set()
    while True:
        try:
            packet = await stay.recv(timeout=8.0)
        except TimeoutError:
            break
        assert isinstance(packet, Publish)
        await stay.send(Puback(packet.packet_id or 0))
        received.add(packet.payload)
        if len(received) == total:
            break
    assert received == {str(i).encode() for i in range(total)}
    await stay.close()
    await pub.close()


@pytest.mark.parametrize("count", [3])
async def test_stats_endpoint_reports_counters(start_node: NodeFactory, count: int) -> None:
    node = await start_node(stats_host="127.0.0.1")
    sub = await RawClient.connected(node.config.port, "stats-sub")
    await sub.subscribe(("stats/t", 0))
    pub = await RawClient.connected(node.config.port, "stats-pub")
    await publish_qos1(pub, "stats/t", [b"s"] * count)
    await receive(sub, count)
    reader, writer = await asyncio.open_connection("127.0.0.1", node.config.stats_port)
    writer.write(b"GET /stats HTTP/1.0\r\n\r\n")
    response = await reader.read()
    writer.close()
    import json

    body = json.loads(response.split(b"\r\n\r\n", 1)[1])
    partition = Router(PARTITIONS, 2).partition_for_topic("stats/t")
    assert body["assigned_partitions"] == [partition]
    assert body["records_fetched"] == count and body["messages_delivered"] == count
    assert body["consumer_lag"] == {str(partition): 0}
    await sub.close()
    await pub.close()


async def test_slow_subscriber_drops_qos0_and_never_stalls_others(start_node: NodeFactory) -> None:
    node = await start_node(limits=Limits(max_queued=50))
    stalled = await RawClient.connected(node.config.port, "stalled")
    await stalled.subscribe(("flood/t", 0))
    fast = await RawClient.connected(node.config.port, "fast")
    await fast.subscribe(("flood/t", 0))
    pub = await RawClient.connected(node.config.port, "flooder")
    payload = b"x" * 65536
    count = 300  # ~20 MB: more than the stalled client's buffers and bounded queue hold

    async def publish_paced() -> None:  # a rate a healthy client keeps up with
        for _ in range(count):
            await pub.send(Publish("flood/t", payload))
            await asyncio.sleep(0.005)

    sender = asyncio.create_task(publish_paced())
    got = 0
    while got < count:
        packet = await fast.recv(timeout=10)
        assert isinstance(packet, Publish) and packet.payload == payload
        got += 1
    await sender
    assert node.dispatcher.counters.messages_dropped > 0  # the stalled client's QoS 0, counted
    for c in (stalled, fast, pub):
        await c.close()
