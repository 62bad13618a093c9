"""The in-memory retained store: clears leave only an expiring marker, a late older write does
not bring a cleared topic back, the limits refuse and count, a wildcard is read in batches."""

from __future__ import annotations

from frontend.retained import BATCH, MemoryRetainedStore, RetainedLimits
from mqttcore.message import Message


def message(topic: str, payload: bytes) -> Message:
    return Message(topic, payload, 1, True, "publisher", "node", 0, bytes(16))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_a_clear_leaves_only_a_marker_that_keeps_a_late_older_write_out_then_expires() -> (
    None
):
    clock = Clock()
    store = MemoryRetainedStore(cleared_for=60.0, clock=clock)
    await store.apply(message("a/b", b"on"), 0, 10)
    await store.apply(message("a/b", b""), 0, 12)  # [MQTT-3.3.1-10]
    await store.apply(message("a/b", b"late"), 0, 11)  # older, arriving late
    assert await store.match("a/#") == [] and await store.match("a/b") == []
    assert store._by_topic == {} and store.bytes == 0
    clock.now = 61.0
    await store.apply(message("other", b"x"), 1, 1)  # any write sweeps expired markers
    assert store._cleared == {}
    await store.apply(message("a/b", b"newer"), 0, 13)
    assert [r.message.payload for r in await store.match("a/+")] == [b"newer"]


async def test_the_limits_refuse_and_count_and_a_refused_write_clears_its_topic() -> None:
    limits = RetainedLimits(max_count=2, max_bytes=10_000)
    store = MemoryRetainedStore(limits)
    await store.apply(message("t/1", b"x"), 0, 1)
    await store.apply(message("t/2", b"x"), 0, 2)
    await store.apply(message("t/3", b"x"), 0, 3)  # a third message
    assert limits.refused == 1
    await store.apply(message("t/1", b"y"), 0, 4)  # a replacement is no more
    await store.apply(message("t/2", b"z" * 20_000), 0, 5)  # too large: refused, t/2 gone
    assert limits.refused == 2
    assert [(r.message.topic, r.message.payload) for r in await store.match("t/#")] == [
        ("t/1", b"y")
    ]
    await store.apply(message("t/2", b"small"), 0, 6)
    assert len(await store.match("t/+")) == 2


async def test_a_wildcard_filter_is_read_in_batches() -> None:
    store = MemoryRetainedStore()
    for i in range(BATCH * 3 + 1):
        await store.apply(message(f"w/{i}", b"x"), 0, i)
    batches = [batch async for batch in store.scan("w/#")]
    assert [len(b) for b in batches] == [BATCH, BATCH, BATCH, 1]
