"""Load generators: raw asyncio MQTT clients on Headwater's own codec, one process per group.

A *group* is a set of clients of one role (publishers or subscribers) run by one worker process
with its own event loop (uvloop when installed), so publishing and receiving do not share one
interpreter.  The parent drives every group through the same steps over a pipe:

1. the worker connects its clients (CONNECT/CONNACK, then SUBSCRIBE/SUBACK) and answers ``ready``;
2. ``go`` carries a :class:`Timing` in ``time.monotonic()`` seconds (system-wide on Linux, so every
   process agrees on it): publishers send from ``start`` to ``end`` (or until a fixed count is
   out), subscribers count until they have been idle for ``drain_idle`` after ``end``;
3. the worker answers ``report`` (a :class:`Report`), then waits for ``close``.

Hot paths avoid per-message work: a flooding QoS 0 publisher writes one pre-encoded batch of
PUBLISH packets per call; a QoS 1 publisher keeps ``window`` packets in flight per connection,
each pre-encoded once per packet identifier; a subscriber counts PUBLISH packets per read and
answers QoS 1 ones with pre-encoded PUBACKs in one write.  Only latency runs (``timestamps``)
encode per message: the payload starts with the send time in ``monotonic_ns``.

Counts are of messages *delivered at subscribers*; a message counts in the measurement window
when it arrives between ``measure_from`` and ``end``.  Each worker also reports the CPU time it
used during that window, so a saturated load generator shows in the results.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import multiprocessing
import multiprocessing.connection
import socket
import struct
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, cast

from bench.jobs import end_process
from mqttcore.codec import Decoder, encode
from mqttcore.packets import (
    Connack,
    Connect,
    Disconnect,
    Packet,
    Puback,
    Publish,
    Suback,
    Subscribe,
)

P = TypeVar("P", bound=Packet)
Role = Literal["pub", "sub"]
Mode = Literal["flood", "paced", "fixed"]

STAMP = struct.Struct(">QQ")
"""Latency payload prefix: send time (monotonic_ns) and sequence number."""

FLOOD_BATCH = 64
"""QoS 0 PUBLISH packets per write of a flooding publisher."""

PUBACKS: tuple[bytes, ...] = tuple(encode(Puback(i)) if i else b"" for i in range(65536))
"""Every PUBACK a subscriber may send, encoded once."""

CONNECT_TIMEOUT = 15.0

Shared = Any
"""A ``multiprocessing`` shared array of counters (``RawArray('q', n)``)."""


@dataclass(frozen=True, slots=True)
class ClientPlan:
    """One connection: where it goes and what it publishes to or subscribes to."""

    client_id: str
    endpoint: tuple[str, int]
    topics: tuple[str, ...]
    qos: int


@dataclass(frozen=True, slots=True)
class GroupPlan:
    """What one worker process runs."""

    name: str
    role: Role
    clients: tuple[ClientPlan, ...]
    mode: Mode = "flood"
    rate: float = 0.0
    """paced: messages per second per client."""
    count: int = 0
    """fixed: messages per topic per client."""
    window: int = 100
    """QoS 1 PUBLISH packets in flight per publisher connection."""
    payload_size: int = 64
    timestamps: bool = False
    """Subscribers: collect end-to-end latencies from the payload's send time."""
    expected: int = 0
    """Subscribers of a fixed-count run: stop once this many messages arrived in all."""
    slot: int = 0
    """Subscribers: their slot in the shared ``delivered`` counters."""
    backlog: int = 0
    """Publishers: stay at most this many messages ahead of what subscribers received (0: off)."""
    per_message: int = 1
    """Publishers: deliveries per message (subscribers per topic), to read ``delivered`` with."""


@dataclass(frozen=True, slots=True)
class Timing:
    start: float
    measure_from: float
    end: float
    drain_idle: float = 1.0
    drain_max: float = 10.0
    ack_wait: float = 10.0


@dataclass(slots=True)
class Report:
    """What a group did; counts summed over its clients."""

    name: str
    role: Role
    sent: int = 0
    sent_window: int = 0
    acked: int = 0
    received: int = 0
    received_window: int = 0
    per_client: list[int] = field(default_factory=list)
    latencies_ns: list[int] = field(default_factory=list)
    cpu_seconds: float = 0.0
    window_seconds: float = 0.0
    errors: list[str] = field(default_factory=list)

    @property
    def cpu_share(self) -> float:
        """CPU used during the measurement window, as a share of one core."""
        return self.cpu_seconds / self.window_seconds if self.window_seconds > 0 else 0.0


