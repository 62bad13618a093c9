"""The node's Redis clients: one Redis (or a primary with replicas) through a blocking pool, or
a Redis Cluster whose commands wait their turn; both pack their commands with hiredis.

**Waiting, not failing.**  A burst of requests waits for a free connection, up to
``REDIS_WAIT`` seconds, instead of failing with "Too many connections", which would refuse
CONNECTs: redis-py's blocking pool does it for one Redis, :class:`QueuedCluster` for a cluster.
A pooled connection that died with a Redis restart is made again at once and the command retried
on it, instead of failing one request per dead connection while the pool cycles through them.

**Packing in C.**  redis-py's asyncio connection packs every command in Python, its synchronous
one with hiredis when hiredis is installed (it is one of our dependencies).  A session script's
EVALSHA (eleven arguments) takes 9.6 us to pack in Python and 1.4 us with hiredis, and a CONNECT
followed by a DISCONNECT sends three of them, four with a will (``frontend.sessions.redis``), so
the node's connections pack with hiredis (:class:`HiredisPacking`) and fall back to redis-py's
own packing for what hiredis does not take (a command name holding a space, a memoryview).

**Pipelines without the extras.**  redis-py 8's asyncio pipeline carries, per ``execute()``,
observability hooks, field-set preparation and a retry wrapper: about 100 us of CPU for one
EVALSHA against 44 us for the same command sent and read on a pooled connection (uvloop, this
machine).  A CONNECT and its DISCONNECT make two such requests, more with a will or a SUBSCRIBE,
so :func:`pipeline` sends a batch on one pooled connection of a single Redis itself (what a
pipeline does underneath: one write, one reply read per command, an error reply answering its
own command), again once on a fresh connection if the pooled one was dead, as the client's
retry policy does (a timeout is not tried again), its replies read within one socket timeout
for them all.  A :class:`Lane` keeps its pooled connection from one batch to the next (the
session store's and the retained store's batches of a loop turn, ``router.batching``), as the
pool's checkout costs more than a small batch's round trip.  A cluster's batches go through
redis-py's cluster pipeline, which routes each command to its slot's node.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any, TypeVar, cast

import hiredis
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

REDIS_WAIT = 10.0
"""Seconds a request waits for a free Redis connection before it counts as Redis unavailable."""

SOCKET_TIMEOUT = 5
"""Seconds a Redis connection may take to open, and a command to be answered."""

C = TypeVar("C", bound=AbstractConnection)

CLUSTER_SPARE_CONNECTIONS = 8
"""Connections per Redis Cluster node beyond the node's share of commands: subscriptions and
pipelines, which hold a connection of their own."""


class HiredisPacking(AbstractConnection):
    """A connection packing its commands with hiredis (module docstring)."""

    def pack_command(self, *args: Any) -> list[bytes]:
        name = args[0]
        if isinstance(name, str) and " " not in name:
            try:
                return [hiredis.pack_command(args)]
            except TypeError:  # an argument hiredis does not take: redis-py's packing says why
                pass
        return super().pack_command(*args)


_PACKING: dict[type, type] = {}


def hiredis_packing(connection_class: type[C]) -> type[C]:
    """``connection_class`` (plain, TLS or Unix socket) packing with hiredis; one class each."""
    packing = _PACKING.get(connection_class)
    if packing is None:
        name = f"Hiredis{connection_class.__name__}"
        packing = _PACKING[connection_class] = type(name, (HiredisPacking, connection_class), {})
    return cast("type[C]", packing)


def single_client(url: str, connections: int) -> aioredis.Redis:
    """A client of one Redis, ``connections`` at most, waiting for a free one."""
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=connections,
        timeout=REDIS_WAIT,
        socket_timeout=SOCKET_TIMEOUT,
        socket_connect_timeout=SOCKET_TIMEOUT,
        retry=Retry(NoBackoff(), 1),
        retry_on_error=[RedisConnectionError],
    )
    pool.connection_class = hiredis_packing(pool.connection_class)
    return aioredis.Redis.from_pool(pool)  # closing the client closes the pool


def cluster_client(url: str, connections: int) -> RedisCluster:
    """A client of a Redis Cluster, ``connections`` commands at once."""
    client = QueuedCluster.from_url(
        url,
        turns=connections,
        max_connections=connections + CLUSTER_SPARE_CONNECTIONS,
        socket_timeout=SOCKET_TIMEOUT,
        socket_connect_timeout=SOCKET_TIMEOUT,
    )
    nodes = client.nodes_manager  # the nodes found later are made with its keyword arguments
    nodes.connection_kwargs["connection_class"] = hiredis_packing(
        nodes.connection_kwargs["connection_class"]
    )
    for node in nodes.startup_nodes.values():
        node.connection_class = hiredis_packing(node.connection_class)
    return client


async def pipeline(
    client: aioredis.Redis | RedisCluster, commands: Sequence[Sequence[Any]]
) -> list[Any]:
    """Send ``commands`` (each a command's arguments, as ``execute_command`` takes them) in one
    round trip; per command, its reply or its error reply (a ``ResponseError``).  A connection
    error or timeout raises, for them all."""
    if not commands:
        return []
    if isinstance(client, RedisCluster):
        pipe = client.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        return list(await pipe.execute(raise_on_error=False))
    pool = client.connection_pool
    connection = await pool.get_connection()  # type: ignore[no-untyped-call]
    try:
        return await _round_trip_once_more(connection, commands)
    except BaseException:
        await connection.disconnect()  # replies may still be on their way: never reuse it
        raise
    finally:
        await pool.release(connection)


class Lane:
    """A pooled connection kept between the round trips of one kind of batch
    (``router.batching`` sends one batch of a kind at a time): redis-py's blocking pool costs,
    at every checkout and return, a condition, a timeout, its observability hooks and a check
    that the connection has nothing to read (about 6% of the loop in a storm of
    CONNECT+SUBSCRIBE, under py-spy).  A send while the kept connection is busy takes one from
    the pool (:func:`pipeline`); a failed round trip closes the kept one and gives it back.  A
    cluster's batches go through its pipeline, as :func:`pipeline` sends them."""

    def __init__(self, client: aioredis.Redis | RedisCluster) -> None:
        self.client = client
        self._connection: AbstractConnection | None = None
        self._busy = False

    async def send(self, commands: Sequence[Sequence[Any]]) -> list[Any]:
        """As :func:`pipeline`: per command its reply or its error reply; a connection error
        or timeout raises, for them all."""
        client = self.client
        if self._busy or not commands or isinstance(client, RedisCluster):
            return await pipeline(client, commands)
        self._busy = True
        try:
            connection = self._connection
            if connection is None:
                connection = await client.connection_pool.get_connection()  # type: ignore[no-untyped-call]
                self._connection = connection
            try:
                return await _round_trip_once_more(connection, commands)
            except BaseException:
                self._connection = None
                await connection.disconnect()  # replies may still be on their way
                await client.connection_pool.release(connection)
                raise
        finally:
            self._busy = False


async def _round_trip_once_more(
    connection: AbstractConnection, commands: Sequence[Sequence[Any]]
) -> list[Any]:
    """:func:`_round_trip`, again once on the connection made anew if Redis had closed it (a
    restart)."""
    try:
        return await _round_trip(connection, commands)
    except RedisConnectionError:
        await connection.disconnect()
        return await _round_trip(connection, commands)


async def _round_trip(
    connection: AbstractConnection, commands: Sequence[Sequence[Any]]
) -> list[Any]:
    """One write, then the replies within one socket timeout: redis-py's ``read_response``
    sets an ``asyncio.timeout`` of its own for each reply (about 5% of the loop in a storm of
    CONNECT+SUBSCRIBE, under py-spy), where one deadline serves the batch."""
    await connection.send_packed_command(connection.pack_commands(commands))
    replies: list[Any] = []
    try:
        async with asyncio.timeout(connection.socket_timeout):
            for _ in commands:
                try:
                    replies.append(await connection.read_response(timeout=math.inf))
                except ResponseError as error:
                    replies.append(error)
    except TimeoutError:  # the connection was closed by read_response as it was cancelled
        raise RedisTimeoutError(
            f"Redis did not answer within {connection.socket_timeout} s"
        ) from None
    return replies


class QueuedCluster(RedisCluster):
    """A Redis Cluster client whose commands wait their turn, up to ``REDIS_WAIT`` seconds, as
    the blocking pool's do on one Redis: redis-py's cluster pool fails a command at once when
    all of a node's connections are busy, which would refuse CONNECTs in a burst.  ``turns``
    commands run at once, so no node is asked for more connections than that (plus the spare
    ones for subscriptions and pipelines)."""

    def __init__(self, *args: Any, turns: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._turns = asyncio.Semaphore(turns)

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        try:
            await asyncio.wait_for(self._turns.acquire(), REDIS_WAIT)
        except TimeoutError:
            raise RedisError(f"no Redis connection free for {REDIS_WAIT:g} s") from None
        try:
            return await super().execute_command(*args, **kwargs)
        finally:
            self._turns.release()
