"""A Kafka broker dies under QoS 1 traffic: no acknowledged message is lost, publishing goes on.

The session's three-broker `kafka_cluster`, a log topic with replication factor 3 and min ISR 2,
two front-end nodes as real processes, a publisher on one and a subscriber on the other. Midway,
with PUBLISHes in flight, the broker leading the publisher's partition is SIGKILLed. A PUBACK
means acks=all reached at least two replicas, so whichever of them Kafka makes leader has the
message; the idempotent producer resends what was in flight to it, and the subscriber's node reads
on from it. QoS 1 allows duplicates, not gaps.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest

from headwater.services.kafka import LocalKafkaCluster
from headwater.services.kafka_admin import admin_client, ensure_topic
from mqttcore.packets import Puback, Publish
from router.partitioner import Router
from router.topics import messages_topic
from tests.conftest import KAFKA_CLUSTER_REPLICATION, free_port
from tests.e2e.conftest import PARTITIONS, eventually, launch_node_process
from tests.e2e.rawmqtt import RawClient

MQTT_TOPIC = "failover/sensor/t"
TOTAL = 600
KILL_AT = 200  # the message after which the leader is killed, the window still in flight
WINDOW = 20  # unacknowledged PUBLISHes the publisher allows itself


@pytest.fixture
async def failover_topic(kafka_cluster: LocalKafkaCluster) -> str:
    name = f"test.{uuid.uuid4().hex[:12]}"
    spec = messages_topic(PARTITIONS, KAFKA_CLUSTER_REPLICATION)
    await asyncio.to_thread(
        ensure_topic,
        kafka_cluster.bootstrap,
        name,
        PARTITIONS,
        spec.config,
        replication_factor=spec.replication_factor,
    )
    return name


@pytest.fixture
async def node_ports(
    kafka_cluster: LocalKafkaCluster, failover_topic: str
) -> AsyncIterator[tuple[int, int]]:
    """Two front-end processes on the cluster: (the publisher's port, the subscriber's port)."""
    ports = (free_port(), free_port())
    procs = []
    try:
        for i, port in enumerate(ports):
            node_id = f"failover{i}"
            procs.append(
                await launch_node_process(node_id, port, kafka_cluster.bootstrap, failover_topic)
            )
        yield ports
    finally:
        for proc in procs:
            proc.terminate()
            await proc.wait()


def partition_leader(bootstrap: str, topic: str, partition: int) -> int:
    metadata = admin_client(bootstrap).list_topics(topic=topic, timeout=10)
    return int(metadata.topics[topic].partitions[partition].leader)


class Publisher:
    """Publishes TOTAL numbered QoS 1 messages with at most WINDOW unacknowledged, and records
    which were acknowledged. At KILL_AT it calls `on_midway` and goes on without waiting."""

    def __init__(self, client: RawClient) -> None:
        self.client = client
        self.window = asyncio.Semaphore(WINDOW)
        self.acked: set[int] = set()

    async def run(self, on_midway: asyncio.Event) -> None:
        reader = asyncio.create_task(self._read_pubacks())
        for n in range(TOTAL):
            if n == KILL_AT:
                on_midway.set()
            await self.window.acquire()
            await self.client.send(Publish(MQTT_TOPIC, str(n).encode(), qos=1, packet_id=n + 1))
        await reader

    async def _read_pubacks(self) -> None:
        while len(self.acked) < TOTAL:
            packet = await self.client.recv(timeout=60)
            assert isinstance(packet, Puback), packet
            self.acked.add(packet.packet_id - 1)
            self.window.release()


async def receive_forever(client: RawClient, received: set[int]) -> None:
    while True:
        packet = await client.recv(timeout=120)
        assert isinstance(packet, Publish), packet
        if packet.qos == 1:
            await client.send(Puback(packet.packet_id or 0))
        received.add(int(packet.payload))


@pytest.mark.fault
async def test_killing_the_partition_leader_loses_no_acknowledged_message(
    kafka_cluster: LocalKafkaCluster, failover_topic: str, node_ports: tuple[int, int]
) -> None:
    bootstrap = kafka_cluster.bootstrap
    partition = Router(PARTITIONS, 2).partition_for_topic(MQTT_TOPIC)
    leader = await asyncio.to_thread(partition_leader, bootstrap, failover_topic, partition)
    victim = kafka_cluster.node(leader)
    sub = await RawClient.connected(node_ports[1], "failover-sub")
    await sub.subscribe((MQTT_TOPIC, 1))
    received: set[int] = set()
    receiver = asyncio.create_task(receive_forever(sub, received))
    pub = await RawClient.connected(node_ports[0], "failover-pub")
    publisher = Publisher(pub)
    midway = asyncio.Event()
    publishing = asyncio.create_task(publisher.run(midway))
    try:
        await asyncio.wait_for(midway.wait(), 60)
        await asyncio.to_thread(victim.kill)
        acked_at_kill = len(publisher.acked)
        await asyncio.wait_for(publishing, 120)  # every PUBLISH acknowledged: publishing went on
        assert acked_at_kill < TOTAL

        def all_acked_received() -> bool:
            if receiver.done():
                receiver.result()  # the subscriber failed: say why
            return publisher.acked <= received

        await eventually(all_acked_received, what="every acknowledged message", timeout=60)
        assert received <= set(range(TOTAL))
        new_leader = await asyncio.to_thread(partition_leader, bootstrap, failover_topic, partition)
        assert new_leader not in (leader, -1)
    finally:
        publishing.cancel()
        receiver.cancel()
        await asyncio.gather(publishing, receiver, return_exceptions=True)
        await pub.close()
        await sub.close()
        await asyncio.to_thread(restart, kafka_cluster, leader)


def restart(cluster: LocalKafkaCluster, node_id: int) -> None:
    """Bring a killed broker back, so that the session's cluster has three again."""
    if cluster.node(node_id).child is None:
        cluster.node(node_id).launch()
    cluster.wait_ready()
