"""Who on this node receives a message, and at what QoS: one rule for every path.

A message reaches a client from five places, and each goes through :meth:`Dispatcher._deliver`
with the QoS of :func:`delivery_qos`:

* **live**: a record the reader fetched, to every local client with a matching subscription
  that has started (``router.subscriptions``);
* **catch-up**: the records a client missed, read back from the log (``router.backlog``): a
  returning persistent session's, from its stored positions, and a connected client's whose queue
  filled up; QoS 1/2 only (QoS 0 is not kept for a client that was away, nor for a slow one),
  taken only while the session's queue has room, so the bound never drops one;
* **retained**: after a SUBACK, the retained messages its filters match [MQTT-3.3.1-6], RETAIN=1;
* **shared**: a record of a share group this node holds the partition of, to one member;
* **local**: a message of the node's own for its own clients only, not in the log (``$SYS``
  totals, ``frontend.systree``, computed from what :class:`Watchers` inside the node read);
* **history**: a ``$history/<since>/<filter>`` subscription is a stream of its own, caught up
  from a time like a returning session, then live (``router.history``).

Each record reaches a client once, at the highest QoS its matching subscriptions granted (the
index's match returns each client once with that), capped by the message's own [MQTT-3.3.5-1].
The PUBLISH bytes are encoded once per record and QoS and shared by every subscriber.  Every
message a session's bound drops is counted.

A client whose queue is full reads on from the log (``router.backlog``): the log is the queue.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterable

from mqttcore import topics
from mqttcore.codec import PublishTemplate
from mqttcore.message import Message
from mqttcore.session import Outbound, Session
from router.backlog import Backlog
from router.delivery import Client, Counters, Subscriber, delivery_qos, lower, template_for
from router.history import HistoryFeed, HistoryLimits, HistoryView, start_time, stream_id
from router.log import Log
from router.partitioner import Router
from router.record import Record
from router.shared import ShareGroup, ShareGroups, ShareLimits
from router.subscriptions import Subscriptions

WATCHER = "\0watch:"
"""Client id prefix of the node's own readers (:meth:`Dispatcher.watch`): no client's id
contains U+0000 [MQTT-1.5.3-2], so none can collide."""


class Dispatcher:
    """Node-local delivery: the connected clients and what each receives."""

    def __init__(
        self,
        log_: Log,
        router: Router,
        share_limits: ShareLimits | None = None,
        history_limits: HistoryLimits | None = None,
    ) -> None:
        self.log = log_
        self.subscriptions = Subscriptions(log_, router)
        self.router = router
        self.counters = Counters()
        self.backlog = Backlog(log_, self.subscriptions, self.counters, self._deliver)
        self._clients: dict[str, Client] = {}
        self.touched: set[str] = set()
        """Persistent sessions given a message since the session manager last took this."""
        self.shares = ShareGroups(log_, router, share_limits or ShareLimits(), self._share)
        self.watchers = Watchers(self.subscriptions)
        self.history_limits = history_limits or HistoryLimits()
        self._starting: dict[str, tuple[HistoryView, dict[int, int]]] = {}
        """History streams subscribed to but not started yet (until their SUBACK is sent)."""
        self.history_streams = 0
        """History streams running here (each is in ``_clients`` under its own id)."""
        self.history_refused = 0
        """History filters refused (0x80) for the bounds of ``history_limits``."""

    # -- clients ------------------------------------------------------------------------------

    def attach(self, session: Session, subscriber: Subscriber) -> None:
        """``subscriber`` is now the live connection of ``session``."""
        current = self._clients.get(session.client_id)
        if current is not None:
            self._forget(current)
        self._clients[session.client_id] = Client(session, subscriber)

    def detach(self, session: Session, subscriber: Subscriber) -> None:
        """The connection closed: this node forgets the session (the store keeps what lasts)."""
        client = self._clients.get(session.client_id)
        if client is not None and client.subscriber is subscriber:
            del self._clients[session.client_id]
            self._forget(client)

    def _forget(self, client: Client) -> None:
        self.backlog.stop(client)
        session = client.session
        plain: list[str] = []
        for topic_filter in session.subscriptions:
            shared = topics.parse_shared(topic_filter)
            if topic_filter.startswith(topics.HISTORY_PREFIX):
                self._end_history(session, topic_filter)
            elif shared is None:
                plain.append(topic_filter)
            else:
                self.shares.leave(shared, session.client_id)
        self.subscriptions.forget(session.client_id, plain)
        for out in session.unfinished():  # unacknowledged shared messages go to another member
            if out.redeliver is not None:
                out.redeliver()

    def subscriber(self, client_id: str) -> Subscriber | None:
        """The live connection of ``client_id`` here, if any."""
        client = self._clients.get(client_id)
        return client.subscriber if client is not None else None

    @property
    def client_count(self) -> int:
        return len(self._clients) - self.history_streams

    @property
    def subscription_count(self) -> int:  # walks the clients: for periodic figures only
        return sum(len(c.session.subscriptions) for c in self._clients.values() if c.owner is None)

    # -- subscriptions ------------------------------------------------------------------------

    async def subscribe(
        self, session: Session, requests: list[tuple[str, int]]
    ) -> tuple[dict[int, int], list[str]]:
        """Register ``requests``: their start offsets and the new plain and history filters,
        which stay pending until :meth:`activate`."""
        plain = await self._subscribe_shared(session, requests)
        plain, history = await self._subscribe_history(session, plain, None)
        starts, new = await self.subscriptions.add(session, plain)
        return starts, new + history

    async def resume(
        self, session: Session, requests: list[tuple[str, int]], positions: dict[int, int]
    ) -> None:
        """Register a returning session's stored subscriptions and catch it up from its stored
        ``positions`` (a partition without one starts where its live stream does); it goes
        live by itself once caught up.  A failed catch-up is reported to its subscriber."""
        plain = await self._subscribe_shared(session, requests)
        plain, history = await self._subscribe_history(session, plain, positions)
        starts, _ = await self.subscriptions.add(session, plain, resume_from=positions)
        client = self._clients.get(session.client_id)
        if client is not None and client.session is session and starts:
            self.backlog.start(client, {p: positions.get(p, at) for p, at in starts.items()})
        self._start_history(session, history)

    async def _subscribe_shared(
        self, session: Session, requests: list[tuple[str, int]]
    ) -> list[tuple[str, int]]:
        """Join the share groups of the shared filters in ``requests`` (all at once, then wait
        for the new ones to read); the plain ones.  A filter the bounds refuse here (a resumed
        session's: a SUBSCRIBE's were refused by ``shares.admit``) stays the session's, unserved
        on this node (``router.shared``)."""
        plain: list[tuple[str, int]] = []
        joined: list[ShareGroup] = []
        for topic_filter, qos in requests:
            shared = topics.parse_shared(topic_filter)
            if shared is None:
                plain.append((topic_filter, qos))
            elif (group := self.shares.join(session, topic_filter, shared, qos)) is not None:
                joined.append(group)
            else:
                session.subscriptions[topic_filter] = qos
        if joined:  # a SUBSCRIBE of plain filters awaits nothing here
            await asyncio.gather(*(self.shares.start(group) for group in joined))
        return plain

    def activate(self, session: Session, filters: Iterable[str]) -> None:
        """Deliver what was buffered while ``filters`` were pending, and start the history
        streams among them; live from now on."""
        filters = list(filters)
        if session.client_id in self._clients:
            for rec in self.subscriptions.activate(session.client_id, filters):
                self._dispatch_one(rec)
        self._start_history(session, filters)

    def unsubscribe(self, session: Session, filters: Iterable[str]) -> None:
        for topic_filter in filters:
            shared = topics.parse_shared(topic_filter)
            if topic_filter.startswith(topics.HISTORY_PREFIX):
                if session.subscriptions.pop(topic_filter, None) is not None:
                    self._end_history(session, topic_filter)
            elif shared is not None and session.subscriptions.pop(topic_filter, None) is not None:
                self.shares.leave(shared, session.client_id)
        self.subscriptions.remove(session, filters)

    # -- history ------------------------------------------------------------------------------

    def admit(self, session: Session, requests: list[tuple[str, int]]) -> set[str]:
        """The ``$share`` and ``$history`` filters of a SUBSCRIBE that a bound refuses (0x80);
        the share groups of the others are joined (``router.shared``)."""
        refused = self.shares.admit(session, requests)
        limits, held = self.history_limits, session.subscriptions
        mine = sum(1 for f in held if f.startswith(topics.HISTORY_PREFIX))
        running = self.history_streams + len(self._starting)
        for topic_filter, _ in requests:
            if not topic_filter.startswith(topics.HISTORY_PREFIX) or topic_filter in held:
                continue
            if mine >= limits.per_client or running >= limits.per_node:
                refused.add(topic_filter)
                self.history_refused += 1
            else:
                mine, running = mine + 1, running + 1
        return refused

    async def _subscribe_history(
        self, session: Session, requests: list[tuple[str, int]], positions: dict[int, int] | None
    ) -> tuple[list[tuple[str, int]], list[str]]:
        """Register the history filters of ``requests``, each a stream of its own beginning at
        its time (a returning session's: at its stored ``positions``, ``router.history``),
        started by :meth:`_start_history`; the other requests, and the new history filters."""
        rest: list[tuple[str, int]] = []
        new: list[str] = []
        for topic_filter, qos in requests:
            parsed = topics.parse_history(topic_filter)
            if parsed is None:
                rest.append((topic_filter, qos))
                continue
            since, real = parsed
            key = stream_id(session.client_id, topic_filter)
            running = self._clients.get(key)
            view = running.session if running is not None else None
            if view is None and key in self._starting:
                view = self._starting[key][0]
            if view is not None:  # subscribed again: the new QoS, the stream goes on
                await self.subscriptions.add(view, [(real, qos)])
                session.subscriptions[topic_filter] = qos
                continue
            view = HistoryView(session, topic_filter, since, real)
            begin = await self._history_begin(real, since, positions or {})
            await self.subscriptions.add(view, [(real, qos)], resume_from=begin)
            session.subscriptions[topic_filter] = qos  # the session's once its stream is set
            self._starting[key] = (view, begin)
            new.append(topic_filter)
        return rest, new

    async def _history_begin(
        self, real_filter: str, since: str, positions: dict[int, int]
    ) -> dict[int, int]:
        """Per partition ``real_filter`` maps to, where its history stream begins: at a stored
        position, else at the first record stamped from ``since`` on."""
        partitions = self.router.partitions_for_filter(real_filter)
        begin = {p: positions[p] for p in partitions if p in positions}
        missing = [p for p in partitions if p not in begin]
        if missing:
            start = start_time(since, int(time.time() * 1000), self.history_limits.max_age)
            if start is None:
                begin.update(await self.log.low_watermarks(missing))
            else:
                begin.update(await self.log.offsets_at(missing, start))
        return begin

    def _start_history(self, session: Session, filters: Iterable[str]) -> None:
        """Start the registered history streams among ``filters``: behind, then live."""
        owner = self._clients.get(session.client_id)
        for topic_filter in filters:
            key = stream_id(session.client_id, topic_filter)
            starting = self._starting.pop(key, None)
            if starting is None:
                continue
            view, begin = starting
            if owner is None or owner.session is not session:  # gone meanwhile
                self.subscriptions.forget(view.client_id, list(view.subscriptions))
                continue
            feed = HistoryFeed(owner.subscriber, view.since, self.counters)
            client = Client(view, feed, owner=session, keeps_qos0=True, prefix=feed.prefix)
            self._clients[key] = client
            self.history_streams += 1
            self.backlog.start(client, dict(begin))

    def _end_history(self, session: Session, topic_filter: str) -> None:
        key = stream_id(session.client_id, topic_filter)
        starting = self._starting.pop(key, None)
        view: Session | None = starting[0] if starting is not None else None
        client = self._clients.pop(key, None)
        if client is not None:
            self.history_streams -= 1
            self.backlog.stop(client)
            view = client.session
        if view is not None:
            self.subscriptions.forget(view.client_id, list(view.subscriptions))

    # -- live ---------------------------------------------------------------------------------

    def dispatch(self, batch: list[Record]) -> None:
        """Deliver a batch the live reader fetched (called in the event loop)."""
        dispatched = self.subscriptions.dispatched
        for rec in batch:
            self._dispatch_one(rec)
            dispatched[rec.partition] = rec.offset + 1
        self.counters.records_dispatched += len(batch)
        if self.backlog.fell:
            self.backlog.pause_idle()

    def _dispatch_one(self, rec: Record) -> None:
        targets = self.subscriptions.match(rec)
        if not targets:
            return
        message = rec.message
        cache: dict[int, PublishTemplate] = {}
        for client_id, granted in targets.items():
            client = self._clients.get(client_id)
            if client is None:
                self.watchers.hear(client_id, rec)
                continue
            qos = delivery_qos(granted, message.qos)
            if not self.backlog.takes_live(client, rec, qos):
                self.backlog.fall_behind(client, rec, qos)
                continue
            template = template_for(message, qos, cache)
            out = Outbound(message, qos, False, template, 0, False, rec.partition, rec.offset)
            self._deliver(client, out)

    def deliver_local(self, message: Message) -> None:
        """Give ``message`` to this node's clients subscribed to it, not through the log: a
        message of the node's own for its own clients only (``frontend.systree``)."""
        cache: dict[int, PublishTemplate] = {}
        for client_id, granted in self.subscriptions.granted(message.topic).items():
            client = self._clients.get(client_id)
            if client is not None:
                qos = delivery_qos(granted, message.qos)
                template = template_for(message, qos, cache)
                self._deliver(client, Outbound(message, qos, False, template))

    def _deliver(self, client: Client, out: Outbound) -> None:
        self.counters.messages_delivered += 1
        session = client.queue
        if not session.clean:
            self.touched.add(session.client_id)
        dropped = session.dropped
        client.subscriber.deliver(out)
        self.counters.messages_dropped += session.dropped - dropped

    # -- retained -----------------------------------------------------------------------------

    async def deliver_retained(
        self,
        session: Session,
        filters: Iterable[str],
        new: Iterable[str],
        starts: dict[int, int],
        scan: Callable[[str], AsyncIterator[list[Record]]],
    ) -> None:
        """After a SUBACK: the retained messages the granted ``filters`` match, RETAIN=1
        [MQTT-3.3.1-8], read from ``scan`` a batch at a time and delivered as they come (in log
        order within a batch).  A topic several filters match is sent once, at the highest QoS
        among them, while its first such filter is read ([MQTT-3.3.5-1]; Mosquitto sends one
        per filter): nothing of it is held meanwhile.  For a new subscription only those before
        its start offsets: later ones arrive live.  Stops if the client goes."""
        fresh = set(new)
        filters = [f for f in filters if not f.startswith(topics.HISTORY_PREFIX)]  # read, not kept
        granted = [(f, session.subscriptions.get(f, 0), f in fresh) for f in dict.fromkeys(filters)]
        for i, (topic_filter, _, _) in enumerate(granted):
            async for batch in scan(topic_filter):
                client = self._clients.get(session.client_id)
                if client is None or client.session is not session:
                    return
                for rec in sorted(batch, key=lambda r: (r.partition, r.offset)):
                    qos = _retained_qos(granted, i, rec, starts)
                    if qos is not None:
                        qos = delivery_qos(qos, rec.message.qos)
                        template = template_for(rec.message, qos, {})
                        self._deliver(client, Outbound(rec.message, qos, True, template))

    # -- catch-up: the log is the queue ---------------------------------------------------------

    def positions_for(self, session: Session) -> dict[int, int]:
        """Per partition, where ``session``'s stream resumes if it went away now: not past a
        message it has not been given yet, nor one waiting in its queue."""
        positions = self.subscriptions.positions_for(session)
        client = self._clients.get(session.client_id)
        if client is not None:
            self.backlog.needed(client, positions)
        for key in _history_ids(session):
            lower(positions, self._history_needs(key))
        return positions

    def _history_needs(self, key: str) -> dict[int, int]:
        """Per partition, where the history stream ``key`` resumes if it went away now."""
        starting = self._starting.get(key)
        if starting is not None:
            return starting[1]
        stream = self._clients.get(key)
        if stream is None:
            return {}
        needed = self.subscriptions.stream_positions(stream.session)
        self.backlog.needed(stream, needed)
        return needed

    def is_behind(self, session: Session) -> bool:
        """True while ``session`` or one of its history streams catches up from the log
        (``router.backlog``)."""
        client = self._clients.get(session.client_id)
        if client is None or client.session is not session:
            return False
        return client.behind is not None or any(
            stream.behind is not None
            for key in _history_ids(session)
            if (stream := self._clients.get(key)) is not None
        )

    # -- shared subscriptions -----------------------------------------------------------------

    def _share(self, group: ShareGroup, rec: Record, skip: str | None = None) -> None:
        """``rec`` to the next member here that may read it; finished unread (denied) if no
        member here may; left uncommitted if none is left here (``router.shared``)."""
        topic = rec.message.topic
        member = group.pick(lambda m: self._may_read(m, topic), skip)
        client = self._clients.get(member) if member is not None else None
        if member is None or client is None:
            if group.members:
                self.shares.denied += 1
                group.finished(rec)
            return
        qos = delivery_qos(group.members[member], rec.message.qos)
        out = Outbound(rec.message, qos, False, template_for(rec.message, qos, {}))
        out.on_done = lambda: group.finished(rec)
        out.redeliver = lambda: self._share(group, rec, skip=member)
        self._deliver(client, out)

    def _may_read(self, client_id: str, topic: str) -> bool:
        client = self._clients.get(client_id)
        return client is not None and client.session.may_read(topic)

    def share_group(self, group: str, topic_filter: str) -> ShareGroup | None:
        return self.shares.groups.get((group, topic_filter))

    def share_names(self) -> list[str]:
        return self.shares.names()


class Watchers:
    """Readers inside the node (``frontend.systree``): each has every record matching its filter
    read live from when it starts watching.  Not clients, so neither connected nor counted; the
    partitions a watcher needs are read while it watches, like a client's."""

    def __init__(self, subscriptions: Subscriptions) -> None:
        self.subscriptions = subscriptions
        self._watching: dict[str, tuple[Session, Callable[[Record], None]]] = {}

    async def watch(self, topic_filter: str, on_record: Callable[[Record], None]) -> None:
        session = Session(WATCHER + topic_filter, True, 1, 0)
        self._watching[session.client_id] = (session, on_record)
        try:
            await self.subscriptions.add(session, [(topic_filter, 0)])
        except Exception:
            del self._watching[session.client_id]
            raise
        for rec in self.subscriptions.activate(session.client_id, [topic_filter]):
            on_record(rec)

    def unwatch(self, topic_filter: str) -> None:
        watcher = self._watching.pop(WATCHER + topic_filter, None)
        if watcher is not None:
            self.subscriptions.remove(watcher[0], [topic_filter])

    def hear(self, client_id: str, rec: Record) -> None:
        """``rec`` matched ``client_id``, who is no connected client: a watcher's, if it is one."""
        watcher = self._watching.get(client_id)
        if watcher is not None:
            watcher[1](rec)


def _history_ids(session: Session) -> list[str]:
    """The ids of ``session``'s history streams (``router.history.stream_id``)."""
    return [
        stream_id(session.client_id, f)
        for f in session.subscriptions
        if f.startswith(topics.HISTORY_PREFIX)
    ]


def _retained_qos(
    granted: list[tuple[str, int, bool]], i: int, rec: Record, starts: dict[int, int]
) -> int | None:
    """The QoS to send retained ``rec`` at while the ``i``-th granted filter is read: the
    highest of the filters it is for, if the ``i``-th is the first of them; else None.  A new
    filter is not for a record from its start offset on (that one arrives live)."""
    topic, first, highest = rec.message.topic, None, 0
    for j, (topic_filter, qos, new) in enumerate(granted):
        if new and rec.offset >= starts.get(rec.partition, 0):
            continue
        if j == i or topics.matches(topic_filter, topic):
            first = j if first is None else first
            highest = max(highest, qos)
    return highest if first == i else None
