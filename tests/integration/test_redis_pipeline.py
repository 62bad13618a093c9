"""``frontend.redis_clients.pipeline``: the session store's round trip, against a real Redis."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from functools import partial
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from frontend.redis_clients import Lane, pipeline, single_client
from headwater.services.redis_server import LocalRedis
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


@pytest.mark.parametrize("through", ["pipeline", "lane"])
async def test_a_redis_that_does_not_answer_times_the_batch_out_and_drops_the_connection(
    through: str, tmp_path: Path
) -> None:
    """A Redis that takes the batch and stays silent (stopped): one socket timeout for the
    whole batch, a Redis error the stores count as an outage; and the connection is not used
    again, so the replies Redis gives once it goes on are never read as a later batch's."""
    with LocalRedis(tmp_path, appendonly=False) as redis:
        assert redis.child is not None
        client = aioredis.Redis.from_url(redis.url, socket_timeout=0.5)
        send = Lane(client).send if through == "lane" else partial(pipeline, client)
        try:
            assert await send([("ECHO", "up")]) == [b"up"]
            os.kill(redis.child.popen.pid, signal.SIGSTOP)
            try:
                started = time.monotonic()
                with pytest.raises(RedisTimeoutError):
                    await send([("INCR", "n"), ("INCR", "n"), ("INCR", "n")])
                assert 0.5 <= time.monotonic() - started < 2.0
            finally:
                os.kill(redis.child.popen.pid, signal.SIGCONT)
            assert await send([("ECHO", "fresh"), ("ECHO", "again")]) == [b"fresh", b"again"]
        finally:
            await client.aclose()


async def test_a_lane_keeps_its_connection_and_makes_it_again_when_redis_closed_it(
    redis_url: str, redis_prefix: str
) -> None:
    client = single_client(redis_url, 4)
    lane = Lane(client)
    key = f"{redis_prefix}lane"
    try:
        (first,) = await lane.send([("CLIENT", "ID")])
        assert await lane.send([("SET", key, "1"), ("INCR", key)]) == [b"OK", 2]
        assert await lane.send([("CLIENT", "ID")]) == [first]  # the same connection, kept
        both = await asyncio.gather(  # the second while the first is out: one from the pool
            lane.send([("INCR", key), ("CLIENT", "ID")]), lane.send([("CLIENT", "ID")])
        )
        assert both[0][1] == first and both[1][0] != first
        assert await client.client_kill_filter(_id=first) == 1
        assert await lane.send([("GET", key)]) == [b"3"]  # made again, the batch sent once more
        assert await lane.send([("CLIENT", "ID")]) != [first]
        await client.delete(key)
    finally:
        await client.aclose()
