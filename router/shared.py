"""Shared subscriptions, ``$share/<group>/<filter>``: each message to one member cluster-wide.

Each (group, filter) is one Kafka consumer group (:func:`group_id`) whose members are the nodes
that have at least one local client in the share.  Kafka's group protocol gives each partition
of the log to exactly one member node, so each matching record is handled by one node; that node
hands it to one of its local members, round-robin.  Partitions the filter cannot need (see
``router.partitioner``) are paused as soon as they are assigned, so a node never fetches them:
interest routing holds for shared subscriptions too.  Balance across nodes is therefore at
partition granularity: a filter whose routing levels are literal lives on one partition and is
served by one node at a time.

Bounds.  A Kafka consumer belongs to exactly one ``group.id``, and each share group must see
every record of the log once, whatever the other groups do; so a group's record positions,
commits and partition ownership are its own, and the one honest way to get them from Kafka is
one consumer per group (librdkafka: about four threads and its fetch buffers).  Groups sharing a
bounded set of consumers per node would mean rebuilding Kafka's group protocol beside it
(partition leases per group in Redis, per-group commit points, the node's one reader delivering
for every group it holds leases of, rebalances when members come and go) with its own failure
cases to prove: not something to ship untested.  So the number of share groups is capped
instead (:class:`ShareGroups`): at most ``--max-share-groups`` groups with members on a node, and
at most ``--max-share-groups-per-client`` ``$share`` filters held by one client.  A SUBSCRIBE
beyond either bound gets 0x80 for that filter, counted (``share_groups_refused``) and logged once
per bound; joining a group the node already has costs no consumer and only counts against the
client's bound.  Threads therefore grow with the setting, never with what clients ask for.  A
returning session whose stored ``$share`` filter would go beyond the node's bound keeps the
filter but is not served it on this node (counted the same way): the group's records wait in
Kafka for a member node, as they do for a group with no member anywhere.

Group ids.  :func:`group_id` is injective: ``headwater.share.<n>:<group>.<filter>``, ``<n>``
the share name's length in characters, so no two (group, filter) pairs share a Kafka group
(the former ``headwater.share.<group>.<filter>`` made ``$share/q1/p.t/x`` and
``$share/q1.p/t/x`` one group, each record going to only one of them).  Deployments upgraded
from that form get new group ids: the old ids' committed offsets are not read, and each group
starts at the high watermark, like any new group (messages published while no node held the
group are not delivered to it); the old groups expire from Kafka by its offset retention.

Reading rights.  A record goes to the next member, in round-robin order, that may read its
topic (``Session.may_read``: the ACL at the time of sending).  A member that may not is
skipped, never handed the record to acknowledge it unread.  If no member on this node may read
it, the record is finished (committed) unread and counted (``share_messages_denied``): Kafka
gave the partition to this node for the group, so no other node of the group will see the
record while this node holds it, and keeping it outstanding would pin the partition's commit
point forever (every later record would be delivered again at each rebalance).  That is
Mosquitto's answer too (a shared message its chosen member may not read is dropped), except
that here every local member is asked first.  A member that leaves with records unacknowledged
hands them to the next member that may read them, or leaves them uncommitted if none is left.

Offsets are committed only for records whose delivery is finished: QoS 0 once written to a
member, QoS 1/2 once the member acknowledged (PUBACK, PUBCOMP), or denied as above.  Per
partition the committed offset is the lowest offset still outstanding, so a node that leaves or
dies hands its partitions to another member node, which resumes from there: nothing is lost, and
a message whose ack was pending may be delivered again (at-least-once across a failure, as Kafka
groups give).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from confluent_kafka import (
    OFFSET_END,
    OFFSET_INVALID,
    OFFSET_STORED,
    Consumer,
    KafkaException,
    TopicPartition,
)

from mqttcore import topics
from mqttcore.session import Session
from router.partitioner import Router
from router.record import Record
from router.retry import close_aside, leave_group

log = logging.getLogger("headwater.shared")

COMMIT_INTERVAL = 0.5

DEFAULT_MAX_SHARE_GROUPS = 32
"""Share groups with members on one node, at most (``--max-share-groups``): a consumer each."""
DEFAULT_MAX_SHARE_GROUPS_PER_CLIENT = 8
"""``$share`` filters one client holds, at most (``--max-share-groups-per-client``)."""


def group_id(group: str, topic_filter: str) -> str:
    """The Kafka group id of ``$share/<group>/<filter>``: injective, the share name's length
    first (a share name may hold dots and colons, a filter dots and slashes)."""
    return f"headwater.share.{len(group)}:{group}.{topic_filter}"


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

    Used from the event loop and, when the group is left, from the thread that commits last and
    closes the consumer (its revocation callback commits and forgets), hence the lock."""

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
        self.wanted = wanted
        """Partitions the filter can match (the others are paused when assigned)."""
        self._deliver = deliver
        self._offsets = _Offsets()
        self._next_commit = 0.0
        self.start_offsets: dict[int, int] = {}
        """High watermarks read when this node joined, for partitions never committed."""
        self.assigned: set[int] = set()
        """Partitions Kafka gave this node in the group (paused ones included)."""
        self.ready: asyncio.Task[None] | None = None
        """Reading the start offsets and subscribing (:meth:`ShareGroups.start`), once."""
        self._stopped = False

    # -- members ------------------------------------------------------------------------------

    def pick(self, may_read: Callable[[str], bool], skip: str | None = None) -> str | None:
        """The member whose turn it is (round-robin) among those that ``may_read`` the record,
        ``skip`` only if no other may; None if none may."""
        names = [m for m in self.members if m != skip]
        for step in range(1, len(names) + 1):
            turn = (self._turn + step) % len(names)
            if may_read(names[turn]):
                self._turn = turn
                return names[turn]
        return skip if skip in self.members and may_read(skip) else None

    # -- life cycle ---------------------------------------------------------------------------

    def start(self, start_offsets: dict[int, int]) -> None:
        self.start_offsets = start_offsets
        self._consumer.subscribe(
            [self._topic], on_assign=self._on_assign, on_revoke=self._on_revoke
        )
        self._next_commit = time.monotonic() + COMMIT_INTERVAL

    async def stop(self) -> None:
        """Leave the group (its partitions move to other member nodes); once.  The last commit
        and the close wait on the group's coordinator, the commit without a bound (it held a
        draining node's event loop while the broker was stalled): both run aside
        (``router.retry.close_aside``), the group left before the close
        (``router.retry.leave_group``: no rebalance callback runs inside ``close()``)."""
        if self._stopped:
            return
        self._stopped = True
        consumer = self._consumer
        await close_aside(consumer, lambda: self._leave(consumer))

    def _leave(self, consumer: Consumer) -> None:
        self._commit_now(consumer)
        leave_group(consumer)  # its revocation commits again: what was finished meanwhile

    # -- rebalances ---------------------------------------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Take partitions at the group's committed offsets; where the group has none yet, at
        the high watermark read when this node's share began (never a lazy "latest", which
        would skip what is published between the SUBACK and the first fetch).  If Kafka does
        not say them in time, the partitions are taken at the stored offsets librdkafka reads
        itself ("latest" where there are none): nothing raises out of a rebalance callback,
        which confluent-kafka re-raises from ``poll()`` or ``close()`` as a ``KafkaError`` no
        ``except`` catches (a closing thread died of one)."""
        unwanted = [tp for tp in partitions if tp.partition not in self.wanted]
        committed: dict[int, int] | None = None
        try:
            committed = {p.partition: p.offset for p in consumer.committed(partitions, timeout=10)}
        except KafkaException as exc:
            log.warning("share group %s: committed offsets not read (%s)", self.group, exc)
        for tp in partitions:
            if committed is None:
                tp.offset = OFFSET_STORED
            elif committed.get(tp.partition, OFFSET_INVALID) < 0:
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


@dataclass(slots=True, frozen=True)
class ShareLimits:
    """The bounds of :class:`ShareGroups` (``--max-share-groups``, ``--max-share-groups-per-
    client``); 0 refuses every ``$share`` filter."""

    per_node: int = DEFAULT_MAX_SHARE_GROUPS
    per_client: int = DEFAULT_MAX_SHARE_GROUPS_PER_CLIENT


class _Named(Protocol):
    @property
    def topic(self) -> str: ...


class GroupReader(Protocol):
    """The node's one reader (``router.reader.LogReader``), as share groups use it."""

    def join(self, group: ShareGroup) -> None: ...

    def forget(self, group: ShareGroup) -> None: ...


