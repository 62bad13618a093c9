"""Integration fixtures: clients of the session's Redis and Redis Cluster, opened on demand.

``open_redis("redis")`` is a client of the single Redis (``redis_url``), ``open_redis("redis-
cluster")`` one of the Redis Cluster (``redis_cluster_url``); each service starts on first use.
What a test wrote under its ``redis_prefix`` is deleted when it ends, so the services stay shared.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from frontend.sessions.redis import RedisClient

OpenRedis = Callable[[str], RedisClient]
REDIS_KINDS = ["redis", "redis-cluster"]


async def keys_under(client: RedisClient, prefix: str) -> list[bytes]:
    """Every key whose name starts with ``prefix`` (on every master of a cluster), by SCAN."""
    return [key async for key in client.scan_iter(match=f"{prefix}*")]


@pytest.fixture
async def open_redis(request: pytest.FixtureRequest, redis_prefix: str) -> AsyncIterator[OpenRedis]:
    opened: list[RedisClient] = []

    def open_client(kind: str) -> RedisClient:
        client: RedisClient
        if kind == "redis-cluster":
            client = RedisCluster.from_url(request.getfixturevalue("redis_cluster_url"))
        else:
            client = aioredis.Redis.from_url(request.getfixturevalue("redis_url"))
        opened.append(client)
        return client

    yield open_client
    for client in opened:
        keys = await keys_under(client, redis_prefix)
        if keys:
            await client.delete(*keys)
        await client.aclose()
