"""The retained store in the real Redis (and Redis Cluster): clears leave nothing behind but a
marker that expires, a late older write does not bring a cleared topic back, the cluster-wide
limits refuse and count, and a wildcard filter is read a batch at a time."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from frontend.retained import BATCH, RedisRetainedStore, RetainedLimits
from mqttcore.message import Message
from router import record
from tests.e2e.conftest import eventually
from tests.integration.conftest import REDIS_KINDS, OpenRedis, keys_under


def message(topic: str, payload: bytes) -> Message:
    return Message(topic, payload, 1, True, "publisher", "node", 0, bytes(16))


async def apply_all(
    store: RedisRetainedStore, topics: list[str], payload: bytes, offset: int
) -> None:
    for i in range(0, len(topics), 100):
        chunk = topics[i : i + 100]
        await asyncio.gather(*(store.apply(message(t, payload), 0, offset) for t in chunk))


async def used_memory(client: aioredis.Redis) -> int:
    """Redis's ``used_memory`` less its clients' buffers (a pool's query buffers are no
    retained message's cost)."""
    memory = await client.info("memory")
    return int(memory["used_memory"]) - int(memory["mem_clients_normal"])


async def test_clearing_5000_retained_messages_leaves_no_key_and_gives_the_memory_back(
    redis_url: str, redis_prefix: str
) -> None:
    client = aioredis.Redis.from_url(redis_url)
    store = RedisRetainedStore(client, 2, redis_prefix, cleared_for=1.0)
    topics = [f"site/dev{i}/state" for i in range(5000)]
    try:
        # Redis's first use of scripts and of 100 connections keeps ~0.4 MB for good: not ours
        await apply_all(store, topics[:100], b"x", 1)
        await apply_all(store, topics[:100], b"", 2)
        await eventually(lambda: _none_under(client, redis_prefix), what="the warm-up to go")
        baseline = await used_memory(client)
        await apply_all(store, topics, b"x" * 20, 10)
        full = await used_memory(client)
        assert len(await keys_under(client, redis_prefix)) > 5000
        await apply_all(store, topics, b"", 11)  # [MQTT-3.3.1-10]
        assert await store.match("site/#") == []
        await eventually(
            lambda: _none_under(client, redis_prefix), what="the clears' markers to expire"
        )
        cleared = await used_memory(client)
    finally:
        await client.aclose()
    print(f"used_memory: {baseline} empty, {full} with 5000 retained, {cleared} cleared")
    assert cleared - baseline < (full - baseline) / 10


async def _none_under(client: aioredis.Redis, prefix: str) -> bool:
    return await keys_under(client, prefix) == []


@pytest.mark.parametrize("kind", REDIS_KINDS)
async def test_a_late_older_write_does_not_bring_a_cleared_topic_back(
    kind: str, open_redis: OpenRedis, redis_prefix: str
) -> None:
    client = open_redis(kind)
    store = RedisRetainedStore(client, 2, redis_prefix)
    await store.apply(message("plant/line1/state", b"on"), 3, 10)
    await store.apply(message("plant/line1/state", b""), 3, 12)  # cleared
    await store.apply(message("plant/line1/state", b"late"), 3, 11)  # older, arriving late
    assert await store.match("plant/line1/state") == []
    assert await store.match("plant/#") == []
    (marker,) = await keys_under(client, redis_prefix)  # the clear's, and nothing else
    assert b":x:plant/line1/state" in marker and 0 < await client.pttl(marker) <= 120_000
    await store.apply(message("plant/line1/state", b"newer"), 3, 13)
    assert [r.message.payload for r in await store.match("plant/+/state")] == [b"newer"]


@pytest.mark.parametrize("kind", REDIS_KINDS)
async def test_max_retained_counts_cluster_wide_and_refuses_beyond(
    kind: str, open_redis: OpenRedis, redis_prefix: str
) -> None:
    client = open_redis(kind)
    limits_a, limits_b = RetainedLimits(max_count=3), RetainedLimits(max_count=3)
    node_a = RedisRetainedStore(client, 2, redis_prefix, limits_a)
    node_b = RedisRetainedStore(client, 2, redis_prefix, limits_b)  # another node
    for i in range(3):
        await node_a.apply(message(f"fleet{i}/dev/state", b"v1"), i, 1)
    await node_b.apply(message("fleet9/dev/state", b"v1"), 0, 2)  # in another bucket
    assert (limits_a.refused, limits_b.refused) == (0, 1)
    await node_b.apply(message("fleet0/dev/state", b"v2"), 0, 3)  # a replacement is no more
    await node_b.apply(message("fleet1/dev/state", b""), 1, 4)  # a clear makes room
    await node_b.apply(message("fleet9/dev/state", b"v2"), 0, 5)
    found = {r.message.topic: r.message.payload for r in await node_a.match("+/dev/state")}
    assert found == {
        "fleet0/dev/state": b"v2",
        "fleet2/dev/state": b"v1",
        "fleet9/dev/state": b"v2",
    }
    assert limits_b.refused == 1


@pytest.mark.parametrize("kind", REDIS_KINDS)
async def test_max_retained_bytes_refuses_a_growth_beyond_and_drops_the_replaced(
    kind: str, open_redis: OpenRedis, redis_prefix: str
) -> None:
    client = open_redis(kind)
    limits = RetainedLimits(max_bytes=2000)
    store = RedisRetainedStore(client, 2, redis_prefix, limits)
    await store.apply(message("big/a/state", b"x" * 800), 0, 1)
    await store.apply(message("big/b/state", b"x" * 800), 1, 1)
    await store.apply(message("big/c/state", b"x" * 800), 2, 1)  # would pass 2000 bytes
    assert limits.refused == 1
    await store.apply(message("big/a/state", b"x" * 1200), 0, 2)  # grows beyond: refused
    assert limits.refused == 2
    # the topic's latest retained word is one not kept: the older one is not kept either
    assert [r.message.topic for r in await store.match("big/#")] == ["big/b/state"]
    await store.apply(message("big/c/state", b"small"), 2, 3)
    assert sorted(r.message.topic for r in await store.match("big/#")) == [
        "big/b/state",
        "big/c/state",
    ]


@pytest.mark.parametrize("kind", REDIS_KINDS)
async def test_a_wildcard_filter_streams_every_match_in_batches(
    kind: str, open_redis: OpenRedis, redis_prefix: str
) -> None:
    client = open_redis(kind)
    store = RedisRetainedStore(client, 2, redis_prefix)
    spread = [f"s/dev{i}/state" for i in range(600)]  # 600 routing keys
    crowded = [f"s/hub/sensor{i}" for i in range(900)]  # one routing key, a hash of 900
    payload = b"p" * 100  # beyond a listpack's values: HSCAN pages the large hash
    await apply_all(store, spread + crowded + ["other/dev/state"], payload, 7)
    for topic_filter, expected in (
        ("s/#", spread + crowded),
        ("+/+/state", [*spread, "other/dev/state"]),
        ("s/hub/+", crowded),
    ):
        batches = [batch async for batch in store.scan(topic_filter)]
        got = [r.message.topic for batch in batches for r in batch]
        assert sorted(got) == sorted(expected), topic_filter  # each once
        assert len(batches) > 1 and all(len(batch) <= BATCH for batch in batches)


@pytest.mark.parametrize("kind", REDIS_KINDS)
async def test_the_totals_follow_every_kind_of_write_and_an_unchanged_size_costs_four_commands(
    kind: str, open_redis: OpenRedis, redis_prefix: str
) -> None:
    """What the buckets' totals say is what the store holds, through new topics, updates of
    the same and of another size, stale writes and clears; and a ``$SYS``-like update of the
    same size costs Redis the script and its three calls (it reads no marker, no totals)."""
    client = open_redis(kind)
    store = RedisRetainedStore(client, 2, redis_prefix)
    writes = [
        ("a/1/s", b"one", 1),
        ("a/2/s", b"two", 1),
        ("a/1/s", b"uno", 2),  # same size
        ("a/2/s", b"longer", 3),  # grows
        ("a/2/s", b"old", 2),  # older: ignored
        ("a/1/s", b"", 4),  # a clear
        ("a/1/s", b"back", 5),  # set again after its clear
        ("b/9/s", b"x" * 50, 1),
        ("b/9/s", b"y", 2),  # shrinks
    ]
    for topic, payload, offset in writes:
        await store.apply(message(topic, payload), 0, offset)
    held = await store.match("#")
    # a fresh store sums every bucket's totals, as another node would
    fresh = RedisRetainedStore(client, 2, redis_prefix)
    await fresh._sum_totals()
    assert fresh.totals.count == len(held) == 3
    stored = sum(len(r.message.topic) + len(record.encode(r.message)) for r in held)
    assert fresh.totals.bytes == stored
    assert (store.totals.count, store.totals.bytes) == (fresh.totals.count, fresh.totals.bytes)
    if kind == "redis":
        before = int((await client.info("stats"))["total_commands_processed"])
        await store.apply(message("a/1/s", b"BACK"), 0, 6)
        after = int((await client.info("stats"))["total_commands_processed"])
        assert after - before - 1 == 4  # less our INFO: EVALSHA, HGET, HSET, HSET


@pytest.mark.parametrize("kind", REDIS_KINDS)
async def test_topics_read_at_once_each_get_their_own_message(
    kind: str, open_redis: OpenRedis, redis_prefix: str
) -> None:
    """A storm of SUBSCRIBEs to plain topics: their reads go together, each answered apart."""
    store = RedisRetainedStore(open_redis(kind), 2, redis_prefix)
    kept = [f"fleet/dev{i}/state" for i in range(0, 300, 2)]
    await apply_all(store, kept, b"up", 5)
    asked = [f"fleet/dev{i}/state" for i in range(300)]
    found = await asyncio.gather(*(store.match(topic) for topic in asked))
    for topic, records in zip(asked, found, strict=True):
        if topic in kept:
            assert [(r.message.topic, r.message.payload) for r in records] == [(topic, b"up")]
        else:
            assert records == []
