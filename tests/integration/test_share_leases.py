"""Share groups' leases on a real Redis and Redis Cluster (``frontend.share_leases``): how the
partitions of a group are dealt between member nodes, moved, fenced and freed."""

from __future__ import annotations

import pytest

from frontend.share_leases import RedisShareLeases
from tests.e2e.conftest import eventually
from tests.integration.conftest import REDIS_KINDS, OpenRedis, keys_under

WANTED = [0, 1, 2, 3]
STARTS = dict.fromkeys(WANTED, 10)
GID = "headwater.share.1:g.a/#"


@pytest.mark.parametrize("kind", REDIS_KINDS)
async def test_partitions_are_dealt_moved_and_fenced(
    kind: str, open_redis: OpenRedis, redis_prefix: str
) -> None:
    client = open_redis(kind)
    a, b = (RedisShareLeases(client, redis_prefix, node) for node in ("node-a", "node-b"))
    assert await a.hold(GID, WANTED, {}, STARTS) == STARTS  # alone: all, at the start
    assert await b.hold(GID, WANTED, {}, STARTS) == {}  # a member, but a holds them all
    # a's next step commits, keeps its half and lets the other half go; b takes that half
    assert await a.hold(GID, WANTED, {0: 12, 1: 13, 2: 15}, STARTS) == {0: 12, 2: 15}
    assert await b.hold(GID, WANTED, {}, STARTS) == {1: 13, 3: 10}
    # a no longer holds 1: its commit there is refused
    assert await a.hold(GID, WANTED, {1: 99}, STARTS) == {0: 12, 2: 15}
    assert await b.hold(GID, WANTED, {}, STARTS) == {1: 13, 3: 10}
    await a.leave(GID, WANTED, {0: 20})
    assert await b.hold(GID, WANTED, {}, STARTS) == {0: 20, 1: 13, 2: 15, 3: 10}


@pytest.mark.parametrize("kind", REDIS_KINDS)
async def test_a_node_that_stops_renewing_loses_its_leases(
    kind: str, open_redis: OpenRedis, redis_prefix: str
) -> None:
    client = open_redis(kind)
    gone = RedisShareLeases(client, redis_prefix, "node-gone", lease_seconds=0.5)
    live = RedisShareLeases(client, redis_prefix, "node-live", lease_seconds=0.5)
    await gone.hold(GID, WANTED, {3: 17}, STARTS)
    assert await gone.hold(GID, WANTED, {3: 17}, STARTS) == {**STARTS, 3: 17}
    assert await live.hold(GID, WANTED, {}, STARTS) == {}

    async def live_holds_all() -> bool:
        return await live.hold(GID, WANTED, {}, STARTS) == {**STARTS, 3: 17}

    await eventually(live_holds_all, what="the leases of a node that stopped renewing", timeout=5)


@pytest.mark.parametrize("kind", REDIS_KINDS)
async def test_a_group_nobody_holds_leaves_only_its_points(
    kind: str, open_redis: OpenRedis, redis_prefix: str
) -> None:
    client = open_redis(kind)
    node = RedisShareLeases(client, redis_prefix, "node-a", lease_seconds=0.5)
    await node.hold(GID, WANTED, {}, STARTS)
    await node.leave(GID, WANTED, {2: 11})
    members, leases, points = node.keys(GID)
    assert await client.exists(members, leases) == 0
    assert await client.hgetall(points) == {b"0": b"10", b"1": b"10", b"2": b"11", b"3": b"10"}
    assert await client.ttl(points) > 0
    assert {key.decode() for key in await keys_under(client, redis_prefix)} == {points}
