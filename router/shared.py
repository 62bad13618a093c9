"""Shared subscriptions, ``$share/<group>/<filter>``: each message to one member cluster-wide.

Each (group, filter) is one Kafka consumer group, ``headwater.share.<group>.<filter>``, whose
members are the nodes that have at least one local client in the share.  Kafka's group protocol
gives each partition of the log to exactly one member node, so each matching record is handled by
one node; that node hands it to one of its local members, round-robin.  Partitions the filter
cannot need (see ``router.partitioner``) are paused as soon as they are assigned, so a node never
fetches them: interest routing holds for shared subscriptions too.  Balance across nodes is
therefore at partition granularity: a filter whose routing levels are literal lives on one
partition and is served by one node at a time.

Offsets are committed only for records whose delivery is finished: QoS 0 once written to a
member, QoS 1/2 once the member acknowledged (PUBACK, PUBCOMP).  Per partition the committed
offset is the lowest offset still outstanding, so a node that leaves or dies hands its partitions
to another member node, which resumes from there: nothing is lost, and a message whose ack was
pending may be delivered again (at-least-once across a failure, as Kafka groups give).  When a
member disconnects its unacknowledged messages go to another local member, or, if none is left,
stay uncommitted for the next owner of the partition.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import OFFSET_END, OFFSET_INVALID, Consumer, KafkaException, TopicPartition

from frontend.mqtt import topics
from router.record import Record

log = logging.getLogger("headwater.shared")

COMMIT_INTERVAL = 0.5


def group_id(group: str, topic_filter: str) -> str:
    return f"headwater.share.{group}.{topic_filter}"


def consumer_config() -> dict[str, Any]:
    """What a share group's consumer needs beyond the log's common consumer settings."""
    return {
        "auto.offset.reset": "latest",
        "partition.assignment.strategy": "cooperative-sticky",
        "session.timeout.ms": 10_000,
        "heartbeat.interval.ms": 1_000,
    }


class _Offsets:
    """Per partition: offsets handed out but not finished; what may be committed.

    Used from the event loop and, when the group is left, from the executor thread that closes
    the consumer (its revocation callback commits and forgets), hence the lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._outstanding: dict[int, set[int]] = {}
        self._next: dict[int, int] = {}
        self._committed: dict[int, int] = {}

    def start(self, partition: int, offset: int) -> None:
        with self._lock:
            self._outstanding.setdefault(partition, set()).add(offset)
            self._next[partition] = max(self._next.get(partition, 0), offset + 1)

    def finish(self, partition: int, offset: int) -> None:
        with self._lock:
            self._outstanding.get(partition, set()).discard(offset)

    def skip(self, partition: int, offset: int) -> None:
        with self._lock:
            self._next[partition] = max(self._next.get(partition, 0), offset + 1)

    def due(self) -> dict[int, int]:
        """Commit points that moved since the last commit."""
        due: dict[int, int] = {}
        with self._lock:
            for partition, nxt in self._next.items():
                pending = self._outstanding.get(partition)
                point = min(pending) if pending else nxt
                if self._committed.get(partition) != point:
                    due[partition] = point
        return due

    def committed(self, points: dict[int, int]) -> None:
        with self._lock:
            self._committed.update(points)

    def forget(self, partitions: list[int]) -> None:
        with self._lock:
            for partition in partitions:
                self._outstanding.pop(partition, None)
                self._next.pop(partition, None)
                self._committed.pop(partition, None)


