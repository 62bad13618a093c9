"""Retained messages [MQTT-3.3.1-5]: the store interface, in memory (one node) and in Redis.

*Order.*  A retained PUBLISH is applied to the store by the node that published it, once the log
reports it durable (``frontend.publishing``; wills and ``$SYS`` reports alike).  Writes to one
topic come from any node, and from concurrent tasks of one, so they reach the store in any order.
Each carries the (partition, offset) the log gave it; one topic always lands in one partition, so
its offsets are comparable, and the store keeps, per topic, the write with the highest offset.

*Clears end* [MQTT-3.3.1-10].  A clear deletes the topic's message and its index entries; what
keeps an older write arriving late from bringing the topic back [MQTT-3.3.1-11] is a marker
"cleared at offset o" that lives ``cleared_for`` seconds (:data:`CLEARED_FOR`), then goes by
itself.  Invariant: a write reaches the store less than :data:`CLEARED_FOR` after any clear
that supersedes it was applied.  It holds because the write came first in the log: the producer
reports every write within its delivery timeout (``router.log``, 30 s) of producing it, which was
before the clear was even written; the store's own call is bounded by the Redis client's pool
wait and socket timeouts (``frontend.node``, 10 + 2 x 5 s).  Only a node whose event loop stalls
longer than the remaining margin could resurrect a topic.  A marker costs ~150 bytes for
:data:`CLEARED_FOR` seconds: a client clearing topics fast costs the store its rate times that.

*Limits.*  At most ``max_count`` messages and ``max_bytes`` bytes (topic plus stored record) are
kept, cluster-wide (:class:`RetainedLimits`).  A write that would go beyond is not retained (its
subscribers still get it, through the log, as every PUBLISH) and acts as a clear of its topic:
the latest retained word on it is one the store does not keep, so no older one is kept either.
Refusals are counted and logged at most once a minute.

*Reading.*  :meth:`RetainedStore.scan` yields the messages a filter matches in batches of about
:data:`BATCH` messages (and :data:`BATCH_BYTES`), reading the store a batch at a time: a wildcard
filter never holds the whole store in memory.  A filter without wildcards reads its one topic,
with the other such reads of the loop's turn, in one round trip (``router.batching``).

*Redis* (``P`` the prefix, ``{rb}`` the hash tag of a routing key's bucket ``b = crc32(rk) %
BUCKETS``: every key of a bucket shares one Redis Cluster slot, and one script updates them all):

=============================  ======  ===========================================================
``Pretained:{rb}:keys``        set     the bucket's routing keys that have a retained message
``Pretained:{rb}:totals``      hash    ``count``, ``bytes`` of the bucket's messages
``Pretained:{rb}:o:<rk>``      hash    topic -> ``offset partition size`` of a routing key's topics
``Pretained:{rb}:m:<rk>``      hash    topic -> its record (``router.record``)
``Pretained:{rb}:x:<topic>``   string  the offset a clear applied at; expires after ``cleared_for``
=============================  ======  ===========================================================

Every key goes when it is empty: a store whose messages were all cleared holds nothing but the
markers, until they expire.  The limits are cluster-wide over the buckets' totals: a node sums
them (one pipelined read, at most every :data:`TOTALS_FRESH` seconds once within
:data:`NEAR_LIMIT` of a limit, every :data:`TOTALS_QUIET` seconds below that, and each write's
answer updates its bucket), and each write's script refuses what goes beyond the room that sum
leaves.  Other nodes' writes since the last sum may be unseen: near a limit, the store can
exceed it by what the cluster writes in a second; further below, a cluster that writes more than
the remaining tenth of a limit within a minute can overshoot by the rest.
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from frontend.redis_clients import Lane
from frontend.sessions.redis import DEFAULT_PREFIX, RedisClient
from mqttcore import topics
from mqttcore.message import Message
from router import record
from router.batching import Batch
from router.partitioner import routing_key
from router.record import Record

log = logging.getLogger("headwater.retained")

CLEARED_FOR = 120.0
"""Seconds a clear's marker lives: over twice the longest a superseded write can take to reach
the store (the producer's 30 s delivery timeout, then the Redis client's 20 s at most)."""
DEFAULT_MAX_RETAINED = 1_000_000
"""Retained messages kept, cluster-wide.  A fleet retains a state topic or two per device: a
million covers half a million devices, ~0.6 KB of Redis each beyond the payload.  Mosquitto has
no bound, nor EMQX's ``retainer.max_retained_messages`` by default (0)."""
DEFAULT_MAX_RETAINED_BYTES = 1 << 30
"""Bytes of retained messages (topic and stored record) kept, cluster-wide: 1 GiB of Redis."""
BATCH = 100
"""Messages per batch that :meth:`RetainedStore.scan` yields, and per Redis read."""
BATCH_BYTES = 1 << 20
"""Bytes of records per Redis read of a scan (one larger record is read alone)."""
READS_AT_ONCE = 16
"""Plain topics read in one round trip at most: a retained record may be as large as a packet
(16 MiB), and a storm of SUBSCRIBEs to one large retained message must not read thousands of
copies at once (one a pooled Redis connection, 50, before the reads went together)."""
BUCKETS = 128
"""Buckets of routing keys (each a Redis Cluster slot): changing it is a migration."""
TOTALS_FRESH = 1.0
"""Seconds a node trusts the buckets' totals it summed before summing them again, once they
are within :data:`NEAR_LIMIT` of a limit."""
TOTALS_QUIET = 60.0
"""... and while they are further below: a store far from its limits costs Redis one pipelined
read a minute, not one a second (each ``$SYS`` report is a retained write)."""
NEAR_LIMIT = 0.9
"""The share of a limit from which the totals are summed every :data:`TOTALS_FRESH` seconds."""
REFUSALS_LOGGED_EVERY = 60.0
"""Seconds between two log lines about refused retained messages."""


