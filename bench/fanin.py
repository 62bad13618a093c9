"""QoS 1 fan-in paced at a fixed rate into one subscriber, every message accounted for.

The publishers are :mod:`bench.load`'s open-loop pacer (``load.paced``): each sends on schedule,
whatever the subscriber does, every payload stamped with (send time, sequence number); its QoS 1
packet identifiers come from a window that only the broker's PUBACKs refill, so a publisher waits
for the broker (which acknowledges once the message is durable), never for the subscriber.  The
subscriber is :mod:`bench.load`'s client; it PUBACKs every PUBLISH at once.

Added here is the accounting.  The pacer draws one packet identifier per message, in sequence
order, so :class:`IdLedger` (the publisher's pool of free identifiers) knows which sequence number
each identifier was last drawn for, and a PUBACK names the message it acknowledges.  The subscriber
keeps the set of (topic, sequence) it received; the topic names the publisher.  After a drain:
*lost* = acknowledged but never received, *duplicates* = received more than once.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import cast

from bench.jobs import State
from bench.load import (
    PUBACKS,
    STAMP,
    Client,
    ClientPlan,
    Credit,
    GroupPlan,
    Publisher,
    Timing,
    open_client,
    paced,
)
from bench.measure import percentile
from mqttcore.packets import Puback, Publish


class IdLedger(deque[int]):
    """Free packet identifiers that remember the sequence number each was last drawn for."""

    def __init__(self, ids: Iterable[int]) -> None:
        super().__init__(ids)
        self.drawn = 0
        self.seq_of: dict[int, int] = {}

    def popleft(self) -> int:
        packet_id = super().popleft()
        self.seq_of[packet_id] = self.drawn
        self.drawn += 1
        return packet_id


class TrackedPublisher(Publisher):
    """A paced publisher that records the sequence numbers the broker acknowledged."""

    __slots__ = ("acked_seqs", "ledger")

    def __init__(self, client: Client, plan: GroupPlan) -> None:
        super().__init__(client, plan, Credit(plan, [0], lambda: 0))  # backlog 0: no credit
        self.ledger = IdLedger(range(1, plan.window + 1))
        self.free_ids = self.ledger
        self.acked_seqs: list[int] = []

    def on_acks(self, acks: list[Puback]) -> None:
        seq_of = self.ledger.seq_of
        self.acked_seqs.extend(seq_of[ack.packet_id] for ack in acks)
        super().on_acks(acks)


@dataclass(slots=True)
class PublisherReport:
    topic: str
    sent: int
    acked: list[int]
    """Sequence numbers the broker acknowledged."""
    drawn: int
    """Packet identifiers drawn: must equal ``sent`` (the ledger saw every message)."""
    lost_connection: bool
    sent_window: int = 0
    """Sent between the timing's ``measure_from`` and ``end``."""


@dataclass(slots=True)
class SubscriberReport:
    received: int = 0
    seen: dict[str, set[int]] = field(default_factory=dict)
    """topic -> distinct sequence numbers received."""
    duplicates: int = 0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    max_ms: float = 0.0
    last_arrival: float = 0.0
    lost_connection: bool = False
    received_window: int = 0
    """Arrived during the measured window (:class:`MeasureWindow`; 0 without one)."""


