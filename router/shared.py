"""Shared subscriptions, ``$share/<group>/<filter>``: each message to one member cluster-wide.

A share group (a name and a filter, :func:`group_id`) has as members the nodes with at least one
local client in it.  Each partition of the log the filter can need (``router.partitioner``) is
held by one member node at a time, under a lease; the node holding a partition hands each
matching record of it to one of its local members, round-robin.  Balance across nodes is at
partition granularity: a filter whose routing levels are literal lives on one partition and is
served by one node at a time.

Pooled, not one consumer a group.  Every share group of a node is read by the node's one share
consumer (:class:`ShareReader`, manual assignment, no Kafka group): it reads each partition some
group here holds from the lowest position among those groups, and each record goes to every
group holding its partition whose position it has reached.  A group is a set of positions and
its members, no consumer and no thread of its own: a client asking for 300 groups costs the
node no thread (librdkafka's are the share consumer's, made once at start).  Kafka's group
protocol, which gave each group a consumer (about four threads), is replaced by leases:

* **Membership and leases** (:class:`Leases`): every ``HOLD_SECONDS`` each node holds each of
  its groups in one atomic step: it renews its membership (expiring ``LEASE_SECONDS`` on), the
  partitions are dealt to the live members (sorted wanted partitions, round-robin over the
  sorted member ids: every node computes the same), it releases the leases dealt to others and
  takes those dealt to it that are free (a lease expires ``LEASE_SECONDS`` after its holder
  last renewed it).  A partition dealt to a new member moves at the holder's next step and is
  taken at the one after: within ``2 * HOLD_SECONDS``; a node that dies loses its leases and
  membership ``LEASE_SECONDS`` later, as a Kafka consumer its session.  With Redis the leases
  are keys of the group's slot (``frontend.cluster.RedisShareLeases``); a node without Redis
  is alone, and holds every partition (:class:`LocalLeases`).
* **Commit points**: per partition, the lowest offset still outstanding (handed to a member and
  not acknowledged: QoS 0 once written, QoS 1/2 once PUBACKed or PUBCOMPed, or finished unread
  as below).  They ride on each step, and a step commits only the partitions the node still
  holds (a fencing check: a node that lost a lease while it stood still cannot move the group's
  point).  A partition taken is read from its commit point; a group's first holder stores the
  high watermark read when its share began (never a lazy "latest", which would skip what is
  published between the SUBACK and the first fetch).  At least once across a move or a crash:
  what was outstanding is delivered again by the next holder.
* **A lease not renewed is not served**: a node whose last step began ``LEASE_SECONDS`` less
  ``LEASE_MARGIN`` ago (Redis unreachable, the process stopped) stops handing out its
  partitions before another node can have taken them, and takes them back only through a step.
  (A process stopped for longer may hand out records it had fetched before it notices: at least
  once, as after a crash.)

Bounds.  A group costs a step every ``HOLD_SECONDS`` (one script on the group's slot) and its
positions; so the number of groups is still bounded (:class:`ShareGroups`): at most
``--max-share-groups`` groups with members on a node, at most ``--max-share-groups-per-client``
``$share`` filters held by one client.  A SUBSCRIBE beyond either gets 0x80 for that filter,
counted (``share_groups_refused``) and logged once per bound.  A returning session whose stored
``$share`` filter would go beyond the node's bound keeps the filter but is not served it on this
node (counted the same way): the group's records wait in the log for a member node.

Group ids.  :func:`group_id` is injective: ``headwater.share.<n>:<group>.<filter>``, ``<n>``
the share name's length in characters, so no two (group, filter) pairs are one group (the former
``headwater.share.<group>.<filter>`` made ``$share/q1/p.t/x`` and ``$share/q1.p/t/x`` one).  The
commit points are kept under it (``frontend.cluster``) for ``RETENTION_SECONDS`` after their last
move (Kafka's default offset retention): a group whose members all left takes up again where it
was.  Deployments upgraded from Kafka consumer groups for shares start each group at the high
watermark, like a new group.

Reading rights.  A record goes to the next member, in round-robin order, that may read its topic
(``Session.may_read``: the ACL at the time of sending).  A member that may not is skipped, never
handed the record to acknowledge it unread.  If no member on this node may read it, the record
is finished unread and counted (``share_messages_denied``): this node holds the partition for
the group, so no other node will see the record while it does, and keeping it outstanding would
pin the partition's commit point for good.  That is Mosquitto's answer too (a shared message its
chosen member may not read is dropped), except that here every local member is asked first.  A
member that leaves with records unacknowledged hands them to the next member that may read them,
or leaves them uncommitted if none is left.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from confluent_kafka import Consumer, KafkaException, TopicPartition

from mqttcore import topics
from mqttcore.session import Session
from router.partitioner import Router
from router.record import Record
from router.retry import Backoff, Retries, close_aside

log = logging.getLogger("headwater.shared")

HOLD_SECONDS = 1.0
"""Seconds between two steps of a group's leases (its commit points ride on them)."""
LEASE_SECONDS = 10.0
"""A membership or a partition's lease not renewed for this long is gone (Kafka's default
session timeout for its groups' members)."""
RETENTION_SECONDS = 7 * 24 * 3600.0
"""A group's commit points are kept this long after they last moved (Kafka's default
``offsets.retention.minutes``)."""
SHARE_BATCH = 500
"""Records the share consumer hands over per turn of the pump."""
STALE_CHECK = 0.1
"""Seconds between two looks for groups whose leases may have passed."""
LEASE_MARGIN = 1.0
"""A node stops serving leases it could not renew this long before they expire (counted
from before the step that renewed them, on its own clock): more than ``STALE_CHECK``."""

