"""Sessions and retained messages that live in the cluster (Redis + the log), not in a node.

Three nodes with Redis stores on the real Redis and Kafka; each test has its own key prefix and
log topic.  Clients move between nodes as a device behind the load balancer would.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import redis.asyncio as aioredis

from frontend.node import Node
from frontend.sessions.saver import SAVE_INTERVAL
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
    Will,
)
from tests.conftest import free_port
from tests.e2e.conftest import NodeFactory, eventually, launch_node_process
from tests.e2e.rawmqtt import RawClient
from tests.e2e.test_cluster import publish_qos1, receive


@pytest.fixture
async def nodes(start_node: NodeFactory, redis_url: str, redis_prefix: str) -> list[Node]:
    return [await start_node(redis_url=redis_url, redis_prefix=redis_prefix) for _ in range(3)]


class Stored:
    """What the cluster keeps in Redis, read as the key layout of ``frontend.sessions.redis``
    documents it: for waiting until a node has stored what a test relies on next."""

    def __init__(self, client: aioredis.Redis, prefix: str) -> None:
        self.redis = client
        self.prefix = prefix

    def _session(self, client_id: str) -> str:
        return f"{self.prefix}{{{client_id}}}:session"

    async def released(self, client_id: str) -> bool:
        """The session's last connection has let go of it (stored, or forgotten if clean)."""
        return await self.redis.hget(self._session(client_id), "connected") != b"1"

    async def saved_while_connected(self, client_id: str) -> bool:
        """A save stored the session while its connection is still open."""
        present, connected = await self.redis.hmget(
            self._session(client_id), ["present", "connected"]
        )
        return present == b"1" and connected == b"1"

    async def will_dropped(self, node_id: str, client_id: str) -> bool:
        """The will of ``client_id``'s connection on ``node_id`` is no longer stored, nor the
        session listed as the node's."""
        listed = await self.redis.hexists(f"{self.prefix}{{{node_id}}}:owned", client_id)
        kept = await self.redis.hexists(self._session(client_id), "will")
        return not listed and not kept


@pytest.fixture
async def stored(redis_url: str, redis_prefix: str) -> AsyncIterator[Stored]:
    client = aioredis.Redis.from_url(redis_url)
    yield Stored(client, redis_prefix)
    await client.aclose()


async def reconnect(port: int, client_id: str, present: bool, **connect: object) -> RawClient:
    client = await RawClient.open(port)
    await client.send(Connect(client_id, clean_session=False, **connect))  # type: ignore[arg-type]
    assert await client.recv() == Connack(present, 0)
    return client


async def test_persistent_session_moves_and_gets_what_it_missed(nodes: list[Node]) -> None:
    n1, n2, n3 = nodes
    sub = await RawClient.connected(n1.config.port, "roamer", clean_session=False)
    await sub.subscribe(("fleet/+/cmd", 2))
    await sub.send(Disconnect())
    await sub.expect_closed()
    pub = await RawClient.connected(n2.config.port, "dispatcher")
    # Not kept for an absent client.  Sent first: the PUBACKs of the later QoS 1 messages on its
    # partition then prove it is in the log before the client comes back (else it is live).
    await pub.send(Publish("fleet/a/cmd", b"q0", qos=0))
    await publish_qos1(pub, "fleet/a/cmd", [b"1", b"2"])
    await pub.send(Publish("fleet/b/cmd", b"3", qos=2, packet_id=90))
    assert await pub.recv() == Pubrec(90)
    await pub.send(Pubrel(90))
    assert await pub.recv() == Pubcomp(90)
    back = await reconnect(n3.config.port, "roamer", present=True)  # [MQTT-3.2.2-2]
    got, owed_pubrel = [], set()
    while len(got) < 3 or owed_pubrel:  # two partitions: their messages may interleave
        packet = await back.recv()
        if isinstance(packet, Pubrel):
            owed_pubrel.remove(packet.packet_id)
            await back.send(Pubcomp(packet.packet_id))
            continue
        assert isinstance(packet, Publish)
        if packet.qos == 2:
            owed_pubrel.add(packet.packet_id)
        ack = Puback if packet.qos == 1 else Pubrec
        await back.send(ack(packet.packet_id or 0))
        got.append((packet.topic, packet.payload, packet.qos))
    fleet_a = [g for g in got if g[0] == "fleet/a/cmd"]
    assert fleet_a == [("fleet/a/cmd", b"1", 1), ("fleet/a/cmd", b"2", 1)]  # in order
    assert ("fleet/b/cmd", b"3", 2) in got
    await back.expect_silence(0.5)
    assert n3.dispatcher.counters.messages_replayed == 3
    await back.close()
    await pub.close()


