"""Calls made during one turn of the event loop, sent together.

A storm of CONNECTs makes hundreds of connections ask the same kind of thing at once: of Redis,
list the session under the node and acquire it, and as they leave, release and unlist it
(``frontend.sessions.redis``); of Kafka, where the partitions of their subscriptions end
(``router.log``).  One request each costs, in redis-py, a pooled connection, a timeout and a round
trip, which was most of a CONNECT's cost.  A :class:`Batch` collects the calls of one loop
iteration and sends them as one request (a pipeline, one ListOffsets), then hands each caller its
own answer or its own error.  One batch of a kind is in flight at a time: calls made meanwhile
wait for it and go in the next, so batches grow with the load (as Nagle's algorithm does), and a
quiet node sends each call at once.  A batch may be bounded (``most``: what its answers may hold
in memory at once); the calls beyond it wait for the next.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

Send = Callable[[list[T]], Awaitable[list[R | BaseException]]]
"""Sends a batch of calls; per call, its answer or the error it got."""


class Batch(Generic[T, R]):
    """One kind of call, coalesced per loop iteration."""

    def __init__(self, send: Send[T, R], most: int | None = None) -> None:
        self._send = send
        self._most = most
        """Calls a batch takes at most (None: all that wait)."""
        self._waiting: list[tuple[T, asyncio.Future[R]]] = []
        self._sending: asyncio.Task[None] | None = None
        self._scheduled = False

    async def __call__(self, call: T) -> R:
        return await self.submit(call)

    def submit(self, call: T) -> asyncio.Future[R]:
        """Queue ``call`` now; its answer comes in the future returned.  Calls submitted one
        after the other go in the same batch, in that order."""
        answer: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._waiting.append((call, answer))
        if self._sending is None and not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)
        return answer

    def _flush(self) -> None:
        self._scheduled = False
        if self._sending is not None or not self._waiting:
            return
        most = self._most
        if most is None or len(self._waiting) <= most:
            batch, self._waiting = self._waiting, []
        else:
            batch, self._waiting = self._waiting[:most], self._waiting[most:]
        self._sending = asyncio.get_running_loop().create_task(self._deliver(batch))
        self._sending.add_done_callback(self._sent)

    def _sent(self, _: asyncio.Task[None]) -> None:
        self._sending = None
        self._flush()  # what came in meanwhile

    async def _deliver(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        try:
            answers = await self._send([call for call, _ in batch])
        except Exception as exc:  # the whole batch failed: every caller gets the error
            answers = [exc] * len(batch)
        for (_, future), answer in zip(batch, answers, strict=True):
            if future.done():  # its caller went away (cancelled)
                continue
            if isinstance(answer, BaseException):
                future.set_exception(answer)
            else:
                future.set_result(answer)
