"""``frontend.redis_clients.pipeline``: the session store's round trip, against a real Redis."""

from __future__ import annotations

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from frontend.redis_clients import pipeline, single_client
from tests.integration.conftest import REDIS_KINDS, OpenRedis


@pytest.mark.parametrize("kind", REDIS_KINDS)
async def test_each_command_gets_its_own_reply_an_error_only_its_own(
    open_redis: OpenRedis, redis_prefix: str, kind: str
) -> None:
    client = open_redis(kind)
    key, other = f"{redis_prefix}{{a}}:text", f"{redis_prefix}{{b}}:count"
    replies = await pipeline(
        client, [("SET", key, "v"), ("INCR", key), ("INCR", other), ("GET", key)]
    )
    assert replies[0] is True or replies[0] == b"OK"
    assert isinstance(replies[1], ResponseError) and "not an integer" in str(replies[1])
    assert replies[2:] == [1, b"v"]
    assert await pipeline(client, []) == []


async def test_a_connection_redis_closed_is_made_again_and_the_batch_sent(
    redis_url: str, redis_prefix: str
) -> None:
    client = single_client(redis_url, 2)
    try:
        key = f"{redis_prefix}kill"
        await client.client_setname("headwater-pipeline-test")
        assert await pipeline(client, [("SET", key, "1")]) == [b"OK"]
        killed = await client.client_kill_filter(skipme=False, _type="normal")
        assert killed >= 1  # every pooled connection, the one the next batch gets included
        assert await pipeline(client, [("INCR", key), ("GET", key)]) == [2, b"2"]
        await client.delete(key)
    finally:
        await client.aclose()


async def test_a_redis_that_is_not_there_raises_for_the_whole_batch() -> None:
    client = single_client("redis://127.0.0.1:1/0", 2)
    try:
        with pytest.raises(RedisConnectionError):
            await pipeline(client, [("SET", "k", "1"), ("GET", "k")])
    finally:
        await client.aclose()