DEFAULT_MAX_SHARE_GROUPS = 256
"""Share groups with members on one node, at most (``--max-share-groups``)."""
DEFAULT_MAX_SHARE_GROUPS_PER_CLIENT = 8
"""``$share`` filters one client holds, at most (``--max-share-groups-per-client``)."""


def group_id(group: str, topic_filter: str) -> str:
    """The id of ``$share/<group>/<filter>``: injective, the share name's length first (a
    share name may hold dots and colons, a filter dots and slashes)."""
    return f"headwater.share.{len(group)}:{group}.{topic_filter}"


class LeaseError(Exception):
    """The leases could not be held now (their store did not answer)."""


class Leases(Protocol):
    """Where the members of share groups hold partitions (see the module docstring)."""

    async def hold(
        self,
        gid: str,
        wanted: Sequence[int],
        commits: Mapping[int, int],
        starts: Mapping[int, int],
    ) -> dict[int, int]:
        """One step of this node's part in group ``gid``: ``commits`` stored for the partitions
        it still holds; its membership renewed; the partitions of ``wanted`` (sorted) dealt to
        the live members, the ones dealt to others released and the free ones dealt to it
        taken.  Returns the partitions it holds, each with the group's commit point (``starts``'
        where the group has none yet, stored).  Raises :class:`LeaseError`."""
        ...

    async def leave(self, gid: str, wanted: Sequence[int], commits: Mapping[int, int]) -> None:
        """``commits`` stored, this node's leases of ``gid`` released, its membership ended."""
        ...


class LocalLeases:
    """A node alone (no Redis): it holds every partition of its groups; commit points kept
    while the group has members here."""

    def __init__(self) -> None:
        self._points: dict[str, dict[int, int]] = {}

    async def hold(
        self,
        gid: str,
        wanted: Sequence[int],
        commits: Mapping[int, int],
        starts: Mapping[int, int],
    ) -> dict[int, int]:
        points = self._points.setdefault(gid, {})
        points.update(commits)
        return {p: points.setdefault(p, starts[p]) for p in wanted}

    async def leave(self, gid: str, wanted: Sequence[int], commits: Mapping[int, int]) -> None:
        self._points.pop(gid, None)