# -- one MQTT connection ----------------------------------------------------------------------


class Client(asyncio.Protocol):
    """A minimal MQTT 3.1.1 client connection; what happens to PUBLISH and PUBACK is pluggable."""

    def __init__(self, plan: ClientPlan) -> None:
        self.plan = plan
        self.decoder = Decoder()
        self.transport: asyncio.Transport | None = None
        self.control: asyncio.Queue[Packet] = asyncio.Queue()
        self.closed = asyncio.get_running_loop().create_future()
        self.on_publishes: Callable[[list[Publish]], None] | None = None
        self.on_acks: Callable[[list[Puback]], None] | None = None
        self._writable: asyncio.Future[None] | None = None

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport: no isinstance check here.
        self.transport = cast(asyncio.Transport, transport)
        self.transport.get_extra_info("socket").setsockopt(
            socket.IPPROTO_TCP, socket.TCP_NODELAY, 1
        )
        self.transport.set_write_buffer_limits(high=256 * 1024)

    def data_received(self, data: bytes) -> None:
        publishes: list[Publish] = []
        acks: list[Puback] = []
        for packet in self.decoder.feed(data):
            kind = type(packet)
            if kind is Publish:
                publishes.append(packet)  # type: ignore[arg-type]
            elif kind is Puback:
                acks.append(packet)  # type: ignore[arg-type]
            else:
                self.control.put_nowait(packet)
        if publishes and self.on_publishes is not None:
            self.on_publishes(publishes)
        if acks and self.on_acks is not None:
            self.on_acks(acks)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(exc)
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    def pause_writing(self) -> None:
        self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._writable = None

    # helpers

    async def writable(self, deadline: float) -> None:
        """Wait until the transport takes writes again, or until ``deadline``."""
        if self._writable is not None:
            await asyncio.wait([self._writable], timeout=max(0.0, deadline - time.monotonic()))

    def write(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    @property
    def is_open(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    async def expect(self, kind: type[P], what: str) -> P:
        packet = await asyncio.wait_for(self.control.get(), CONNECT_TIMEOUT)
        if not isinstance(packet, kind):
            raise RuntimeError(f"{self.plan.client_id}: expected {what}, got {packet!r}")
        return packet

    async def handshake(self, subscribe: bool) -> None:
        self.write(encode(Connect(self.plan.client_id, clean_session=True, keep_alive=0)))
        connack = await self.expect(Connack, "CONNACK")
        if connack.return_code != 0:
            raise RuntimeError(f"{self.plan.client_id}: CONNACK {connack}")
        if subscribe:
            filters = tuple((t, self.plan.qos) for t in self.plan.topics)
            self.write(encode(Subscribe(1, filters)))
            suback = await self.expect(Suback, "SUBACK")
            if any(code == 0x80 for code in suback.return_codes):
                raise RuntimeError(f"{self.plan.client_id}: subscription refused: {suback}")

    def disconnect(self) -> None:
        if self.is_open:
            assert self.transport is not None
            self.transport.write(encode(Disconnect()))
            self.transport.close()


async def open_client(plan: ClientPlan) -> Client:
    loop = asyncio.get_running_loop()
    host, port = plan.endpoint
    _, client = await asyncio.wait_for(
        loop.create_connection(lambda: Client(plan), host, port), CONNECT_TIMEOUT
    )
    return client


# -- subscribers ------------------------------------------------------------------------------


class Counter:
    """Deliveries to one subscriber connection, in and out of the measurement window."""

    __slots__ = (
        "client", "delivered", "latencies", "measure_from", "received", "slot", "timing", "window",
    )  # fmt: skip

    def __init__(
        self,
        client: Client,
        timing: Timing,
        latencies: list[int] | None,
        delivered: Shared,
        slot: int,
    ) -> None:
        self.client = client
        self.timing = timing
        self.measure_from = timing.measure_from
        self.received = 0
        self.window = 0
        self.latencies = latencies
        self.delivered = delivered
        self.slot = slot
        client.on_publishes = self.on_publishes

    def on_publishes(self, publishes: list[Publish]) -> None:
        n = len(publishes)
        self.received += n
        self.delivered[self.slot] += n
        now = time.monotonic()
        if self.measure_from <= now <= self.timing.end:
            self.window += n
        acks = [PUBACKS[p.packet_id] for p in publishes if p.qos]  # type: ignore[index]
        if acks:
            self.client.write(b"".join(acks))
        if self.latencies is not None:
            self.record_latencies(publishes)

    def record_latencies(self, publishes: list[Publish]) -> None:
        now_ns = time.monotonic_ns()
        low = int(self.timing.measure_from * 1e9)
        high = int(self.timing.end * 1e9)
        assert self.latencies is not None
        for p in publishes:
            sent_ns = STAMP.unpack_from(p.payload)[0]
            if low <= sent_ns <= high:
                self.latencies.append(now_ns - sent_ns)


async def run_subscribers(
    clients: list[Client], plan: GroupPlan, timing: Timing, report: Report, delivered: Shared
) -> None:
    latencies: list[int] | None = [] if plan.timestamps else None
    counters = [Counter(c, timing, latencies, delivered, plan.slot) for c in clients]
    await sleep_until(timing.measure_from)
    cpu0 = time.process_time()
    if plan.expected:
        await drain(counters, timing, plan.expected)
    else:
        await sleep_until(timing.end)
    report.cpu_seconds = time.process_time() - cpu0
    report.window_seconds = min(time.monotonic(), timing.end) - timing.measure_from
    if not plan.expected:
        await drain(counters, timing, 0)
    report.received = sum(c.received for c in counters)
    report.received_window = sum(c.window for c in counters)
    report.per_client = [c.received for c in counters]
    report.latencies_ns = latencies or []


async def drain(counters: list[Counter], timing: Timing, expected: int) -> None:
    """Wait until ``expected`` messages arrived (when given), or nothing arrived for
    ``drain_idle`` seconds after ``end``; never past ``end + drain_max``."""
    deadline = timing.end + timing.drain_max
    last_total, last_change = -1, time.monotonic()
    while (now := time.monotonic()) < deadline:
        total = sum(c.received for c in counters)
        if expected and total >= expected:
            return
        if total != last_total:
            last_total, last_change = total, now
        elif (now >= timing.end or (expected and total)) and now - last_change >= timing.drain_idle:
            return
        await asyncio.sleep(0.02)


# -- publishers -------------------------------------------------------------------------------


def payload_of(size: int) -> bytes:
    return bytes(itertools.islice(itertools.cycle(b"headwater-bench-"), size))


class Credit:
    """A bounded run: the group's publishers stay at most ``backlog`` messages ahead of what the
    subscribers received, so no broker is measured while it piles up an unbounded backlog.

    A broker that drops messages would otherwise stall the publishers for good: when nothing
    arrives for ``STALL`` seconds, everything outstanding is written off as lost.
    """

    STALL = 0.5

    def __init__(self, plan: GroupPlan, delivered: Shared, sent: Callable[[], int]) -> None:
        self.backlog = plan.backlog
        self.per_message = plan.per_message
        self.delivered = delivered
        self.sent = sent
        self.written_off = 0
        self.last_seen = -1
        self.last_change = time.monotonic()

    def allows(self) -> bool:
        if self.backlog <= 0:
            return True
        sent = self.sent()
        received = sum(self.delivered) // self.per_message
        if sent < received + self.written_off + self.backlog:
            return True
        now = time.monotonic()
        if received != self.last_seen:
            self.last_seen, self.last_change = received, now
        elif now - self.last_change > self.STALL:
            self.written_off = sent - received
            self.last_change = now
        return False


class Publisher:
    """One publishing connection: its counters and free QoS 1 packet identifiers."""

    __slots__ = ("acked", "client", "credit", "free_ids", "plan", "sent", "sent_window", "topics")

    def __init__(self, client: Client, plan: GroupPlan, credit: Credit) -> None:
        self.client = client
        self.plan = plan
        self.credit = credit
        self.topics = client.plan.topics
        self.sent = 0
        self.sent_window = 0
        self.acked = 0
        self.free_ids: deque[int] = deque(range(1, plan.window + 1))
        client.on_acks = self.on_acks

    @property
    def qos(self) -> int:
        return self.client.plan.qos

    def count(self, n: int, now: float, timing: Timing) -> None:
        self.sent += n
        if timing.measure_from <= now <= timing.end:
            self.sent_window += n

    def on_acks(self, acks: list[Puback]) -> None:
        self.acked += len(acks)
        self.free_ids.extend(ack.packet_id for ack in acks)

    def in_flight(self) -> int:
        return self.plan.window - len(self.free_ids)


async def flood_qos0(pub: Publisher, timing: Timing) -> None:
    """Write pre-encoded batches as fast as the socket takes them until ``end``."""
    payload = payload_of(pub.plan.payload_size)
    packets = [encode(Publish(t, payload, 0)) for t in pub.topics]
    batch = b"".join(itertools.islice(itertools.cycle(packets), FLOOD_BATCH))
    client = pub.client
    writes = 0
    credit = pub.credit
    while (now := time.monotonic()) < timing.end and client.is_open:
        if not credit.allows():
            await asyncio.sleep(0.001)
            continue
        client.write(batch)
        pub.count(FLOOD_BATCH, now, timing)
        writes += 1
        await client.writable(timing.end)
        if writes % 16 == 0:
            await asyncio.sleep(0)  # let reads and other connections run


def qos1_encoder(pub: Publisher) -> Callable[[int], bytes]:
    """packet id -> PUBLISH bytes; pre-encoded per id when the publisher has one topic."""
    payload = payload_of(pub.plan.payload_size)
    if len(pub.topics) == 1:
        topic = pub.topics[0]
        per_id = [b""] + [
            encode(Publish(topic, payload, 1, packet_id=i)) for i in range(1, pub.plan.window + 1)
        ]
        return per_id.__getitem__
    topics = itertools.cycle(pub.topics)  # a fixed mix: rotate exactly over the topics
    return lambda pid: encode(Publish(next(topics), payload, 1, packet_id=pid))


async def windowed_qos1(pub: Publisher, timing: Timing, total: int | None) -> None:
    """Keep ``window`` QoS 1 PUBLISH packets in flight until ``end`` (or ``total`` are sent),
    then wait up to ``ack_wait`` for the last PUBACKs."""
    packet_for = qos1_encoder(pub)
    client = pub.client
    done = asyncio.Event()
    stopped = False

    def send_more() -> None:
        nonlocal stopped
        now = time.monotonic()
        out: list[bytes] = []
        while pub.free_ids and not stopped:
            if now >= timing.end or (total is not None and pub.sent >= total):
                stopped = True
                break
            if not pub.credit.allows():
                break
            out.append(packet_for(pub.free_ids.popleft()))
            pub.count(1, now, timing)
        if out and client.is_open:
            client.write(b"".join(out))
        if stopped and pub.in_flight() == 0:
            done.set()

    def on_acks(acks: list[Puback]) -> None:
        Publisher.on_acks(pub, acks)
        send_more()

    client.on_acks = on_acks
    while not stopped and client.is_open:
        send_more()  # also notices ``end`` while no PUBACK arrives, and returning credit
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), 0.002 if pub.plan.backlog else 0.05)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(done.wait(), timing.ack_wait)


