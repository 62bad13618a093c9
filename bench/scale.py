"""``python -m bench scale``: what a fleet costs, Headwater beside mosquitto (issue 11's rows).

Each scenario runs against a fresh broker (``headwater dev up``; mosquitto), the clients held by
this process on :mod:`bench.mqtt` (a :class:`Device` is an ``asyncio.Protocol``: no task or timer
per connection; one pinger sends the fleet's PINGREQs at a steady N / 60 per second):

``idle``   N connections (half cleanSession=0), 200 awaiting CONNACK at a time, each subscribed
           at QoS 1 to ``fleet/<id>/cmd``, keep-alive 60 s: the CONNECT rate, memory per
           connection (growth of the broker's VmRSS over N), then over an idle window the
           broker's CPU and Redis commands/s (``INFO``, our own excluded); last, one more client
           subscribes to 1,000 distinct filters: memory per subscription.
``storm``  S clients (half persistent, all subscribed) leave; each persistent session is owed 2
           QoS 1 messages; every client reconnects at once (Headwater: 3 nodes, client i on node
           i mod 3, back on the next node, so every session moves): time to the last CONNACK and
           to the last owed message, refusals, sessions present, owed messages received.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import resource
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path

import redis

from bench import brokers, mqtt
from bench.brokers import Broker, Headwater
from bench.measure import (
    Meter,
    commands_between,
    machine,
    percentile,
    redis_reading,
    rss_kib,
    tree_cpu_seconds,
)
from bench.mqtt import CONNACK, PUBLISH, SUBACK, Endpoint
from bench.report import table, wrap

IN_FLIGHT = 200
KEEP_ALIVE = 60
FILTERS = 1_000


@dataclass(frozen=True)
class Settings:
    clients: int = 10_000
    storm: int = 5_000
    idle: float = 30.0


def quick(s: Settings) -> Settings:
    return replace(s, clients=500, storm=300, idle=3.0)


class Device(asyncio.Protocol):
    """One connection: answers are futures by packet type; PUBLISHes PUBACKed and kept."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.waiting: dict[int, asyncio.Future[bytes]] = {}
        self.got: list[bytes] = []
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        for fut in self.waiting.values():
            if not fut.done():
                fut.set_exception(ConnectionError("closed"))

    def data_received(self, data: bytes) -> None:
        self.buf += data
        for first, body in mqtt.split_all(self.buf):
            if first >> 4 == PUBLISH:
                p = mqtt.parse_publish(first, body)
                self.got.append(p.payload)
                if p.qos and self.transport is not None:
                    self.transport.write(mqtt.PUBACKS[p.packet_id])
            elif (fut := self.waiting.pop(first >> 4, None)) is not None and not fut.done():
                fut.set_result(body)

    async def ask(self, data: bytes, kind: int, timeout: float = 90.0) -> bytes:
        fut = self.waiting[kind] = asyncio.get_running_loop().create_future()
        assert self.transport is not None
        self.transport.write(data)
        return await asyncio.wait_for(fut, timeout)

    def send(self, data: bytes) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.abort()


@dataclass
class Connects:
    connected: int = 0
    refused: int = 0
    present: int = 0
    seconds: float = 0.0
    times: list[float] = field(default_factory=list)

    def text(self) -> str:
        rate = self.connected / self.seconds if self.seconds else 0.0
        return (
            f"{rate:,.0f}/s ({self.connected:,} in {self.seconds:.2f} s; p50 "
            f"{percentile(self.times, 50) * 1000:.1f} ms, p99 "
            f"{percentile(self.times, 99) * 1000:.1f} ms; {self.refused} refused)"
        )


async def connect(
    at: Endpoint, client_id: str, clean: bool, topic: str | None, tally: Connects
) -> Device | None:
    """A device that got CONNACK 0 (and its SUBACK for ``topic`` unless its session was kept)."""
    started = time.monotonic()
    try:
        _, dev = await asyncio.get_running_loop().create_connection(Device, at.host, at.port)
        dev.send(at.hello())
        connack = await dev.ask(mqtt.connect(client_id, clean, keep_alive=KEEP_ALIVE), CONNACK)
        if connack[1] != 0:
            raise ConnectionError(f"CONNACK {connack[1]}")
        tally.times.append(time.monotonic() - started)
        tally.connected += 1
        tally.present += connack[0] & 1
        if topic is not None and not connack[0] & 1:
            await dev.ask(mqtt.subscribe(1, [topic]), SUBACK)
        return dev
    except (OSError, TimeoutError, ConnectionError):
        tally.refused += 1
        return None


