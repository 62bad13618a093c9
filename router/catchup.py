"""Catch-up: the ranges of the log that returning sessions missed, read by one shared consumer.

Each returning session asks for ``[start, end)`` of some partitions (its stored position up to
where its live stream begins) and gets a :class:`Cursor`: per partition, the next offset it
needs.  The consumer reads each partition from the lowest cursor of the sessions that can take
more, and every record goes to each cursor whose range holds it.

A session whose queue is full answers "no room" (``take`` returns False): its cursor stays where
it is and it is left out until it has room again.  Meanwhile it keeps the records it needs that
the consumer had already handed out (at most ``STASH_LIMIT``), and while every cursor waits the
consumer is not read at all (librdkafka stops fetching once its local queue is full): when the
session has room it takes the kept records and reading goes on where it stopped, without
fetching anything twice.  Only if another cursor moved a partition on does it get read again from
the waking cursor.  The log is the queue: a
catching-up session never loses a message to its queue bound, and a slow one does not hold the
fast ones back.

A leader election or a short outage is ridden out: the consumer fetches again by itself, a consume
call that raises is not made again before a backoff (counted as ``catch_up`` retries,
``router.retry``), and a cursor fails only after ``STALL_SECONDS`` without a record it could take:
the node then cannot serve that session, whose connection is closed (``frontend.outages``).

Invariants: a cursor's offsets only grow; a record is handed to a cursor at most once (only at or
after its position, which then moves past it); a partition is assigned exactly while some cursor
that can take more needs it, at the lowest such cursor's position or below.  Re-assigning a
partition bumps librdkafka's fetch version, so records fetched before are never handed out.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from router.record import Record
from router.retry import OUTAGE_SECONDS, Backoff, Retries

log = logging.getLogger("headwater.catchup")

STALL_SECONDS = OUTAGE_SECONDS
"""A cursor that could take records but got none for this long fails: its range is unreadable,
Kafka having answered no fetch for as long as the node rides out an outage (``router.retry``)."""

STASH_LIMIT = 2000
"""Records a waiting cursor keeps at most (references to records fetched anyway)."""

CHECK_INTERVAL = 0.005
"""Seconds between two looks at whether waiting cursors have room again."""

Take = Callable[[Record], bool]
"""Hands one record to a session; False: no room now, offer it again later."""


class Cursor:
    """One session's place in the ranges it catches up on."""

    __slots__ = ("done", "end", "kept_to", "next", "progress", "room", "stash", "take", "waiting")

    def __init__(
        self, ranges: dict[int, tuple[int, int]], take: Take, room: Callable[[], bool]
    ) -> None:
        self.next = {p: start for p, (start, end) in ranges.items() if start < end}
        self.end = {p: end for p, (start, end) in ranges.items() if start < end}
        self.take = take
        self.room = room
        self.waiting = False
        self.stash: list[Record] = []
        """Records needed but refused or fetched while waiting, in fetch order, contiguous."""
        self.kept_to: dict[int, int] = {}
        """Per partition, the offset the next kept record must have."""
        self.progress = time.monotonic()
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def offer(self, rec: Record) -> bool:
        """Hand ``rec`` over if this cursor needs it; False once it has no room."""
        position = self.next.get(rec.partition)
        if position is None or rec.offset < position:
            return True
        if not self.take(rec):
            return False
        self.progress = time.monotonic()
        if rec.offset + 1 >= self.end[rec.partition]:
            del self.next[rec.partition]
        else:
            self.next[rec.partition] = rec.offset + 1
        return True

    def keep(self, rec: Record) -> None:
        """While waiting: keep a record it will need, if it follows on from what is kept (so
        what is kept of a partition is always the run of records starting at its position)."""
        position = self.next.get(rec.partition)
        if position is None or len(self.stash) >= STASH_LIMIT:
            return
        if rec.offset == self.kept_to.get(rec.partition, position):
            self.stash.append(rec)
            self.kept_to[rec.partition] = rec.offset + 1

    def wake(self) -> bool:
        """Take the kept records; True once all are taken (it is no longer waiting)."""
        taken = 0
        for rec in self.stash:
            if not self.offer(rec):
                break
            taken += 1
        del self.stash[:taken]
        if not self.stash:
            self.kept_to.clear()
        self.waiting = bool(self.stash)
        return not self.waiting