async def paced(pub: Publisher, timing: Timing) -> None:
    """``rate`` messages per second, each stamped with its send time, until ``end``."""
    interval = 1.0 / pub.plan.rate
    pad = bytes(max(0, pub.plan.payload_size - STAMP.size))
    topics = itertools.cycle(pub.topics)
    client = pub.client
    seq = 0
    due = timing.start
    while (now := time.monotonic()) < timing.end and client.is_open:
        out: list[bytes] = []
        while due <= now:
            stamp = STAMP.pack(time.monotonic_ns(), seq) + pad
            packet_id = pub.free_ids.popleft() if pub.qos and pub.free_ids else None
            if pub.qos and packet_id is None:
                break  # window full: the broker is behind; the stamp shows the delay
            out.append(encode(Publish(next(topics), stamp, pub.qos, packet_id=packet_id)))
            seq += 1
            due += interval
        if out:
            client.write(b"".join(out))
            pub.count(len(out), now, timing)
        await asyncio.sleep(max(0.0, due - time.monotonic()))


async def run_publishers(
    clients: list[Client], plan: GroupPlan, timing: Timing, report: Report, delivered: Shared
) -> None:
    pubs: list[Publisher] = []
    credit = Credit(plan, delivered, lambda: sum(p.sent for p in pubs))
    pubs.extend(Publisher(c, plan, credit) for c in clients)
    await sleep_until(timing.start)
    tasks = [asyncio.create_task(publish(pub, timing)) for pub in pubs]
    await sleep_until(timing.measure_from)
    cpu0 = time.process_time()
    await asyncio.wait(tasks, timeout=max(0.0, timing.end - time.monotonic()))
    report.cpu_seconds = time.process_time() - cpu0
    report.window_seconds = min(time.monotonic(), timing.end) - timing.measure_from
    await asyncio.gather(*tasks)
    report.sent = sum(p.sent for p in pubs)
    report.sent_window = sum(p.sent_window for p in pubs)
    report.acked = sum(p.acked for p in pubs)


