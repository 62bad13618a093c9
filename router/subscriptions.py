"""This node's subscriptions: the index, the partitions they need, and where each one starts.

Subscriptions live in a topic trie (``router.index``) keyed by (client id, filter).  Changes
turn into partition interest (``router.interest``): the first subscription needing a partition
has the live reader read it from the partition's high watermark, the last one leaving releases
it.  Shared subscriptions (``$share/group/filter``) are not in the trie: the node joins the
share group (``router.shared``) while it has a local member.

A new subscription's life, and why nothing is missed or delivered early:

1. it enters the trie as *pending*: records matching it are buffered, not delivered;
2. the high watermark of each partition it needs is read: its start offsets;
3. the client gets its SUBACK, then retained messages that precede those offsets;
4. it is *activated*: buffered records at or after the start offsets are delivered, in log order,
   and from then on every matching record at or after them.

A record published after the SUBACK has an offset at or above the start offset, so it is
delivered; one published before the watermark read is not (retained messages aside).

A returning session's stored subscriptions are not pending: they start at its stored positions,
and the dispatcher catches it up from the log until it is live (``router.dispatch``).

*Matching.*  A topic's subscribers are looked up in the trie once and kept (:meth:`match`): a
fan-out's every record then costs one dict lookup, not a walk and two dicts of its subscribers
(16% of the loop thread, QoS 0 fan-out 1 -> 50 under perf).  What is kept is split: subscribers
with neither a pending state nor a start offset, merged per client, and the rest, judged per
record.  Any change of the index, of a pending state or of a start empties it; a start the live
stream has passed everywhere is dropped (its subscription then kept with the others).  Bounded,
and emptied when full: at most :data:`MATCHED_TOPICS` topics (none longer than
:data:`MATCHED_TOPIC_LENGTH`) and :data:`MATCHED_TARGETS` subscribers in all, about 9 MB.
"""

from __future__ import annotations

from collections.abc import Iterable

from mqttcore import topics
from mqttcore.session import Session
from router.index import SubscriptionTrie
from router.interest import InterestTable
from router.log import Log
from router.partitioner import Router
from router.record import Record

_NOT_HERE = (topics.SHARE_PREFIX, topics.HISTORY_PREFIX)
"""Filters not in this index: share groups' (``router.shared``) and history streams' (each
indexed under a session of its own, ``router.history``)."""

SubKey = tuple[str, str]
"""(client id, topic filter)"""

MATCHED_TOPICS = 8192
"""Topics :meth:`Subscriptions.match` keeps the subscribers of (those of no subscriber too: a
publisher of ever new topics fills it, never more)."""
MATCHED_TOPIC_LENGTH = 256
"""Longer topics are matched in the trie each time."""
MATCHED_TARGETS = 65_536
"""Subscribers kept for the topics matched, in all (about 100 bytes each); a topic with more
is matched in the trie each time."""