async def test_switch_from_replay_to_live_has_no_gap_and_no_duplicate(nodes: list[Node]) -> None:
    n1, n2, n3 = nodes
    sub = await RawClient.connected(n1.config.port, "switcher", clean_session=False)
    await sub.subscribe(("seq/t", 1))
    await sub.send(Disconnect())
    await sub.expect_closed()  # away before the first message: none goes to this connection
    pub = await RawClient.connected(n2.config.port, "seq-pub")
    total = 400
    acked = 0

    async def publish_all() -> None:
        nonlocal acked
        for i in range(total):
            await publish_qos1(pub, "seq/t", [str(i).encode()], first_id=i + 1)
            acked += 1
            if i % 20 == 0:
                await asyncio.sleep(0.01)

    sender = asyncio.create_task(publish_all())
    await eventually(  # part of the stream is published while the client is away
        lambda: acked >= total // 4, what="a quarter of the stream published"
    )
    back = await reconnect(n3.config.port, "switcher", present=True)
    got = await receive(back, total, timeout=15)
    await sender
    assert [p.payload for p in got] == [str(i).encode() for i in range(total)]
    await back.expect_silence(0.5)
    await back.close()
    await pub.close()


async def test_inflight_qos1_resent_with_dup_after_a_move(
    nodes: list[Node], stored: Stored
) -> None:
    n1, n2, _ = nodes
    sub = await RawClient.connected(n1.config.port, "unacked", clean_session=False)
    await sub.subscribe(("inflight/t", 1))
    pub = await RawClient.connected(n2.config.port, "if-pub")
    await publish_qos1(pub, "inflight/t", [b"owed"])
    first = await sub.recv()
    assert isinstance(first, Publish) and not first.dup
    await sub.close()  # no PUBACK
    await eventually(lambda: stored.released("unacked"), what="n1 to store unacked's session")
    back = await reconnect(n2.config.port, "unacked", present=True)
    again = await back.recv()
    assert again == Publish("inflight/t", b"owed", qos=1, packet_id=first.packet_id, dup=True)
    await back.send(Puback(first.packet_id or 0))  # [MQTT-4.4.0-1]
    await back.expect_silence(0.5)
    await back.close()
    await pub.close()


async def test_qos2_inbound_exactly_once_across_a_move(nodes: list[Node], stored: Stored) -> None:
    n1, n2, n3 = nodes
    watcher = await RawClient.connected(n3.config.port, "q2-watch")
    await watcher.subscribe(("q2/in", 2))
    pub = await RawClient.connected(n1.config.port, "q2-pub", clean_session=False)
    await pub.send(Publish("q2/in", b"once", qos=2, packet_id=7))
    assert await pub.recv() == Pubrec(7)
    await pub.close()  # gone before PUBREL
    await eventually(lambda: stored.released("q2-pub"), what="n1 to store q2-pub's session")
    back = await reconnect(n2.config.port, "q2-pub", present=True)
    await back.send(Publish("q2/in", b"once", qos=2, packet_id=7, dup=True))
    assert await back.recv() == Pubrec(7)  # acknowledged, not published again
    await back.send(Pubrel(7))
    assert await back.recv() == Pubcomp(7)
    got = await watcher.recv()
    assert isinstance(got, Publish) and got.payload == b"once"
    await watcher.send(Pubrec(got.packet_id or 0))
    assert await watcher.recv() == Pubrel(got.packet_id or 0)
    await watcher.send(Pubcomp(got.packet_id or 0))
    await watcher.expect_silence(1.0)
    await back.close()
    await watcher.close()


