"""The node's broker: who is subscribed to what here, and delivery of what the log brings.

Subscriptions live in a topic trie keyed by (client id, filter).  The broker turns subscription
changes into partition interest (``router.interest``): the first subscription needing a partition
has the consumer read it from the partition's high watermark, the last one leaving releases it.

A new subscription's life, and why nothing is missed or delivered early:

1. it enters the trie as *pending*: records matching it are buffered, not delivered;
2. the high watermark of each partition it needs is read: its start offsets;
3. the client gets its SUBACK, then retained messages that precede those offsets;
4. it is *activated*: buffered records at or after the start offsets are delivered, in log order,
   and from then on every matching record at or after them.

A record published after the SUBACK has an offset at or above the start offset, so it is
delivered; one published before the watermark read is not (retained messages aside).  Each record
reaches a client once, at the highest QoS its matching subscriptions granted [MQTT-3.3.5-1].
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from frontend.log import KafkaLog, Record
from frontend.mqtt import topics
from frontend.mqtt.codec import PublishTemplate
from frontend.record import Message
from frontend.session import Outbound, Session
from frontend.shared import ShareGroup
from frontend.trie import SubscriptionTrie
from router.interest import InterestTable
from router.partitioner import Router

log = logging.getLogger("headwater.broker")

SubKey = tuple[str, str]
"""(client id, topic filter)"""


class Subscriber(Protocol):
    """A connected client, as the broker sees it."""

    def deliver(self, out: Outbound) -> None:
        """Send (or queue) one message for the client."""

    def takeover(self) -> None:
        """Another connection is taking this client id: close, publishing the will."""


@dataclass(slots=True)
class Counters:
    records_dispatched: int = 0
    messages_delivered: int = 0
    messages_dropped: int = 0


@dataclass(slots=True)
class _Client:
    session: Session
    subscriber: Subscriber | None
    pending: dict[str, list[Record]] = field(default_factory=dict)


def template_for(message: Message, qos: int, cache: dict[int, PublishTemplate]) -> PublishTemplate:
    """The PUBLISH of ``message`` at ``qos``, encoded once per record and QoS."""
    template = cache.get(qos)
    if template is None:
        template = cache[qos] = PublishTemplate(message.topic, message.payload, qos)
    return template


class Broker:
    """Node-local subscription index and dispatch."""

    def __init__(self, log_: KafkaLog, router: Router) -> None:
        self.log = log_
        self.router = router
        self.counters = Counters()
        self._trie: SubscriptionTrie[SubKey] = SubscriptionTrie()
        self._interest = InterestTable()
        self._clients: dict[str, _Client] = {}
        self._starts: dict[SubKey, dict[int, int]] = {}
        self._dispatched: dict[int, int] = {}
        """Per partition, the offset after the last record dispatched here."""
        self._shares: dict[tuple[str, str], ShareGroup] = {}
        self._background: set[asyncio.Task[None]] = set()

    # -- sessions -----------------------------------------------------------------------------

    def take_over(self, client_id: str) -> None:
        """Close the live connection of ``client_id``, if any [MQTT-3.1.4-2]: its will is
        published and, as it closes, its session is stored for the new connection."""
        current = self._clients.get(client_id)
        if current is not None and current.subscriber is not None:
            current.subscriber.takeover()

    def attach(self, session: Session, subscriber: Subscriber) -> None:
        """``subscriber`` is now the live connection of ``session``."""
        current = self._clients.get(session.client_id)
        if current is not None:
            self._forget(current)
        self._clients[session.client_id] = _Client(session, subscriber)

    def detach(self, session: Session, subscriber: Subscriber) -> None:
        """The connection closed: this node forgets the session (the store keeps what lasts)."""
        client = self._clients.get(session.client_id)
        if client is not None and client.subscriber is subscriber:
            del self._clients[session.client_id]
            self._forget(client)

    def _forget(self, client: _Client) -> None:
        session = client.session
        self._drop_subscriptions(session.client_id, list(session.subscriptions))
        self._hand_over_shared(session)

    def positions_for(self, session: Session) -> dict[int, int]:
        """Per partition, where the session's stream resumes if it went away now: after what
        this node has dispatched, but not past a message still waiting in its queue, and never
        before a subscription's start."""
        queued = session.queued_from_log()
        positions: dict[int, int] = {}
        for topic_filter in session.subscriptions:
            if topics.parse_shared(topic_filter) is not None:
                continue
            starts = self._starts.get((session.client_id, topic_filter), {})
            for p in self.router.partitions_for_filter(topic_filter):
                pos = max(self._dispatched.get(p, 0), starts.get(p, 0))
                pos = min(pos, queued.get(p, pos), positions.get(p, pos))
                positions[p] = pos
        return positions

    @property
    def client_count(self) -> int:
        return sum(1 for c in self._clients.values() if c.subscriber is not None)

    # -- subscriptions ------------------------------------------------------------------------

    async def subscribe(
        self, session: Session, requests: list[tuple[str, int]]
    ) -> tuple[dict[int, int], list[str]]:
        """Steps 1-2 above: register ``requests``; their start offsets and the new filters."""
        client = self._clients[session.client_id]
        new: list[str] = []
        for topic_filter, qos in requests:
            shared = topics.parse_shared(topic_filter)
            if shared is not None:
                session.subscriptions[topic_filter] = qos
                await self._join_share(shared, session.client_id, qos)
                continue
            fresh = topic_filter not in session.subscriptions
            session.subscriptions[topic_filter] = qos  # a re-subscribe replaces QoS [MQTT-3.8.4-3]
            self._trie.add(topic_filter, (session.client_id, topic_filter), qos)
            if fresh:
                new.append(topic_filter)
                client.pending[topic_filter] = []
        partitions = self._partitions_of(new)
        for needed in partitions:
            self._interest.acquire(needed)
        wanted = frozenset().union(*partitions)
        try:
            starts = await self.log.high_watermarks(wanted)
        except Exception:
            self.unsubscribe(session, new)
            client.pending.clear()
            raise
        assigned = set(self.log.assigned())
        self.log.assign({p: starts[p] for p in wanted if p not in assigned})
        for topic_filter in new:
            self._starts[(session.client_id, topic_filter)] = starts
        return starts, new

    def activate(self, session: Session, filters: Iterable[str], starts: dict[int, int]) -> None:
        """Step 4 above: deliver what was buffered while the subscriptions were pending."""
        client = self._clients.get(session.client_id)
        if client is None:
            return
        buffered: dict[tuple[int, int], Record] = {}
        for topic_filter in filters:
            for rec in client.pending.pop(topic_filter, ()):
                if rec.offset >= starts.get(rec.partition, 0):
                    buffered[(rec.partition, rec.offset)] = rec
        for key in sorted(buffered):
            self._dispatch_one(buffered[key])

    def unsubscribe(self, session: Session, filters: Iterable[str]) -> None:
        present = [f for f in filters if f in session.subscriptions]
        for topic_filter in present:
            del session.subscriptions[topic_filter]
        self._drop_subscriptions(session.client_id, present)

    def _drop_subscriptions(self, client_id: str, filters: list[str]) -> None:
        for topic_filter in filters:
            shared = topics.parse_shared(topic_filter)
            if shared is not None:
                self._leave_share(shared, client_id)
                continue
            key = (client_id, topic_filter)
            if self._trie.remove(topic_filter, key):
                self._starts.pop(key, None)
                released = self._interest.release(self.router.partitions_for_filter(topic_filter))
                self.log.unassign(released)

    def _partitions_of(self, filters: list[str]) -> list[frozenset[int]]:
        return [self.router.partitions_for_filter(f) for f in filters]

    # -- shared subscriptions -----------------------------------------------------------------

    async def _join_share(self, shared: tuple[str, str], client_id: str, qos: int) -> None:
        group = self._shares.get(shared)
        if group is None:
            wanted = self.router.partitions_for_filter(shared[1])
            group = ShareGroup(self.log.settings, *shared, wanted, self._deliver_shared)
            self._shares[shared] = group
            group.start_offsets = await self.log.high_watermarks(wanted)
            group.start()
        group.members[client_id] = qos

    def _leave_share(self, shared: tuple[str, str], client_id: str) -> None:
        group = self._shares.get(shared)
        if group is None or group.members.pop(client_id, None) is None:
            return
        if not group.members:
            del self._shares[shared]
            self._run_in_background(group.stop())

    def _deliver_shared(self, group: ShareGroup, rec: Record, skip: str | None = None) -> None:
        member = group.next_member(skip)
        if member is None:
            return  # nobody left here: stays uncommitted for the partition's next owner
        message = rec.message
        qos = min(group.members[member], message.qos)
        out = Outbound(message, qos, False, template_for(message, qos, {}))
        out.on_done = lambda: group.finished(rec)
        out.redeliver = lambda: self._deliver_shared(group, rec, skip=member)
        self._deliver(member, out)

    def _hand_over_shared(self, session: Session) -> None:
        """A departing member's unacknowledged shared messages go to another member."""
        for out in session.unfinished():
            if out.redeliver is not None:
                out.redeliver()

    def _run_in_background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def share_group(self, group: str, topic_filter: str) -> ShareGroup | None:
        return self._shares.get((group, topic_filter))

    def share_names(self) -> list[str]:
        return [f"$share/{g}/{f}" for g, f in self._shares]

    async def stop(self) -> None:
        for group in list(self._shares.values()):
            await group.stop()
        self._shares.clear()

    # -- dispatch -----------------------------------------------------------------------------

    def dispatch(self, batch: list[Record]) -> None:
        """Deliver a batch consumed from the log (called in the event loop)."""
        dispatched = self._dispatched
        for rec in batch:
            self._dispatch_one(rec)
            dispatched[rec.partition] = rec.offset + 1
        self.counters.records_dispatched += len(batch)

    def _dispatch_one(self, rec: Record) -> None:
        matches = self._trie.match(rec.message.topic)
        if not matches:
            return
        targets: dict[str, int] = {}
        for (client_id, topic_filter), qos in matches.items():
            if self._before_start(rec, client_id, topic_filter):
                continue
            if qos > targets.get(client_id, -1):
                targets[client_id] = qos
        cache: dict[int, PublishTemplate] = {}
        message = rec.message
        for client_id, qos in targets.items():
            out_qos = qos if qos < message.qos else message.qos
            template = template_for(message, out_qos, cache)
            out = Outbound(message, out_qos, False, template, 0, False, rec.partition, rec.offset)
            self._deliver(client_id, out)

    def _before_start(self, rec: Record, client_id: str, topic_filter: str) -> bool:
        """True if the subscription must not see ``rec`` (yet): it starts later, or is pending."""
        client = self._clients.get(client_id)
        if client is not None and client.pending and topic_filter in client.pending:
            client.pending[topic_filter].append(rec)
            return True
        start = self._starts.get((client_id, topic_filter))
        return start is not None and rec.offset < start.get(rec.partition, 0)

    def _deliver(self, client_id: str, out: Outbound) -> None:
        client = self._clients.get(client_id)
        if client is None:
            return
        self.counters.messages_delivered += 1
        session = client.session
        dropped = session.dropped
        if client.subscriber is not None:
            client.subscriber.deliver(out)
        else:
            session.deliver(out, online=False)
        self.counters.messages_dropped += session.dropped - dropped

    # -- retained -----------------------------------------------------------------------------

    def deliver_retained(self, subscriber: Subscriber, message: Message, qos: int) -> None:
        """A retained message for a new subscription: RETAIN=1 [MQTT-3.3.1-8]."""
        out_qos = min(qos, message.qos)
        subscriber.deliver(Outbound(message, out_qos, True, template_for(message, out_qos, {})))
