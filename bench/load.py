"""The load generator: raw MQTT clients on :mod:`bench.mqtt`, one process per group of clients.

It imports nothing of the product.  A :class:`Role` says what one process does; the parent
(:func:`run_groups`) starts one process per role (uvloop when installed), waits until each has
connected (and subscribed) its clients, sends every process the same :class:`Timing` in
``time.monotonic()`` seconds (system-wide on Linux, so the processes agree), and collects one
:class:`Report` each.  The roles:

* ``flood0``: QoS 0 PUBLISHes written 32 to a write (one pre-encoded batch), as fast as TCP takes
  them: the next write waits while the transport is paused (its buffer above the high-water mark);
* ``flood1``: QoS 1 with ``window`` PUBLISHes unacknowledged per connection, the next one written
  as a PUBACK comes back;
* ``paced``: ``rate`` per connection, one PUBLISH per write, on schedule whatever the broker has
  acknowledged (at QoS 1 a packet identifier is reused only once its PUBACK came);
* ``sub``: subscribes ``filter`` (or ``filters``), PUBACKs every QoS 1 PUBLISH, counts what
  arrives in the measured window, then drains until nothing came for ``drain_idle``
  (``drain_max`` at most);
* ``churn``: ``clients`` connections in flight, each CONNECT -> CONNACK (-> SUBSCRIBE -> SUBACK)
  -> DISCONNECT, again and again, counting what completed in the window; with a ``rate``, cycles
  start on schedule at that rate in all (open loop: at most ``clients`` in flight), so the
  broker's CPU per cycle is measured at one load whatever its speed.

Stamped payloads (every role but ``flood0``) start with (send ``monotonic_ns``, publisher,
sequence), so a subscriber gives send -> receive latencies of the messages sent in the window and
the set of (publisher, sequence) it got; a QoS 1 publisher reports the sequences the broker
PUBACKed: lost = PUBACKed and never received.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import struct
import time
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Literal, cast

from bench import mqtt
from bench.mqtt import PUBACK, PUBACKS, PUBLISH, Endpoint

STAMP = struct.Struct(">QII")
"""A stamped payload's head: send time (monotonic_ns), publisher, sequence."""
BATCH = 32
PAYLOAD = 64
CONNECT_TIMEOUT = 30.0
Kind = Literal["flood0", "flood1", "paced", "sub", "churn"]


@dataclass(frozen=True)
class Role:
    kind: Kind
    at: Endpoint
    clients: int = 1
    tag: str = "lg"
    topic: str = "lg/{i}"
    """Publishers: ``{i}`` is the publisher's number (``first`` + its index here)."""
    topics: tuple[str, ...] = ()
    """Publishers: one topic per connection instead of ``topic`` (the k-th connection's)."""
    first: int = 0
    filter: str = "lg/#"
    filters: tuple[str, ...] = ()
    """Subscribers: every connection subscribes these in one SUBSCRIBE instead of ``filter``."""
    qos: int = 0
    rate: float = 0.0
    """paced: messages per second per connection; churn: cycles per second in all."""
    window: int = 64
    clean: bool = True
    subscribe: bool = False
    """churn: a SUBSCRIBE (QoS 1) between CONNECT and DISCONNECT."""
    stamped: bool = True

    def topic_of(self, i: int) -> str:
        """Publisher ``i``'s topic."""
        return self.topics[i - self.first] if self.topics else self.topic.format(i=i)


@dataclass(frozen=True)
class Timing:
    start: float
    measure_from: float
    end: float
    drain_idle: float = 2.0
    drain_max: float = 30.0