async def fleet(
    ats: Sequence[Endpoint], ids: Sequence[str], bound: int, tally: Connects
) -> list[Device | None]:
    """Connect ``ids`` (client i on ``ats[i % len]``; even ones persistent), ``bound`` at a
    time (0: all at once)."""
    gate = asyncio.Semaphore(bound or len(ids))
    started = time.monotonic()

    async def one(i: int, cid: str) -> Device | None:
        async with gate:
            return await connect(ats[i % len(ats)], cid, i % 2 == 1, f"fleet/{cid}/cmd", tally)

    devices = await asyncio.gather(*(one(i, c) for i, c in enumerate(ids)))
    tally.seconds = time.monotonic() - started
    return list(devices)


async def pinger(devices: Sequence[Device | None]) -> None:
    """PINGREQs at a steady N / KEEP_ALIVE per second, each device once per period."""
    live = [d for d in devices if d is not None]
    k = 0
    while live:
        for _ in range(max(1, len(live) // KEEP_ALIVE)):
            live[k % len(live)].send(mqtt.PINGREQ)
            k += 1
        await asyncio.sleep(1.0)


@dataclass
class Idle:
    broker: str
    connects: Connects
    rss_kib: tuple[int, int, int, int] = (0, 0, 0, 0)
    """Before, connected, after the window, after the 1,000 filters."""
    cpu: float = 0.0
    redis_per_s: float | None = None
    error: str = ""


async def idle_fleet(b: Broker, s: Settings, r: redis.Redis | None) -> Idle:
    out = Idle(b.label, Connects())
    before = rss_kib(b.pids)
    ids = [f"idle-{i}" for i in range(s.clients)]
    devices = await fleet(b.endpoints, ids, IN_FLIGHT, out.connects)
    connected = rss_kib(b.pids)
    pings = asyncio.ensure_future(pinger(devices))
    meter = Meter(b.pids, tree_cpu_seconds)
    reading = redis_reading(r.info("all")) if r else None
    await asyncio.sleep(s.idle)
    out.cpu = sum(meter.used()) / s.idle
    if r is not None and reading is not None:
        out.redis_per_s = commands_between(reading, redis_reading(r.info("all")))[0] / s.idle
    after = rss_kib(b.pids)
    one = await connect(b.endpoints[0], "filters", True, None, Connects())
    if one is not None:
        topics = [f"fleet/filters/f{i}/cmd" for i in range(FILTERS)]
        for k in range(0, FILTERS, 100):
            await one.ask(mqtt.subscribe(k // 100 + 1, topics[k : k + 100]), SUBACK)
    out.rss_kib = (before, connected, after, rss_kib(b.pids))
    pings.cancel()
    for dev in [*devices, one]:
        if dev is not None:
            dev.close()
    return out


@dataclass
class Storm:
    broker: str
    clients: int
    back: Connects = field(default_factory=Connects)
    owed_seconds: float = 0.0
    received: int = 0
    duplicates: int = 0
    error: str = ""


async def storm(b: Broker, s: Settings) -> Storm:
    out = Storm(b.label, s.storm)
    ids = [f"storm-{i}" for i in range(s.storm)]
    devices = await fleet(b.endpoints, ids, IN_FLIGHT, Connects())
    for dev in devices:
        if dev is not None:
            dev.send(mqtt.DISCONNECT)
            dev.close()
    pub = await mqtt.connected(b.endpoints[0], "storm-pub")
    owed = [(f"fleet/{c}/cmd", f"{c}:{k}".encode()) for c in ids[0::2] for k in range(2)]
    for k in range(0, len(owed), 5_000):
        await pub.publish_all(owed[k : k + 5_000])
    pub.close()
    moved = [*b.endpoints[1:], b.endpoints[0]]
    started = time.monotonic()
    back = await fleet(moved, ids, 0, out.back)
    deadline = started + 120.0
    while time.monotonic() < deadline and sum(len(d.got) for d in back if d) < len(owed):
        await asyncio.sleep(0.05)
    out.owed_seconds = time.monotonic() - started
    got = [p for d in back if d is not None for p in d.got]
    out.received, out.duplicates = len(set(got)), len(got) - len(set(got))
    for dev in back:
        if dev is not None:
            dev.close()
    return out


@dataclass
class ScaleRun:
    settings: Settings
    command: str
    headwater: str
    started: datetime.datetime = field(default_factory=lambda: datetime.datetime.now(datetime.UTC))
    idle: list[Idle] = field(default_factory=list)
    storms: list[Storm] = field(default_factory=list)


def run(
    work: Path,
    names: list[str],
    s: Settings,
    hw: Headwater,
    command: str,
    progress: Callable[[str], None],
) -> ScaleRun:
    """Both scenarios on each broker (Headwater first), each on a fresh broker."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    out = ScaleRun(s, command, hw.version)
    for name in [n for n in ("headwater", "mosquitto") if n in names]:
        for scenario in ("idle", "storm"):
            with ExitStack() as stack:
                nodes = 3 if scenario == "storm" else 1
                b = brokers.start(name, work, stack, hw, nodes)
                progress(f"scale {scenario}: {b.label} up")
                if scenario == "idle":
                    url = b.state.get("redis")
                    r = redis.Redis.from_url(url) if url else None
                    try:
                        out.idle.append(asyncio.run(idle_fleet(b, s, r)))
                    except (OSError, RuntimeError, redis.RedisError) as exc:
                        out.idle.append(Idle(b.label, Connects(), error=str(exc)))
                    progress(f"scale idle, {b.label}: {idle_cells(out.idle[-1])}")
                else:
                    try:
                        out.storms.append(asyncio.run(storm(b, s)))
                    except (OSError, RuntimeError) as exc:
                        out.storms.append(Storm(b.label, s.storm, error=str(exc)))
                    progress(f"scale storm, {b.label}: {storm_cell(out.storms[-1])}")
    with contextlib.suppress(ValueError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return out


def idle_cells(i: Idle) -> list[str]:
    if i.error:
        return [f"FAILED: {i.error}"] * 5
    before, connected, after, filters = i.rss_kib
    per = (max(connected, after) - before) / max(1, i.connects.connected)
    sub = (filters - after) * 1024 / FILTERS
    redis_text = f"{i.redis_per_s:.1f}/s" if i.redis_per_s is not None else "n/a (no Redis)"
    return [
        i.connects.text(),
        f"{per:.2f} KB",
        f"{i.cpu:.2%} of a core",
        redis_text,
        f"{sub:,.0f} B",
    ]


def storm_cell(st: Storm) -> str:
    if st.error:
        return f"FAILED: {st.error}"
    persistent = (st.clients + 1) // 2
    return (
        f"last CONNACK after {st.back.seconds:.1f} s, all owed messages after "
        f"{st.owed_seconds:.1f} s; {st.back.refused} refused; sessions present "
        f"{st.back.present:,}/{persistent:,}; owed received {st.received:,}/{2 * persistent:,} "
        f"({st.duplicates} duplicates)"
    )


def render(run: ScaleRun) -> str:
    s = run.settings
    labels = [i.broker for i in run.idle] or [st.broker for st in run.storms]
    rows = [
        f"CONNECT/s: {s.clients:,} connects (half persistent, each then subscribing), "
        f"{IN_FLIGHT} in flight",
        f"memory per idle connection: {s.clients:,} idle, one QoS 1 subscription each, "
        f"keep-alive {KEEP_ALIVE} s",
        f"broker CPU while they idle for {s.idle:g} s",
        "Redis commands/s meanwhile (all of them, ours excluded)",
        f"memory per subscription: one more client subscribes to {FILTERS:,} filters",
    ]
    cells = [idle_cells(i) for i in run.idle]
    lines = [[row, *(c[k] for c in cells)] for k, row in enumerate(rows)]
    storm_row = (
        f"reconnect storm: {s.storm:,} clients (half persistent, each owed 2 QoS 1 messages) "
        "reconnect at once; Headwater: 3 nodes, each client back on the next node"
    )
    lines.append([storm_row, *(storm_cell(st) for st in run.storms)])
    return wrap("scale", [
        "## Scale: idle fleets, CONNECT bursts, reconnect storms",
        "",
        f"{run.started:%Y-%m-%d %H:%M} UTC; {machine()}; Headwater {run.headwater} "
        f"(`headwater dev up`), beside {brokers.mosquitto_version()}; command: `{run.command}`.",
        "",
        *table(["scenario", *labels], lines),
        "",
        "How it ran: each scenario on a fresh broker; clients of this process on 127.0.0.1 "
        "(raw MQTT 3.1.1, `bench/mqtt.py`). Memory = growth of the broker's VmRSS "
        "(/proc/<pid>/status) from before the connects to the larger of 'connected' and 'after "
        "the window', over the connections made (KB = 1024 bytes). CPU = utime + stime of "
        "/proc/<pid>/stat over the window. A CONNECT's time runs from the TCP connect to the "
        "CONNACK.",
    ])  # fmt: skip
