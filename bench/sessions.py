"""``python -m bench.sessions``: what a session costs to move: takeover time and replay rate.

Two Headwater nodes with Redis stores share one Kafka log.  Measured:

* **takeover**: a client is connected (cleanSession=0, with a will) to node 1; the same client id
  connects to node 2.  Time from the second CONNECT sent to its CONNACK received: node 2 asks
  node 1 to let go, node 1 closes the old connection, publishes the will and stores the session,
  node 2 acquires it.  Repeated, p50 and max reported.
* **replay**: a persistent subscriber (QoS 1) leaves; N QoS 1 messages are published meanwhile;
  it reconnects to the other node.  Rate = N / (time from CONNACK to the N-th message), the
  subscriber acknowledging each as it arrives: messages read back from the log, filtered by the
  session's subscriptions, and delivered through the in-flight window.
* **resume storm**: S persistent sessions (one topic each) leave node 1, are each owed 2 QoS 1
  messages, and all reconnect to node 2 at once.  Reported: the time until every one has its
  messages, and node 2's threads (``/proc/<pid>/task``) and resident memory before and at most
  during the storm, sampled every 20 ms.

The result is printed and written as the "Sessions" section of ``docs/benchmarks.md`` (between
markers, so the main benchmark's report and this one can be regenerated independently).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from headwater.services.kafka import LocalKafka
from headwater.services.kafka_admin import ensure_topic
from headwater.services.ports import free_port
from headwater.services.process import ChildProcess
from headwater.services.redis_server import LocalRedis
from mqttcore.codec import Decoder, encode
from mqttcore.packets import (
    Connack,
    Connect,
    Disconnect,
    Packet,
    Puback,
    Publish,
    Subscribe,
    Will,
)
from router.topics import messages_topic

REPORT = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
BEGIN, END = "<!-- sessions:begin -->", "<!-- sessions:end -->"
PARTITIONS = 12


class Client:
    """Just enough MQTT to drive the measurements."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.decoder = Decoder()
        self.pending: list[Packet] = []

    @classmethod
    async def connect(cls, port: int, connect: Connect) -> tuple[Client, Connack]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        client = cls(reader, writer)
        client.send(connect)
        connack = await client.recv()
        assert isinstance(connack, Connack) and connack.return_code == 0, connack
        return client, connack

    def send(self, packet: Packet) -> None:
        self.writer.write(encode(packet))

    async def recv(self, timeout: float = 30.0) -> Packet:
        while not self.pending:
            data = await asyncio.wait_for(self.reader.read(1 << 16), timeout)
            if not data:
                raise ConnectionError("closed by the server")
            self.pending.extend(self.decoder.feed(data))
        return self.pending.pop(0)

    def close(self) -> None:
        self.writer.close()


async def takeover_times(ports: tuple[int, int], rounds: int) -> list[float]:
    times = []
    for i in range(rounds):
        will = Will("bench/wills", b"gone", 1)
        connect = Connect(f"mover-{i}", clean_session=False, keep_alive=60, will=will)
        old, _ = await Client.connect(ports[0], connect)
        started = time.perf_counter()
        new, connack = await Client.connect(ports[1], connect)
        times.append(time.perf_counter() - started)
        assert connack.session_present
        new.close()
        old.close()
    return times


async def replay_rate(ports: tuple[int, int], count: int) -> float:
    connect = Connect("replayer", clean_session=False, keep_alive=60)
    sub, _ = await Client.connect(ports[0], connect)
    sub.send(Subscribe(1, (("replay/#", 1),)))
    await sub.recv()
    sub.close()
    pub, _ = await Client.connect(ports[1], Connect("replay-pub"))
    for i in range(count):
        pub.send(Publish(f"replay/{i % 50}/t", b"x" * 64, qos=1, packet_id=i % 65535 + 1))
        if i % 500 == 499:
            await pub.writer.drain()
    acks = 0
    while acks < count:
        if isinstance(await pub.recv(), Puback):
            acks += 1
    back, connack = await Client.connect(ports[1], connect)
    assert connack.session_present
    started = time.perf_counter()
    received = 0
    while received < count:
        packet = await back.recv()
        if isinstance(packet, Publish):
            back.send(Puback(packet.packet_id or 0))
            received += 1
    elapsed = time.perf_counter() - started
    back.close()
    pub.close()
    return count / elapsed


@dataclass(slots=True)
class Storm:
    sessions: int
    seconds: float
    threads: tuple[int, int]
    rss_mib: tuple[float, float]


def _threads_and_rss(pid: int) -> tuple[int, float]:
    status = Path(f"/proc/{pid}/status").read_text()
    rss_kib = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS"))
    return len(os.listdir(f"/proc/{pid}/task")), rss_kib / 1024


async def _leave_subscribed(port: int, i: int) -> None:
    client, _ = await Client.connect(port, Connect(f"storm-{i}", clean_session=False))
    client.send(Subscribe(1, ((f"storm/{i}/cmd", 1),)))
    await client.recv()
    client.send(Disconnect())
    await client.writer.drain()
    client.close()


