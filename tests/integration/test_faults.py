"""Kafka and Redis killed under load and started again, as an operator or a crash would: what the
clients saw.  Each test runs its own Kafka or Redis (the session's must stay up), SIGKILLs it and
starts it again on the same ports.

* Kafka: PUBACKs resume within 2 s of Kafka taking writes again, new clients are accepted again as
  soon, and a subscriber that stayed connected gets every message that was acknowledged.
* A leader election (the three-broker ``kafka_cluster``, the leader SIGKILLed) while a returning
  persistent session catches up closes no client: the node asks again (counted) and the session
  gets every message it missed.
* Redis: no node is judged dead from a Redis that has just come back (no spurious will), the
  node's pooled connections are made again at once (CONNECTs accepted within seconds), and a
  clean DISCONNECT made while Redis was away leaves nothing behind that could publish its will.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import Producer

from frontend.node import Node
from frontend.sessions.redis import ALIVE_SECONDS
from headwater.services.kafka import LocalKafka, LocalKafkaCluster
from headwater.services.kafka_admin import ensure_topic
from headwater.services.redis_server import LocalRedis
from mqttcore.codec import encode
from mqttcore.packets import (
    Disconnect,
    Pingreq,
    Pingresp,
    Puback,
    Publish,
    Will,
)
from router.retry import OUTAGE_SECONDS
from router.topics import messages_topic
from tests.conftest import KAFKA_CLUSTER_REPLICATION
from tests.e2e.conftest import eventually
from tests.e2e.rawmqtt import RawClient
from tests.e2e.test_kafka_failover import partition_leader, restart
from tests.integration.test_outages import (
    connack_code,
    node_config,
    restart_on_its_port,
    wait_for_connack,
)

pytestmark = [pytest.mark.fault, pytest.mark.timeout(240)]

PUBLISH_EVERY = 0.02
"""Seconds between two PUBLISHes of the load (50/s), before, during and after the fault."""

OUTAGE_DELIVERY_TIMEOUT_MS = 150_000
"""The producer's delivery timeout in the Kafka restart test: longer than the outage can take
(the kill, 5 s, Kafka's restart, up to 60 s for its first write, ``writable``)."""


@dataclass
class Load:
    """A QoS 1 publisher that keeps sending whether or not PUBACKs come, and a persistent
    subscriber that acknowledges what it gets: what was acknowledged and what arrived."""

    publisher: RawClient
    subscriber: RawClient
    sent: dict[int, bytes] = field(default_factory=dict)
    acked: list[tuple[float, bytes]] = field(default_factory=list)
    received: list[bytes] = field(default_factory=list)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    sending: bool = True

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.tasks = [
            loop.create_task(self._send()),
            loop.create_task(self._acks()),
            loop.create_task(self._receive()),
        ]

    async def _send(self) -> None:
        number = 0
        while self.sending:
            packet_id = number % 65535 + 1
            payload = b"m%d" % number
            self.sent[packet_id] = payload
            await self.publisher.send(Publish("load/t", payload, 1, packet_id=packet_id))
            number += 1
            await asyncio.sleep(PUBLISH_EVERY)

    async def _acks(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            packet = await self.publisher.recv(timeout=600)
            assert isinstance(packet, Puback), packet
            self.acked.append((loop.time(), self.sent.pop(packet.packet_id)))

    async def _receive(self) -> None:
        while True:
            packet = await self.subscriber.recv(timeout=600)
            assert isinstance(packet, Publish), packet
            await self.subscriber.send(Puback(packet.packet_id or 0))
            self.received.append(packet.payload)

    def first_ack_after(self, moment: float) -> float:
        return min(at for at, _ in self.acked if at > moment)

    def undelivered(self) -> set[bytes]:
        return {payload for _, payload in self.acked} - set(self.received)

    async def stop(self) -> None:
        self.sending = False
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def writable(bootstrap: str, topic: str) -> None:
    """Return once a fresh producer's write to ``topic`` is acknowledged."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    done: list[bool] = []
    while not any(done):
        producer.produce(topic, b"probe", on_delivery=lambda err, _: done.append(err is None))
        await asyncio.to_thread(producer.flush, 1.0)


async def test_kafka_killed_and_restarted_pubacks_resume_within_2s_and_nothing_acked_is_lost(
    tmp_path: Path,
) -> None:
    kafka = LocalKafka(tmp_path / "kafka")
    bootstrap = await asyncio.to_thread(kafka.start)
    node: Node | None = None
    load: Load | None = None
    try:
        for topic in ("faults", "probe"):
            await asyncio.to_thread(ensure_topic, bootstrap, topic, 2, {})
        node = Node(node_config(bootstrap, "faults"))
        # The premise: the producer holds the PUBLISHes of the outage until Kafka is back.  A
        # restart took up to 55 s on a loaded machine, past the default 30 s.
        node.log.settings.delivery_timeout_ms = OUTAGE_DELIVERY_TIMEOUT_MS
        await node.start()
        port = node.config.port
        subscriber = await RawClient.connected(port, "k-sub", clean_session=False)
        await subscriber.subscribe(("load/#", 1))
        load = Load(await RawClient.connected(port, "k-pub"), subscriber)
        load.start()
        await eventually(lambda: len(load.acked) >= 50, what="the load acknowledged")

        loop = asyncio.get_running_loop()
        killed = loop.time()
        await asyncio.to_thread(kafka.kill)
        await asyncio.sleep(5)  # the outage itself
        await asyncio.to_thread(kafka.launch)
        await asyncio.to_thread(kafka.wait_ready)
        await asyncio.wait_for(writable(bootstrap, "probe"), 60)
        back = loop.time()
        await eventually(lambda: any(at > killed for at, _ in load.acked), what="a PUBACK")
        resumed = load.first_ack_after(killed) - back
        assert resumed <= 2.0, f"PUBACKs resumed {resumed:.1f} s after Kafka took writes"
        await wait_for_connack(port, 0, timeout=3)  # new clients accepted as soon

        acked_before_stop = len(load.acked)
        await eventually(lambda: len(load.acked) > acked_before_stop + 50, what="load after")
        load.sending = False
        await eventually(lambda: not load.sent, what="every PUBLISH acknowledged", timeout=30)
        await eventually(
            lambda: not load.undelivered(), what="every acknowledged message delivered", timeout=30
        )
        duplicates = len(load.received) - len(set(load.received))
        print(f"PUBACKs resumed {resumed:+.2f} s after Kafka took writes; {len(load.acked)} "
              f"acknowledged, all delivered, {duplicates} duplicates")  # fmt: skip
    finally:
        if load is not None:
            await load.stop()
        if node is not None:
            await node.stop()
        await asyncio.to_thread(kafka.stop)


BEHIND = 5000
"""Messages a persistent subscriber missed in the Kafka restart test, of ``PADDING`` bytes each:
20 MB, more than a waiting catch-up keeps aside (``router.catchup.STASH_LIMIT``) and than its
consumer fetches ahead (8 MB), so the rest must be read from Kafka after its restart."""
PADDING = bytes(4096)


async def test_kafka_killed_and_restarted_during_a_catch_up_closes_no_client_and_loses_nothing(
    tmp_path: Path,
) -> None:
    kafka = LocalKafka(tmp_path / "kafka")
    bootstrap = await asyncio.to_thread(kafka.start)
    node: Node | None = None
    try:
        await asyncio.to_thread(ensure_topic, bootstrap, "behind", 2, {})
        node = Node(node_config(bootstrap, "behind"))
        await node.start()
        port = node.config.port
        away = await RawClient.connected(port, "r-sub", clean_session=False)
        await away.subscribe(("r/#", 1))
        await away.send(Disconnect())
        await away.expect_closed()
        publisher = await RawClient.connected(port, "r-pub")
        expected = {b"%d" % n + PADDING for n in range(BEHIND)}
        for n in range(0, BEHIND, 500):
            burst = [
                Publish("r/t", b"%d" % i + PADDING, 1, packet_id=i % 65535 + 1)
                for i in range(n, n + 500)
            ]
            await publisher.send(b"".join(encode(p) for p in burst))
            for _ in burst:
                assert isinstance(await publisher.recv(timeout=30), Puback)
        await publisher.close()

        subscriber = await RawClient.connected(port, "r-sub", clean_session=False)
        received: set[bytes] = set()
        while len(received) < 60:  # catching up
            packet = await subscriber.recv(timeout=10)
            assert isinstance(packet, Publish), packet
            received.add(packet.payload)
            await subscriber.send(Puback(packet.packet_id or 0))
        unacknowledged: list[int] = []
        with contextlib.suppress(TimeoutError):
            while True:  # then its window fills, unacknowledged: the catch-up waits
                packet = await subscriber.recv(timeout=0.5)
                assert isinstance(packet, Publish), packet
                received.add(packet.payload)
                unacknowledged.append(packet.packet_id or 0)
        assert node.log.reader.catching_up == 1

        fetched_before = node.log.reader.fetched_records
        await asyncio.to_thread(kafka.kill)
        await asyncio.sleep(3)  # the outage itself
        await asyncio.to_thread(kafka.launch)
        for packet_id in unacknowledged:  # room again: the rest must come from the new Kafka
            await subscriber.send(Puback(packet_id))
        while len(received) < BEHIND:  # a closed connection raises ConnectionError here
            packet = await subscriber.recv(timeout=OUTAGE_SECONDS)
            assert isinstance(packet, Publish), packet
            await subscriber.send(Puback(packet.packet_id or 0))
            received.add(packet.payload)
        assert received == expected
        fetched = node.log.reader.fetched_records - fetched_before
        print(f"caught up across a Kafka restart, {fetched} records read from the new Kafka; "
              f"retries {node.log.retries.counts}")  # fmt: skip
        assert fetched > 0, "the catch-up never needed the restarted Kafka"
        await subscriber.send(Pingreq())
        assert await subscriber.recv() == Pingresp()
        await subscriber.close()
    finally:
        if node is not None:
            await node.stop()
        await asyncio.to_thread(kafka.stop)


MISSED = 200
"""Messages published while the persistent subscriber of the election test is away."""


async def test_a_leader_election_while_a_session_catches_up_closes_no_client_and_loses_nothing(
    kafka_cluster: LocalKafkaCluster, topic_name: str
) -> None:
    bootstrap = kafka_cluster.bootstrap
    spec = messages_topic(2, KAFKA_CLUSTER_REPLICATION)
    await asyncio.to_thread(
        ensure_topic, bootstrap, topic_name, 2, spec.config,
        replication_factor=spec.replication_factor,
    )  # fmt: skip
    node = Node(node_config(bootstrap, topic_name))
    await node.start()
    leader: int | None = None
    try:
        port = node.config.port
        away = await RawClient.connected(port, "e-sub", clean_session=False)
        await away.subscribe(("e/#", 1))
        await away.send(Disconnect())
        await away.expect_closed()
        publisher = await RawClient.connected(port, "e-pub")
        for n in range(MISSED):
            await publisher.send(Publish("e/t", b"%d" % n, 1, packet_id=n + 1))
        acks = [await publisher.recv() for _ in range(MISSED)]
        assert set(acks) == {Puback(n + 1) for n in range(MISSED)}

        partition = node.router.partition_for_topic("e/t")
        leader = await asyncio.to_thread(partition_leader, bootstrap, topic_name, partition)
        await asyncio.to_thread(kafka_cluster.node(leader).kill)
        # Back at once, while no broker leads the partition: its catch-up meets the election.
        subscriber = await RawClient.connected(port, "e-sub", clean_session=False)
        received: set[bytes] = set()
        while len(received) < MISSED:  # a closed connection raises ConnectionError here
            packet = await subscriber.recv(timeout=OUTAGE_SECONDS)
            assert isinstance(packet, Publish), packet
            await subscriber.send(Puback(packet.packet_id or 0))
            received.add(packet.payload)
        assert received == {b"%d" % n for n in range(MISSED)}
        retries = node.log.retries.counts
        print(f"caught up across the election of partition {partition}'s leader; retries {retries}")
        assert sum(retries.values()) > 0, "the catch-up never met the election"
        await subscriber.send(Pingreq())
        assert await subscriber.recv() == Pingresp()
        await publisher.close()
        await subscriber.close()
    finally:
        await node.stop()
        if leader is not None:
            await asyncio.to_thread(restart, kafka_cluster, leader)


@contextlib.asynccontextmanager
async def two_nodes_on_own_redis(
    tmp_path: Path, bootstrap: str, topic: str
) -> AsyncIterator[tuple[Node, Node, LocalRedis]]:
    redis = LocalRedis(tmp_path / "redis", appendonly=True)
    url = await asyncio.to_thread(redis.start)
    await asyncio.to_thread(ensure_topic, bootstrap, topic, 2, {})
    nodes: list[Node] = []
    try:
        for name in ("fa", "fb"):
            config = node_config(bootstrap, topic, url)
            config.node_id = name
            nodes.append(Node(config))
            await nodes[-1].start()
        yield nodes[0], nodes[1], redis
    finally:
        for node in nodes:
            await node.stop()
        await asyncio.to_thread(redis.stop)


async def test_redis_killed_and_restarted_publishes_no_spurious_will_and_keeps_no_stale_one(
    tmp_path: Path, kafka_bootstrap: str, topic_name: str
) -> None:
    async with two_nodes_on_own_redis(tmp_path, kafka_bootstrap, topic_name) as (a, b, redis):
        watcher = await RawClient.connected(b.config.port, "f-watcher")
        await watcher.subscribe(("wills/#", 1))
        willed = Will("wills/alive", b"alive went", 1)
        alive = await RawClient.connected(
            a.config.port, "f-alive", clean_session=False, will=willed
        )
        leaving = await RawClient.connected(
            a.config.port, "f-leaving", will=Will("wills/leaving", b"leaving went", 1)
        )

        assert redis.child is not None
        redis.child.popen.send_signal(signal.SIGKILL)
        await asyncio.to_thread(redis.child.popen.wait)
        await leaving.send(Disconnect())  # clean, while Redis is away: its will is void
        await leaving.expect_closed()
        await asyncio.sleep(ALIVE_SECONDS + 1)  # the outage: every liveness key expires

        loop = asyncio.get_running_loop()
        await restart_on_its_port(redis, tmp_path)
        back = loop.time()
        for node in (a, b):  # pooled connections made again at once
            await wait_for_connack(node.config.port, 0, timeout=5)
        print(f"CONNACK 0 on both nodes {loop.time() - back:.1f} s after Redis came back")

        # Two sweeps and a liveness key's lifetime later, no will was published: both nodes
        # and their clients are alive, and the DISCONNECT's will is gone for good.
        await watcher.expect_silence(ALIVE_SECONDS + 5)
        await alive.send(Pingreq())
        assert await alive.recv() == Pingresp()
        store = a.sessions.store
        await eventually(
            lambda: _none_left(store, "f-leaving"), what="f-leaving's keys gone", timeout=10
        )
        assert await connack_code(a.config.port, "f-probe") == 0
        await alive.close()
        await watcher.close()


async def _none_left(store: object, client_id: str) -> bool:
    keys = store._keys(client_id)  # type: ignore[attr-defined]
    return not await store.redis.exists(*keys)  # type: ignore[attr-defined]