class _Offsets:
    """Per partition: offsets handed out but not finished; what may be committed."""

    def __init__(self) -> None:
        self._outstanding: dict[int, set[int]] = {}
        self._next: dict[int, int] = {}
        self._committed: dict[int, int] = {}

    def start(self, partition: int, offset: int) -> None:
        self._outstanding.setdefault(partition, set()).add(offset)
        self._next[partition] = offset + 1

    def finish(self, partition: int, offset: int) -> None:
        pending = self._outstanding.get(partition)
        if pending is not None:
            pending.discard(offset)

    def skip(self, partition: int, offset: int) -> None:
        self._next[partition] = offset + 1

    def due(self) -> dict[int, int]:
        """Commit points that moved since the last commit."""
        due: dict[int, int] = {}
        for partition, nxt in self._next.items():
            pending = self._outstanding.get(partition)
            point = min(pending) if pending else nxt
            if self._committed.get(partition) != point:
                due[partition] = point
        return due

    def committed(self, points: Mapping[int, int]) -> None:
        self._committed.update(points)

    def forget(self, partitions: Iterable[int]) -> None:
        for partition in partitions:
            self._outstanding.pop(partition, None)
            self._next.pop(partition, None)
            self._committed.pop(partition, None)


class ShareGroup:
    """This node's part in one shared subscription: its local members and the partitions it
    holds, each with the next offset it takes."""

    def __init__(
        self,
        group: str,
        topic_filter: str,
        wanted: frozenset[int],
        deliver: Callable[[ShareGroup, Record], None],
    ) -> None:
        self.group = group
        self.filter = topic_filter
        self.gid = group_id(group, topic_filter)
        self.members: dict[str, int] = {}
        """client id -> granted QoS, in joining order (round-robin order)."""
        self._turn = 0
        self.wanted = tuple(sorted(wanted))
        """Partitions the filter can match, the only ones it holds leases of."""
        self._deliver = deliver
        self.offsets = _Offsets()
        self.start_offsets: dict[int, int] = {}
        """High watermarks read when this node's share began: the group's start where none."""
        self.positions: dict[int, int] = {}
        """Partitions held now -> the next offset to take."""
        self.held_until = 0.0
        """``time.monotonic()`` after which the leases may have passed to another node."""
        self.ready: asyncio.Task[None] | None = None
        """Reading the start offsets and the first step (:meth:`ShareGroups.start`), once."""

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

    def offer(self, rec: Record) -> None:
        """``rec`` read from a partition this group holds: taken if the group is there."""
        at = self.positions.get(rec.partition)
        if at is None or rec.offset < at:
            return
        self.positions[rec.partition] = rec.offset + 1
        if topics.matches(self.filter, rec.message.topic):
            self.offsets.start(rec.partition, rec.offset)
            self._deliver(self, rec)
        else:
            self.offsets.skip(rec.partition, rec.offset)

    def finished(self, rec: Record) -> None:
        """A member acknowledged ``rec`` (or it needed no acknowledgement)."""
        self.offsets.finish(rec.partition, rec.offset)