async def _come_back(port: int, i: int) -> None:
    client, connack = await Client.connect(port, Connect(f"storm-{i}", clean_session=False))
    assert connack.session_present
    received = 0
    while received < 2:
        packet = await client.recv()
        if isinstance(packet, Publish):
            client.send(Puback(packet.packet_id or 0))
            received += 1
    client.close()


async def resume_storm(ports: tuple[int, int], pid: int, sessions: int) -> Storm:
    for start in range(0, sessions, 100):
        await asyncio.gather(
            *(_leave_subscribed(ports[0], i) for i in range(start, min(start + 100, sessions)))
        )
    pub, _ = await Client.connect(ports[0], Connect("storm-pub"))
    for n in range(2 * sessions):
        pub.send(Publish(f"storm/{n % sessions}/cmd", b"x" * 64, qos=1, packet_id=n % 65535 + 1))
    acks = 0
    while acks < 2 * sessions:
        acks += isinstance(await pub.recv(), Puback)
    pub.close()
    threads, rss = before = _threads_and_rss(pid)
    started = time.perf_counter()
    storm = asyncio.gather(*(_come_back(ports[1], i) for i in range(sessions)))
    while not storm.done():
        now = _threads_and_rss(pid)
        threads, rss = max(threads, now[0]), max(rss, now[1])
        await asyncio.sleep(0.02)
    await storm
    return Storm(sessions, time.perf_counter() - started, (before[0], threads), (before[1], rss))


def start_nodes(stack: ExitStack, bootstrap: str, redis_url: str, work: Path) -> tuple[int, int]:
    topic = f"bench.sessions.{os.getpid()}"
    ensure_topic(bootstrap, topic, PARTITIONS, messages_topic(PARTITIONS).config)
    ports = []
    pids.clear()
    for i in (1, 2):
        port = free_port()
        argv = [sys.executable, "-m", "frontend", "--node-id", f"s{i}", "--listen",
                f"127.0.0.1:{port}", "--kafka-bootstrap", bootstrap, "--redis-url", redis_url,
                "--redis-prefix", f"bench{os.getpid()}:", "--topic", topic,
                "--partitions", str(PARTITIONS), "--log-level", "WARNING"]  # fmt: skip
        child = ChildProcess.spawn(f"s{i}", argv, work / f"s{i}.log")
        stack.callback(child.stop, 15.0)
        ports.append(port)
        pids.append(child.pid)
    return ports[0], ports[1]


async def wait_ready(ports: tuple[int, int]) -> None:
    for port in ports:
        for _ in range(300):
            try:
                client, _ = await Client.connect(port, Connect("probe"))
                client.close()
                break
            except (OSError, AssertionError):
                await asyncio.sleep(0.1)


pids: list[int] = []
"""The node processes' ids, in start order."""


def report(takeovers: list[float], rate: float, count: int, storm: Storm, command: str) -> str:
    ms = sorted(t * 1000 for t in takeovers)
    return "\n".join([
        BEGIN,
        "## Sessions (takeover and replay)",
        "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on the same machine,"
        f" two Headwater nodes with Redis stores on one Kafka log; command: `{command}`.",
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
        "publishes its will and stores the session; node 2 acquires it (`frontend/cluster.py`, "
        "`frontend/sessions/manager.py`). Replay: the reconnecting node's one catch-up consumer "
        "reads the session's partitions from its stored positions to the live offsets and the "
        "dispatcher delivers the QoS 1/2 matches (`router/catchup.py`, `Dispatcher.replay`); "
        "every session of the storm shares that consumer.",
        END,
    ])  # fmt: skip


def write_section(section: str) -> None:
    text = REPORT.read_text() if REPORT.exists() else "# Benchmarks\n"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + section + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    REPORT.write_text(text)


async def measure(
    ports: tuple[int, int], rounds: int, count: int, sessions: int
) -> tuple[list[float], float, Storm]:
    await wait_ready(ports)
    takeovers = await takeover_times(ports, rounds)
    rate = await replay_rate(ports, count)
    return takeovers, rate, await resume_storm(ports, pids[1], sessions)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sessions")
    parser.add_argument("--rounds", type=int, default=20, help="takeovers to time [20]")
    parser.add_argument("--messages", type=int, default=20_000, help="queued messages [20000]")
    parser.add_argument("--sessions", type=int, default=500, help="resume storm size [500]")
    parser.add_argument("--no-report", action="store_true", help="print only")
    args = parser.parse_args(argv)
    command = "python -m bench.sessions " + " ".join(argv if argv is not None else sys.argv[1:])
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="hwsessions-") as tmp:
        work = Path(tmp)
        bootstrap = os.environ.get("HEADWATER_KAFKA_BOOTSTRAP")
        if not bootstrap:
            kafka = LocalKafka(work / "kafka")
            bootstrap = kafka.start()
            stack.callback(kafka.stop)
        redis_url = os.environ.get("HEADWATER_REDIS_URL")
        if not redis_url:
            redis = LocalRedis(work / "redis")
            redis_url = redis.start()
            stack.callback(redis.stop)
        ports = start_nodes(stack, bootstrap, redis_url, work)
        measured = asyncio.run(measure(ports, args.rounds, args.messages, args.sessions))
    section = report(*measured[:2], args.messages, measured[2], command.strip())
    print(section)
    if not args.no_report:
        write_section(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