class CatchUp:
    """The catch-up consumer and the cursors it serves."""

    def __init__(
        self,
        consumer: Consumer,
        topic: str,
        batch: int,
        decode: Callable[[list[Any]], list[Record]],
        retries: Retries | None = None,
    ) -> None:
        self.consumer = consumer
        self.topic = topic
        self.batch = batch
        self._decode = decode
        self.retries = retries or Retries()
        self._backoff = Backoff()
        """The consumer's pause after a consume call failed."""
        self.cursors: set[Cursor] = set()
        self._by_partition: dict[int, set[Cursor]] = {}
        self._reading: dict[int, int] = {}
        """Assigned partitions: the offset the consumer returns next for each."""
        self._active = False
        """Some cursor can take records now (else the consumer is left unread)."""
        self._changed = False
        self._checked = 0.0

    async def read(
        self, ranges: dict[int, tuple[int, int]], take: Take, room: Callable[[], bool]
    ) -> None:
        """Hand ``take`` every record in ``[start, end)`` of each partition, in log order per
        partition, and return once all are handed over.  After ``take`` refused one, records
        are offered again from there once ``room()`` is true."""
        cursor = Cursor(ranges, take, room)
        if not cursor.next:
            return
        self.cursors.add(cursor)
        for partition in cursor.next:
            self._by_partition.setdefault(partition, set()).add(cursor)
        self._changed = True
        try:
            await cursor.done
        finally:
            self.cursors.discard(cursor)
            for partition in cursor.end:
                on_partition = self._by_partition.get(partition)
                if on_partition is not None:
                    on_partition.discard(cursor)
                    if not on_partition:
                        del self._by_partition[partition]
            self._changed = True

    def stop(self) -> None:
        """The log stops: every replay still waiting fails now, rather than wait for a pump
        that will not turn again."""
        for cursor in self.cursors:
            self._finish(cursor, ConnectionError("the log stopped"))

    def serve(self) -> bool:
        """Wake cursors that have room again, read what is fetched, re-aim the consumer."""
        if not self.cursors and not self._reading:
            return False
        self._check_cursors()
        if self._changed:
            self._aim()
        if not self._reading or not self._active:
            return False
        backoff = self._backoff
        if backoff.until and time.monotonic() < backoff.until:
            return False
        try:
            raw = self.consumer.consume(self.batch, 0)
        except (KafkaException, RuntimeError) as exc:
            paused = backoff.failed(time.monotonic())
            self.retries.count("catch_up")
            log.warning("catch-up consume failed: %s; trying again in %.2f s", exc, paused)
            return False
        if backoff.until:
            backoff.succeeded()
        for rec in self._decode(raw):
            self._hand(rec)
        return bool(raw)

    def _hand(self, rec: Record) -> None:
        self._reading[rec.partition] = rec.offset + 1
        for cursor in self._by_partition.get(rec.partition, ()):
            if rec.partition not in cursor.next:
                continue
            if cursor.waiting:
                cursor.keep(rec)
            elif not cursor.offer(rec):
                cursor.waiting = True
                cursor.keep(rec)
                self._changed = True
            elif not cursor.next:
                self._finish(cursor)
            elif rec.partition not in cursor.next:
                self._changed = True

    def _finish(self, cursor: Cursor, error: BaseException | None = None) -> None:
        if not cursor.done.done():
            if error is None:
                cursor.done.set_result(None)
            else:
                cursor.done.set_exception(error)
        self._changed = True

    def _check_cursors(self) -> None:
        """Wake waiting cursors that have room; fail those stalled for ``STALL_SECONDS``.  At most
        every ``CHECK_INTERVAL``: the pump may come back many times a millisecond."""
        now = time.monotonic()
        if now - self._checked < CHECK_INTERVAL:
            return
        self._checked = now
        for cursor in self.cursors:
            if cursor.done.done():
                continue
            if cursor.waiting:
                if cursor.room() and cursor.wake():
                    cursor.progress = now
                    self._changed = True
                    if not cursor.next:
                        self._finish(cursor)
            elif now - cursor.progress > STALL_SECONDS:
                stalled = sorted(cursor.next)
                self._finish(cursor, TimeoutError(f"catch-up made no progress on {stalled}"))

    def _aim(self) -> None:
        """Read each partition from its lowest cursor that can take more; keep those only
        waiting cursors need where they are; release the rest."""
        self._changed = False
        wanted: dict[int, int] = {}
        waiting: set[int] = set()
        for cursor in self.cursors:
            if cursor.done.done():
                continue
            if cursor.waiting:
                waiting.update(cursor.next)
                continue
            for partition, position in cursor.next.items():
                wanted[partition] = min(position, wanted.get(partition, position))
        self._active = bool(wanted)
        behind = [p for p, at in self._reading.items() if p in wanted and wanted[p] < at]
        gone = [p for p in self._reading if p not in wanted and p not in waiting]
        if behind or gone:
            self.consumer.incremental_unassign(
                [TopicPartition(self.topic, p) for p in (*behind, *gone)]
            )
            for partition in (*behind, *gone):
                del self._reading[partition]
        fresh = {p: at for p, at in wanted.items() if p not in self._reading}
        if fresh:
            self.consumer.incremental_assign(
                [TopicPartition(self.topic, p, at) for p, at in fresh.items()]
            )
            self._reading.update(fresh)