class GroupLog(Protocol):
    """The node's log (``router.log.KafkaLog``), as share groups use it."""

    @property
    def settings(self) -> _Named: ...

    @property
    def reader(self) -> GroupReader: ...

    def consumer(self, group_id: str, **config: Any) -> Consumer: ...

    async def high_watermarks(self, partitions: Iterable[int]) -> dict[int, int]: ...


class ShareGroups:
    """This node's share groups and their members, within :class:`ShareLimits`.

    Invariants: ``groups`` never holds more than ``limits.per_node`` groups, each with at least
    one member; a member of a group holds the group's ``$share`` filter in its session, and no
    session holds more than ``limits.per_client`` of them through :meth:`join`.  Joining is
    synchronous (the bounds are checked and taken in one step of the event loop); starting a
    new group's consumer is awaited once by everyone who joined it meanwhile."""

    def __init__(
        self,
        log_: GroupLog,
        router: Router,
        limits: ShareLimits,
        deliver: Callable[[ShareGroup, Record], None],
    ) -> None:
        self.limits = limits
        self.groups: dict[tuple[str, str], ShareGroup] = {}
        self.refused = 0
        """``$share`` filters refused (SUBACK 0x80) or not served here for the bounds."""
        self.denied = 0
        """Records no local member of their group may read: finished unread."""
        self._log = log_
        self._router = router
        self._deliver = deliver
        self._warned: set[str] = set()

    def admit(self, session: Session, requests: list[tuple[str, int]]) -> set[str]:
        """Join ``session`` to the groups of the ``$share`` filters of ``requests`` the bounds
        allow (held by the session from now on); the filters refused."""
        refused: set[str] = set()
        for topic_filter, qos in requests:
            shared = topics.parse_shared(topic_filter)
            if shared is not None and self.join(session, topic_filter, shared, qos) is None:
                refused.add(topic_filter)
        return refused

    def join(
        self, session: Session, topic_filter: str, shared: tuple[str, str], qos: int
    ) -> ShareGroup | None:
        """``session`` in the group of ``shared`` (opened if new), or None if a bound refuses
        it (counted; the session is left as it was)."""
        group = self.groups.get(shared)
        if group is None or session.client_id not in group.members:
            bound = self._bound_reached(session, topic_filter, new=group is None)
            if bound is not None:
                self._refuse(bound, session.client_id)
                return None
            group = group or self._open(shared)
        group.members[session.client_id] = qos
        session.subscriptions[topic_filter] = qos
        return group

    def _bound_reached(self, session: Session, topic_filter: str, new: bool) -> str | None:
        held = sum(
            1 for f in session.subscriptions if f != topic_filter and f.startswith("$share/")
        )
        if held >= self.limits.per_client:
            return "--max-share-groups-per-client"
        if new and len(self.groups) >= self.limits.per_node:
            return "--max-share-groups"
        return None

    def _refuse(self, bound: str, client_id: str) -> None:
        self.refused += 1
        if bound not in self._warned:  # once per bound: the counter tells the rest
            self._warned.add(bound)
            log.warning("share group refused to client %r: %s reached", client_id, bound)

    def _open(self, shared: tuple[str, str]) -> ShareGroup:
        wanted = self._router.partitions_for_filter(shared[1])
        consumer = self._log.consumer(group_id(*shared), **consumer_config())
        topic = self._log.settings.topic
        group = ShareGroup(consumer, topic, *shared, wanted, self._deliver)
        self.groups[shared] = group
        return group

    async def start(self, group: ShareGroup) -> None:
        """Until ``group`` reads: its start offsets taken and its consumer subscribed."""
        if group.ready is None:
            group.ready = asyncio.get_running_loop().create_task(self._start(group))
        await asyncio.shield(group.ready)

    async def _start(self, group: ShareGroup) -> None:
        key = (group.group, group.filter)
        try:
            starts = await self._log.high_watermarks(group.wanted)
        except BaseException:
            if self.groups.get(key) is group:  # a later SUBSCRIBE opens it afresh
                del self.groups[key]
                self._log.reader.forget(group)
            raise
        if self.groups.get(key) is group:  # not left by every member meanwhile
            group.start(starts)
            self._log.reader.join(group)

    def leave(self, shared: tuple[str, str], client_id: str) -> None:
        """``client_id`` is no member any more; the group's last member closes its consumer."""
        group = self.groups.get(shared)
        if group is None or group.members.pop(client_id, None) is None:
            return
        if not group.members:
            del self.groups[shared]
            self._log.reader.forget(group)

    def names(self) -> list[str]:
        return [f"$share/{g}/{f}" for g, f in self.groups]