async def publish(pub: Publisher, timing: Timing) -> None:
    if pub.plan.mode == "paced":
        await paced(pub, timing)
    elif pub.plan.mode == "fixed":
        await windowed_qos1(pub, timing, pub.plan.count * len(pub.topics))
    elif pub.qos == 0:
        await flood_qos0(pub, timing)
    else:
        await windowed_qos1(pub, timing, None)


# -- the worker process -----------------------------------------------------------------------


async def sleep_until(when: float) -> None:
    delay = when - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)


async def worker_main(
    plan: GroupPlan, conn: multiprocessing.connection.Connection, delivered: Shared
) -> None:
    loop = asyncio.get_running_loop()
    report = Report(plan.name, plan.role)
    clients = await asyncio.gather(*(open_client(c) for c in plan.clients))
    await asyncio.gather(*(c.handshake(plan.role == "sub") for c in clients))
    conn.send(("ready", len(clients)))
    command = await loop.run_in_executor(None, conn.recv)
    if command[0] != "go":
        return
    timing: Timing = command[1]
    if plan.role == "sub":
        await run_subscribers(list(clients), plan, timing, report, delivered)
    else:
        await run_publishers(list(clients), plan, timing, report, delivered)
    report.errors = [f"{c.plan.client_id}: connection lost" for c in clients if c.closed.done()]
    conn.send(("report", report))
    await loop.run_in_executor(None, conn.recv)  # close
    for client in clients:
        client.disconnect()
    await asyncio.sleep(0.05)


