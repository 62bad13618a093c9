"""``python -m bench history``: what reading the log's history costs (``$history/<since>/...``).

One node of ``headwater dev up``.  The log is filled first: 8 publishers flood QoS 0 PUBLISHes
(64 bytes) on ``hist/<i>``, one topic each, until the node has taken ``--history`` of them (its
``messages_received_by_qos``; each goes to the log).  Then, measured:

* **read alone**: one raw client subscribes ``$history/earliest/hist/#`` at QoS 1 (a filter that
  maps to every partition; the messages were published at QoS 0, so they come at QoS 0): what it
  got, the seconds from its SUBACK to the last one, the rate, and the node's CPU per message and
  threads;
* **live latency beside it**: ``latency-qos1`` of ``bench.throughput`` (1,000 QoS 1 msg/s through
  the same node, p50 and p99, and its loss), alone, then while a second client reads the same
  history from its start;
* **subscribing**: the time from SUBSCRIBE to SUBACK for a history filter that maps to every
  partition (``hist/#``) and for one that maps to one (``hist/1``), each reading from 5 s back
  (nothing): the price of finding Kafka's offsets for a time;
* **a greedy client**: one SUBSCRIBE of 1,000 distinct history filters of the whole log
  (``$history/<n>d/hist/#``): what is granted, and the node's CPU and memory over 5 s.

The readers run in processes of their own (``multiprocessing``, as the load generator's roles),
on ``bench.mqtt``: nothing here imports the product.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

from bench import mqtt
from bench.brokers import Broker, Headwater
from bench.load import Groups, Role, Timing
from bench.measure import (
    Meter,
    machine,
    node_stats,
    percentile,
    rss_kib,
    threads,
    tree_cpu_seconds,
)
from bench.mqtt import PUBACKS, PUBLISH, SUBACK, Endpoint
from bench.report import table, wrap
from bench.throughput import SCENARIOS, Settings, measure, warm_kafka

FILL_TOPICS = 8
FILL_ROUND = 10.0
"""Seconds of one round of filling; rounds go on until the log holds what was asked."""
IDLE = 10.0
"""A reader that got nothing for this long has read everything."""
HISTORY = "$history/earliest/hist/#"
GREEDY = 1000


@dataclass
class Read:
    """What one history reader saw."""

    suback_s: float = 0.0
    """SUBSCRIBE sent to SUBACK."""
    first_s: float = 0.0
    """SUBSCRIBE sent to the first message."""
    got: int = 0
    seconds: float = 0.0
    """SUBACK to the last message."""
    error: str = ""

    @property
    def rate(self) -> float:
        return self.got / self.seconds if self.seconds else 0.0


@dataclass
class Run:
    command: str
    version: str
    filled: int = 0
    fill_rate: float = 0.0
    alone: Read = field(default_factory=Read)
    alone_cpu_us: float = 0.0
    threads: tuple[int, int] = (0, 0)
    """The node's threads before the read and at most during it."""
    baseline: tuple[float, float, int] = (0.0, 0.0, 0)
    """Live QoS 1 at 1,000 msg/s: p50 ms, p99 ms, lost."""
    beside: tuple[float, float, int] = (0.0, 0.0, 0)
    beside_read: Read = field(default_factory=Read)
    subscribe_all: list[float] = field(default_factory=list)
    subscribe_one: list[float] = field(default_factory=list)
    greedy: tuple[int, int] = (0, 0)
    """Of ``GREEDY`` history filters in one SUBSCRIBE: granted, refused."""
    greedy_cost: tuple[float, int] = (0.0, 0)
    """The node's CPU seconds and resident growth (KiB) over the 5 s after it."""
    seconds: float = 0.0


