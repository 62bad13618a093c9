"""Sessions end: a persistent session not resumed within the expiry is removed with nothing left,
and counted once; one resumed in time keeps its state and loses its deadline.

Run against every backend with an expiry of one second.  In Redis the keys go by their TTLs,
which these tests check with SCAN (the store itself never scans), and the count needs a node
listening for expired markers: the tests that count run the real ``Coordinator``.  Fencing
tokens grow across keys that expired or were deleted, so no old lease ever writes a new session.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from frontend.cluster import Coordinator
from frontend.sessions.redis import RedisSessionStore
from frontend.sessions.store import Acquired, Lease, MemorySessionStore, SessionStore
from headwater.services.redis_server import LocalRedis
from mqttcore.session import StoredSession
from tests.e2e.conftest import eventually
from tests.integration.conftest import REDIS_KINDS, OpenRedis, keys_under

EXPIRY = 1.0


def state(last_id: int = 1) -> StoredSession:
    return StoredSession({"sensors/#": 1}, {0: 5}, [], [], last_id)


async def parked(store: SessionStore, client_id: str, node_id: str = "node-a") -> Lease:
    """A persistent session acquired, saved with a QoS 2 mark and a will, then released."""
    answer = await store.acquire(client_id, node_id, False)
    assert isinstance(answer, Acquired)
    assert await store.save(answer.lease, state())
    await store.mark_received(answer.lease, 3)
    await store.keep_will(answer.lease, b"will")
    await store.release(answer.lease, state())
    return answer.lease


async def acquire(store: SessionStore, client_id: str, node_id: str = "node-b") -> Acquired:
    answer = await store.acquire(client_id, node_id, False)
    assert isinstance(answer, Acquired)
    return answer


@pytest.fixture(params=["memory", *REDIS_KINDS])
def store(request: pytest.FixtureRequest, open_redis: OpenRedis, redis_prefix: str) -> SessionStore:
    if request.param == "memory":
        return MemorySessionStore(EXPIRY)
    return RedisSessionStore(open_redis(request.param), redis_prefix, EXPIRY)


@pytest.fixture(params=REDIS_KINDS)
def redis_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def redis_store(redis_kind: str, open_redis: OpenRedis, redis_prefix: str) -> RedisSessionStore:
    return RedisSessionStore(open_redis(redis_kind), redis_prefix, EXPIRY)


class Nodes:
    """The coordinators (heartbeat, inbox, sweep, expiry listener) of the nodes a test runs,
    and the wills they published."""

    def __init__(self) -> None:
        self.started: list[Coordinator] = []
        self.wills: list[bytes] = []

    async def start(self, store: RedisSessionStore, node_id: str) -> Coordinator:
        coordinator = Coordinator(store, node_id, _ignore, self.wills.extend, _ignore)
        await coordinator.start()
        self.started.append(coordinator)
        return coordinator


@pytest.fixture
async def nodes() -> AsyncIterator[Nodes]:
    running = Nodes()
    yield running
    for coordinator in running.started:
        await coordinator.stop()


async def gone(store: SessionStore, client_id: str) -> bool:
    """Nothing is kept of ``client_id``'s session any more (looked at without acquiring it)."""
    if isinstance(store, MemorySessionStore):
        return client_id not in store._states and client_id not in store._marks
    return await keys_under(store.redis, f"{store.prefix}{{{client_id}}}") == []


# -- every backend ------------------------------------------------------------------------------


async def test_a_session_not_resumed_in_time_ends_with_nothing_left(store: SessionStore) -> None:
    lease = await parked(store, "sleeper")
    await eventually(lambda: gone(store, "sleeper"), what="the session to expire", timeout=15)
    if isinstance(store, RedisSessionStore):
        assert await keys_under(store.redis, store.prefix) == []
    back = await acquire(store, "sleeper")
    assert (back.state, back.orphaned_will) == (None, None)
    assert back.lease.token > lease.token  # the token grew across the expired key
    assert not await store.save(lease, state(last_id=2))


async def test_a_session_resumed_in_time_keeps_its_state_and_loses_its_deadline(
    store: SessionStore,
) -> None:
    await parked(store, "returner")
    back = await acquire(store, "returner")
    assert back.state is not None and back.state.last_id == 1 and back.state.awaiting_rel == [3]
    if isinstance(store, RedisSessionStore):
        ttls = [await store.redis.pttl(key) for key in store._keys("returner")]
        assert ttls == [-1, -1, -2]  # session, marks: no TTL; expiry marker: none
    await parked(store, "witness")  # parked later: if "returner" were to expire, it would first
    await eventually(lambda: gone(store, "witness"), what="the witness to expire", timeout=15)
    assert not await gone(store, "returner")
    assert await store.save(back.lease, state(last_id=2))


async def test_a_released_clean_session_leaves_nothing(store: SessionStore) -> None:
    first = await store.acquire("passer", "node-a", True)
    assert isinstance(first, Acquired)
    await store.mark_received(first.lease, 1)
    await store.release(first.lease, None)
    assert await gone(store, "passer")
    if isinstance(store, RedisSessionStore):
        assert await keys_under(store.redis, store.prefix) == []
    again = await store.acquire("passer", "node-b", True)
    assert isinstance(again, Acquired) and again.lease.token > first.lease.token
    assert not await store.save(first.lease, state())


