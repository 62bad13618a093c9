"""Routing keys, Kafka's murmur2 partitioner, and the partitions a filter needs."""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from mqttcore.topics import matches
from router.partitioner import Router, murmur2, partition_for_key, routing_key

# Apache Kafka, clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java, testMurmur2.
KAFKA_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}

# librdkafka, src/rdmurmur2.c, unittest_murmur2 (Java results, as int32 bit patterns).
_UNALIGNED = b"PreAmbleWillBeRemoved,ThePrePartThatIs"
LIBRDKAFKA_VECTORS = {
    b"kafka": 0xD067CF64,
    b"giberish123456789": 0x8F552B0C,
    b"1234": 0x9FC97B14,
    b"234": 0xE7C009CA,
    b"34": 0x873930DA,
    b"4": 0x5A4B5CA1,
    _UNALIGNED: 0x78424F1C,
    _UNALIGNED[1:]: 0x4A62B377,
    _UNALIGNED[2:]: 0xE0E4E09E,
    _UNALIGNED[3:]: 0x62B8B43F,
    b"": 0x106E08D9,
}


def _signed(value: int) -> int:
    return value - (1 << 32) if value & 0x8000_0000 else value


@pytest.mark.parametrize(("data", "expected"), KAFKA_VECTORS.items())
def test_murmur2_kafka_utils_test_vectors(data: bytes, expected: int) -> None:
    assert murmur2(data) == expected


@pytest.mark.parametrize(("data", "expected"), LIBRDKAFKA_VECTORS.items())
def test_murmur2_librdkafka_vectors(data: bytes, expected: int) -> None:
    assert murmur2(data) == _signed(expected)


def _java_int(value: int) -> int:
    return _signed(value & 0xFFFFFFFF)


def _java_murmur2(data: bytes) -> int:
    """A line-by-line transliteration of Java's Utils.murmur2, int overflow emulated."""
    length, m, r = len(data), 0x5BD1E995, 24
    h = _java_int(0x9747B28C ^ length)
    for i in range(length // 4):
        i4 = i * 4
        k = _java_int(data[i4] + (data[i4 + 1] << 8) + (data[i4 + 2] << 16) + (data[i4 + 3] << 24))
        k = _java_int(k * m)
        k ^= (k & 0xFFFFFFFF) >> r
        k = _java_int(k * m)
        h = _java_int(h * m)
        h ^= k
    rest, base = length % 4, length & ~3
    if rest >= 3:
        h ^= data[base + 2] << 16
    if rest >= 2:
        h ^= data[base + 1] << 8
    if rest >= 1:
        h ^= data[base]
        h = _java_int(h * m)
    h ^= (h & 0xFFFFFFFF) >> 13
    h = _java_int(h * m)
    h ^= (h & 0xFFFFFFFF) >> 15
    return _java_int(h)


@given(st.binary(max_size=64))
def test_murmur2_equals_java_transliteration(data: bytes) -> None:
    result = murmur2(data)
    assert result == _java_murmur2(data)
    assert -(2**31) <= result < 2**31


def test_partition_for_key_is_to_positive_mod_n() -> None:
    assert partition_for_key(b"foobar", 50) == (1357151166 % 50) == 16
    for data, hashed in KAFKA_VECTORS.items():
        for n in (1, 3, 12, 64):
            assert partition_for_key(data, n) == (hashed & 0x7FFFFFFF) % n


def test_partition_for_key_rejects_no_partitions() -> None:
    with pytest.raises(ValueError):
        partition_for_key(b"a", 0)


# -- routing keys -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("topic", "depth", "expected"),
    [
        ("a/b/c", 2, "a/b"),
        ("a/b", 2, "a/b"),
        ("a", 2, "a"),
        ("a/b/c", 1, "a"),
        ("/a/b", 2, "/a"),
        ("a//b", 2, "a/"),
        ("/", 1, ""),
        ("/", 2, "/"),
        ("app/dev42/cmd/x", 3, "app/dev42/cmd"),
    ],
)
def test_routing_key(topic: str, depth: int, expected: str) -> None:
    assert routing_key(topic, depth) == expected


@given(st.text(alphabet="ab/", max_size=10), st.integers(min_value=1, max_value=5))
def test_routing_key_is_the_first_levels(topic: str, depth: int) -> None:
    assert routing_key(topic, depth) == "/".join(topic.split("/")[:depth])


def test_routing_key_rejects_depth_zero() -> None:
    with pytest.raises(ValueError):
        routing_key("a/b", 0)


# -- the router -------------------------------------------------------------------------------


def test_partition_for_topic_hashes_the_utf8_routing_key() -> None:
    router = Router(12)
    assert router.partition_for_topic("ä/ö/ü") == partition_for_key("ä/ö".encode(), 12)
    assert router.partition_for_topic("a") == partition_for_key(b"a", 12)
    assert Router(12, depth=1).partition_for_topic("a/b/c") == partition_for_key(b"a", 12)


