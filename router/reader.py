"""The node's one reader of the log: live partitions, catch-up ranges and share groups.

Everything is served by the log's pump on the event loop with non-blocking calls: no thread and
no consumer per client, per session or per replay.  The consumers:

* **live** (manual assignment, no group): every partition some local subscription needs, from
  where that subscription started onwards; each record read goes to the dispatcher once, however
  many local subscribers it has.  A partition every local holder of which is behind is paused
  (``router.backlog``): the catch-up reads it alone then, so each record is read once;
* **catch-up** (manual assignment, no group): the ranges returning sessions missed, ``[stored
  position, live start)`` per partition.  All sessions catching up share it: per partition it
  reads from the lowest cursor among them, and each record goes to every session whose range
  holds it (:class:`router.catchup.CatchUp`);
* **shares** (manual assignment, no group): every partition a share group of this node holds a
  lease of, from the lowest position among those groups; each record goes to every such group
  it is for (:class:`router.shared.ShareReader`).

So the number of consumers is three, independent of clients, sessions and share groups.

A leader election or a short outage is ridden out, never reported to a client from here: a
consume call that raises is not made again before a backoff (``router.retry``), a fetch error a
batch carries is skipped (librdkafka fetches again by itself), and both are counted
(``live``, ``fetch``).  Only a catch-up that gets nothing for ``router.retry.OUTAGE_SECONDS``
fails its sessions (``router.catchup``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from confluent_kafka import Consumer, KafkaException, TopicPartition

from router import record
from router.catchup import CatchUp, Take
from router.record import Record
from router.retry import Backoff, Retries, close_aside
from router.shared import GroupReader, ShareReader

log = logging.getLogger("headwater.log")

CATCH_UP_BATCH = 100
"""Records the catch-up consumer hands over per turn of the pump.  Each goes to every session
whose range holds it, so a turn costs up to this many deliveries: small turns keep the loop's
iterations short (the PUBACKs of connected subscribers are read between them), where a turn of
1,000 took 10-15 ms and a subscriber that fell behind at 20,000 msg/s never got back."""


CLOSE_WAIT = 5.0
"""Seconds a stopping reader waits for its consumers to close; one still at it then is left to
its thread (a broker that does not answer holds up neither a drain nor the process's exit)."""


class Reader(GroupReader, Protocol):
    """The node's one reader (:class:`router.reader.LogReader`) as the index, the backlog and
    share groups use it."""

    def assign(self, offsets: dict[int, int]) -> None: ...

    def unassign(self, partitions: Iterable[int]) -> None: ...

    def assigned(self) -> list[int]: ...

    def pause(self, partitions: Iterable[int]) -> None: ...

    def resume(self, partitions: Iterable[int]) -> None: ...

    def skip(self, partition: int, offset: int) -> None: ...

    def is_paused(self, partition: int) -> bool: ...

    def head(self, partition: int) -> int | None: ...

    async def replay(
        self, ranges: dict[int, tuple[int, int]], take: Take, room: Callable[[], bool]
    ) -> None: ...


class LogReader:
    """The live consumer, the catch-up consumer and the share consumer of one node."""

    def __init__(self, topic: str, fetch_batch: int, retries: Retries | None = None) -> None:
        self.topic = topic
        self.fetch_batch = fetch_batch
        self.retries = retries or Retries()
        self._backoff = Backoff()
        """The live consumer's pause after a consume call failed."""
        self.fetched_records = 0
        self.fetched_bytes = 0
        self.undecodable = 0
        self.on_records: Callable[[list[Record]], None] = lambda batch: None
        """Where the live records go: the node hands them to its dispatcher."""
        self._live: Consumer | None = None
        self._assigned: dict[int, bool] = {}
        self._paused: set[int] = set()
        """Live partitions not read now (:meth:`pause`)."""
        self.catch_up: CatchUp | None = None
        self.shares = ShareReader(topic, self._decode, self.retries)

    def start(self, live: Consumer, catch_up: Consumer, shares: Consumer) -> None:
        self._live = live
        self.catch_up = CatchUp(catch_up, self.topic, CATCH_UP_BATCH, self._decode, self.retries)
        self.shares.start(shares)

    async def stop(self) -> None:
        """Close every consumer at once, each aside (``router.retry.close_aside``), and wait
        for them up to ``CLOSE_WAIT``; the replays still waiting fail (nothing serves them
        any more)."""
        closing: list[asyncio.Future[None]] = []
        if (shares := self.shares.stop()) is not None:
            closing.append(shares)
        for consumer in (self._live, self.catch_up.consumer if self.catch_up else None):
            if consumer is not None:
                closing.append(close_aside(consumer))
        if self.catch_up is not None:
            self.catch_up.stop()
        self._live = None
        self.catch_up = None
        if closing:
            await asyncio.wait(closing, timeout=CLOSE_WAIT)

    def serve(self) -> bool:
        """One non-blocking look at every consumer; True if any had something."""
        busy = self._serve_live()
        if self.catch_up is not None:
            busy |= self.catch_up.serve()
        busy |= self.shares.serve()
        return busy

    # -- live partitions ----------------------------------------------------------------------

    def assign(self, offsets: dict[int, int]) -> None:
        """Start reading these partitions live at these offsets."""
        new = [TopicPartition(self.topic, p, o) for p, o in offsets.items()]
        if new and self._live is not None:  # after stop() there is nothing to read any more
            self._assigned.update(dict.fromkeys(offsets, True))
            self._live.incremental_assign(new)

    def unassign(self, partitions: Iterable[int]) -> None:
        """Stop reading these partitions live."""
        gone = [TopicPartition(self.topic, p) for p in partitions if p in self._assigned]
        for tp in gone:
            self._assigned.pop(tp.partition, None)
        self.resume([tp.partition for tp in gone])  # librdkafka's pause outlives an unassign
        if gone and self._live is not None:
            self._live.incremental_unassign(gone)

    def pause(self, partitions: Iterable[int]) -> None:
        """Read these live partitions no more for now: what librdkafka fetched ahead of the
        records consumed is dropped, and a resume goes on from the next one."""
        new = [p for p in partitions if p in self._assigned and p not in self._paused]
        if new and self._live is not None:
            self._paused.update(new)
            self._live.pause([TopicPartition(self.topic, p) for p in new])

    def resume(self, partitions: Iterable[int]) -> None:
        """Read these paused partitions live again, from where the live read stopped (or from
        where :meth:`skip` moved it)."""
        back = [p for p in partitions if p in self._paused]
        if back:
            self._paused.difference_update(back)
            if self._live is not None:
                self._live.resume([TopicPartition(self.topic, p) for p in back])

    def skip(self, partition: int, offset: int) -> None:
        """Move a paused partition's live read on to ``offset``: the records before it are the
        catch-up's to read."""
        if partition in self._paused and self._live is not None:
            self._live.seek(TopicPartition(self.topic, partition, offset))

    def is_paused(self, partition: int) -> bool:
        return partition in self._paused

    def paused(self) -> list[int]:
        return sorted(self._paused)

    def head(self, partition: int) -> int | None:
        """The partition's high watermark as the last fetch of either the live or the
        catch-up consumer saw it (no request); None if neither has fetched it."""
        tp, high = TopicPartition(self.topic, partition), -1
        for consumer in (self._live, self.catch_up.consumer if self.catch_up else None):
            if consumer is not None:
                high = max(high, consumer.get_watermark_offsets(tp, cached=True)[1])
        return high if high >= 0 else None

    def assigned(self) -> list[int]:
        return sorted(self._assigned)

    def positions(self) -> dict[int, tuple[int, int]]:
        """Per live partition, Kafka's own view: (consumer position, high watermark).

        The watermark is the one the last fetch response carried; their difference is the lag.
        A position of -1001 means nothing was fetched yet (the assigned offset still applies)."""
        if self._live is None:
            return {}
        tps = [TopicPartition(self.topic, p) for p in self._assigned]
        found = {}
        for tp in self._live.position(tps):
            _, high = self._live.get_watermark_offsets(tp, cached=True)
            found[tp.partition] = (tp.offset, high)
        return found

    def _serve_live(self) -> bool:
        if not self._assigned or self._live is None:
            return False
        backoff = self._backoff
        if backoff.until and time.monotonic() < backoff.until:
            return False
        try:
            raw = self._live.consume(self.fetch_batch, 0)
        except (KafkaException, RuntimeError) as exc:
            paused = backoff.failed(time.monotonic())
            self.retries.count("live")
            log.warning("consume failed: %s; trying again in %.2f s", exc, paused)
            return False
        if backoff.until:
            backoff.succeeded()
        if not raw:
            return False
        batch = self._decode(raw)
        if batch:
            self.on_records(batch)
        return True

    # -- catch-up ranges ---------------------------------------------------------------------

    async def replay(
        self, ranges: dict[int, tuple[int, int]], take: Take, room: Callable[[], bool]
    ) -> None:
        """Hand ``take`` every record in ``[start, end)`` of each partition, in log order per
        partition; see :meth:`router.catchup.CatchUp.read`."""
        assert self.catch_up is not None, "the log is not started"
        await self.catch_up.read(ranges, take, room)

    @property
    def catching_up(self) -> int:
        """Sessions reading missed records now."""
        return len(self.catch_up.cursors) if self.catch_up is not None else 0

    def _decode(self, raw: list[Any]) -> list[Record]:
        """The records of a fetched batch, counted; fetch errors and undecodable values are
        logged and skipped."""
        batch: list[Record] = []
        for msg in raw:
            error = msg.error()
            if error is not None:  # librdkafka fetches again by itself
                self.retries.count("fetch")
                log.warning("fetch error: %s", error.str())
                continue
            value = msg.value()
            self.fetched_records += 1
            self.fetched_bytes += len(value)
            try:
                message = record.decode(value)
            except record.RecordError as exc:
                self.undecodable += 1
                log.warning(
                    "skipping undecodable record at %s/%s: %s", msg.partition(), msg.offset(), exc
                )
                continue
            batch.append(Record(msg.partition(), msg.offset(), len(value), message))
        return batch