async def test_the_memory_store_counts_expiry_and_keeps_nothing() -> None:
    store = MemorySessionStore(0.05)
    for client_id in ("a", "b", "c"):
        await parked(store, client_id)
    await acquire(store, "b")  # resumed in time
    await eventually(lambda: store.expired == 2, what="two sessions to expire")
    assert set(store._states) == {"b"} and set(store._owners) == {"b"}
    assert not store._parked and not store._deadlines  # the one heap is empty again


# -- Redis: counting, dead nodes, checkpoints ---------------------------------------------------


async def test_expired_sessions_are_counted_once_across_nodes(
    redis_kind: str,
    open_redis: OpenRedis,
    redis_prefix: str,
    nodes: Nodes,
) -> None:
    one = RedisSessionStore(open_redis(redis_kind), redis_prefix, EXPIRY)
    two = RedisSessionStore(open_redis(redis_kind), redis_prefix, EXPIRY)
    await nodes.start(one, "node-1")
    await nodes.start(two, "node-2")
    sleepers = [f"sleeper-{i}" for i in range(5)]
    for client_id in sleepers:
        await parked(one, client_id)

    markers = [one._keys(client_id)[2] for client_id in sleepers]

    async def all_expired() -> bool:
        # Looking at a key past its TTL expires it at once (and sends the event): the test does
        # not wait on Redis's sampling of a server whose other keys have long TTLs.
        return all([await missing(one, marker) for marker in markers])

    await eventually(all_expired, what="the 5 markers to expire", timeout=15)
    await eventually(lambda: one.expired + two.expired == 5, what="5 expiries counted", timeout=15)
    for client_id in sleepers:
        assert await gone(one, client_id)
    assert one.expired + two.expired == 5


async def test_a_late_return_counts_the_expiry_it_finds(redis_store: RedisSessionStore) -> None:
    """The marker expired but nobody reaped (no node listening): the returning client's acquire
    finds the session expired, removes it and counts it."""
    await parked(redis_store, "late")
    marker = redis_store._keys("late")[2]
    await eventually(lambda: missing(redis_store, marker), what="the marker to expire", timeout=15)
    back = await acquire(redis_store, "late")  # before the other keys' TTL (a second later)
    assert (back.state, redis_store.expired) == (None, 1)


async def test_a_dead_nodes_sessions_expire_after_its_sweep(
    redis_store: RedisSessionStore, nodes: Nodes
) -> None:
    await redis_store.heartbeat("dead")  # listed among the nodes, then it dies
    answer = await redis_store.acquire("orphan", "dead", False)
    assert isinstance(answer, Acquired)
    assert await redis_store.save(answer.lease, state())
    await redis_store.keep_will(answer.lease, b"orphan's will")
    await redis_store.redis.delete(redis_store.alive_key("dead"))
    ttls = [await redis_store.redis.pttl(key) for key in redis_store._keys("orphan")]
    assert ttls == [-1, -2, -2]  # connected: no TTL until its node is found dead

    survivor = await nodes.start(redis_store, "survivor")
    await survivor.sweep_dead_nodes()
    assert nodes.wills == []  # not before the survivor's own heartbeats prove Redis steady
    await eventually(lambda: nodes.wills == [b"orphan's will"], what="the sweep", timeout=15)
    assert await redis_store.redis.pttl(redis_store._keys("orphan")[0]) > 0
    marker = redis_store._keys("orphan")[2]
    await eventually(lambda: missing(redis_store, marker), what="the marker to expire", timeout=15)
    await eventually(lambda: redis_store.expired == 1, what="the orphan's expiry", timeout=15)
    assert await gone(redis_store, "orphan")
    assert await redis_store.nodes() == ["survivor"]  # the dead node is no longer listed


async def test_checkpoints_last_as_long_as_the_sessions_that_need_them(
    redis_kind: str, open_redis: OpenRedis, redis_prefix: str
) -> None:
    client = open_redis(redis_kind)
    expiring = RedisSessionStore(client, redis_prefix, 100.0)
    await expiring.checkpoint("node-a", 1, {0: 10})
    key = f"{redis_prefix}{{node-a}}:ckpt"
    assert 160_000 < await client.pttl(key) <= 100_000 + 60_000 + 60_000
    await RedisSessionStore(client, redis_prefix, 0).checkpoint("node-b", 1, {0: 10})
    assert await client.pttl(f"{redis_prefix}{{node-b}}:ckpt") == -1  # expiry 0: kept forever


async def test_a_node_turns_on_expiry_events_where_redis_has_them_off(tmp_path: Path) -> None:
    local = LocalRedis(tmp_path / "redis")
    url = await asyncio.to_thread(local.start)
    client = aioredis.Redis.from_url(url)
    try:
        await client.config_set("notify-keyspace-events", "g")
        store = RedisSessionStore(client, "t:")
        coordinator = Coordinator(store, "node", _ignore, _ignore, _ignore)
        await coordinator.start()
        await coordinator.stop()
        flags = (await client.config_get("notify-keyspace-events"))["notify-keyspace-events"]
        assert set(flags) == {"g", "E", "x"}
    finally:
        await client.aclose()
        await asyncio.to_thread(local.stop)


async def missing(store: RedisSessionStore, key: str) -> bool:
    return not await store.redis.exists(key)


def _ignore(*_: object) -> None:
    """What a coordinator calls back, where a test has no use for it."""
