"""In-memory fakes of our own interfaces, for unit tests of the router and the session manager.

Not fakes of Kafka or Redis semantics at large: a :class:`FakeConsumer` is the handful of
confluent-kafka consumer calls the catch-up reader makes, over a list of records per partition;
a :class:`FakeLog` is what the dispatcher asks of ``router.log.KafkaLog``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from mqttcore.codec import Decoder, Wire, wire_bytes
from mqttcore.message import Message
from mqttcore.packets import Publish
from mqttcore.session import Outbound, Session
from router import record
from router.catchup import CatchUp, Take
from router.record import Record, wall_clock_stamps

STAMPS = wall_clock_stamps("node-test")


def message(topic: str, qos: int = 1, payload: bytes = b"x", retain: bool = False) -> Message:
    return STAMPS.message(topic, payload, qos, retain, "publisher")


class _Msg:
    """What ``Consumer.consume`` returns, for one record."""

    def __init__(self, partition: int, offset: int, value: bytes) -> None:
        self._partition, self._offset, self._value = partition, offset, value

    def error(self) -> None:
        return None

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def value(self) -> bytes:
        return self._value


class FakeConsumer:
    """Manual assignment over fixed partitions; ``consume`` returns up to ``n`` records."""

    def __init__(self, partitions: dict[int, list[Message]]) -> None:
        self.partitions = partitions
        """Shared with the log: what a test appends is there to read."""
        self.position: dict[int, int] = {}
        self.paused: set[int] = set()
        self.assigns = 0
        self.returned = 0

    def incremental_assign(self, tps: list[Any]) -> None:
        self.assigns += 1
        for tp in tps:
            self.position[tp.partition] = tp.offset

    def incremental_unassign(self, tps: list[Any]) -> None:
        for tp in tps:
            self.position.pop(tp.partition, None)

    def pause(self, tps: list[Any]) -> None:
        """Like librdkafka's, a pause outlives the partition's unassignment."""
        self.paused.update(tp.partition for tp in tps)

    def resume(self, tps: list[Any]) -> None:
        self.paused.difference_update(tp.partition for tp in tps)

    def consume(self, n: int, timeout: float) -> list[_Msg]:
        out: list[_Msg] = []
        for p in sorted(set(self.position) - self.paused):
            records = self.partitions.get(p, [])
            while len(out) < n and self.position[p] < len(records):
                offset = self.position[p]
                out.append(_Msg(p, offset, record.encode(records[offset])))
                self.position[p] = offset + 1
        self.returned += len(out)
        return out

    def close(self) -> None:
        self.position.clear()


def decode(raw: list[Any]) -> list[Record]:
    return [
        Record(m.partition(), m.offset(), len(m.value()), record.decode(m.value())) for m in raw
    ]


class FakeReader:
    """The reader's interface to the dispatcher: live assignment and catch-up (a real
    :class:`CatchUp` over a :class:`FakeConsumer`, served by :meth:`pump`)."""

    def __init__(self, partitions: dict[int, list[Message]]) -> None:
        self.partitions = partitions
        self.live: dict[int, int] = {}
        """Per live partition, the offset the live read takes next (``serve_live``)."""
        self.paused: set[int] = set()
        self.catch_up = CatchUp(FakeConsumer(partitions), "t", 7, decode)

    def assign(self, offsets: dict[int, int]) -> None:
        self.live.update(offsets)

    def unassign(self, partitions: Any) -> None:
        for p in partitions:
            self.live.pop(p, None)
            self.paused.discard(p)

    def assigned(self) -> list[int]:
        return sorted(self.live)

    def pause(self, partitions: Any) -> None:
        self.paused.update(p for p in partitions if p in self.live)

    def resume(self, partitions: Any) -> None:
        self.paused.difference_update(partitions)

    def skip(self, partition: int, offset: int) -> None:
        if partition in self.paused:
            self.live[partition] = offset

    def is_paused(self, partition: int) -> bool:
        return partition in self.paused

    def head(self, partition: int) -> int | None:
        return len(self.partitions.get(partition, [])) if partition in self.live else None

    def serve_live(self, dispatch: Callable[[list[Record]], None]) -> int:
        """What the live consumer would hand over now: every record of each live partition not
        paused, from where it read last; how many."""
        batch = []
        for p in sorted(set(self.live) - self.paused):
            held = self.partitions.get(p, [])
            batch += [Record(p, o, 1, held[o]) for o in range(self.live[p], len(held))]
            self.live[p] = len(held)
        if batch:
            dispatch(batch)
        return len(batch)

    async def replay(
        self, ranges: dict[int, tuple[int, int]], take: Take, room: Callable[[], bool]
    ) -> None:
        await self.catch_up.read(ranges, take, room)


class FakeLog:
    """The log as the dispatcher and session manager use it: watermarks, reader, produce."""

    def __init__(self, partitions: dict[int, list[Message]] | None = None) -> None:
        self.partitions = partitions or {}
        self.reader = FakeReader(self.partitions)
        self.produced: list[Message] = []
        self.available = True

    async def high_watermarks(self, partitions: Any) -> dict[int, int]:
        return {p: len(self.partitions.get(p, [])) for p in partitions}

    async def low_watermarks(self, partitions: Any) -> dict[int, int]:
        return dict.fromkeys(partitions, 0)

    async def offsets_at(self, partitions: Any, time_ms: int) -> dict[int, int]:
        found = {}
        for p in partitions:
            held = self.partitions.get(p, [])
            later = (o for o, m in enumerate(held) if m.timestamp_ms >= time_ms)
            found[p] = next(later, len(held))
        return found

    def produce(self, message: Message, on_delivery: Any, kind: str = "client") -> bool:
        self.produced.append(message)
        return True


async def pump(log: FakeLog, until: Callable[[], bool], ack: Callable[[], None]) -> None:
    """Serve the catch-up reader (as the log's pump does) and let the client acknowledge what
    it received, until ``until()``; at most 10,000 rounds."""
    for _ in range(10_000):
        if until():
            return
        log.reader.catch_up._checked = 0.0  # look at waiting cursors every round
        log.reader.catch_up.serve()
        ack()
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


class FakeClient:
    """A connected client as the dispatcher and the session manager see it: it writes what it
    is sent to a list, and acknowledges QoS 1 messages when told to."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.wire: list[Wire] = []
        self.taken_over = 0
        self.lost = 0
        self.stream_errors: list[BaseException] = []
        self.owned: Any = None
        """The session manager's record of the session, once a test sets it."""
        self.on_takeover: Callable[[], None] = lambda: None
        """What closing does: a real connection releases its session as it closes."""

    def deliver(self, out: Outbound) -> None:
        data = self.session.deliver(out, online=True)
        if data is not None:
            self.wire.append(data)

    def may_read(self, topic: str) -> bool:
        return True

    def takeover(self) -> None:
        self.taken_over += 1
        self.on_takeover()

    def lose_session(self) -> None:
        self.lost += 1

    def stream_failed(self, error: BaseException) -> None:
        self.stream_errors.append(error)

    def received(self) -> list[Publish]:
        decoder = Decoder()
        packets = (p for data in self.wire for p in decoder.feed(wire_bytes(data)))
        return [p for p in packets if isinstance(p, Publish)]

    def ack_all(self) -> None:
        """PUBACK everything in flight, sending what the freed window lets out."""
        for packet_id in list(self.session.inflight):
            self.wire.extend(self.session.puback(packet_id))