async def _read(at: Endpoint, history_filter: str, want: int, idle: float) -> Read:
    stream = await mqtt.connected(at, f"history-reader-{time.monotonic_ns()}")
    read = Read()
    sent = time.monotonic()
    stream.send(mqtt.subscribe(1, [history_filter], 1))
    suback = await stream.expect(SUBACK)
    if suback is None or suback[-1] == 0x80:
        stream.close()
        return Read(error=f"SUBACK {suback!r}")
    subacked = time.monotonic()
    read.suback_s = subacked - sent
    last = subacked
    while read.got < want:
        found = await stream.next(idle)
        if found is None:  # nothing for ``idle`` seconds (or closed): all read
            break
        first, body = found
        if first >> 4 != PUBLISH:
            continue
        last = time.monotonic()
        if not read.got:
            read.first_s = last - sent
        read.got += 1
        if first & 0x06:
            at_id = 2 + int.from_bytes(body[:2], "big")
            stream.send(PUBACKS[int.from_bytes(body[at_id : at_id + 2], "big")])
    read.seconds = last - subacked
    stream.close()
    return read


def reader_main(
    at: Endpoint, history_filter: str, want: int, idle: float, conn: Connection
) -> None:
    try:
        conn.send(asyncio.run(_read(at, history_filter, want, idle)))
    except Exception as exc:  # reported, not raised: the parent waits on the pipe
        conn.send(Read(error=f"{type(exc).__name__}: {exc}"))


class Reader:
    """A history reader in a process of its own."""

    def __init__(self, at: Endpoint, history_filter: str, want: int, idle: float = IDLE) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.pipe, theirs = ctx.Pipe()
        self.proc = ctx.Process(
            target=reader_main, args=(at, history_filter, want, idle, theirs), daemon=True
        )
        self.proc.start()

    def result(self, timeout: float) -> Read:
        try:
            if not self.pipe.poll(timeout):
                return Read(error=f"no answer in {timeout:.0f} s")
            got = self.pipe.recv()
            assert isinstance(got, Read)
            return got
        finally:
            self.proc.kill()
            self.proc.join(2)


def received(broker: Broker) -> int:
    """QoS 0 PUBLISHes the node has taken (``messages_produced`` counts acknowledged ones)."""
    return int(node_stats(broker.stats[0])["messages_received_by_qos"]["0"])


def fill(broker: Broker, want: int, progress: Callable[[str], None]) -> tuple[int, float]:
    """Flood ``hist/<i>`` until the log holds ``want`` of them: how many, at what rate."""
    topics = tuple(f"hist/{k}" for k in range(FILL_TOPICS))
    before, started = received(broker), time.monotonic()
    while (done := received(broker) - before) < want:
        role = Role("flood0", broker.endpoints[0], FILL_TOPICS, "fill", topics=topics,
                    stamped=False)  # fmt: skip
        groups = Groups([role])
        try:
            groups.ready()
            t0 = time.monotonic() + 0.2
            rate = done / max(1e-3, time.monotonic() - started)
            seconds = min(FILL_ROUND, (want - done) / rate + 0.5) if done else FILL_ROUND / 4
            groups.go(Timing(t0, t0, t0 + seconds))
            groups.reports(seconds + 30)
        finally:
            groups.close()
        progress(f"history: the log holds {received(broker) - before:,} of {want:,}")
    return done, done / (time.monotonic() - started)


def latency(broker: Broker, base: int) -> tuple[float, float, int]:
    result = measure(SCENARIOS["latency-qos1"], broker, Settings(), base)
    if result.error:
        raise RuntimeError(result.error)
    return result.p50_ms, result.p99_ms, result.lost


def subscribe_times(at: Endpoint, history_filter: str, rounds: int) -> list[float]:
    times = []
    for _ in range(rounds):
        read = asyncio.run(_read(at, history_filter, 1, 0.5))
        if read.error:
            raise RuntimeError(f"{history_filter}: {read.error}")
        times.append(read.suback_s)
    return times


async def _greedy(at: Endpoint) -> tuple[int, int]:
    stream = await mqtt.connected(at, "history-greedy")
    wanted = [f"$history/{n + 1}d/hist/#" for n in range(GREEDY)]
    stream.send(mqtt.subscribe(1, wanted, 1))
    suback = await stream.expect(SUBACK, 60.0)
    codes = suback[2:] if suback is not None else b""
    await asyncio.sleep(5.0)
    stream.close()
    return sum(c != 0x80 for c in codes), sum(c == 0x80 for c in codes)