def test_topics_sharing_a_routing_key_share_a_partition() -> None:
    router = Router(64)
    assert len({router.partition_for_topic(f"app/dev42/{x}") for x in "abcdefgh"}) == 1
    assert len({router.partition_for_topic(f"app/dev{i}/t") for i in range(100)}) > 1


@pytest.mark.parametrize(
    ("filter", "key"),
    [
        ("a", "a"),  # fewer levels than depth, no wildcard: only topic "a"
        ("a/b", "a/b"),
        ("a/b/#", "a/b"),  # matches a/b and a/b/..., all keyed a/b
        ("a/b/+", "a/b"),
        ("a/b/c/d", "a/b"),
        ("app/dev42/cmd", "app/dev42"),
        ("/", "/"),
        ("$SYS/broker/#", "$SYS/broker"),
    ],
)
def test_filters_with_literal_routing_levels_need_one_partition(filter: str, key: str) -> None:
    router = Router(32)
    assert router.partitions_for_filter(filter) == {partition_for_key(key.encode(), 32)}


@pytest.mark.parametrize("filter", ["#", "+", "a/#", "a/+", "+/b", "app/+/telemetry", "+/+/c"])
def test_filters_with_wildcard_routing_levels_need_all_partitions(filter: str) -> None:
    router = Router(8)
    assert router.partitions_for_filter(filter) == frozenset(range(8))


def test_router_rejects_bad_configuration() -> None:
    with pytest.raises(ValueError):
        Router(0)
    with pytest.raises(ValueError):
        Router(4, depth=0)


_LEVELS = ["", "a", "b", "$x"]


@st.composite
def filters(draw: st.DrawFn) -> str:
    levels = draw(st.lists(st.sampled_from([*_LEVELS, "+"]), min_size=0, max_size=4))
    if draw(st.booleans()) or not "/".join(levels):
        levels.append("#")
    return "/".join(levels)


topic_names = st.lists(st.sampled_from(_LEVELS), min_size=1, max_size=5).map("/".join)
routers = st.builds(
    Router, st.integers(min_value=1, max_value=16), st.integers(min_value=1, max_value=4)
)


@given(routers, filters(), topic_names)
def test_a_matched_topic_lies_in_the_filters_partitions(
    router: Router, filter: str, topic: str
) -> None:
    if matches(filter, topic):
        assert router.partition_for_topic(topic) in router.partitions_for_filter(filter)


@st.composite
def matching_pairs(draw: st.DrawFn) -> tuple[str, str]:
    """A filter and a topic built to match it: each wildcard replaced by drawn levels."""
    filter = draw(filters())
    names: list[str] = []
    for level in filter.split("/"):
        if level == "+":
            names.append(draw(st.sampled_from(_LEVELS)))
        elif level == "#":
            names.extend(draw(st.lists(st.sampled_from(_LEVELS), max_size=3)))
        else:
            names.append(level)
    return filter, "/".join(names)


@given(routers, matching_pairs())
def test_constructed_matches_lie_in_the_filters_partitions(
    router: Router, pair: tuple[str, str]
) -> None:
    filter, topic = pair
    assume(topic and matches(filter, topic))
    assert router.partition_for_topic(topic) in router.partitions_for_filter(filter)


def _retained_bytes(work: Callable[[], object]) -> int:
    """Bytes still allocated once ``work`` has run and its own garbage is gone."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        work()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def test_routing_remembers_routing_keys_not_whole_topics() -> None:
    router = Router(8, 2)
    deep = [f"fleet/dev1/{i}/" + "x/" * 30_000 for i in range(10)]  # 64 KB topics, one key
    retained = _retained_bytes(lambda: [router.route(topic) for topic in deep])
    assert router.cached_keys == 1
    assert retained < 2_000  # today each 64 KB topic stays in the cache: ~650 KB
    assert router.route(deep[0]) == (router.partition_for_topic("fleet/dev1"), b"fleet/dev1")


def test_a_long_routing_key_is_computed_not_cached() -> None:
    router = Router(8, 2)
    long_keys = [f"{i}" + "k" * 65_000 for i in range(5)]  # one level: the key is the topic
    retained = _retained_bytes(lambda: [router.route(topic) for topic in long_keys])
    assert router.cached_keys == 0
    assert retained < 2_000  # today: ~130 KB per topic (the topic and its encoded key)
    partition, key = router.route(long_keys[0])
    assert (partition, key) == (partition_for_key(key, 8), long_keys[0].encode())


def test_the_route_cache_is_bounded_in_keys() -> None:
    router = Router(8, 1, cache_size=4)
    for i in range(100):
        router.route(f"app{i}/device")
    assert router.cached_keys == 4