@dataclass(slots=True)
class RetainedLimits:
    """The cluster-wide bounds of the retained store, and what they refused here."""

    max_count: int = DEFAULT_MAX_RETAINED
    max_bytes: int = DEFAULT_MAX_RETAINED_BYTES
    refused: int = 0
    """Retained messages this node did not retain for a limit (still delivered live)."""
    _logged_at: float = float("-inf")

    def refuse(self, topic: str, reason: str) -> None:
        self.refused += 1
        now = time.monotonic()
        if now - self._logged_at >= REFUSALS_LOGGED_EVERY:
            self._logged_at = now
            log.warning(
                "retained message on %r not retained: %s (--max-retained %d, "
                "--max-retained-bytes %d); %d refused here so far, delivered live only",
                topic, reason, self.max_count, self.max_bytes, self.refused,
            )  # fmt: skip


class RetainedStore(Protocol):
    async def apply(self, message: Message, partition: int, offset: int) -> None:
        """Store ``message`` as its topic's retained message, or clear it (empty payload)."""

    def scan(self, topic_filter: str) -> AsyncIterator[list[Record]]:
        """The retained messages whose topic matches ``topic_filter``, a batch at a time."""

    async def match(self, topic_filter: str) -> list[Record]:
        """All of them at once: for filters that match a few (``frontend.systree``)."""


async def collect(batches: AsyncIterator[list[Record]]) -> list[Record]:
    return [rec async for batch in batches for rec in batch]


def stored_size(topic: str, value: bytes) -> int:
    """What a message counts against ``max_bytes``: its topic and its stored record."""
    return len(topic.encode()) + len(value)


def _literal_prefix(topic_filter: str, depth: int | None = None) -> str:
    """The filter's levels before its first wildcard (at most ``depth``), joined: every topic it
    matches starts with them."""
    levels = topic_filter.split("/")[:depth]
    cut = next((i for i, level in enumerate(levels) if level in ("+", "#")), len(levels))
    return "/".join(levels[:cut])


def _glob(prefix: str) -> str:
    """A Redis MATCH pattern for the names starting with ``prefix``."""
    escaped = "".join("\\" + c if c in "*?[]\\" else c for c in prefix)
    return escaped + "*"