class ShareGroup:
    """This node's part in one shared subscription: a group consumer and the local members.

    Served by the log's pump (:meth:`serve`, non-blocking) like the node's other consumers.  The
    rebalance callbacks run inside that call and make the two short blocking calls Kafka's
    group protocol asks for (read the committed offsets of partitions gained, commit those of
    partitions lost): when a node joins or leaves the group, never per message."""

    def __init__(
        self,
        consumer: Consumer,
        topic: str,
        group: str,
        topic_filter: str,
        wanted: frozenset[int],
        deliver: Callable[[ShareGroup, Record], None],
    ) -> None:
        self.group = group
        self.filter = topic_filter
        self.members: dict[str, int] = {}
        """client id -> granted QoS, in joining order (round-robin order)."""
        self._turn = 0
        self._consumer = consumer
        self._topic = topic
        self._wanted = wanted
        self._deliver = deliver
        self._offsets = _Offsets()
        self._next_commit = 0.0
        self.start_offsets: dict[int, int] = {}
        """High watermarks read when this node joined, for partitions never committed."""
        self.assigned: set[int] = set()
        """Partitions Kafka gave this node in the group (paused ones included)."""

    # -- members ------------------------------------------------------------------------------

    def next_member(self, skip: str | None = None) -> str | None:
        """The member whose turn it is (round-robin), other than ``skip`` if possible."""
        names = [m for m in self.members if m != skip] or list(self.members)
        if not names:
            return None
        self._turn = (self._turn + 1) % len(names)
        return names[self._turn]

    # -- life cycle ---------------------------------------------------------------------------

    def start(self, start_offsets: dict[int, int]) -> None:
        self.start_offsets = start_offsets
        self._consumer.subscribe(
            [self._topic], on_assign=self._on_assign, on_revoke=self._on_revoke
        )
        self._next_commit = time.monotonic() + COMMIT_INTERVAL

    async def stop(self) -> None:
        """Leave the group (its partitions move to other member nodes)."""
        self._commit_now(self._consumer)
        await asyncio.get_running_loop().run_in_executor(None, self._consumer.close)

    # -- rebalances ---------------------------------------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Take partitions at the group's committed offsets; where the group has none yet, at
        the high watermark read when this node's share began (never a lazy "latest", which
        would skip what is published between the SUBACK and the first fetch)."""
        unwanted = [tp for tp in partitions if tp.partition not in self._wanted]
        committed = {tp.partition: tp.offset for tp in consumer.committed(partitions, timeout=10)}
        for tp in partitions:
            if committed.get(tp.partition, OFFSET_INVALID) < 0:
                tp.offset = self.start_offsets.get(tp.partition, OFFSET_END)
            else:
                tp.offset = committed[tp.partition]
        consumer.incremental_assign(partitions)
        self.assigned.update(tp.partition for tp in partitions)
        if unwanted:
            consumer.pause(unwanted)  # never fetched: the filter cannot match them

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._commit_now(consumer)
        consumer.incremental_unassign(partitions)
        self.assigned.difference_update(tp.partition for tp in partitions)
        self._offsets.forget([tp.partition for tp in partitions])

    # -- serving ------------------------------------------------------------------------------

    def serve(self, decode: Callable[[list[Any]], list[Record]]) -> bool:
        """Take what the consumer fetched (and run its rebalance callbacks); commit what is due."""
        try:
            raw = self._consumer.consume(500, 0)
        except (KafkaException, RuntimeError) as exc:
            log.warning("share group %s: %s", self.group, exc)
            return False
        for rec in decode(raw):
            if topics.matches(self.filter, rec.message.topic):
                self._offsets.start(rec.partition, rec.offset)
                self._deliver(self, rec)
            else:
                self._offsets.skip(rec.partition, rec.offset)
        now = time.monotonic()
        if now >= self._next_commit:
            self._next_commit = now + COMMIT_INTERVAL
            self._commit_due()
        return bool(raw)

    def finished(self, rec: Record) -> None:
        """A member acknowledged ``rec`` (or it needed no acknowledgement)."""
        self._offsets.finish(rec.partition, rec.offset)

    def _commit_due(self) -> None:
        due = self._offsets.due()
        if due:
            offsets = [TopicPartition(self._topic, p, o) for p, o in due.items()]
            with contextlib.suppress(KafkaException):
                self._consumer.commit(offsets=offsets, asynchronous=True)
                self._offsets.committed(due)

    def _commit_now(self, consumer: Consumer) -> None:
        due = self._offsets.due()
        if due:
            offsets = [TopicPartition(self._topic, p, o) for p, o in due.items()]
            with contextlib.suppress(KafkaException):
                consumer.commit(offsets=offsets, asynchronous=False)
                self._offsets.committed(due)
