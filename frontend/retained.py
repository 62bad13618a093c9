"""Retained messages [MQTT-3.3.1-5]: the store interface, in memory (one node) and in Redis.

Retained messages are applied in log order: each carries the (partition, offset) the log gave it,
and a store keeps, per topic, the message with the highest offset.  One topic always lands in one
partition, so offsets of one topic are comparable, and the retained message everywhere is the
one later in the log, whichever node wrote it and in whatever order the writes reach the store.
An empty payload stays as a tombstone, so an older write arriving late cannot resurrect the topic
[MQTT-3.3.1-10], [MQTT-3.3.1-11]; ``match`` never returns tombstones.

In Redis, one hash per routing key (``Pretained:{routing key}``: topic -> 12-byte (offset,
partition) + record value, and ``...:offsets``: topic -> offset; the braces are a hash tag, so in
Redis Cluster both hashes of a routing key share a slot and one script updates them), and the set
``Pretained-keys`` of routing keys that have any.  A filter whose routing levels are literal
reads one hash; only wildcard routing levels read all.  The set is written before the hashes, in
a command of its own (its slot is another): it may name a routing key whose hashes are not
written yet, or were refused, which a reader takes as no message; it never misses one that has.
"""

from __future__ import annotations

import struct
from typing import Protocol

from frontend.mqtt import topics
from frontend.mqtt.message import Message
from frontend.sessions.redis import RedisClient, hash_tag
from router import record
from router.partitioner import routing_key
from router.record import Record


class RetainedStore(Protocol):
    async def apply(self, message: Message, partition: int, offset: int) -> None:
        """Store ``message`` as its topic's retained message, or clear it (empty payload)."""

    async def match(self, topic_filter: str) -> list[Record]:
        """Every retained message whose topic matches ``topic_filter``, where the log has it."""


class MemoryRetainedStore:
    """Retained messages of one node, in a dict by topic."""

    def __init__(self) -> None:
        self._by_topic: dict[str, Record] = {}

    async def apply(self, message: Message, partition: int, offset: int) -> None:
        current = self._by_topic.get(message.topic)
        if current is not None and current.offset >= offset:
            return
        # An empty payload stays as a tombstone, so an older write arriving late cannot
        # resurrect the topic [MQTT-3.3.1-10], [MQTT-3.3.1-11].
        self._by_topic[message.topic] = Record(partition, offset, 0, message)

    async def match(self, topic_filter: str) -> list[Record]:
        if "+" not in topic_filter and "#" not in topic_filter:
            found = self._by_topic.get(topic_filter)
            candidates = [found] if found else []
        else:
            candidates = [r for t, r in self._by_topic.items() if topics.matches(topic_filter, t)]
        return [r for r in candidates if r.message.payload]


_APPLY_RETAINED = """
local current = redis.call('HGET', KEYS[2], ARGV[1])
if current and tonumber(current) >= tonumber(ARGV[3]) then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
return 1
"""

_POSITION = struct.Struct(">qi")


class RedisRetainedStore:
    """Retained messages, one hash per routing key."""

    def __init__(self, client: RedisClient, routing_depth: int, prefix: str = "hw:") -> None:
        self.redis = client
        self.depth = routing_depth
        self.prefix = prefix
        self._apply = client.register_script(_APPLY_RETAINED)

    def _hash(self, key: str) -> str:
        return f"{self.prefix}retained:{hash_tag(key)}"

    @property
    def _index(self) -> str:
        return f"{self.prefix}retained-keys"

    async def apply(self, message: Message, partition: int, offset: int) -> None:
        key = routing_key(message.topic, self.depth)
        value = _POSITION.pack(offset, partition) + record.encode(message)
        await self.redis.sadd(self._index, key)
        keys = [self._hash(key), self._hash(key) + ":offsets"]
        await self._apply(keys=keys, args=[message.topic, value, offset])

    async def match(self, topic_filter: str) -> list[Record]:
        key = routing_key(topic_filter, self.depth)
        if "+" in key or "#" in key:
            members = await self.redis.smembers(self._index)
            hashes = [self._hash(_text(m)) for m in members]
        else:
            hashes = [self._hash(key)]
        found: list[Record] = []
        for name in hashes:
            for topic, value in (await self.redis.hgetall(name)).items():
                if topics.matches(topic_filter, _text(topic)):
                    raw = value if isinstance(value, bytes) else value.encode()
                    offset, partition = _POSITION.unpack_from(raw)
                    message = record.decode(raw[_POSITION.size :])
                    if message.payload:
                        found.append(Record(partition, offset, len(raw), message))
        return found


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
