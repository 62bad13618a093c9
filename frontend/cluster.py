"""The cluster as a node sees it: liveness, the takeover inbox [MQTT-3.1.4-2], the will sweep.

A node that finds a session "busy" (owned by a live connection elsewhere) publishes the client
id on the owner's inbox channel.  The owner closes that connection as a server-side close (the
will is published: the client did not send DISCONNECT), stores the session and lets go; the
asking node polls until it can acquire.  If the owner does not let go within ``FORCE_AFTER``
seconds (it is partitioned away or stuck), the session is taken by force: the fencing token moves
on, so whatever the old owner writes later is refused.

Liveness is a key per node with a short expiry, refreshed every second; a session owned by a
node whose key has expired is free, so a crashed node never blocks its clients' return.  Every
``SWEEP_SECONDS`` each node also sweeps for the wills of nodes whose key has expired and
publishes those it wins (``RedisSessionStore.claim_wills``): a client whose node crashed gets its
will published even if it never comes back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from frontend.sessions.redis import RedisSessionStore

log = logging.getLogger("headwater.cluster")

FORCE_AFTER = 1.5
HEARTBEAT_SECONDS = 1.0
SWEEP_SECONDS = 2.0


class Coordinator:
    """This node's heartbeat, takeover inbox and sweep for dead nodes' wills."""

    def __init__(
        self,
        store: RedisSessionStore,
        node_id: str,
        on_request: Callable[[str], None],
        on_wills: Callable[[list[bytes]], None],
    ) -> None:
        self.store = store
        self.node_id = node_id
        self._on_request = on_request
        self._on_wills = on_wills
        self._tasks: list[asyncio.Task[None]] = []
        self._pubsub: Any = None

    async def start(self) -> None:
        await self.store.heartbeat(self.node_id)
        self._pubsub = self.store.redis.pubsub()
        await self._pubsub.subscribe(self.store.inbox(self.node_id))
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._beat()), loop.create_task(self._listen())]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._pubsub is not None:
            with contextlib.suppress(Exception):
                await self._pubsub.aclose()
        with contextlib.suppress(Exception):
            await self.store.redis.delete(self.store.alive_key(self.node_id))

    async def sweep_wills(self) -> None:
        """Publish the wills left by this node id's previous process (it crashed: nothing else
        would, since the id is alive again), then sweep for dead nodes' wills from now on.
        Called once the log can take them."""
        self._on_wills(await self.store.claim_wills(self.node_id, only_if_dead=False))
        self._tasks.append(asyncio.get_running_loop().create_task(self._sweep()))

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_SECONDS)
            try:
                for node in await self.store.nodes_with_wills():
                    if node != self.node_id:
                        wills = await self.store.claim_wills(node, only_if_dead=True)
                        if wills:
                            log.warning("node %s is gone: publishing %d wills", node, len(wills))
                            self._on_wills(wills)
            except Exception as exc:  # Redis down: keep serving, keep trying
                log.warning("sweeping for dead nodes' wills failed: %s", exc)

    async def request_release(self, owner: str, client_id: str) -> None:
        await self.store.redis.publish(self.store.inbox(owner), client_id)

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_SECONDS)
            try:
                await self.store.heartbeat(self.node_id)
            except Exception as exc:  # Redis down: keep serving, keep trying
                log.warning("heartbeat to Redis failed: %s", exc)

    async def _listen(self) -> None:
        while True:
            try:
                message = await self._pubsub.get_message(ignore_subscribe_messages=True, timeout=1)
            except Exception as exc:
                log.warning("takeover inbox: %s", exc)
                await asyncio.sleep(1)
                continue
            if message is not None:
                data = message["data"]
                self._on_request(data.decode() if isinstance(data, bytes) else str(data))