class Subscriptions:
    """The node-local subscription index and the log partitions it needs."""

    def __init__(self, log_: Log, router: Router) -> None:
        self.log = log_
        self.router = router
        self._trie: SubscriptionTrie[SubKey] = SubscriptionTrie()
        self._interest = InterestTable()
        self._starts: dict[SubKey, dict[int, int]] = {}
        self._pending: dict[SubKey, list[Record]] = {}
        self.dispatched: dict[int, int] = {}
        """Per partition read live, the offset of the next record to dispatch here."""
        self._matched: dict[str, tuple[dict[str, int], list[tuple[SubKey, int]]]] = {}
        """Per topic matched: the highest QoS per client of its plain subscribers, and its
        subscribers pending or with a start offset (module docstring, *Matching*)."""
        self._matched_targets = 0

    # -- adding and removing ------------------------------------------------------------------

    async def add(
        self,
        session: Session,
        requests: list[tuple[str, int]],
        resume_from: dict[int, int] | None = None,
    ) -> tuple[dict[int, int], list[str]]:
        """Steps 1-2 above for the plain (not shared) filters of ``requests``: their start
        offsets, and which filters are new.  Re-subscribing replaces the QoS [MQTT-3.8.4-3]
        and keeps the start.  With ``resume_from`` (a returning session's stored positions)
        the filters start there, not pending."""
        new: list[str] = []
        for topic_filter, qos in requests:
            fresh = topic_filter not in session.subscriptions
            session.subscriptions[topic_filter] = qos
            self._trie.add(topic_filter, (session.client_id, topic_filter), qos)
            if fresh:
                new.append(topic_filter)
                if resume_from is None:
                    self._pending[(session.client_id, topic_filter)] = []
        self._changed()
        needed = [self.router.partitions_for_filter(f) for f in new]
        for partitions in needed:
            self._interest.acquire(partitions)
        wanted = frozenset().union(*needed)
        try:
            starts = await self.log.high_watermarks(wanted)
        except Exception:
            self.remove(session, new)
            raise
        reader = self.log.reader
        assigned = set(reader.assigned())
        newly = {p: starts[p] for p in wanted if p not in assigned}
        reader.assign(newly)
        reader.resume(wanted)  # paused while every holder was behind (router.backlog)
        self.dispatched.update(newly)  # the live stream of these begins there
        if resume_from is not None:
            starts = {p: resume_from.get(p, start) for p, start in starts.items()}
        # A start the live stream has already reached filters nothing: it is not kept.
        ahead = {p: at for p, at in starts.items() if self.dispatched.get(p, 0) < at}
        if ahead:
            for topic_filter in new:
                self._starts[(session.client_id, topic_filter)] = ahead
            self._changed()
        return starts, new

    def activate(self, client_id: str, filters: Iterable[str]) -> list[Record]:
        """Step 4 above: the records buffered while ``filters`` were pending, in log order,
        from their start offsets on."""
        buffered: dict[tuple[int, int], Record] = {}
        self._changed()
        for topic_filter in filters:
            key = (client_id, topic_filter)
            starts = self._starts.get(key, {})
            for rec in self._pending.pop(key, ()):
                if rec.offset >= starts.get(rec.partition, 0):
                    buffered[(rec.partition, rec.offset)] = rec
        return [buffered[key] for key in sorted(buffered)]

    def remove(self, session: Session, filters: Iterable[str]) -> None:
        """Drop plain ``filters`` of ``session`` (those it has) from the index."""
        present = [f for f in filters if f in session.subscriptions]
        for topic_filter in present:
            del session.subscriptions[topic_filter]
        self.forget(session.client_id, present)

    def forget(self, client_id: str, filters: Iterable[str]) -> None:
        """Take ``filters`` out of the index; release the partitions nobody needs any more."""
        self._changed()
        for topic_filter in filters:
            key = (client_id, topic_filter)
            self._pending.pop(key, None)
            if self._trie.remove(topic_filter, key):
                self._starts.pop(key, None)
                partitions = self.router.partitions_for_filter(topic_filter)
                self.log.reader.unassign(self._interest.release(partitions))

    def holders(self, partition: int) -> int:
        """How many subscriptions of the index need ``partition``."""
        return self._interest.count(partition)

    def holds(self, session: Session, partition: int) -> int:
        """How many of ``session``'s active subscriptions in the index need ``partition`` (a
        pending one is not counted: it waits for live records)."""
        held, pending = 0, self._pending
        for topic_filter in session.subscriptions:
            if topic_filter.startswith(_NOT_HERE) or (session.client_id, topic_filter) in pending:
                continue
            if partition in self.router.partitions_for_filter(topic_filter):
                held += 1
        return held

    # -- matching -----------------------------------------------------------------------------

    def match(self, rec: Record) -> dict[str, int]:
        """Per client, the highest QoS granted by its subscriptions that may see ``rec`` now;
        records for pending subscriptions are buffered for :meth:`activate` instead.  The dict
        may be the one kept for the topic: read it, never change it."""
        topic = rec.message.topic
        matched = self._matched.get(topic)
        if matched is None:
            matched = self._remember(topic)
        plain, judged = matched
        if not judged:
            return plain
        targets = dict(plain)
        pending, starts = self._pending, self._starts
        for key, qos in judged:
            if key in pending:
                pending[key].append(rec)
                continue
            start = starts.get(key)
            if start is not None:
                if rec.offset < start.get(rec.partition, 0):
                    continue
                if self._passed(start):
                    del starts[key]
                    self._changed()
            if qos > targets.get(key[0], -1):
                targets[key[0]] = qos
        return targets

    def _remember(self, topic: str) -> tuple[dict[str, int], list[tuple[SubKey, int]]]:
        """``topic``'s subscribers from the trie, split as :meth:`match` keeps them."""
        plain: dict[str, int] = {}
        judged: list[tuple[SubKey, int]] = []
        pending, starts = self._pending, self._starts
        matched = self._trie.match(topic)
        for key, qos in matched.items():
            if key in pending or key in starts:
                judged.append((key, qos))
            elif qos > plain.get(key[0], -1):
                plain[key[0]] = qos
        size = len(matched)
        if size <= MATCHED_TARGETS and len(topic) <= MATCHED_TOPIC_LENGTH:
            full = len(self._matched) >= MATCHED_TOPICS
            if full or self._matched_targets + size > MATCHED_TARGETS:
                self._changed()
            self._matched[topic] = (plain, judged)
            self._matched_targets += size
        return plain, judged

    def _passed(self, start: dict[int, int]) -> bool:
        """Whether the live stream has dispatched every record before ``start`` (it then
        filters nothing more)."""
        dispatched = self.dispatched
        return all(dispatched.get(partition, 0) >= at for partition, at in start.items())

    def _changed(self) -> None:
        """The index, a pending state or a start changed: forget what was matched."""
        if self._matched:
            self._matched.clear()
            self._matched_targets = 0

    def granted(self, topic: str) -> dict[str, int]:
        """Per client, the highest QoS its plain subscriptions grant ``topic``, as the index
        has them (pending or not; start offsets are the caller's to look at)."""
        granted: dict[str, int] = {}
        for (client_id, _), qos in self._trie.match(topic).items():
            if qos > granted.get(client_id, -1):
                granted[client_id] = qos
        return granted

    def stream_positions(self, session: Session) -> dict[int, int]:
        """Per partition of ``session``'s plain subscriptions, the offset of the next record
        the live stream would give it: after what this node has dispatched, and never before a
        subscription's start."""
        positions: dict[int, int] = {}
        dispatched = self.dispatched
        for topic_filter in session.subscriptions:
            if topic_filter.startswith(_NOT_HERE):
                continue
            starts = self._starts.get((session.client_id, topic_filter), {})
            for p in self.router.partitions_for_filter(topic_filter):
                pos = max(dispatched.get(p, 0), starts.get(p, 0))
                positions[p] = min(pos, positions.get(p, pos))
        return positions

    def positions_for(self, session: Session) -> dict[int, int]:
        """Per partition, where the session's stream resumes if it went away now: its stream
        positions, but not past a message still waiting in its queue."""
        positions = self.stream_positions(session)
        for p, offset in session.queued_from_log().items():
            if offset < positions.get(p, offset + 1):
                positions[p] = offset
        return positions