class MemoryRetainedStore:
    """Retained messages of one node, in a dict by topic; clears' markers in insertion order,
    which is their expiry order."""

    def __init__(
        self,
        limits: RetainedLimits | None = None,
        cleared_for: float = CLEARED_FOR,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limits = limits or RetainedLimits()
        self.cleared_for = cleared_for
        self.clock = clock
        self._by_topic: dict[str, Record] = {}
        self._cleared: dict[str, tuple[int, float]] = {}
        """topic -> (offset of its clear, when the marker expires)."""
        self.bytes = 0

    async def apply(self, message: Message, partition: int, offset: int) -> None:
        self._expire()
        topic = message.topic
        current = self._by_topic.get(topic)
        cleared = self._cleared.get(topic)
        if (current and current.offset >= offset) or (cleared and cleared[0] >= offset):
            return
        if message.payload:
            size = stored_size(topic, record.encode(message))
            reason = self._refusal(current, size)
            if reason is None:
                self._keep(topic, Record(partition, offset, size, message))
                return
            self.limits.refuse(topic, reason)
        self._clear(topic, offset)

    def _refusal(self, current: Record | None, size: int) -> str | None:
        limits, held = self.limits, current.size if current else 0
        if current is None and len(self._by_topic) >= limits.max_count:
            return f"{limits.max_count} retained messages kept"
        if size > held and self.bytes + size - held > limits.max_bytes:
            return f"{self.bytes} bytes of retained messages kept"
        return None

    def _keep(self, topic: str, rec: Record) -> None:
        current = self._by_topic.get(topic)
        self.bytes += rec.size - (current.size if current else 0)
        self._by_topic[topic] = rec
        self._cleared.pop(topic, None)

    def _clear(self, topic: str, offset: int) -> None:
        current = self._by_topic.pop(topic, None)
        if current is not None:
            self.bytes -= current.size
        self._cleared.pop(topic, None)  # re-inserted last: the dict stays in expiry order
        self._cleared[topic] = (offset, self.clock() + self.cleared_for)

    def _expire(self) -> None:
        now, cleared = self.clock(), self._cleared
        while cleared:
            topic, (_, until) = next(iter(cleared.items()))
            if until > now:
                return
            del cleared[topic]

    async def scan(self, topic_filter: str) -> AsyncIterator[list[Record]]:
        if "+" not in topic_filter and "#" not in topic_filter:
            found = self._by_topic.get(topic_filter)
            if found is not None:
                yield [found]
            return
        batch: list[Record] = []
        for topic in list(self._by_topic):  # the topics only: a batch copies BATCH records
            rec = self._by_topic.get(topic)
            if rec is not None and topics.matches(topic_filter, topic):
                batch.append(rec)
                if len(batch) >= BATCH:
                    yield batch
                    batch = []
        if batch:
            yield batch

    async def match(self, topic_filter: str) -> list[Record]:
        return await collect(self.scan(topic_filter))


_APPLY_RETAINED = """
-- KEYS: the routing key's index (o) and messages (m), the topic's marker (x), the bucket's keys
-- set and totals.  ARGV: topic, record ('' to clear), offset, partition, routing key,
-- room for messages, room for bytes, marker lifetime (ms).
-- Answers the verdict, then the bucket's count and bytes when they changed.  A topic with a
-- message has no marker (a write deletes it), so an update reads neither marker nor totals.
local topic, value, offset = ARGV[1], ARGV[2], tonumber(ARGV[3])
local current = redis.call('HGET', KEYS[1], topic)
local cleared = nil
if current then
  if tonumber(string.match(current, '^%S+')) >= offset then
    return {'older'}
  end
else
  cleared = redis.call('GET', KEYS[3])
  if cleared and tonumber(cleared) >= offset then
    return {'older'}
  end
end
local held = current and tonumber(string.match(current, '(%S+)$')) or 0
local verdict = 'cleared'
if value ~= '' then
  local size, added = #topic + #value, current and 0 or 1
  if added > tonumber(ARGV[6]) then
    verdict = 'count'
  elseif size > held and size - held > tonumber(ARGV[7]) then
    verdict = 'bytes'
  else
    redis.call('HSET', KEYS[1], topic, ARGV[3] .. ' ' .. ARGV[4] .. ' ' .. size)
    redis.call('HSET', KEYS[2], topic, value)
    if not current then
      redis.call('SADD', KEYS[4], ARGV[5])
      if cleared then
        redis.call('DEL', KEYS[3])
      end
      local count = redis.call('HINCRBY', KEYS[5], 'count', 1)
      return {'stored', count, redis.call('HINCRBY', KEYS[5], 'bytes', size)}
    end
    if size ~= held then
      local bytes = redis.call('HINCRBY', KEYS[5], 'bytes', size - held)
      return {'stored', redis.call('HGET', KEYS[5], 'count'), bytes}
    end
    return {'stored'}
  end
end
if current then
  redis.call('HDEL', KEYS[1], topic)
  redis.call('HDEL', KEYS[2], topic)
  if redis.call('EXISTS', KEYS[1]) == 0 then
    redis.call('SREM', KEYS[4], ARGV[5])
  end
  if redis.call('HINCRBY', KEYS[5], 'count', -1) <= 0 then
    redis.call('DEL', KEYS[5])
  else
    redis.call('HINCRBY', KEYS[5], 'bytes', -held)
  end
end
redis.call('SET', KEYS[3], ARGV[3], 'PX', ARGV[8])
local t = redis.call('HMGET', KEYS[5], 'count', 'bytes')
return {verdict, t[1] or 0, t[2] or 0}
"""


class Totals:
    """The cluster's retained count and bytes as this node last saw them, per bucket."""

    def __init__(self) -> None:
        self.buckets: dict[int, tuple[int, int]] = {}
        self.count = self.bytes = 0
        self.read_at = float("-inf")

    def update(self, bucket: int, count: int, size: int) -> None:
        old_count, old_bytes = self.buckets.get(bucket, (0, 0))
        self.buckets[bucket] = (count, size)
        self.count += count - old_count
        self.bytes += size - old_bytes


class RedisRetainedStore:
    """Retained messages, one pair of hashes per routing key, routing keys in buckets."""

    def __init__(
        self,
        client: RedisClient,
        routing_depth: int,
        prefix: str = DEFAULT_PREFIX,
        limits: RetainedLimits | None = None,
        cleared_for: float = CLEARED_FOR,
    ) -> None:
        self.redis = client
        self.depth = routing_depth
        self.prefix = prefix
        self.limits = limits or RetainedLimits()
        self.cleared_for = cleared_for
        self.totals = Totals()
        self._summing = asyncio.Lock()
        self._apply = client.register_script(_APPLY_RETAINED)
        self._lane = Lane(client)
        self._reads: Batch[tuple[str, str, str], tuple[Any, Any]] = Batch(
            self._read_topics, READS_AT_ONCE
        )

    def _bucket_key(self, bucket: int, name: str) -> str:
        return f"{self.prefix}retained:{{r{bucket}}}:{name}"

    def _keys(self, topic: str) -> tuple[int, str, list[str]]:
        key = routing_key(topic, self.depth)
        bucket = zlib.crc32(key.encode()) % BUCKETS
        names = [f"o:{key}", f"m:{key}", f"x:{topic}", "keys", "totals"]
        return bucket, key, [self._bucket_key(bucket, name) for name in names]

    # -- writing ------------------------------------------------------------------------------

    async def apply(self, message: Message, partition: int, offset: int) -> None:
        topic = message.topic
        bucket, key, keys = self._keys(topic)
        value = record.encode(message) if message.payload else b""
        if value:  # a clear needs no room
            await self._sum_totals()
        limits, totals = self.limits, self.totals
        room = [limits.max_count - totals.count, limits.max_bytes - totals.bytes]
        marker_ms = max(1, int(self.cleared_for * 1000))
        args: list[str | bytes | int] = [topic, value, offset, partition, key, *room, marker_ms]
        answer = await self._apply(keys=keys, args=args)
        if len(answer) == 3:
            totals.update(bucket, int(answer[1]), int(answer[2]))
        verdict = _text(answer[0])
        if verdict == "count":
            self.limits.refuse(topic, f"{totals.count} retained messages kept")
        elif verdict == "bytes":
            self.limits.refuse(topic, f"{totals.bytes} bytes of retained messages kept")

    async def _sum_totals(self) -> None:
        """Sum the buckets' totals again if they are older than :data:`TOTALS_FRESH`."""
        async with self._summing:
            totals, limits = self.totals, self.limits
            near = (
                totals.count >= limits.max_count * NEAR_LIMIT
                or totals.bytes >= limits.max_bytes * NEAR_LIMIT
            )
            if time.monotonic() - totals.read_at < (TOTALS_FRESH if near else TOTALS_QUIET):
                return
            pipe = self.redis.pipeline(transaction=False)
            for bucket in range(BUCKETS):
                pipe.hmget(self._bucket_key(bucket, "totals"), ["count", "bytes"])
            read = await pipe.execute()
            for bucket, (count, size) in enumerate(read):
                self.totals.update(bucket, int(count or 0), int(size or 0))
            self.totals.read_at = time.monotonic()

    # -- reading ------------------------------------------------------------------------------

    async def scan(self, topic_filter: str) -> AsyncIterator[list[Record]]:
        if "+" not in topic_filter and "#" not in topic_filter:
            found = await self._read_topic(topic_filter)
            if found is not None:
                yield [found]
            return
        key = routing_key(topic_filter, self.depth)
        keys = self._routing_keys(topic_filter) if "+" in key or "#" in key else _one(key)
        async for group in _groups(keys, BATCH):
            async for places in self._places(group, topic_filter):
                for chunk in _chunks(places):
                    yield await self._records(chunk)

    async def match(self, topic_filter: str) -> list[Record]:
        return await collect(self.scan(topic_filter))

    async def _read_topic(self, topic: str) -> Record | None:
        _, _, keys = self._keys(topic)
        place, value = await self._reads((keys[0], keys[1], topic))
        return None if place is None or value is None else _record(place, value)

    async def _read_topics(
        self, reads: list[tuple[str, str, str]]
    ) -> list[tuple[Any, Any] | BaseException]:
        """The topics read during one turn of the loop, in one round trip (``router.batching``):
        a SUBSCRIBE to a topic without wildcards reads its retained message, and in a storm of
        them redis-py's pipeline per read was 16% of the node's loop (``python -m bench
        throughput --scenarios connect-sub-clean`` under py-spy).  Per read, its place and
        record, or the error either got."""
        commands = [
            command
            for places, records, topic in reads
            for command in (("HGET", places, topic), ("HGET", records, topic))
        ]
        replies = await self._lane.send(commands)
        answers: list[tuple[Any, Any] | BaseException] = []
        for place, value in zip(replies[0::2], replies[1::2], strict=True):
            error = next((r for r in (place, value) if isinstance(r, BaseException)), None)
            answers.append((place, value) if error is None else error)
        return answers

    def _key_of(self, routing: str, kind: str) -> str:
        return self._bucket_key(zlib.crc32(routing.encode()) % BUCKETS, f"{kind}:{routing}")

    async def _routing_keys(self, topic_filter: str) -> AsyncIterator[str]:
        """The routing keys that may hold topics ``topic_filter`` matches: every bucket's first
        page in one round trip, then the rest of the larger ones (SSCAN may give a member
        twice: each is given once)."""
        pattern = _glob(_literal_prefix(topic_filter, self.depth))
        names = [self._bucket_key(bucket, "keys") for bucket in range(BUCKETS)]
        pipe = self.redis.pipeline(transaction=False)
        for name in names:
            pipe.sscan(name, 0, match=pattern, count=BATCH)
        seen: set[str] = set()
        for name, (cursor, members) in zip(names, await pipe.execute(), strict=True):
            while True:
                for key in map(_text, members):
                    if key not in seen:
                        seen.add(key)
                        yield key
                if cursor == 0:
                    break
                cursor, members = await self.redis.sscan(name, cursor, pattern, BATCH)

    async def _places(self, group: list[str], topic_filter: str) -> AsyncIterator[list[Place]]:
        """Where the matching topics of the routing keys ``group`` are, a page at a time: each
        key's first page (HSCAN) in one round trip, then the rest of the larger ones.  A place
        is small: the records are read apart, a batch at a time."""
        pattern = _glob(_literal_prefix(topic_filter))
        pipe = self.redis.pipeline(transaction=False)
        for routing in group:
            pipe.hscan(self._key_of(routing, "o"), 0, match=pattern, count=BATCH)
        first = [
            (routing, cursor, self._matching(routing, page, topic_filter))
            for routing, (cursor, page) in zip(group, await pipe.execute(), strict=True)
        ]
        yield [place for _, _, found in first for place in found]
        for routing, cursor, found in first:
            if cursor != 0:
                async for more in self._rest(routing, cursor, pattern, found, topic_filter):
                    yield more

    async def _rest(
        self, routing: str, cursor: int, pattern: str, found: list[Place], topic_filter: str
    ) -> AsyncIterator[list[Place]]:
        """The pages of a larger hash after its first (HSCAN may give a field twice as the
        hash grows: each topic is given once)."""
        seen = {place.topic for place in found}
        name = self._key_of(routing, "o")
        while cursor != 0:
            cursor, page = await self.redis.hscan(name, cursor, pattern, BATCH)
            more = [p for p in self._matching(routing, page, topic_filter) if p.topic not in seen]
            seen.update(place.topic for place in more)
            yield more

    def _matching(self, routing: str, page: Any, topic_filter: str) -> list[Place]:
        """The places on an HSCAN ``page`` (topic -> place) whose topic the filter matches."""
        messages = self._key_of(routing, "m")
        return [
            Place(messages, topic, place)
            for topic, place in _pairs(page.items())
            if topics.matches(topic_filter, topic)
        ]

    async def _records(self, chunk: list[Place]) -> list[Record]:
        """The records at ``chunk``'s places, in one round trip (one gone since: skipped)."""
        pipe = self.redis.pipeline(transaction=False)
        for place in chunk:
            pipe.hget(place.messages, place.topic)
        values = await pipe.execute()
        return [_record(p.place, v) for p, v in zip(chunk, values, strict=True) if v is not None]


@dataclass(slots=True)
class Place:
    """A retained topic found by a scan: its hash of records, and its ``offset partition size``."""

    messages: str
    topic: str
    place: bytes


async def _one(key: str) -> AsyncIterator[str]:
    yield key


async def _groups(keys: AsyncIterator[str], size: int) -> AsyncIterator[list[str]]:
    group: list[str] = []
    async for key in keys:
        group.append(key)
        if len(group) >= size:
            yield group
            group = []
    if group:
        yield group


def _pairs(items: Iterable[tuple[Any, Any]]) -> Iterable[tuple[str, bytes]]:
    for topic, place in items:
        yield _text(topic), place if isinstance(place, bytes) else place.encode()


def _chunks(wanted: list[Place]) -> Iterable[list[Place]]:
    """``wanted`` in runs of at most :data:`BATCH` topics and :data:`BATCH_BYTES` of records."""
    chunk: list[Place] = []
    size = 0
    for place in wanted:
        held = int(place.place.rsplit(b" ", 1)[1])
        if chunk and (len(chunk) >= BATCH or size + held > BATCH_BYTES):
            yield chunk
            chunk, size = [], 0
        chunk.append(place)
        size += held
    if chunk:
        yield chunk


def _record(place: bytes, value: bytes) -> Record:
    offset, partition, size = (int(x) for x in place.split(b" "))
    return Record(partition, offset, size, record.decode(value))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
