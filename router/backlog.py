"""The log is the queue: clients read from the log what they could not be given live.

A client whose queue is full when a QoS 1/2 record comes for it is not given the record: it
*falls behind*.  From then on live records are not queued for it (``Client.behind`` holds, per
partition, the next offset it needs), and a catch-up task reads them back from the log in
rounds, each from where the client is to where the live stream has got to
(``Subscriptions.dispatched``), through the node's one catch-up consumer (``router.catchup``),
handing records over only while its queue has room.  A client
goes live again partition by partition: a live record finds it behind but with everything before
it in that partition handed over (the round has reached the live stream there) and room in its
queue, so it is delivered live and the partition needs no more rounds.  Under steady traffic the
live stream never stands still, so this is how a client that caught up rejoins it; when a round
ends and the live stream has not moved past it, the client is live again too.  Either way the
switch is in one step of the event loop, with no gap and no duplicate.  ``--max-queued`` bounds
memory, not delivery; only QoS 0 messages are dropped for a slow client (counted).  A persistent
session that returns starts behind, at its stored positions, and goes through the same rounds.

A record is read once, even so.  When a live batch finds every local holder of a partition
behind on it (each of the index's subscriptions needing it is a behind client's; one found to
have a live holder is looked at again ``LOOK_AGAIN`` later), the live read of it is paused
(``router.reader``), so the live edge (``dispatched``) stands still and the rounds end there.
A client whose round has reached the edge of a paused partition then either moves the edge on
to the partition's head (the live read skips there, still paused: the next rounds read on),
while the head is more records on than the client's queue holds, or resumes the live read,
which goes on from the edge: the switch above.  A new subscription needing the partition
resumes it (``router.subscriptions``), as it would need its live records.

Records that waited for a pending subscription (``router.subscriptions``) are older than the
live stream: if one finds the client behind, its offset goes into ``Client.rewind`` and the next
round starts there.  A catch-up that cannot read the log (``router.catchup`` gives up after its
stall timeout) is reported to the client's subscriber, which closes the connection; the stored
positions stay where the client was, so the next connection reads on from there.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from mqttcore.codec import PublishTemplate
from mqttcore.session import Outbound
from router.delivery import Client, Counters, delivery_qos, lower, template_for
from router.log import Log
from router.record import Record
from router.subscriptions import Subscriptions

log = logging.getLogger("headwater.backlog")

LOOK_AGAIN = 1.0
"""Seconds before a partition found to have a live holder is looked at again: a look walks
every client behind, and a reconnect storm brings thousands of them."""


class Backlog:
    """The clients of this node that are behind, and the rounds that catch them up."""

    def __init__(
        self,
        log_: Log,
        subscriptions: Subscriptions,
        counters: Counters,
        deliver: Callable[[Client, Outbound], None],
    ) -> None:
        self.log = log_
        self.subscriptions = subscriptions
        self.counters = counters
        self._deliver = deliver
        self.clients: set[Client] = set()
        """The clients behind now."""
        self.fell: set[int] = set()
        """Partitions a live record found a client behind on, since the last live batch."""
        self._looked: dict[int, float] = {}
        """When each partition was last found to have a live holder (``pause_idle``)."""
        self._matched_record: Record | None = None
        self._matched: dict[str, int] = {}
        self._templates: dict[int, PublishTemplate] = {}

    @staticmethod
    def needed(client: Client, positions: dict[int, int]) -> None:
        """Lower ``positions`` to what ``client`` still needs from the log, if it is behind."""
        if client.behind is not None:
            lower(positions, client.behind)
            lower(positions, client.rewind or {})

    def start(self, client: Client, positions: dict[int, int]) -> None:
        """Catch ``client`` up from ``positions`` (a returning session's stored ones)."""
        client.behind = positions
        self._catch_up(client)

    def stop(self, client: Client) -> None:
        if client.catching_up is not None:
            client.catching_up.cancel()
        self.clients.discard(client)

    def takes_live(self, client: Client, rec: Record, qos: int) -> bool:
        """Whether ``client`` takes the live record ``rec`` live: a QoS 0 one or one its queue
        has room for, if it is not behind; if it is, only when the rounds have handed it
        everything before ``rec`` in its partition too (``rec`` is new to the live stream, and
        the client needs nothing older there): the partition is then live again for it."""
        behind = client.behind
        kept = qos or client.keeps_qos0
        if behind is None:
            return not kept or client.session.has_room()
        edge = self.subscriptions.dispatched.get(rec.partition)
        if (
            edge is None
            or rec.offset < edge
            or behind.get(rec.partition, -1) < edge
            or client.rewind is not None
            or (kept and not client.session.has_room())
        ):
            return False
        behind[rec.partition] = rec.offset + 1
        return True

    def fall_behind(self, client: Client, rec: Record, qos: int) -> None:
        """``client`` is not given ``rec`` live: a QoS 0 one is dropped (counted), unless the
        client keeps QoS 0 (a history stream); a QoS 1/2 one is read back from the log later,
        with everything after it."""
        if not qos and not client.keeps_qos0:
            self.counters.messages_dropped += 1
            return
        self.fell.add(rec.partition)
        behind = client.behind
        if behind is None:
            behind = client.behind = self.subscriptions.stream_positions(client.session)
            self.counters.fell_behind += 1
            self._catch_up(client)
        at = behind.get(rec.partition)
        if at is None:
            behind[rec.partition] = rec.offset
        elif rec.offset < at:
            rewind = client.rewind = client.rewind or {}
            rewind[rec.partition] = min(rec.offset, rewind.get(rec.partition, rec.offset))

    def pause_idle(self) -> None:
        """After a live batch: pause the live read of each partition it found a client behind
        on whose every local holder is behind on it (module docstring)."""
        reader, dispatched = self.log.reader, self.subscriptions.dispatched
        now = time.monotonic()
        for partition in self.fell:
            edge = dispatched.get(partition)
            if edge is None or reader.is_paused(partition):
                continue
            if now - self._looked.get(partition, now - LOOK_AGAIN) < LOOK_AGAIN:
                continue
            behind = 0
            for client in self.clients:
                at = client.behind.get(partition) if client.behind is not None else None
                if at is not None and at < edge:
                    behind += self.subscriptions.holds(client.session, partition)
            if behind >= self.subscriptions.holders(partition):
                reader.pause([partition])
            else:
                self._looked[partition] = now
        self.fell.clear()

    def _at_edge(self, client: Client, behind: dict[int, int]) -> None:
        """For each paused partition whose edge ``client`` has reached: move the edge on to
        the head if that is more records on than its queue holds (a live read would find it
        full), else resume the live read."""
        reader, dispatched = self.log.reader, self.subscriptions.dispatched
        holds = client.queue.max_queued
        for partition, at in behind.items():
            edge = dispatched.get(partition)
            if edge is None or at < edge or not reader.is_paused(partition):
                continue
            head = reader.head(partition)
            if head is not None and head - edge > holds:
                dispatched[partition] = head
                reader.skip(partition, head)
            else:
                reader.resume([partition])

    def _catch_up(self, client: Client) -> None:
        self.clients.add(client)
        task = asyncio.get_running_loop().create_task(self._read_behind(client))
        client.catching_up = task
        task.add_done_callback(lambda done: self._caught_up(client, done))

    def _caught_up(self, client: Client, task: asyncio.Task[None]) -> None:
        if client.catching_up is task:
            client.catching_up = None
        if task.cancelled() or (error := task.exception()) is None:
            return
        self.clients.discard(client)
        client.subscriber.stream_failed(error)

    async def _read_behind(self, client: Client) -> None:
        """Rounds of catch-up from where ``client`` is to where the live stream has got to,
        until a round ends where the live stream still is: then it is live again."""
        session = client.session
        behind = client.behind
        assert behind is not None
        dispatched = self.subscriptions.dispatched
        first = True
        while True:
            lower(behind, client.rewind or {})
            client.rewind = None
            self._at_edge(client, behind)
            ranges = {
                p: (at, dispatched[p]) for p, at in behind.items() if at < dispatched.get(p, at)
            }
            if not ranges:
                client.behind = None  # the next live record of each partition follows on
                self.clients.discard(client)
                return
            if first:
                await self._skip_expired(session.client_id, ranges)
                first = False
            replayed = await self._replay(client, ranges)  # (mypyc: no += across an await)
            self.counters.messages_replayed += replayed
            for partition, (_, end) in ranges.items():
                behind[partition] = max(end, behind[partition])

    async def _replay(self, client: Client, ranges: dict[int, tuple[int, int]]) -> int:
        """Hand ``client`` the QoS 1/2 records of ``ranges`` matching its plain subscriptions,
        while its queue has room; the number handed over."""
        session = client.session
        client_id = session.client_id
        behind = client.behind
        assert behind is not None
        # In flight from before a reconnect, resent already: the same record under the same topic
        # (a history stream's copy goes out under its prefix, a plain one under the topic).
        resent = {(o.partition, o.offset, o.message.topic) for o in client.queue.inflight.values()}
        prefix = client.prefix
        delivered = 0

        def take(rec: Record) -> bool:
            nonlocal delivered
            if (rec.partition, rec.offset, prefix + rec.message.topic) in resent:
                return True
            granted = self._granted(rec).get(client_id)
            qos = 0 if granted is None else delivery_qos(granted, rec.message.qos)
            if qos or (client.keeps_qos0 and granted is not None):
                if not session.has_room():
                    return False
                template = template_for(rec.message, qos, self._templates)
                out = Outbound(
                    rec.message, qos, False, template, 0, False, rec.partition, rec.offset
                )
                self._deliver(client, out)
                delivered += 1
            behind[rec.partition] = rec.offset + 1
            return True

        await self.log.reader.replay(ranges, take, session.half_empty)
        return delivered

    def _granted(self, rec: Record) -> dict[str, int]:
        """Per client, the highest QoS its plain subscriptions grant ``rec``'s topic: one walk of
        the index per record, shared by every session the catch-up offers it to (in a storm, a
        record is offered to hundreds of them in a row), as is its PUBLISH per QoS."""
        if rec is not self._matched_record:
            self._matched_record = rec
            self._matched = self.subscriptions.granted(rec.message.topic)
            self._templates = {}
        return self._matched

    async def _skip_expired(self, client_id: str, ranges: dict[int, tuple[int, int]]) -> None:
        """Records retention already removed cannot be replayed: count them and go on."""
        wanted = [p for p, (start, end) in ranges.items() if start < end]
        for partition, low in (await self.log.low_watermarks(wanted)).items():
            start, end = ranges[partition]
            if start < low:
                lost = min(low, end) - start
                self.counters.retention_lost += lost
                log.warning(
                    "session %s: %d records of partition %d were removed by retention "
                    "before it came back; continuing without them",
                    client_id, lost, partition,
                )  # fmt: skip
                ranges[partition] = (min(low, end), end)