@dataclass
class Report:
    sent: int = 0
    sent_window: int = 0
    received: int = 0
    received_window: int = 0
    done_window: int = 0
    """churn: cycles completed in the window."""
    latencies: list[float] = field(default_factory=list)
    """Seconds, send -> receive, of stamped messages sent in the window."""
    acked: dict[int, set[int]] = field(default_factory=dict)
    got: dict[int, set[int]] = field(default_factory=dict)
    duplicates: int = 0
    behind: int = 0
    """paced: messages sent later than due because no packet identifier was free."""
    errors: list[str] = field(default_factory=list)

    def merge(self, other: Report) -> None:
        for name in ("sent", "sent_window", "received", "received_window", "done_window"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.duplicates += other.duplicates
        self.behind += other.behind
        self.latencies += other.latencies
        for mine, theirs in ((self.acked, other.acked), (self.got, other.got)):
            for pub, seqs in theirs.items():
                mine.setdefault(pub, set()).update(seqs)
        self.errors += other.errors

    def lost(self) -> int:
        return sum(len(s - self.got.get(p, set())) for p, s in self.acked.items())


def stamped(topic: str, qos: int, pid: int, pub: int, seq: int) -> bytes:
    head = STAMP.pack(time.monotonic_ns(), pub, seq)
    return mqtt.publish(topic, head.ljust(PAYLOAD, b"."), pid, qos=qos)


class Client(asyncio.Protocol):
    """One connection: writes what it is given, hands PUBLISHes and PUBACKs to its owner role."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.writable = asyncio.Event()
        self.writable.set()
        self.answers: asyncio.Queue[tuple[int, bytes]] = asyncio.Queue()
        self.on_publish: Callable[[int, bytes], None] | None = None
        self.on_puback: Callable[[int], None] | None = None
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.writable.set()
        if not self.closed.done():
            self.closed.set_result(None)

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def write(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        for first, body in mqtt.split_all(self.buf):
            kind = first >> 4
            if kind == PUBLISH and self.on_publish is not None:
                self.on_publish(first, body)
            elif kind == PUBACK and self.on_puback is not None:
                self.on_puback(int.from_bytes(body[:2], "big"))
            else:
                self.answers.put_nowait((first, body))

    async def expect(self, kind: int) -> bytes:
        first, body = await asyncio.wait_for(self.answers.get(), CONNECT_TIMEOUT)
        if first >> 4 != kind:
            raise RuntimeError(f"expected packet type {kind}, got {first >> 4}")
        return body


async def open_client(role: Role, client_id: str) -> Client:
    loop = asyncio.get_running_loop()
    _, client = await loop.create_connection(Client, role.at.host, role.at.port)
    client.write(role.at.hello() + mqtt.connect(client_id, role.clean))
    connack = await client.expect(mqtt.CONNACK)
    if connack[1] != 0:
        raise RuntimeError(f"{client_id}: CONNACK {connack[1]}")
    if role.kind == "sub":
        client.write(mqtt.subscribe(1, role.filters or [role.filter], role.qos))
        await client.expect(mqtt.SUBACK)
    return client


# -- the roles ---------------------------------------------------------------------------------


async def flood0(client: Client, role: Role, i: int, t: Timing, report: Report) -> None:
    batch = mqtt.publish(role.topic_of(i), b"x" * PAYLOAD, qos=0) * BATCH
    while (now := time.monotonic()) < t.end:
        if not client.writable.is_set():
            await client.writable.wait()
            continue
        client.write(batch)
        report.sent += BATCH
        report.sent_window += BATCH if now >= t.measure_from else 0
        await asyncio.sleep(0)


class Acks:
    """A QoS 1 publisher's packet identifiers: which sequence each is in flight for."""

    def __init__(self, report: Report, pub: int) -> None:
        self.free = deque(range(1, 65536))
        self.flight: dict[int, int] = {}
        self.acked = report.acked.setdefault(pub, set())
        self.came = asyncio.Event()

    def take(self, seq: int) -> int:
        pid = self.free.popleft()
        self.flight[pid] = seq
        return pid

    def on_puback(self, pid: int) -> None:
        seq = self.flight.pop(pid, None)
        if seq is not None:
            self.acked.add(seq)
            self.free.append(pid)
            self.came.set()


async def flood1(client: Client, role: Role, i: int, t: Timing, report: Report) -> None:
    acks, topic, seq = Acks(report, i), role.topic_of(i), 0
    client.on_puback = acks.on_puback
    while (now := time.monotonic()) < t.end:
        while len(acks.flight) < role.window:
            client.write(stamped(topic, 1, acks.take(seq), i, seq))
            seq += 1
            report.sent_window += now >= t.measure_from
        acks.came.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(acks.came.wait(), max(0.001, t.end - now))
    report.sent += seq
    await last_acks(acks)


async def paced(client: Client, role: Role, i: int, t: Timing, report: Report) -> None:
    acks, topic, seq, qos = Acks(report, i), role.topic_of(i), 0, role.qos
    client.on_puback = acks.on_puback
    total = int((t.end - t.start) * role.rate)
    while seq < total:
        due = min(total, int((time.monotonic() - t.start) * role.rate) + 1)
        while seq < due:
            if qos and not acks.free:
                report.behind += 1
                acks.came.clear()
                await acks.came.wait()
                continue
            when = t.start + seq / role.rate
            client.write(stamped(topic, qos, acks.take(seq) if qos else 0, i, seq))
            report.sent_window += t.measure_from <= when < t.end
            seq += 1
        await asyncio.sleep(max(0.0, t.start + seq / role.rate - time.monotonic()))
    report.sent += seq
    await last_acks(acks)


async def last_acks(acks: Acks, most: float = 10.0) -> None:
    deadline = time.monotonic() + most
    while acks.flight and time.monotonic() < deadline:
        acks.came.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(acks.came.wait(), deadline - time.monotonic())


class Counter:
    """A subscriber's tally, fed by its clients' PUBLISHes."""

    def __init__(self, role: Role, t: Timing, report: Report) -> None:
        self.role, self.t, self.report = role, t, report
        self.last = time.monotonic()
        self.window_ns = (int(t.measure_from * 1e9), int(t.end * 1e9))

    def bind(self, client: Client) -> None:
        def on_publish(first: int, body: bytes) -> None:
            self.count(client, first, body)

        client.on_publish = on_publish

    def count(self, client: Client, first: int, body: bytes) -> None:
        r, now = self.report, time.monotonic()
        self.last = now
        r.received += 1
        r.received_window += self.t.measure_from <= now < self.t.end
        at = int.from_bytes(body[:2], "big") + 2
        if first & 0x06:
            client.write(PUBACKS[int.from_bytes(body[at : at + 2], "big")])
            at += 2
        if self.role.stamped:
            sent, pub, seq = STAMP.unpack_from(body, at)
            seen = r.got.setdefault(pub, set())
            if seq in seen:
                r.duplicates += 1
                return
            seen.add(seq)
            if self.window_ns[0] <= sent < self.window_ns[1]:
                r.latencies.append(now - sent / 1e9)

    async def drain(self) -> None:
        await asyncio.sleep(max(0.0, self.t.end - time.monotonic()))
        stop = time.monotonic() + self.t.drain_max
        while (now := time.monotonic()) < stop and now - self.last < self.t.drain_idle:
            await asyncio.sleep(0.1)


async def churn(role: Role, t: Timing, report: Report) -> None:
    """``role.clients`` loops of connect, (subscribe,) disconnect from start to end."""

    gap = role.clients / role.rate if role.rate else 0.0
    """Seconds between two cycles of one slot, on schedule."""

    async def one(slot: int) -> None:
        n = 0
        due = t.start + slot * gap / role.clients
        while time.monotonic() < t.end:
            n += 1
            if gap:
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                due += gap
            try:
                await cycle(role, f"{role.tag}-{slot}-{n}")
            except (OSError, RuntimeError, TimeoutError) as exc:
                report.errors.append(f"{type(exc).__name__}: {exc}")
                continue
            report.done_window += t.measure_from <= time.monotonic() < t.end

    await asyncio.sleep(max(0.0, t.start - time.monotonic()))
    await asyncio.gather(*(one(k) for k in range(role.clients)))


async def cycle(role: Role, client_id: str) -> None:
    stream, connack = await mqtt.login(role.at, client_id, role.clean)
    try:
        if connack is None or connack[0] != 0:
            raise RuntimeError(f"CONNACK {connack}")
        if role.subscribe:
            stream.send(mqtt.subscribe(1, [f"churn/{client_id}"]))
            if await stream.expect(mqtt.SUBACK) is None:
                raise RuntimeError("closed before SUBACK")
        stream.send(mqtt.DISCONNECT)
        await stream.writer.drain()
    finally:
        stream.writer.close()


PUBLISHERS = {"flood0": flood0, "flood1": flood1, "paced": paced}


# -- one process per role -----------------------------------------------------------------------


async def run_role(role: Role, conn: Connection) -> Report:
    report = Report()
    clients: list[Client] = []
    if role.kind != "churn":
        ids = [f"{role.tag}-{role.first + k}" for k in range(role.clients)]
        clients = list(await asyncio.gather(*(open_client(role, c) for c in ids)))
    conn.send("ready")
    loop = asyncio.get_running_loop()
    t: Timing = await loop.run_in_executor(None, conn.recv)
    if role.kind == "churn":
        await churn(role, t, report)
    elif role.kind == "sub":
        counter = Counter(role, t, report)
        for client in clients:
            counter.bind(client)
        await counter.drain()
    else:
        await asyncio.sleep(max(0.0, t.start - time.monotonic()))
        fn = PUBLISHERS[role.kind]
        await asyncio.gather(
            *(fn(c, role, role.first + k, t, report) for k, c in enumerate(clients))
        )
    for client in clients:
        if client.transport is not None:
            client.transport.close()
    return report


def role_main(role: Role, conn: Connection) -> None:
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
    try:
        conn.send(asyncio.run(run_role(role, conn)))
    except BaseException:
        with contextlib.suppress(OSError):
            conn.send(traceback.format_exc())


class Groups:
    """The load processes of one run: started, connected, driven, collected, always ended."""

    def __init__(self, roles: Sequence[Role]) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.pipes: list[Connection] = []
        self.procs = []
        for role in roles:
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=role_main, args=(role, theirs), daemon=True)
            proc.start()
            self.pipes.append(mine)
            self.procs.append(proc)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p.pid is not None]

    def answer(self, pipe: Connection, timeout: float) -> object:
        if not pipe.poll(timeout):
            raise RuntimeError(f"a load process did not answer in {timeout:.0f} s")
        got = pipe.recv()
        if isinstance(got, str) and got != "ready":
            raise RuntimeError(f"a load process failed:\n{got}")
        return got

    def ready(self) -> None:
        for pipe in self.pipes:
            self.answer(pipe, CONNECT_TIMEOUT * 2)

    def go(self, timing: Timing) -> None:
        for pipe in self.pipes:
            pipe.send(timing)

    def reports(self, timeout: float) -> list[Report]:
        found = []
        for pipe in self.pipes:
            got = self.answer(pipe, timeout)
            assert isinstance(got, Report)
            found.append(got)
        return found

    def close(self) -> None:
        for proc in self.procs:
            proc.join(2)
            if proc.is_alive():
                proc.kill()
                proc.join(2)
