"""Redis Cluster: every key of one client (or node, or retained routing key) in one slot, the
stores and the takeover inbox working on a real local cluster of three masters, and front-end
nodes selecting it with ``redis_cluster``.

The session store contract and the expiry tests run against the cluster too (their fixtures are
parametrized over it); here is what is particular to it: names that cannot be hash tags as they
are, and the node wiring.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.asyncio.cluster import RedisCluster

from frontend.cluster import Coordinator
from frontend.node import Node, NodeConfig
from frontend.retained import RedisRetainedStore
from frontend.sessions.redis import RedisSessionStore
from frontend.sessions.store import Acquired
from headwater.services.kafka_admin import ensure_topic
from mqttcore.message import Message
from mqttcore.packets import Connack, Connect, Disconnect
from mqttcore.session import StoredSession
from tests.e2e.conftest import eventually
from tests.e2e.rawmqtt import RawClient
from tests.integration.conftest import REDIS_KINDS, OpenRedis

ODD_NAMES = ["plain", "", "}", "a}b", "{tagged}", "x{y", "ü/🚀"]


@pytest.mark.parametrize("client_id", ODD_NAMES)
async def test_every_key_of_a_client_or_node_shares_one_slot(
    client_id: str, open_redis: OpenRedis, redis_prefix: str
) -> None:
    client = open_redis("redis-cluster")
    assert isinstance(client, RedisCluster)
    store = RedisSessionStore(client, redis_prefix)
    assert len({client.keyslot(key) for key in store._keys(client_id)}) == 1
    node_keys = [store.alive_key(client_id), store.inbox(client_id)]
    node_keys += [store._node_key(client_id, name) for name in ("owned", "ckpt")]
    assert len({client.keyslot(key) for key in node_keys}) == 1

    kept = StoredSession({"a/#": 1}, {0: 5}, [], [], 2)
    first = await store.acquire(client_id, client_id, False)  # the same name as node and client
    assert isinstance(first, Acquired)
    assert await store.save(first.lease, kept)
    await store.mark_received(first.lease, 4)
    await store.release(first.lease, kept)
    again = await store.acquire(client_id, "node-b", False)
    assert isinstance(again, Acquired) and again.state is not None
    assert (again.state.subscriptions, again.state.awaiting_rel) == ({"a/#": 1}, [4])


@pytest.mark.parametrize("kind", REDIS_KINDS)
async def test_retained_messages(kind: str, open_redis: OpenRedis, redis_prefix: str) -> None:
    store = RedisRetainedStore(open_redis(kind), 2, redis_prefix)

    def message(topic: str, payload: bytes) -> Message:
        return Message(topic, payload, 1, True, "publisher", "node", 0, bytes(16))

    await store.apply(message("site/a}b/temp", b"21"), 0, 10)
    await store.apply(message("site/{c}/temp", b"19"), 1, 4)
    await store.apply(message("site/a}b/temp", b"20"), 0, 9)  # older, arriving late
    await store.apply(message("site/{c}/temp", b""), 1, 5)  # cleared
    assert [r.message.payload for r in await store.match("site/a}b/temp")] == [b"21"]
    assert [r.message.payload for r in await store.match("site/+/temp")] == [b"21"]
    assert await store.match("site/{c}/temp") == []
    assert [r.offset for r in await store.match("#")] == [10]


@pytest.mark.parametrize("kind", REDIS_KINDS)
async def test_takeover_requests_and_notices_reach_the_owner(
    kind: str, open_redis: OpenRedis, redis_prefix: str
) -> None:
    asked: list[str] = []
    taken: list[tuple[str, int]] = []

    def told(client_id: str, token: int) -> None:
        taken.append((client_id, token))

    def nothing(*_: object) -> None:
        pass

    owner = Coordinator(
        RedisSessionStore(open_redis(kind), redis_prefix), "owner", asked.append, nothing, told
    )
    other = Coordinator(
        RedisSessionStore(open_redis(kind), redis_prefix), "other", nothing, nothing, nothing
    )
    await owner.start()
    await other.start()
    try:
        await other.request_release("owner", "client-1")
        await eventually(lambda: asked == ["client-1"], what="the owner to be asked")
        await other.tell_taken("owner", "client 2", 1795)  # any MQTT client id: no NUL in it
        await eventually(lambda: taken == [("client 2", 1795)], what="the owner to be told")
    finally:
        await other.stop()
        await owner.stop()


@pytest.fixture
async def cluster_nodes(
    kafka_bootstrap: str, topic_name: str, redis_cluster_url: str, redis_prefix: str
) -> AsyncIterator[list[Node]]:
    """Two front-end nodes on the Redis Cluster."""
    await asyncio.to_thread(ensure_topic, kafka_bootstrap, topic_name, 2, {})
    started: list[Node] = []
    for node_id in ("c1", "c2"):
        config = NodeConfig(
            node_id=node_id, host="127.0.0.1", port=0, kafka_bootstrap=kafka_bootstrap,
            redis_url=redis_cluster_url, redis_cluster=True, redis_prefix=redis_prefix,
            topic=topic_name, partitions=2,
        )  # fmt: skip
        node = Node(config)
        await node.start()
        started.append(node)
    yield started
    for node in started:
        await node.stop()
    client = RedisCluster.from_url(redis_cluster_url)
    keys = [key async for key in client.scan_iter(match=f"{redis_prefix}*")]
    if keys:
        await client.delete(*keys)
    await client.aclose()


async def test_nodes_on_redis_cluster_move_a_persistent_session(cluster_nodes: list[Node]) -> None:
    one, two = cluster_nodes
    first = await RawClient.connected(one.config.port, "mover", clean_session=False)
    await first.subscribe(("fleet/#", 1))
    taken = await RawClient.open(two.config.port)
    await taken.send(Connect("mover", clean_session=False))
    assert await taken.recv() == Connack(True, 0)  # taken over from node c1 [MQTT-3.1.4-2]
    await first.expect_closed()
    await taken.send(Disconnect())
    await taken.expect_closed()
    back = await RawClient.open(one.config.port)
    await back.send(Connect("mover", clean_session=False))
    assert await back.recv() == Connack(True, 0)
    await back.close()