async def test_qos2_outbound_exactly_once_across_a_move(nodes: list[Node], stored: Stored) -> None:
    n1, n2, n3 = nodes
    sub = await RawClient.connected(n1.config.port, "q2-out", clean_session=False)
    await sub.subscribe(("q2/out", 2))
    pub = await RawClient.connected(n3.config.port, "q2-out-pub")
    await pub.send(Publish("q2/out", b"exactly", qos=2, packet_id=1))
    assert await pub.recv() == Pubrec(1)
    await pub.send(Pubrel(1))
    assert await pub.recv() == Pubcomp(1)
    got = await sub.recv()
    assert isinstance(got, Publish) and got.qos == 2
    await sub.send(Pubrec(got.packet_id or 0))
    assert await sub.recv() == Pubrel(got.packet_id or 0)
    await sub.close()  # gone before PUBCOMP
    await eventually(lambda: stored.released("q2-out"), what="n1 to store q2-out's session")
    back = await reconnect(n2.config.port, "q2-out", present=True)
    assert await back.recv() == Pubrel(got.packet_id or 0)  # not the PUBLISH again
    await back.send(Pubcomp(got.packet_id or 0))
    await back.expect_silence(0.5)
    await back.close()
    await pub.close()


async def test_takeover_across_nodes_closes_old_and_publishes_its_will(nodes: list[Node]) -> None:
    n1, n2, n3 = nodes
    watcher = await RawClient.connected(n3.config.port, "will-watch")
    await watcher.subscribe(("wills/dev", 1))
    old = await RawClient.connected(
        n1.config.port, "dev-1", clean_session=False, will=Will("wills/dev", b"old gone", 1)
    )
    await old.subscribe(("dev-1/cmd", 1))
    started = time.monotonic()
    new = await reconnect(n2.config.port, "dev-1", present=True)  # [MQTT-3.1.4-2]
    took = time.monotonic() - started
    await old.expect_closed()
    will = await watcher.recv()
    assert isinstance(will, Publish) and will.payload == b"old gone"
    await watcher.send(Puback(will.packet_id or 0))
    assert took < 1.0, f"takeover took {took:.3f} s"
    pub = await RawClient.connected(n3.config.port, "cmd-pub")
    await publish_qos1(pub, "dev-1/cmd", [b"to the new owner"])
    got = await new.recv()
    assert isinstance(got, Publish) and got.payload == b"to the new owner"
    for c in (new, watcher, pub):
        await c.close()


NodeProcess = Callable[[str, int], Awaitable[asyncio.subprocess.Process]]


@pytest.fixture
async def node_process(
    nodes: list[Node], kafka_bootstrap: str, log_topic: str, redis_url: str, redis_prefix: str
) -> AsyncIterator[NodeProcess]:
    """Nodes on the tests' Redis as processes of their own, for a test to kill.  They are
    killed before the in-process ``nodes`` stop (this fixture is set up after them)."""
    procs: list[asyncio.subprocess.Process] = []

    async def launch(node_id: str, port: int) -> asyncio.subprocess.Process:
        store = ("--redis-url", redis_url, "--redis-prefix", redis_prefix)
        proc = await launch_node_process(node_id, port, kafka_bootstrap, log_topic, *store)
        procs.append(proc)
        return proc

    yield launch
    for proc in procs:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


@pytest.fixture
async def will_watcher(nodes: list[Node]) -> AsyncIterator[RawClient]:
    watcher = await RawClient.connected(nodes[0].config.port, "will-watch")
    await watcher.subscribe(("wills/#", 1))
    yield watcher
    await watcher.close()


async def next_will(watcher: RawClient, timeout: float = 5.0) -> Publish:
    packet = await watcher.recv(timeout=timeout)
    assert isinstance(packet, Publish)
    await watcher.send(Puback(packet.packet_id or 0))
    return packet


async def kill(proc: asyncio.subprocess.Process) -> None:
    proc.send_signal(signal.SIGKILL)
    await proc.wait()


@pytest.mark.fault
async def test_wills_of_a_killed_node_are_published_once_by_another_node(
    nodes: list[Node], node_process: NodeProcess, will_watcher: RawClient, stored: Stored
) -> None:
    # [MQTT-3.1.2-8]: the connection closed without DISCONNECT, even though its node died with it
    port = free_port()
    proc = await node_process("doomed", port)
    stayer = await RawClient.connected(port, "stayer", will=Will("wills/stayer", b"lost", 1))
    leaver = await RawClient.connected(port, "leaver", will=Will("wills/leaver", b"no", 1))
    await leaver.send(Disconnect())  # its will is discarded [MQTT-3.14.4-3]
    await leaver.expect_closed()
    await stayer.send(Pingreq())
    assert await stayer.recv() == Pingresp()
    await eventually(  # the node drops the leaver's stored will as it releases it
        lambda: stored.will_dropped("doomed", "leaver"), what="the leaver's will dropped"
    )
    await kill(proc)
    # The node's alive key expires (5 s), then the next sweep (every 2 s) takes the will.
    will = await next_will(will_watcher, timeout=15)
    assert (will.topic, will.payload, will.qos) == ("wills/stayer", b"lost", 1)
    await will_watcher.expect_silence(3.0)  # once, by one node; never the leaver's
    assert sum(n.sessions.wills.orphaned for n in nodes) == 1