def worker_entry(
    plan: GroupPlan, conn: multiprocessing.connection.Connection, delivered: Shared
) -> None:
    """The worker process: run the group, report any failure over the pipe."""
    try:
        with contextlib.suppress(ImportError):
            import uvloop

            uvloop.install()
        asyncio.run(worker_main(plan, conn, delivered))
    except KeyboardInterrupt:
        pass
    except BaseException:
        with contextlib.suppress(OSError):
            conn.send(("error", traceback.format_exc()))


# -- the parent's side ------------------------------------------------------------------------


def shared_counters(groups: int) -> Shared:
    """One delivered-messages counter per subscriber group, shared with every worker."""
    return multiprocessing.get_context("spawn").RawArray("q", max(1, groups))


class Group:
    """A worker process as the parent drives it."""

    def __init__(self, plan: GroupPlan, delivered: Shared) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.plan = plan
        self.conn, child_conn = ctx.Pipe()
        self.process = ctx.Process(
            target=worker_entry,
            args=(plan, child_conn, delivered),
            name=f"bench-{plan.name}",
            daemon=True,
        )
        self.process.start()
        child_conn.close()

    def expect(self, what: str, timeout: float) -> Any:
        if not self.conn.poll(timeout):
            raise TimeoutError(f"load group {self.plan.name}: no {what} within {timeout:.0f}s")
        try:
            message = self.conn.recv()
        except EOFError:
            raise RuntimeError(f"load group {self.plan.name} exited before {what}") from None
        if message[0] == "error":
            last = message[1].strip().splitlines()[-1]
            raise RuntimeError(f"load group {self.plan.name} failed: {last}\n{message[1]}")
        if message[0] != what:
            raise RuntimeError(f"load group {self.plan.name}: expected {what}, got {message[0]}")
        return message[1]

    def send(self, *message: Any) -> None:
        with contextlib.suppress(OSError):
            self.conn.send(message)

    def stop(self) -> None:
        self.send("close")
        end_process(self.process, self.conn, grace=3.0)