def run(
    work: Path,
    headwater: Headwater,
    command: str,
    progress: Callable[[str], None],
    messages: int,
) -> Run:
    out = Run(command, headwater.version)
    started = time.monotonic()
    with ExitStack() as stack:
        broker = headwater.start(work, stack)
        at, pid = broker.endpoints[0], broker.pids[0]
        progress("history: warming Kafka up")
        warm_kafka(broker, 10.0)
        out.filled, out.fill_rate = fill(broker, messages, progress)
        total = out.filled  # on hist/#, give or take the node's few $SYS reports
        out.threads = (threads(pid), threads(pid))
        progress(f"history: one client reads {total:,} messages")
        meter = Meter([pid], tree_cpu_seconds)
        reader = Reader(at, HISTORY, total)
        most = out.threads[0]
        while reader.proc.is_alive() and not reader.pipe.poll(0.2):
            most = max(most, threads(pid))
        out.alone = reader.result(600)
        out.threads = (out.threads[0], most)
        out.alone_cpu_us = sum(meter.used()) / max(1, out.alone.got) * 1e6
        progress(f"history: read alone {out.alone.got:,} in {out.alone.seconds:.1f} s")
        out.baseline = latency(broker, 500)
        reader = Reader(at, HISTORY, total)
        time.sleep(2.0)  # the read is under way
        out.beside = latency(broker, 600)
        out.beside_read = reader.result(600)
        progress(f"history: live p99 {out.baseline[1]:.1f} ms alone, {out.beside[1]:.1f} beside")
        out.subscribe_all = subscribe_times(at, "$history/5s/hist/#", 5)
        out.subscribe_one = subscribe_times(at, "$history/5s/hist/1", 5)
        meter, rss = Meter([pid], tree_cpu_seconds), rss_kib([pid])
        out.greedy = asyncio.run(_greedy(at))
        out.greedy_cost = (sum(meter.used()), rss_kib([pid]) - rss)
    out.seconds = time.monotonic() - started
    return out


def _read_cell(read: Read) -> str:
    if read.error and not read.got:
        return read.error
    rate = f"{read.got:,} in {read.seconds:.1f} s: {read.rate:,.0f} msg/s"
    return rate + (f" ({read.error})" if read.error else "")


def _median_ms(values: list[float]) -> str:
    return f"{percentile(sorted(values), 50) * 1000:.1f} ms"


def render(run: Run) -> str:
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rows = [
        ["filled: QoS 0 flood on 8 topics", f"{run.filled:,} messages at {run.fill_rate:,.0f}/s"],
        [f"`{HISTORY}` read alone (granted QoS 1; the messages are QoS 0, so sent at 0)",
         _read_cell(run.alone)],
        ["node CPU per message read; threads before -> at most",
         f"{run.alone_cpu_us:.1f} us; {run.threads[0]} -> {run.threads[1]}"],
        ["the same read, beside live traffic", _read_cell(run.beside_read)],
        ["live QoS 1 at 1,000 msg/s alone: p50 / p99, lost",
         f"{run.baseline[0]:.1f} / {run.baseline[1]:.1f} ms, {run.baseline[2]}"],
        ["the same while a client reads the history",
         f"{run.beside[0]:.1f} / {run.beside[1]:.1f} ms, {run.beside[2]}"],
        ["SUBSCRIBE to SUBACK, `$history/5s/hist/#` (every partition), median of 5",
         _median_ms(run.subscribe_all)],
        ["the same, `$history/5s/hist/1` (one partition)", _median_ms(run.subscribe_one)],
        [f"one SUBSCRIBE of {GREEDY:,} history filters of the whole log: granted / refused; "
         "node CPU and resident growth over 5 s",
         f"{run.greedy[0]:,} / {run.greedy[1]:,}; {run.greedy_cost[0]:.1f} s, "
         f"{run.greedy_cost[1] / 1024:+.1f} MiB"],
    ]  # fmt: skip
    lines = [
        "## History: reading the log through `$history/<since>/<filter>`",
        "",
        "| | |",
        "|---|---|",
        f"| Date | {stamp} |",
        f"| Machine | {machine()} |",
        f"| Headwater | {run.version}, one node of `headwater dev up` |",
        f"| Command | `{run.command}` ({run.seconds:.0f} s) |",
        "",
        *table(["", "measured"], rows),
    ]
    return wrap("history", lines)