@pytest.mark.fault
async def test_a_client_back_at_once_after_its_node_died_gets_its_will_out_first(
    nodes: list[Node], node_process: NodeProcess, will_watcher: RawClient, stored: Stored
) -> None:
    port = free_port()
    proc = await node_process("crashing", port)
    will = Will("wills/meter", b"offline", 1)
    # Kept referenced: a dropped RawClient's socket is closed whenever it is garbage-collected,
    # which would end the session (and publish the will) before the node is killed.
    meter = await RawClient.connected(port, "meter", clean_session=False, will=will)
    await eventually(  # stored by the node's periodic save
        lambda: stored.saved_while_connected("meter"),
        what=f"the periodic save (every {SAVE_INTERVAL:g} s) to store meter's session",
    )
    await kill(proc)
    # Its node still looks alive: n1 asks it to let go, gets no answer, takes it by force.
    back = await reconnect(nodes[0].config.port, "meter", present=True)
    await publish_qos1(back, "wills/meter", [b"online"])
    got = [(await next_will(will_watcher)).payload for _ in range(2)]
    assert got == [b"offline", b"online"]  # the old connection's will, then the new one's news
    await will_watcher.expect_silence(8.0)  # past the dead node's expiry and a sweep: once only
    await back.close()
    await meter.close()


@pytest.mark.fault
async def test_a_stuck_nodes_idle_session_taken_by_force_is_closed_without_a_second_will(
    nodes: list[Node], node_process: NodeProcess, will_watcher: RawClient, stored: Stored
) -> None:
    """The stuck node never saves the idle session again, so no refused save would tell it; the
    node that took the session tells its inbox, and when it runs again it closes the old
    connection without publishing the will the other node already published."""
    port = free_port()
    proc = await node_process("stuck", port)
    will = Will("wills/sleepy", b"offline", 1)
    old = await RawClient.connected(port, "sleepy", clean_session=False, will=will, keep_alive=60)
    await eventually(lambda: stored.saved_while_connected("sleepy"), what="the session stored")
    proc.send_signal(signal.SIGSTOP)
    try:
        back = await reconnect(nodes[0].config.port, "sleepy", present=True)  # after 1.5 s
        assert (await next_will(will_watcher)).payload == b"offline"
    finally:
        proc.send_signal(signal.SIGCONT)
    await old.expect_closed(timeout=10)  # the stuck node, running again, let go of it
    await will_watcher.expect_silence(3.0)  # the will went out once
    await back.close()


async def test_a_node_restarted_under_its_id_publishes_the_wills_it_left(
    node_process: NodeProcess, will_watcher: RawClient
) -> None:
    port = free_port()
    proc = await node_process("phoenix", port)
    # Kept referenced: a collected client would close its socket and its node publish the will.
    sensor = await RawClient.connected(port, "sensor", will=Will("wills/sensor", b"offline", 1))
    await kill(proc)
    # Back before its alive key expired: no other node sweeps it, the new process does.
    await node_process("phoenix", port)
    assert (await next_will(will_watcher, timeout=10)).payload == b"offline"
    await will_watcher.expect_silence(7.0)  # past the expiry and a sweep: not published again
    back = await RawClient.connected(port, "sensor")  # the stale session is no obstacle
    await back.close()
    await sensor.close()


