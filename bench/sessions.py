"""``python -m bench sessions``: what a session costs to move: takeover time and replay rate.

Two Headwater nodes with Redis stores share one Kafka log.  Measured:

* **takeover**: a client is connected (cleanSession=0, with a will) to node 1; the same client id
  connects to node 2: time from that CONNECT sent to its CONNACK (node 2 asks node 1 to let go,
  node 1 closes the old connection, publishes the will, stores the session; node 2 acquires it).
* **replay**: a persistent subscriber (QoS 1) leaves; N QoS 1 messages are published meanwhile;
  it reconnects to the other node.  Rate = N / (CONNACK to the N-th message), each PUBACKed.
* **resume storm**: S persistent sessions (a topic each) leave node 1, are each owed 2 QoS 1
  messages, and all reconnect to node 2 at once: the time until every one has them, node 2's
  threads and resident memory (``/proc/<pid>/status``) before and at most, every 20 ms.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from bench import mqtt
from bench.brokers import Headwater
from bench.measure import rss_kib, threads
from bench.mqtt import Endpoint
from bench.report import wrap

Ports = tuple[Endpoint, Endpoint]


async def client(
    at: Endpoint, client_id: str, clean: bool = True, **kw: object
) -> tuple[mqtt.Stream, bool]:
    """A connection that got CONNACK 0, and its session-present flag."""
    stream, connack = await mqtt.login(at, client_id, clean, None, **kw)
    if connack is None or connack[0] != 0:
        raise RuntimeError(f"{client_id}: CONNACK {connack}")
    return stream, connack[1]


async def takeover_times(ports: Ports, rounds: int) -> list[float]:
    times = []
    for i in range(rounds):
        will = ("bench/wills", b"gone", 1)
        old, _ = await client(ports[0], f"mover-{i}", False, will=will)
        started = time.perf_counter()
        new, present = await client(ports[1], f"mover-{i}", False, will=will)
        times.append(time.perf_counter() - started)
        assert present
        new.close()
        old.close()
    return times


async def replay_rate(ports: Ports, count: int) -> float:
    sub, _ = await client(ports[0], "replayer", False)
    sub.send(mqtt.subscribe(1, ["replay/#"]))
    await sub.expect(mqtt.SUBACK)
    sub.close()
    pub, _ = await client(ports[1], "replay-pub")
    for start in range(0, count, 5_000):
        await pub.publish_all(
            [(f"replay/{i % 50}/t", b"x" * 64) for i in range(start, min(count, start + 5_000))]
        )
    back, present = await client(ports[1], "replayer", False)
    assert present
    started = time.perf_counter()
    received = len(await back.receive(count, idle=30.0, most=300.0))
    elapsed = time.perf_counter() - started
    back.close()
    pub.close()
    if received < count:
        raise RuntimeError(f"replay: {received} of {count} messages came back")
    return count / elapsed


@dataclass(slots=True)
class Storm:
    sessions: int
    seconds: float
    threads: tuple[int, int]
    rss_mib: tuple[float, float]


async def resume_storm(ports: Ports, pid: int, sessions: int) -> Storm:
    async def leave(i: int) -> None:
        c, _ = await client(ports[0], f"storm-{i}", False)
        c.send(mqtt.subscribe(1, [f"storm/{i}/cmd"]))
        await c.expect(mqtt.SUBACK)
        c.send(mqtt.DISCONNECT)
        await c.writer.drain()
        c.close()

    async def come_back(i: int) -> None:
        c, present = await client(ports[1], f"storm-{i}", False)
        assert present
        got = await c.receive(2, idle=60.0, most=120.0)
        c.close()
        if len(got) < 2:
            raise RuntimeError(f"storm-{i}: {len(got)} of 2 owed messages")

    for start in range(0, sessions, 100):
        await asyncio.gather(*(leave(i) for i in range(start, min(start + 100, sessions))))
    pub, _ = await client(ports[0], "storm-pub")
    await pub.publish_all([(f"storm/{n % sessions}/cmd", b"x" * 64) for n in range(2 * sessions)])
    pub.close()
    before = most = (threads(pid), rss_kib([pid]) / 1024)
    started = time.perf_counter()
    storm = asyncio.gather(*(come_back(i) for i in range(sessions)))
    while not storm.done():
        now = (threads(pid), rss_kib([pid]) / 1024)
        most = (max(most[0], now[0]), max(most[1], now[1]))
        await asyncio.sleep(0.02)
    await storm
    return Storm(
        sessions, time.perf_counter() - started, (before[0], most[0]), (before[1], most[1])
    )


async def measure(
    ports: Ports, pid: int, rounds: int, count: int, sessions: int
) -> tuple[list[float], float, Storm]:
    return (
        await takeover_times(ports, rounds),
        await replay_rate(ports, count),
        await resume_storm(ports, pid, sessions),
    )


def run(
    work: Path, hw: Headwater, command: str, progress: Callable[[str], None], quick: bool
) -> str:
    """Start two nodes (``headwater dev up --nodes 2``), measure; the "Sessions" section."""
    rounds, count, sessions = (5, 2_000, 50) if quick else (20, 20_000, 500)
    with ExitStack() as stack:
        nodes = hw.start(work, stack, 2)
        progress(f"sessions: {nodes.label} up")
        ports = (nodes.endpoints[0], nodes.endpoints[1])
        takeovers, rate, storm = asyncio.run(measure(ports, nodes.pids[1], rounds, count, sessions))
    ms = sorted(t * 1000 for t in takeovers)

    return wrap("sessions", [
        "## Sessions (takeover and replay)",
        "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on the same machine,"
        f" two Headwater nodes of `headwater dev up --nodes 2` (Redis stores, one Kafka log), "
        f"clients on each node's own port; command: `{command}`.",
        "",
        "| Scenario | Result |",
        "|---|---|",
        f"| takeover across nodes, CONNECT to CONNACK ({len(ms)} rounds) | p50 "
        f"{statistics.median(ms):.1f} ms, max {ms[-1]:.1f} ms |",
        f"| replay on reconnect to another node, {count:,} queued QoS 1 messages | "
        f"{rate:,.0f} msgs/s |",
        f"| resume storm: {storm.sessions} persistent sessions, each owed 2 QoS 1 messages, "
        f"reconnect to node 2 at once | all served in {storm.seconds:.1f} s; node 2 threads "
        f"{storm.threads[0]} before, {storm.threads[1]} at most; RSS {storm.rss_mib[0]:.0f} "
        f"-> {storm.rss_mib[1]:.0f} MiB |",
        "",
        "Takeover: node 2 asks node 1 over Redis to let go; node 1 closes the old connection, "
        "publishes its will and stores the session; node 2 acquires it. Replay: the reconnecting "
        "node's one catch-up consumer reads the session's partitions from its stored positions to "
        "the live offsets and the dispatcher delivers the QoS 1/2 matches (`router/catchup.py`); "
        "every session of the storm shares that consumer.",
    ])  # fmt: skip