class Tally:
    """What the subscriber receives: distinct (topic, sequence), duplicates, latencies."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.report = SubscriberReport()
        self.distinct = 0
        self.latencies_ns: list[int] = []
        self.low_ns, self.high_ns = 0, 2**63
        """Latencies of messages sent in this window only (:class:`MeasureWindow`)."""
        self.window = (0.0, 0.0)
        client.on_publishes = self.on_publishes

    def on_publishes(self, publishes: list[Publish]) -> None:
        now_ns = time.monotonic_ns()
        report = self.report
        acks = []
        low, high = self.low_ns, self.high_ns
        for p in publishes:
            sent_ns, seq = STAMP.unpack_from(p.payload)
            seen = report.seen.setdefault(p.topic, set())
            if seq in seen:
                report.duplicates += 1
            else:
                seen.add(seq)
                self.distinct += 1
                if low <= sent_ns <= high:
                    self.latencies_ns.append(now_ns - sent_ns)
            if p.qos:
                acks.append(PUBACKS[p.packet_id or 0])
        report.received += len(publishes)
        report.last_arrival = now = time.monotonic()
        if self.window[0] <= now <= self.window[1]:
            report.received_window += len(publishes)
        if acks:
            self.client.write(b"".join(acks))

    def finish(self) -> SubscriberReport:
        ms = [ns / 1e6 for ns in self.latencies_ns]
        self.report.p50_ms = percentile(ms, 50)
        self.report.p99_ms = percentile(ms, 99)
        self.report.max_ms = max(ms, default=0.0)
        self.report.lost_connection = self.client.closed.done()
        return self.report


@dataclass(frozen=True, slots=True)
class OpenSubscriber:
    """Connect the subscriber and subscribe it to its topics at QoS 1."""

    plan: ClientPlan

    async def run(self, state: State) -> int:
        client = await open_client(self.plan)
        await client.handshake(subscribe=True)
        state["tally"] = Tally(client)
        return len(self.plan.topics)


@dataclass(frozen=True, slots=True)
class MeasureWindow:
    """From now on, the subscriber counts arrivals between ``start`` and ``end`` (monotonic
    seconds) and keeps the latencies of messages sent between them only (a warm-up's are
    left out); without this job it keeps every latency."""

    start: float
    end: float

    async def run(self, state: State) -> None:
        tally = cast(Tally, state["tally"])
        tally.window = (self.start, self.end)
        tally.low_ns, tally.high_ns = int(self.start * 1e9), int(self.end * 1e9)


@dataclass(frozen=True, slots=True)
class OpenPublishers:
    """Connect the publishers, each paced at ``rate`` messages per second."""

    plans: tuple[ClientPlan, ...]
    rate: float
    window: int
    payload: int = 64

    async def run(self, state: State) -> int:
        clients = await asyncio.gather(*(open_client(p) for p in self.plans))
        await asyncio.gather(*(c.handshake(subscribe=False) for c in clients))
        group = GroupPlan(
            "fanin", "pub", self.plans, mode="paced", rate=self.rate, window=self.window,
            payload_size=self.payload,
        )  # fmt: skip
        state["publishers"] = [TrackedPublisher(c, group) for c in clients]
        return len(clients)


@dataclass(frozen=True, slots=True)
class PublishPaced:
    """Publish on schedule from ``start`` to ``end``; then wait up to ``ack_wait`` for the last
    PUBACKs."""

    timing: Timing

    async def run(self, state: State) -> list[PublisherReport]:
        pubs = cast(list[TrackedPublisher], state["publishers"])
        await asyncio.gather(*(paced(pub, self.timing) for pub in pubs))
        deadline = time.monotonic() + self.timing.ack_wait
        while any(p.in_flight() for p in pubs) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        reports = [
            PublisherReport(
                p.topics[0],
                p.sent,
                p.acked_seqs,
                p.ledger.drawn,
                p.client.closed.done(),
                p.sent_window,
            )
            for p in pubs
        ]
        for p in pubs:
            p.client.disconnect()
        return reports


@dataclass(frozen=True, slots=True)
class Drain:
    """Once the publishers are done: wait until ``expected`` distinct messages have arrived, or
    nothing has for ``idle`` seconds, or ``most`` seconds have passed; then report."""

    expected: int
    idle: float = 10.0
    most: float = 60.0

    async def run(self, state: State) -> SubscriberReport:
        tally = cast(Tally, state["tally"])
        started = time.monotonic()
        while (now := time.monotonic()) < started + self.most:
            if tally.distinct >= self.expected:
                break
            if now - max(tally.report.last_arrival, started) >= self.idle:
                break
            await asyncio.sleep(0.05)
        report = tally.finish()
        tally.client.disconnect()
        return report


@dataclass(slots=True)
class Accounting:
    """Publishers' and subscriber's reports put together."""

    sent: int = 0
    acked: int = 0
    received: int = 0
    distinct: int = 0
    lost: int = 0
    """Acknowledged, never received."""
    duplicates: int = 0
    unacked: int = 0
    """Sent, never acknowledged (the broker owed no delivery for them)."""
    problems: list[str] = field(default_factory=list)


def account(pubs: list[PublisherReport], sub: SubscriberReport) -> Accounting:
    out = Accounting(received=sub.received, duplicates=sub.duplicates)
    for p in pubs:
        seen = sub.seen.get(p.topic, set())
        acked = set(p.acked)
        out.sent += p.sent
        out.acked += len(acked)
        out.distinct += len(seen)
        out.lost += len(acked - seen)
        out.unacked += p.sent - len(acked)
        if p.drawn != p.sent:
            out.problems.append(f"{p.topic}: {p.drawn} packet ids drawn for {p.sent} messages")
        if len(acked) != len(p.acked):
            out.problems.append(f"{p.topic}: {len(p.acked) - len(acked)} repeated PUBACKs")
        if p.lost_connection:
            out.problems.append(f"{p.topic}: the publisher's connection was closed")
    if sub.lost_connection:
        out.problems.append("the subscriber's connection was closed")
    return out