class ShareReader:
    """The node's one consumer for its share groups (manual assignment, no Kafka group).

    Invariants: a partition is assigned exactly while some group here holds it, at or below the
    lowest position among those groups; a record goes to a group at most once (at or after its
    position, which then moves past it).  Re-assigning a partition bumps librdkafka's fetch
    version, so records fetched before are never handed out."""

    def __init__(
        self, topic: str, decode: Callable[[list[Any]], list[Record]], retries: Retries
    ) -> None:
        self.topic = topic
        self._decode = decode
        self._retries = retries
        self._backoff = Backoff()
        self.consumer: Consumer | None = None
        self._holders: dict[int, list[ShareGroup]] = {}
        self._reading: dict[int, int] = {}
        """Assigned partitions -> the next offset the consumer hands out."""
        self._next_check = 0.0
        """When to look again for groups whose leases may have passed (``STALE_CHECK``)."""

    def start(self, consumer: Consumer) -> None:
        self.consumer = consumer

    def stop(self) -> asyncio.Future[None] | None:
        """Close the consumer aside (``router.retry.close_aside``); nothing is committed."""
        consumer, self.consumer = self.consumer, None
        self._holders.clear()
        self._reading.clear()
        return close_aside(consumer) if consumer is not None else None

    def gain(self, group: ShareGroup, partition: int, offset: int) -> None:
        """``group`` holds ``partition`` from ``offset`` on."""
        group.positions[partition] = offset
        holders = self._holders.setdefault(partition, [])
        if group not in holders:
            holders.append(group)
        at = self._reading.get(partition)
        if (at is not None and at <= offset) or self.consumer is None:
            return
        tp = TopicPartition(self.topic, partition, offset)
        if at is not None:
            self.consumer.incremental_unassign([TopicPartition(self.topic, partition)])
        self.consumer.incremental_assign([tp])
        self._reading[partition] = offset

    def lose(self, group: ShareGroup, partitions: Iterable[int]) -> None:
        """``group`` holds ``partitions`` no more (their outstanding records stay its own)."""
        for partition in list(partitions):
            group.positions.pop(partition, None)
            holders = self._holders.get(partition, [])
            if group in holders:
                holders.remove(group)
            if not holders:
                self._holders.pop(partition, None)
                if self._reading.pop(partition, None) is not None and self.consumer is not None:
                    self.consumer.incremental_unassign([TopicPartition(self.topic, partition)])

    def serve(self) -> bool:
        """Hand what the consumer fetched to the groups; True if it had something."""
        consumer = self.consumer
        if consumer is None or not self._reading:
            return False
        now = time.monotonic()
        if self._backoff.until and now < self._backoff.until:
            return False
        if now >= self._next_check:
            self._next_check = now + STALE_CHECK
            self._drop_stale(now)
        try:
            raw = consumer.consume(SHARE_BATCH, 0)
        except (KafkaException, RuntimeError) as exc:
            paused = self._backoff.failed(now)
            self._retries.count("share")
            log.warning("share consume failed: %s; trying again in %.2f s", exc, paused)
            return False
        if self._backoff.until:
            self._backoff.succeeded()
        for rec in self._decode(raw):
            if rec.partition not in self._reading:
                continue
            self._reading[rec.partition] = rec.offset + 1
            for group in self._holders.get(rec.partition, ()):
                group.offer(rec)
        return bool(raw)

    def _drop_stale(self, now: float) -> None:
        """Groups whose leases may have passed to another node stop being served."""
        stale = {g for holders in self._holders.values() for g in holders if g.held_until < now}
        for group in stale:
            log.warning("share group %s: leases not renewed; not serving them", group.gid)
            self.lose(group, list(group.positions))


@dataclass(slots=True, frozen=True)
class ShareLimits:
    """The bounds of :class:`ShareGroups` (``--max-share-groups``, ``--max-share-groups-per-
    client``); 0 refuses every ``$share`` filter."""

    per_node: int = DEFAULT_MAX_SHARE_GROUPS
    per_client: int = DEFAULT_MAX_SHARE_GROUPS_PER_CLIENT


class GroupReader(Protocol):
    """The node's one reader (``router.reader.LogReader``), as share groups use it."""

    @property
    def shares(self) -> ShareReader: ...


class GroupLog(Protocol):
    """The node's log (``router.log.KafkaLog``), as share groups use it."""

    @property
    def reader(self) -> GroupReader: ...

    async def high_watermarks(self, partitions: Iterable[int]) -> dict[int, int]: ...


