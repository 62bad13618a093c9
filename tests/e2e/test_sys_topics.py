"""``$SYS`` as a client sees it (``frontend.systree``): Mosquitto's names, each node's figures
under ``$SYS/brokers/<node id>/``, the cluster's totals under ``$SYS/broker/`` on every node with
no master, a dead node dropping out of them, and no client publishing into ``$SYS``.

Nodes report every ``INTERVAL`` seconds and share Redis (the per-node reports are retained
there, so a new subscriber anywhere gets them at once) and a fresh log topic in the real Kafka;
``mosquitto_sub`` reaches them through HAProxy, as a user's does.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

from frontend.node import Node
from frontend.systree import STALE_AFTER
from headwater.services.haproxy import LocalHAProxy, Server
from mqttcore.packets import Puback, Publish
from router.partitioner import Router
from tests.conftest import free_port
from tests.e2e.conftest import PARTITIONS, NodeFactory, eventually, launch_node_process
from tests.e2e.rawmqtt import RawClient
from tests.e2e.realclients import MosquittoSub, Received

INTERVAL = 0.5


async def sys_node(start_node: NodeFactory, redis_url: str, redis_prefix: str) -> Node:
    return await start_node(redis_url=redis_url, redis_prefix=redis_prefix, sys_interval=INTERVAL)


class Watch:
    """What a raw subscriber has received so far, read in the background: topic -> payloads."""

    def __init__(self, client: RawClient) -> None:
        self.client = client
        self.seen: dict[str, list[bytes]] = {}
        self._task = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        while True:
            try:
                packet = await self.client.recv(timeout=60)
            except ConnectionError:
                return
            if isinstance(packet, Publish):
                if packet.qos:
                    await self.client.send(Puback(packet.packet_id or 0))
                self.seen.setdefault(packet.topic, []).append(packet.payload)

    def last(self, topic: str) -> bytes | None:
        values = self.seen.get(topic)
        return values[-1] if values else None

    async def close(self) -> None:
        self._task.cancel()
        await self.client.close()


async def watching(port: int, client_id: str, *filters: str) -> Watch:
    client = await RawClient.connected(port, client_id)
    await client.subscribe(*((f, 0) for f in filters))
    return Watch(client)


async def until(sub: MosquittoSub, payload: bytes) -> Received:
    """The first message ``sub`` receives (from now) with ``payload``."""
    message = await sub.next_message()
    while message.payload != payload:
        message = await sub.next_message()
    return message


async def test_mosquitto_sub_through_haproxy_sees_the_cluster_total_on_any_node(
    start_node: NodeFactory, redis_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    nodes = [await sys_node(start_node, redis_url, redis_prefix) for _ in range(2)]
    servers = [Server(n.config.node_id, "127.0.0.1", n.config.port) for n in nodes]
    haproxy = LocalHAProxy(tmp_path, free_port(), servers)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, haproxy.start)
    devices = [await RawClient.connected(nodes[0].config.port, f"dev{i}") for i in range(2)]
    topic = "$SYS/broker/clients/connected"
    subs = [await MosquittoSub.start(haproxy.port, topic, qos=0) for _ in range(2)]
    try:
        assert [n.dispatcher.client_count for n in nodes] == [3, 1]  # leastconn: one sub each
        for sub in subs:  # two devices and the two mosquitto_sub, wherever each landed
            assert (await until(sub, b"4")).topic == topic
        await devices[0].close()
        for sub in subs:
            assert not (await until(sub, b"3")).retain  # a change, not a new subscriber's state
    finally:
        for sub in subs:
            await sub.close()
        await loop.run_in_executor(None, haproxy.stop)
    await devices[1].close()


async def test_each_nodes_own_figures_version_and_uptime(
    start_node: NodeFactory, redis_url: str, redis_prefix: str
) -> None:
    n1 = await sys_node(start_node, redis_url, redis_prefix)
    n2 = await sys_node(start_node, redis_url, redis_prefix)
    devices = [await RawClient.connected(n1.config.port, f"d{i}") for i in range(3)]
    watch = await watching(n2.config.port, "ops", "$SYS/brokers/+/clients/connected")
    await eventually(
        lambda: (
            watch.last("$SYS/brokers/node1/clients/connected") == b"3"
            and watch.last("$SYS/brokers/node2/clients/connected") == b"1"
        ),
        what="each node's own count of its clients",
        timeout=10,
    )
    # a subscriber arriving now gets the reports stored so far at once, RETAIN=1
    late = await RawClient.connected(n1.config.port, "late")
    await late.subscribe(("$SYS/brokers/node2/version", 0), ("$SYS/broker/version", 0))
    got = [await late.recv(), await late.recv()]
    assert all(isinstance(p, Publish) and p.retain for p in got)
    assert {p.topic: p.payload for p in got if isinstance(p, Publish)} == {
        "$SYS/brokers/node2/version": b"headwater version 0.1.0",
        "$SYS/broker/version": b"headwater version 0.1.0",
    }
    uptime = await watching(n1.config.port, "uptime", "$SYS/broker/uptime")
    await eventually(
        lambda: len(uptime.seen.get("$SYS/broker/uptime", [])) >= 3, what="uptime going on"
    )
    seconds = [int(p.split()[0]) for p in uptime.seen["$SYS/broker/uptime"]]
    assert seconds == sorted(seconds) and seconds[-1] > seconds[0]
    assert all(p.endswith(b" seconds") for p in uptime.seen["$SYS/broker/uptime"])
    for client in [*devices, late]:
        await client.close()
    await watch.close()
    await uptime.close()


async def test_a_node_that_dies_drops_out_of_the_totals_after_three_intervals(
    kafka_bootstrap: str,
    log_topic: str,
    start_node: NodeFactory,
    redis_url: str,
    redis_prefix: str,
) -> None:
    survivor = await sys_node(start_node, redis_url, redis_prefix)
    port = free_port()
    options = ("--redis-url", redis_url, "--redis-prefix", redis_prefix)
    proc = await launch_node_process(
        "victim", port, kafka_bootstrap, log_topic, *options, "--sys-interval", str(INTERVAL)
    )
    try:
        devices = [await RawClient.connected(port, f"v{i}") for i in range(2)]
        watch = await watching(survivor.config.port, "ops", "$SYS/broker/clients/connected")
        topic = "$SYS/broker/clients/connected"
        await eventually(lambda: watch.last(topic) == b"3", what="both nodes counted")
        proc.send_signal(signal.SIGKILL)  # no last report: its figures stay as they were
        await proc.wait()
        died = asyncio.get_running_loop().time()
        await eventually(lambda: watch.last(topic) == b"1", what="the dead node dropped")
        waited = asyncio.get_running_loop().time() - died
        assert waited >= (STALE_AFTER - 1) * INTERVAL  # heard last at most an interval earlier
        await watch.close()
        for device in devices:
            device.writer.close()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_a_client_cannot_publish_into_sys(
    start_node: NodeFactory, redis_url: str, redis_prefix: str
) -> None:
    node = await sys_node(start_node, redis_url, redis_prefix)
    watch = await watching(node.config.port, "ops", "$SYS/#")
    forger = await RawClient.connected(node.config.port, "forger")
    await forger.send(Publish("$SYS/broker/x", b"forged", qos=1, packet_id=7))
    assert await forger.recv() == Puback(7)  # acknowledged and dropped (the ACL's rule)
    await forger.send(Publish("$SYS/brokers/node1/clients/connected", b"999", qos=0))
    seen_before = len(watch.seen.get("$SYS/brokers/node1/uptime", []))
    await eventually(  # two more reports of the node's own have arrived since
        lambda: len(watch.seen.get("$SYS/brokers/node1/uptime", [])) >= seen_before + 2,
        what="the node's own reports",
    )
    assert "$SYS/broker/x" not in watch.seen
    assert b"999" not in watch.seen.get("$SYS/brokers/node1/clients/connected", [])
    assert watch.last("$SYS/broker/clients/connected") == b"2"
    await forger.close()
    await watch.close()


async def test_only_a_node_with_a_totals_subscriber_reads_the_reports(
    start_node: NodeFactory, redis_url: str, redis_prefix: str
) -> None:
    n1 = await sys_node(start_node, redis_url, redis_prefix)
    n2 = await sys_node(start_node, redis_url, redis_prefix)
    reports = Router(PARTITIONS, 2).partition_for_topic("$SYS/brokers/node1/uptime")
    await eventually(
        lambda: n1.systree.reports_published > 20 and n2.systree.reports_published > 20,
        what="both nodes reporting, twice at least",
    )
    for node in (n1, n2):
        assert node.log.reader.assigned() == [] and node.log.reader.fetched_records == 0
    watch = await watching(n2.config.port, "ops", "$SYS/broker/clients/connected")
    await eventually(  # the reports are read once the SUBACK is out
        lambda: reports in n2.log.reader.assigned() and n2.log.reader.fetched_records > 0,
        what="node2 reading the reports",
    )
    assert n1.log.reader.assigned() == []
    await watch.close()  # the last subscriber of a total leaves: the next interval lets go
    await eventually(lambda: n2.log.reader.assigned() == [], what="node2 letting go")
    assert n1.log.reader.fetched_records == 0
