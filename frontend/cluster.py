"""The cluster as a node sees it: liveness, the takeover inbox [MQTT-3.1.4-2], the sweep of dead
nodes, and the reaping of expired sessions.

This module carries messages; it decides nothing about a session's life.  Requests, news of a
session taken by force and orphaned wills are handed to the session manager (callables given at
construction, ``frontend.sessions.manager``), which decides and takes every step.

A node that finds a session "busy" (owned by a live connection elsewhere) publishes the client
id on the owner's inbox channel.  The owner closes that connection as a server-side close (the
will is published: the client did not send DISCONNECT), stores the session and lets go; the
asking node polls until it can acquire.  If the owner does not let go within
``frontend.sessions.manager.FORCE_AFTER`` seconds (it is partitioned away or stuck), the session
is taken by force: the fencing token moves on, so whatever the old owner writes later is
refused, and the taker tells the old owner's inbox
(a NUL, the new token, a NUL, the client id: MQTT strings hold no NUL [MQTT-1.5.3-2]), so that
when it runs again it closes a connection holding an older lease without the will, which the
taker published.  An idle session is never saved again, so a refused save would not tell it.

Liveness is a key per node with a short expiry, refreshed every second; a session owned by a
node whose key has expired is free, so a crashed node never blocks its clients' return.  Every
``SWEEP_SECONDS`` each node also sweeps the nodes whose key has expired, but only once its own
heartbeats have reached Redis without a miss for a key's whole lifetime (``ALIVE_SECONDS``): a
node is judged dead only if it failed to renew while Redis was reachable, never from a Redis
that has just come back, whose keys all expired while it was away
(``RedisSessionStore.sweep_node``): it publishes the wills it wins, so a client whose node
crashed gets its will published even if it never comes back, and the dead node's sessions start
to expire.  Before serving, a node sweeps what its own id's previous process left (that process
crashed, and nothing else would sweep a live id); nodes that died while none was up are swept
once its heartbeats have held for ``ALIVE_SECONDS``.

Expiry: Redis publishes an event when it expires a session's marker key (``notify-keyspace-events
Ex``, which the node sets at start where the server allows it); every node listens and runs
``RedisSessionStore.reap``, whose script lets exactly one of them remove the session and count it;
that node tells the session manager's events (``session_expired``).

Redis Cluster: PUBLISH reaches subscribers on every node of a cluster, so the inbox is one
subscription wherever it lands; keyspace events stay on the master that holds the key, so the
expiry listener subscribes on every master (redis-py's cluster keyspace notifications, which
follow topology changes).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from frontend.outages import every
from frontend.sessions.redis import ALIVE_SECONDS, RedisClient, RedisSessionStore

log = logging.getLogger("headwater.cluster")

HEARTBEAT_SECONDS = 1.0
SWEEP_SECONDS = 2.0
NOTIFY = "notify-keyspace-events"


class Coordinator:
    """This node's heartbeat, takeover inbox, dead-node sweep and expiry listener."""

    def __init__(
        self,
        store: RedisSessionStore,
        node_id: str,
        on_request: Callable[[str], None],
        on_wills: Callable[[list[bytes]], None],
        on_taken: Callable[[str, int], None],
        on_expired: Callable[[str], None] = lambda _: None,
    ) -> None:
        self.store = store
        self.node_id = node_id
        self._on_request = on_request
        self._on_taken = on_taken
        self._on_expired = on_expired
        """Told the client id of each session this node reaped (its ``session_expired``)."""
        self._on_wills = on_wills
        self._reachable_since: float | None = None
        """When this node's heartbeats began to reach Redis without a miss (the loop's clock)."""
        self._tasks: list[asyncio.Task[None]] = []
        self._inbox: Any = None
        self._expiries: Any = None

    @property
    def redis_reachable(self) -> bool:
        """The last heartbeat reached Redis (what ``/ready`` reports)."""
        return self._reachable_since is not None

    async def start(self) -> None:
        redis = self.store.redis
        await self._beat()
        self._inbox = redis.pubsub()
        await self._inbox.subscribe(self.store.inbox(self.node_id))
        await enable_expiry_events(redis)
        self._expiries = redis.keyspace_notifications()
        await self._expiries.subscribe_keyevent("expired", db=_database(redis))
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(every(HEARTBEAT_SECONDS, self._beat, "heartbeat to Redis")),
            loop.create_task(self._listen()),
            loop.create_task(self._reap()),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for subscription in (self._inbox, self._expiries):
            if subscription is not None:
                with contextlib.suppress(Exception):
                    await subscription.aclose()
        with contextlib.suppress(Exception):
            await self.store.redis.delete(self.store.alive_key(self.node_id))

    async def sweep_dead_nodes(self) -> None:
        """Sweep what this node id's previous process left and any node already dead, then
        sweep for dead nodes from now on.  Called once the log can take their wills."""
        self._on_wills(await self.store.sweep_node(self.node_id, only_if_dead=False))
        await self._sweep_once()
        sweep = every(SWEEP_SECONDS, self._sweep_once, "sweeping for dead nodes")
        self._tasks.append(asyncio.get_running_loop().create_task(sweep))

    async def request_release(self, owner: str, client_id: str) -> None:
        await self.store.redis.publish(self.store.inbox(owner), client_id)

    async def tell_taken(self, owner: str, client_id: str, token: int) -> None:
        await self.store.redis.publish(self.store.inbox(owner), f"\0{token}\0{client_id}")

    async def _sweep_once(self) -> None:
        since = self._reachable_since
        if since is None or asyncio.get_running_loop().time() - since < ALIVE_SECONDS:
            return  # the others may not have renewed since Redis came back
        for node in await self.store.nodes():
            if node != self.node_id:
                wills = await self.store.sweep_node(node)
                if wills:
                    log.warning("node %s is gone: publishing %d wills", node, len(wills))
                    self._on_wills(wills)

    async def _beat(self) -> None:
        try:
            await self.store.heartbeat(self.node_id)
        except Exception:
            self._reachable_since = None
            raise
        if self._reachable_since is None:
            self._reachable_since = asyncio.get_running_loop().time()

    async def _listen(self) -> None:
        while True:
            try:
                messages = await self._inbox_messages()
            except Exception as exc:
                log.warning("takeover inbox: %s", exc)
                await asyncio.sleep(1)
                continue
            taken: dict[str, int] = {}
            asked: list[str] = []
            for text in messages:
                if text.startswith("\0"):
                    _, number, client_id = text.split("\0", 2)
                    taken[client_id] = max(int(number), taken.get(client_id, 0))
                else:
                    asked.append(text)
            # A node that was stuck finds both a request to let go and the news that the session
            # was taken meanwhile: the news wins (the will was published by the taker).
            for client_id, token in taken.items():
                self._on_taken(client_id, token)
            for client_id in asked:
                if client_id not in taken:
                    self._on_request(client_id)

    async def _inbox_messages(self) -> list[str]:
        """The next message, and every one already waiting behind it."""
        texts: list[str] = []
        timeout = 1.0
        while (message := await self._inbox.get_message(True, timeout=timeout)) is not None:
            data = message["data"]
            texts.append(data.decode() if isinstance(data, bytes) else str(data))
            timeout = 0.0
        return texts

    async def _reap(self) -> None:
        while True:
            try:
                event = await self._expiries.get_message(timeout=1)
                if event is not None and (client_id := await self.store.reap(event.key)):
                    self._on_expired(client_id)
            except Exception as exc:
                log.warning("reaping expired sessions: %s", exc)
                await asyncio.sleep(1)


async def enable_expiry_events(redis: RedisClient) -> None:
    """Have Redis publish expired-key events (flags ``E`` and ``x``), keeping the flags it has.
    A server that refuses (CONFIG disabled, as on some managed services) gets a warning: its
    sessions still expire, by their keys' TTL, but are counted only if it is configured so."""
    try:
        flags = str((await redis.config_get(NOTIFY)).get(NOTIFY) or "")
        missing = "E" * ("E" not in flags) + "x" * ("x" not in flags and "A" not in flags)
        if not missing:
            return
        if isinstance(redis, RedisCluster):
            await redis.config_set(NOTIFY, flags + missing, target_nodes=RedisCluster.ALL_NODES)
        else:
            await redis.config_set(NOTIFY, flags + missing)
    except RedisError as exc:
        log.warning(
            "Redis refused to publish expired-key events (%s): expired sessions are removed "
            "but not counted unless the server has %s Ex",
            exc,
            NOTIFY,
        )


def _database(redis: RedisClient) -> int:
    """The database whose keyspace events to hear (always 0 in Redis Cluster)."""
    if isinstance(redis, RedisCluster):
        return 0
    return int(redis.connection_pool.connection_kwargs.get("db", 0))
