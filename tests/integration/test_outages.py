"""Kafka and Redis outages: a node keeps running, refuses new sessions with CONNACK 3, never
acknowledges a PUBLISH that is not durably written, and recovers when the service returns.

Each test runs its own Kafka or Redis (the session's shared ones must stay up) and restarts it
on the same ports, as an operator restarting a broker would.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path

import pytest

from frontend.node import Node, NodeConfig
from headwater.services.kafka import KafkaPorts, LocalKafka
from headwater.services.kafka_admin import ensure_topic
from headwater.services.process import ChildProcess
from headwater.services.redis_server import LocalRedis, require_redis_server
from mqttcore.packets import Connack, Connect, Pingreq, Pingresp, Puback, Publish
from router.shared import LEASE_SECONDS
from tests.e2e.conftest import eventually, http_get
from tests.e2e.rawmqtt import RawClient


async def connack_code(port: int, client_id: str) -> int:
    client = await RawClient.open(port)
    await client.send(Connect(client_id))
    try:
        answer = await client.recv()
    finally:
        await client.close()
    assert isinstance(answer, Connack)
    return answer.return_code


async def wait_for_connack(port: int, expected: int, timeout: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    code = -1
    while loop.time() < deadline:
        code = await connack_code(port, f"probe-{expected}")
        if code == expected:
            return
        await asyncio.sleep(0.5)
    raise AssertionError(f"CONNACK stayed {code}, expected {expected}")


def node_config(bootstrap: str, topic: str, redis_url: str | None = None) -> NodeConfig:
    return NodeConfig(
        node_id="outage", host="127.0.0.1", port=0, kafka_bootstrap=bootstrap,
        redis_url=redis_url, topic=topic, partitions=2,
    )  # fmt: skip


@pytest.mark.fault
async def test_kafka_outage_gives_connack_3_and_no_early_puback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kafka = LocalKafka(tmp_path / "kafka")
    bootstrap = await asyncio.to_thread(kafka.start)
    node: Node | None = None
    try:
        await asyncio.to_thread(ensure_topic, bootstrap, "outage", 2, {})
        node = Node(node_config(bootstrap, "outage"))
        await node.start()
        port = node.config.port
        sub = await RawClient.connected(port, "o-sub")
        await sub.subscribe(("o/t", 1))
        pub = await RawClient.connected(port, "o-pub")
        await pub.send(Publish("o/t", b"before", qos=1, packet_id=1))
        assert await pub.recv() == Puback(1)

        await asyncio.to_thread(kafka.stop)
        await pub.send(Publish("o/t", b"during", qos=1, packet_id=2))
        await pub.expect_silence(3.0)  # not durable, so not acknowledged
        await wait_for_connack(port, 3, timeout=20)  # server unavailable

        ports = kafka.ports
        assert ports is not None
        monkeypatch.setattr(KafkaPorts, "pick", classmethod(lambda cls: ports))
        await asyncio.to_thread(kafka.start)
        assert await pub.recv(timeout=60) == Puback(2)  # written once Kafka is back
        payloads = []
        for _ in range(2):
            packet = await sub.recv(timeout=30)
            assert isinstance(packet, Publish)
            await sub.send(Puback(packet.packet_id or 0))
            payloads.append(packet.payload)
        assert payloads == [b"before", b"during"]
        await sub.expect_silence(1.0)  # exactly once: the idempotent producer's retries
        await wait_for_connack(port, 0, timeout=20)
        await sub.close()
        await pub.close()
    finally:
        if node is not None:
            await node.stop()
        await asyncio.to_thread(kafka.stop)


@contextlib.asynccontextmanager
async def node_on_own_redis(
    tmp_path: Path, bootstrap: str, topic: str, **settings: object
) -> AsyncIterator[tuple[Node, LocalRedis]]:
    """A node on a Redis of its own (one a test may stop), and that Redis; both stopped after."""
    redis = LocalRedis(tmp_path / "redis")
    url = await asyncio.to_thread(redis.start)
    await asyncio.to_thread(ensure_topic, bootstrap, topic, 2, {})
    config = node_config(bootstrap, topic, url)
    for name, value in settings.items():
        setattr(config, name, value)
    node = Node(config)
    await node.start()
    try:
        yield node, redis
    finally:
        await node.stop()
        await asyncio.to_thread(redis.stop)


async def restart_on_its_port(redis: LocalRedis, tmp_path: Path) -> None:
    """Start a stopped Redis again where the node expects it."""
    assert redis.port is not None
    argv = redis.argv(require_redis_server(), redis.port)
    redis.child = ChildProcess.spawn("redis", argv, tmp_path / "redis" / "redis.log")
    await asyncio.to_thread(redis.wait_ready)


@pytest.mark.fault
async def test_redis_outage_refuses_new_sessions_and_recovers(
    tmp_path: Path, kafka_bootstrap: str, topic_name: str
) -> None:
    async with node_on_own_redis(tmp_path, kafka_bootstrap, topic_name) as (node, redis):
        port = node.config.port
        live = await RawClient.connected(port, "r-live")
        await live.subscribe(("r/t", 1))
        await asyncio.to_thread(redis.stop)
        assert await connack_code(port, "r-new") == 3
        await live.send(Publish("r/t", b"still", qos=1, packet_id=1))  # needs Kafka only
        assert await live.recv() == Puback(1)
        assert isinstance(await live.recv(), Publish)

        await restart_on_its_port(redis, tmp_path)
        await wait_for_connack(port, 0, timeout=20)
        await live.close()


@pytest.mark.fault
async def test_redis_stuck_mid_storm_refuses_new_sessions_only_and_loses_nothing_acknowledged(
    tmp_path: Path, kafka_bootstrap: str, topic_name: str
) -> None:
    """A storm of 1000 CONNECTs, Redis stopped (SIGSTOP) halfway: the first 500 are accepted and
    stay served, the 500 after the stop get CONNACK 3 (none hangs), a connected client keeps
    publishing and receiving QoS 1, and once Redis answers again CONNECTs are accepted."""
    async with node_on_own_redis(tmp_path, kafka_bootstrap, topic_name) as (node, redis):
        assert redis.child is not None
        redis_pid = redis.child.popen.pid
        port = node.config.port
        live = await RawClient.connected(port, "s-live")
        await live.subscribe(("s/t", 1))

        async def connect(i: int) -> tuple[RawClient, int]:
            client = await RawClient.open(port)
            await client.send(Connect(f"s-{i}", clean_session=i % 2 == 0))
            connack = await client.recv(timeout=30)
            assert isinstance(connack, Connack)
            return client, connack.return_code

        before = await asyncio.gather(*(connect(i) for i in range(500)))
        assert {code for _, code in before} == {0}
        os.kill(redis_pid, signal.SIGSTOP)
        try:
            after = await asyncio.wait_for(
                asyncio.gather(*(connect(i) for i in range(500, 1000))), 60
            )
            assert {code for _, code in after} == {3}  # Redis does not answer: not accepted
            await live.send(Publish("s/t", b"during", qos=1, packet_id=1))  # needs Kafka only
            assert await live.recv(timeout=10) == Puback(1)
            delivered = await live.recv(timeout=10)
            assert isinstance(delivered, Publish) and delivered.payload == b"during"
            for client, _ in before[::50]:  # the connections made before the stop stay
                await client.send(Pingreq())
                assert await client.recv(timeout=10) == Pingresp()
        finally:
            os.kill(redis_pid, signal.SIGCONT)
        await wait_for_connack(port, 0, timeout=30)
        for client, _ in before + after:
            await client.close()
        await live.close()


@pytest.mark.fault
async def test_ready_turns_off_while_redis_is_unreachable_and_live_stays_on(
    tmp_path: Path, kafka_bootstrap: str, topic_name: str
) -> None:
    own = node_on_own_redis(tmp_path, kafka_bootstrap, topic_name, stats_host="127.0.0.1")
    async with own as (node, redis):
        stats = node.config.stats_port

        async def status(path: str) -> int:
            return (await http_get(stats, path))[0]

        assert await http_get(stats, "/ready") == (200, "ready\n")
        await asyncio.to_thread(redis.stop)
        await eventually(lambda: _is(status("/ready"), 503), what="/ready off", timeout=15)
        assert (await http_get(stats, "/ready"))[1] == "Redis is unreachable\n"
        assert await status("/live") == 200
        await restart_on_its_port(redis, tmp_path)
        await eventually(lambda: _is(status("/ready"), 200), what="/ready on again", timeout=20)


async def _is(answer: Awaitable[int], expected: int) -> bool:
    return await answer == expected


@pytest.mark.fault
async def test_a_share_group_rides_out_a_redis_outage_longer_than_its_leases(
    tmp_path: Path, kafka_bootstrap: str, topic_name: str
) -> None:
    """Redis stopped for longer than a lease (``router.shared.LEASE_SECONDS``): the group's
    steps fail (counted), the node stops serving the group once its leases may have passed to
    another node, and takes them again when Redis is back (restarted empty: from the group's
    start); its member gets every message published meanwhile, and the node ran throughout."""
    own = node_on_own_redis(tmp_path, kafka_bootstrap, topic_name)
    async with own as (node, redis):
        port = node.config.port
        member = await RawClient.connected(port, "sh-member")
        assert (await member.subscribe(("$share/o/sh/#", 1))).return_codes == (1,)
        pub = await RawClient.connected(port, "sh-pub")
        await asyncio.to_thread(redis.stop)
        shares = node.dispatcher.shares
        await eventually(lambda: shares.lease_failures > 0, what="a step failing", timeout=5)
        group = node.dispatcher.share_group("o", "sh/#")
        assert group is not None

        async def publish(first: int, last: int) -> None:
            for i in range(first, last + 1):
                await pub.send(Publish(f"sh/{i}", b"%d" % i, qos=1, packet_id=i))
                assert await pub.recv(timeout=10) == Puback(i)  # needs Kafka only

        await publish(1, 5)
        await eventually(
            lambda: group.positions == {}, what="the group not served past its leases",
            timeout=LEASE_SECONDS + 5,
        )  # fmt: skip
        await publish(6, 10)
        await restart_on_its_port(redis, tmp_path)
        got: set[bytes] = set()

        async def all_delivered() -> bool:
            with contextlib.suppress(TimeoutError):
                while True:
                    packet = await member.recv(timeout=0.2)
                    assert isinstance(packet, Publish), packet
                    await member.send(Puback(packet.packet_id or 0))
                    got.add(packet.payload)
            return got >= {b"%d" % i for i in range(1, 11)}

        await eventually(all_delivered, what="every message of the outage", timeout=30)
        await member.close()
        await pub.close()
