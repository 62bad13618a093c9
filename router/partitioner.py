"""Which Kafka partition carries a topic, and which partitions a topic filter needs.

Every PUBLISH is written to the partition of its *routing key*: the first ``depth`` levels of
its topic name joined by ``/`` (the whole topic if it has fewer levels).  The partition is
Kafka's default partitioner for a keyed record::

    partition = (murmur2(routing_key.encode("utf-8")) & 0x7fffffff) % num_partitions

where ``murmur2`` is Java's ``org.apache.kafka.common.utils.Utils.murmur2`` (seed 0x9747b28c).
The Java producer's ``BuiltInPartitioner.partitionForKey`` and librdkafka's ``murmur2`` /
``murmur2_random`` partitioners compute the same, so a Spark job, ``kafka-console-producer``
with the routing key as record key, or any Java client reproduces a topic's partition.
(librdkafka's *default* partitioner, ``consistent_random``, uses CRC32 and does not.)

Invariant: if ``matches(filter, topic)`` then ``partition_for_topic(topic)`` is in
``partitions_for_filter(filter)``.  A filter whose first ``depth`` levels are literal fixes the
routing key of every topic it matches (``a/b/#`` with depth 2 matches ``a/b`` and ``a/b/...``,
all keyed ``a/b``), so it needs one partition; a wildcard among them needs every partition.

The depth trade-off.  MQTT fleets name topics ``<app-or-tenant>/<device>/...``.  With the
default depth 2, a device-side subscription (``app/dev42/cmd``) needs one partition while a
fleet-wide one (``app/+/telemetry``) needs all, and an application's traffic spreads over every
partition.  Depth 1 would put a whole application on one partition: no parallelism, and every
device subscription would need the partition carrying all of that application's traffic.
Changing the depth or the partition count moves topics between partitions: it is a migration.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable

_SEED = 0x9747B28C
_M = 0x5BD1E995
_R = 24
_MASK = 0xFFFFFFFF
_WORDS = struct.Struct("<I")

CACHED_KEY_CHARS = 256
"""Routing keys longer than this are hashed each time, not cached (see :class:`Router`)."""
DEFAULT_ROUTING_DEPTH = 2
"""The depth of a cluster that sets none (``--routing-depth``): see "The depth trade-off"."""


def routing_key(topic: str, depth: int) -> str:
    """The first ``depth`` levels of ``topic`` joined by ``/``, or all of it if it has fewer."""
    if depth < 1:
        raise ValueError(f"depth must be at least 1, not {depth}")
    levels = topic.split("/", depth)  # at most depth + 1 pieces: the last is the rest
    if len(levels) <= depth:
        return topic
    return topic[: len(topic) - len(levels[-1]) - 1]


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2``: the signed 32-bit result Java returns."""
    length = len(data)
    tail = length & ~3
    h = _SEED ^ length
    for (k,) in _WORDS.iter_unpack(data[:tail]):
        k = (k * _M) & _MASK
        k ^= k >> _R
        h = ((h * _M) & _MASK) ^ ((k * _M) & _MASK)
    h = _mix_tail(h, data, tail, length & 3)
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - 0x1_0000_0000 if h & 0x8000_0000 else h


def _mix_tail(h: int, data: bytes, tail: int, rest: int) -> int:
    """Java's fall-through ``switch (length % 4)`` over the last one to three bytes."""
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * _M) & _MASK
    return h


def partition_for_key(key: bytes, num_partitions: int) -> int:
    """The partition Kafka's default partitioner picks for a record with this key."""
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be at least 1, not {num_partitions}")
    return (murmur2(key) & 0x7FFFFFFF) % num_partitions


class Router:
    """Topic -> partition and filter -> partitions for one topic layout.

    What it computes is cached by routing key, never by whole topic: a fleet has far fewer keys
    than topics, and a topic's levels below the routing depth cost nothing to remember.  The
    cache is bounded in entries (``cache_size``, least recently used out) and in bytes: a key
    longer than :data:`CACHED_KEY_CHARS` is computed each time, never kept.  An entry holds the
    key's text and its partition, not the encoded record key (encoding a short key per PUBLISH
    costs less than keeping it: every idle device's filter is an entry), so the cache holds at
    most about ``cache_size`` x 0.4 KB (0.15 KB with keys like ``app/device42``, tracemalloc).
    """

    __slots__ = ("_all", "_depth", "_num_partitions", "_route_key")

    def __init__(
        self, num_partitions: int, depth: int = DEFAULT_ROUTING_DEPTH, cache_size: int = 65536
    ) -> None:
        if num_partitions < 1:
            raise ValueError(f"num_partitions must be at least 1, not {num_partitions}")
        if depth < 1:
            raise ValueError(f"depth must be at least 1, not {depth}")
        self._num_partitions = num_partitions
        self._depth = depth
        self._all = frozenset(range(num_partitions))
        self._route_key: Callable[[str], int] = functools.lru_cache(maxsize=cache_size)(
            self._compute
        )

    @property
    def num_partitions(self) -> int:
        return self._num_partitions

    @property
    def depth(self) -> int:
        return self._depth

    @property
    def all_partitions(self) -> frozenset[int]:
        return self._all

    @property
    def cached_keys(self) -> int:
        """Routing keys in the cache now."""
        return self._route_key.cache_info().currsize  # type: ignore[attr-defined,no-any-return]

    def partition_for_topic(self, topic: str) -> int:
        """The partition every PUBLISH to ``topic`` is written to."""
        return self.route(topic)[0]

    def route(self, topic: str) -> tuple[int, bytes]:
        """(partition, Kafka record key) for a PUBLISH to ``topic``; cached per routing key."""
        return self._route(routing_key(topic, self._depth))

    def partitions_for_filter(self, filter: str) -> frozenset[int]:
        """The partitions that can carry a topic matched by the plain filter ``filter``."""
        key = routing_key(filter, self._depth)
        if _has_wildcard(key):
            return self._all
        return frozenset((self._route(key)[0],))

    def _route(self, key: str) -> tuple[int, bytes]:
        data = key.encode("utf-8")
        if len(key) > CACHED_KEY_CHARS:
            return partition_for_key(data, self._num_partitions), data
        return self._route_key(key), data

    def _compute(self, key: str) -> int:
        return partition_for_key(key.encode("utf-8"), self._num_partitions)


def _has_wildcard(levels: str) -> bool:
    return "+" in levels or "#" in levels