async def test_racing_connects_end_with_one_owner(nodes: list[Node]) -> None:
    async def attempt(node: Node) -> RawClient | None:
        client = await RawClient.open(node.config.port)
        await client.send(Connect("racer", clean_session=False))
        try:
            await client.recv()
        except (ConnectionError, TimeoutError):
            return None
        return client

    clients = [c for c in await asyncio.gather(*(attempt(n) for n in nodes)) if c is not None]

    def racer_connections() -> int:
        return sum(c.channel.client_id == "racer" for n in nodes for c in n.connections)

    await eventually(  # the race is over: the losers' connections are closed
        lambda: racer_connections() == 1, what="one connection of racer left in the cluster"
    )
    alive = []
    for client in clients:
        try:
            await client.send(Pingreq())
            if await client.recv(timeout=2.0) == Pingresp():
                alive.append(client)
        except (ConnectionError, TimeoutError, OSError):
            pass
    assert len(alive) == 1
    for client in clients:
        await client.close()


async def test_retained_set_replace_clear_seen_from_every_node(nodes: list[Node]) -> None:
    n1, n2, n3 = nodes
    a = await RawClient.connected(n1.config.port, "ret-a")
    b = await RawClient.connected(n2.config.port, "ret-b")
    await a.send(Publish("site/x/state", b"first", qos=1, retain=True, packet_id=1))
    assert await a.recv() == Puback(1)
    await b.send(Publish("site/x/state", b"second", qos=1, retain=True, packet_id=1))
    assert await b.recv() == Puback(1)
    for i, node in enumerate(nodes):
        sub = await RawClient.connected(node.config.port, f"ret-sub{i}")
        await sub.subscribe(("site/x/state", 0), packet_id=3)
        assert await sub.recv() == Publish("site/x/state", b"second", retain=True)
        await sub.close()
        wild = await RawClient.connected(node.config.port, f"ret-wild{i}")
        await wild.subscribe(("site/#", 0))
        assert await wild.recv() == Publish("site/x/state", b"second", retain=True)
        await wild.close()
    await a.send(Publish("site/x/state", b"", qos=1, retain=True, packet_id=2))
    assert await a.recv() == Puback(2)
    for i, node in enumerate((n3, n2)):
        sub = await RawClient.connected(node.config.port, f"ret-empty{i}")
        await sub.subscribe(("site/#", 0))
        await sub.expect_silence(0.5)
        await sub.close()
    await a.close()
    await b.close()


async def test_clean_session_wipes_an_earlier_session_cluster_wide(
    nodes: list[Node], stored: Stored
) -> None:
    n1, n2, n3 = nodes
    sub = await RawClient.connected(n1.config.port, "wiped", clean_session=False)
    await sub.subscribe(("wipe/t", 1))
    await sub.send(Disconnect())
    clean = await RawClient.open(n2.config.port)
    await clean.send(Connect("wiped", clean_session=True))
    assert await clean.recv() == Connack(False, 0)  # [MQTT-3.2.2-1]
    await clean.send(Disconnect())
    await eventually(lambda: stored.released("wiped"), what="n2 to forget wiped's session")
    again = await reconnect(n3.config.port, "wiped", present=False)  # [MQTT-3.1.2-6]
    pub = await RawClient.connected(n1.config.port, "wipe-pub")
    await publish_qos1(pub, "wipe/t", [b"nobody"])
    await again.expect_silence(0.5)  # the subscription went with the old session
    await again.close()
    await pub.close()


async def test_records_lost_to_retention_are_counted_and_session_continues(
    nodes: list[Node], kafka_bootstrap: str, log_topic: str
) -> None:
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    n1, n2, _ = nodes
    sub = await RawClient.connected(n1.config.port, "late", clean_session=False)
    await sub.subscribe(("old/t", 1))
    await sub.send(Disconnect())
    # away before the first message: one delivered to the closing connection would be in
    # flight, kept with the session and sent again from there, whatever the log still holds
    await sub.expect_closed()
    pub = await RawClient.connected(n2.config.port, "old-pub")
    await publish_qos1(pub, "old/t", [str(i).encode() for i in range(5)])
    partition = n1.router.partition_for_topic("old/t")
    end = (await n2.log.high_watermarks([partition]))[partition]
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    futures = admin.delete_records([TopicPartition(log_topic, partition, end - 2)])
    for future in futures.values():
        future.result(10)  # as retention would: all but the last two records are gone
    back = await reconnect(n2.config.port, "late", present=True)
    got = await receive(back, 2)
    assert [p.payload for p in got] == [b"3", b"4"]
    assert n2.dispatcher.counters.retention_lost == 3
    await back.close()
    await pub.close()