class ShareGroups:
    """This node's share groups and their members, within :class:`ShareLimits`.

    Invariants: ``groups`` never holds more than ``limits.per_node`` groups, each with at least
    one member; a member of a group holds the group's ``$share`` filter in its session, and no
    session holds more than ``limits.per_client`` of them through :meth:`join`.  Joining is
    synchronous (the bounds are checked and taken in one step of the event loop); a new group's
    first step is awaited once by everyone who joined it meanwhile.  The steps run on one timer
    while groups exist, none while there are none."""

    def __init__(
        self,
        log_: GroupLog,
        router: Router,
        limits: ShareLimits,
        deliver: Callable[[ShareGroup, Record], None],
    ) -> None:
        self.limits = limits
        self.groups: dict[tuple[str, str], ShareGroup] = {}
        self.leases: Leases = LocalLeases()
        """Where the leases are held: ``frontend.cluster.RedisShareLeases`` in a cluster."""
        self.refused = 0
        """``$share`` filters refused (SUBACK 0x80) or not served here for the bounds."""
        self.denied = 0
        """Records no local member of their group may read: finished unread."""
        self.lease_failures = 0
        """Steps that failed (the leases' store did not answer)."""
        self._log = log_
        self._router = router
        self._deliver = deliver
        self._warned: set[str] = set()
        self._stepping: asyncio.Task[None] | None = None
        self._leaving: set[asyncio.Task[None]] = set()

    # -- members ------------------------------------------------------------------------------

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
            if group is None:
                wanted = self._router.partitions_for_filter(shared[1])
                group = self.groups[shared] = ShareGroup(*shared, wanted, self._deliver)
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

    def leave(self, shared: tuple[str, str], client_id: str) -> None:
        """``client_id`` is no member any more; the group's last member ends this node's part
        (its leases released, its commit points stored, in the background)."""
        group = self.groups.get(shared)
        if group is None or group.members.pop(client_id, None) is None:
            return
        if not group.members:
            del self.groups[shared]
            self._end(group)

    def names(self) -> list[str]:
        return [f"$share/{g}/{f}" for g, f in self.groups]

    # -- leases -------------------------------------------------------------------------------

    async def start(self, group: ShareGroup) -> None:
        """Until ``group`` reads: its start offsets read and its first step taken."""
        if group.ready is None:
            group.ready = asyncio.get_running_loop().create_task(self._start(group))
        await asyncio.shield(group.ready)

    async def _start(self, group: ShareGroup) -> None:
        key = (group.group, group.filter)
        try:
            group.start_offsets = await self._log.high_watermarks(group.wanted)
            if self.groups.get(key) is group:  # not left by every member meanwhile
                await self._step(group, raising=True)
        except BaseException:
            if self.groups.get(key) is group:  # a later SUBSCRIBE opens it afresh
                del self.groups[key]
                self._end(group)
            raise
        if self._stepping is None:
            self._stepping = asyncio.get_running_loop().create_task(self._steps())

    async def _steps(self) -> None:
        """Every ``HOLD_SECONDS``, a step of every group started here; ends with the last group."""
        try:
            while self.groups:
                await asyncio.sleep(HOLD_SECONDS)
                started = [g for g in self.groups.values() if g.ready and g.ready.done()]
                await asyncio.gather(*(self._step(g) for g in started))
        finally:
            self._stepping = None

    async def _step(self, group: ShareGroup, raising: bool = False) -> None:
        """One step of ``group``'s leases (:meth:`Leases.hold`); what it holds follows."""
        due = group.offsets.due()
        began = time.monotonic()
        try:
            held = await self.leases.hold(group.gid, group.wanted, due, group.start_offsets)
        except LeaseError as exc:
            self.lease_failures += 1
            log.warning("share group %s: leases not held: %s", group.gid, exc)
            if raising:
                raise
            return
        if self.groups.get((group.group, group.filter)) is not group:
            return  # left during the step: _end releases what it took
        group.offsets.committed({p: o for p, o in due.items() if p in held})
        group.held_until = began + LEASE_SECONDS - LEASE_MARGIN
        reader = self._log.reader.shares
        lost = [p for p in group.positions if p not in held]
        reader.lose(group, lost)
        group.offsets.forget(lost)
        for partition, offset in held.items():
            if partition not in group.positions:
                reader.gain(group, partition, offset)

    def _end(self, group: ShareGroup) -> None:
        self._log.reader.shares.lose(group, list(group.positions))
        task = asyncio.get_running_loop().create_task(self._leave(group))
        self._leaving.add(task)
        task.add_done_callback(self._leaving.discard)

    async def _leave(self, group: ShareGroup) -> None:
        if group.ready is not None:
            await asyncio.wait([group.ready])  # a first step still running takes leases
        try:
            await self.leases.leave(group.gid, group.wanted, group.offsets.due())
        except LeaseError as exc:  # the leases expire by themselves
            log.warning("share group %s: leases not released: %s", group.gid, exc)

    async def stop(self) -> None:
        """Until every group left (its last commit points stored, its leases released)."""
        for key, group in list(self.groups.items()):
            del self.groups[key]
            self._end(group)
        if self._stepping is not None:
            self._stepping.cancel()
        if self._leaving:
            await asyncio.wait(list(self._leaving))
