"""``python -m bench routing``: interest routing, the design's point: no node reads every message.

``headwater dev up --nodes 3 --partitions 12`` (one Kafka).  A topic's partition is Kafka's keyed
default partitioner on its routing key (its first two levels, the nodes' default depth),
``(murmur2(key) & 0x7fffffff) % P`` with Kafka's ``Utils.murmur2``, written out here: nothing is
imported from the product, and each node's ``assigned_partitions`` shows whether it agrees.

Layout: for every partition, ``devices`` topics ``rt/<device>/t`` that land on it; node k's
subscriber (one connection, QoS 1, one SUBSCRIBE of all its topics) takes the devices of the k-th
contiguous share of the partitions; one QoS 1 publisher connection per topic, the topics dealt
round robin over the nodes (so most messages cross nodes), each sending ``messages`` spread over
``seconds``.

Figures, per node: the partitions it reads (``assigned_partitions`` of its ``GET /stats``, read
while the subscribers are connected); the records and bytes its reader fetched
(``records_fetched``, ``bytes_fetched``: after the drain minus before the run) as shares of what
the log took in the run (records: the partitions' high watermarks, after minus before; bytes: the
value bytes of those records, read back from Kafka); what its subscriber received against what
the publishers had PUBACKed (lost = PUBACKed and never received).  A node reading every message
would show 100%; with this layout each shows about a third.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from contextlib import ExitStack, closing
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from bench.brokers import Broker, Headwater
from bench.load import Groups, Report, Role, Timing
from bench.measure import machine, node_stats
from bench.report import error_summary, fmt_pct, table, wrap

DEPTH = 2
"""The nodes' default routing depth: a topic's routing key is its first two levels."""


@dataclass(frozen=True)
class Settings:
    nodes: int = 3
    partitions: int = 12
    devices: int = 4
    """Topics per partition."""
    messages: int = 200
    """QoS 1 messages per topic."""
    seconds: float = 4.0


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2`` (seed 0x9747b28c), as the unsigned 32 bits Java's int holds."""
    m, mask = 0x5BD1E995, 0xFFFFFFFF
    h = 0x9747B28C ^ len(data)
    tail = len(data) & ~3
    for k in (int.from_bytes(data[i : i + 4], "little") for i in range(0, tail, 4)):
        k = (k * m) & mask
        k ^= k >> 24
        h = ((h * m) & mask) ^ ((k * m) & mask)
    rest = data[tail:]
    if rest:
        h ^= int.from_bytes(rest, "little")
        h = (h * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    return h ^ (h >> 15)


def partition_of(topic: str, partitions: int) -> int:
    key = "/".join(topic.split("/")[:DEPTH])
    return (murmur2(key.encode()) & 0x7FFFFFFF) % partitions


def plan(s: Settings) -> list[list[str]]:
    """Per node, its subscriber's topics: ``devices`` per partition of its contiguous share."""
    if s.partitions % s.nodes:
        raise ValueError(f"{s.partitions} partitions do not split evenly over {s.nodes} nodes")
    found: list[list[str]] = [[] for _ in range(s.partitions)]
    i = 0
    while any(len(topics) < s.devices for topics in found):
        topic = f"rt/d{i}/t"
        if len(mine := found[partition_of(topic, s.partitions)]) < s.devices:
            mine.append(topic)
        i += 1
    size = s.partitions // s.nodes
    shares = (found[k * size : (k + 1) * size] for k in range(s.nodes))
    return [[t for topics in share for t in topics] for share in shares]


def roles(b: Broker, wanted: list[list[str]], s: Settings) -> list[Role]:
    """One subscriber per node, then one publisher role per node (a connection per topic)."""
    subs = [
        Role("sub", at, 1, f"rs{k}", filters=tuple(mine), qos=1)
        for k, (at, mine) in enumerate(zip(b.endpoints, wanted, strict=True))
    ]
    every, n, pubs = sorted(t for mine in wanted for t in mine), len(b.endpoints), []
    for k, at in enumerate(b.endpoints):
        first = sum(len(every[j::n]) for j in range(k))
        pubs.append(Role("paced", at, len(every[k::n]), f"rp{k}", topics=tuple(every[k::n]),
                         first=first, qos=1, rate=s.messages / s.seconds))  # fmt: skip
    return [*subs, *pubs]


@dataclass
class NodeShare:
    node: str
    needed: list[int]
    assigned: list[int]
    records: int
    bytes: int
    received: int = 0
    acked: int = 0
    lost: int = 0


@dataclass
class Outcome:
    settings: Settings
    command: str
    headwater: str
    started: datetime.datetime = field(default_factory=lambda: datetime.datetime.now(datetime.UTC))
    records: int = 0
    bytes: int = 0
    nodes: list[NodeShare] = field(default_factory=list)
    error: str = ""


def run(
    work: Path, hw: Headwater, command: str, progress: Callable[[str], None], s: Settings
) -> Outcome:
    out = Outcome(s, command, hw.version)
    with ExitStack() as stack:
        try:
            b = hw.start(work, stack, s.nodes, up_args=["--partitions", str(s.partitions)])
            progress(f"{b.label} up: {', '.join(str(e.port) for e in b.endpoints)}")
            measure(b, s, out)
        except (RuntimeError, OSError) as exc:
            out.error = f"FAILED: {error_summary(str(exc))}"
    return out


def measure(b: Broker, s: Settings, out: Outcome) -> None:
    wanted = plan(s)
    topic = next(k.removeprefix("topic ") for k in b.state if k.startswith("topic "))
    rs = roles(b, wanted, s)
    groups = Groups(rs)
    try:
        groups.ready()
        with closing(LogCounts(b.state["kafka"], topic, s.partitions)) as log:
            before, start = [node_stats(u) for u in b.stats], time.monotonic() + 0.5
            groups.go(Timing(start, start, start + s.seconds, drain_idle=3.0, drain_max=30.0))
            time.sleep(max(0.0, start + s.seconds - time.monotonic()))
            during = [node_stats(u) for u in b.stats]
            reports = groups.reports(120.0)
            after = [node_stats(u) for u in b.stats]
            out.records, out.bytes = log.grown(), log.value_bytes()
    finally:
        groups.close()
    acked = Report()
    for report in reports[len(wanted) :]:
        acked.merge(report)
    pub_of = {t: r.first + k for r in rs for k, t in enumerate(r.topics)}
    size = s.partitions // s.nodes
    for k, (sub, mine) in enumerate(zip(reports[: len(wanted)], wanted, strict=True)):
        sub.acked = {pub_of[t]: acked.acked.get(pub_of[t], set()) for t in mine}
        out.nodes.append(NodeShare(
            f"node {k + 1}", list(range(k * size, (k + 1) * size)),
            sorted(int(p) for p in during[k]["assigned_partitions"]),
            after[k]["records_fetched"] - before[k]["records_fetched"],
            after[k]["bytes_fetched"] - before[k]["bytes_fetched"],
            sub.received, sum(len(a) for a in sub.acked.values()), sub.lost(),
        ))  # fmt: skip


class LogCounts:
    """The log's partitions at the start, and what they took since (high watermarks, bytes)."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-routing",
                                  "enable.auto.commit": False})  # fmt: skip
        self.topic, self.partitions = topic, partitions
        self.before = self.highs()

    def highs(self) -> list[int]:
        return [
            self.consumer.get_watermark_offsets(TopicPartition(self.topic, p), 10.0)[1]
            for p in range(self.partitions)
        ]

    def grown(self) -> int:
        self.after = self.highs()
        return sum(a - b for a, b in zip(self.after, self.before, strict=True))

    def value_bytes(self, timeout: float = 30.0) -> int:
        """Value bytes of the records between ``before`` and ``after``, read back."""
        pairs = enumerate(zip(self.before, self.after, strict=True))
        left = {p: a - 1 for p, (b, a) in pairs if a > b}
        self.consumer.assign([TopicPartition(self.topic, p, self.before[p]) for p in left])
        total, deadline = 0, time.monotonic() + timeout
        while left and time.monotonic() < deadline:
            for m in self.consumer.consume(1000, 1.0):
                p, offset = m.partition(), m.offset()
                if m.error() is not None or p not in left or offset is None or offset > left[p]:
                    continue
                total += len(m.value() or b"")
                if offset == left[p]:
                    del left[p]
        return total

    def close(self) -> None:
        self.consumer.close()


def render(out: Outcome) -> str:
    s = out.settings
    topics = s.partitions * s.devices
    lines = [
        "## Interest routing: what each node reads of the log",
        "",
        "| | |",
        "|---|---|",
        f"| Date | {out.started:%Y-%m-%d %H:%M} UTC |",
        f"| Machine | {machine()} |",
        f"| Headwater | {out.headwater}, `headwater dev up --nodes {s.nodes} --partitions "
        f"{s.partitions}` (one Kafka) |",
        f"| Command | `{out.command}` |",
        "",
    ]
    if out.error:
        return wrap("routing", [*lines, out.error])
    rows = [
        [n.node, spans(n.needed), ", ".join(map(str, n.assigned)),
         f"{n.records:,} / {out.records:,} ({fmt_pct(n.records / max(1, out.records))})",
         f"{n.bytes:,} / {out.bytes:,} ({fmt_pct(n.bytes / max(1, out.bytes))})",
         f"{n.received:,} / {n.acked:,}", f"{n.lost:,}"]
        for n in out.nodes
    ]  # fmt: skip
    head = ["node", "partitions its subscriber needs", "partitions it read (its /stats)",
            "records it read / the log's", "bytes it read / the log's",
            "delivered / PUBACKed", "lost"]  # fmt: skip
    return wrap("routing", [
        *lines,
        f"{topics * s.messages:,} QoS 1 messages ({s.messages} to each of {topics} topics "
        f"`rt/<device>/t`, {s.devices} per partition) over {s.seconds:g} s, one publisher "
        f"connection per topic, the topics dealt round robin over the {s.nodes} nodes; node k's "
        "subscriber takes the devices of the k-th third of the partitions.",
        "",
        *table(head, rows),
        "",
        "Read: the node's `records_fetched` and `bytes_fetched` (GET /stats) over the run; the "
        "log's: its partitions' high watermarks over the run, and those records' value bytes "
        "read back from Kafka (a node reading every message would show 100%); the log also "
        "holds the nodes' own records (`$SYS` reports), read by the node whose partitions carry "
        "them. Lost: PUBACKed and never received by the subscriber whose topic it was.",
    ])  # fmt: skip


def spans(partitions: list[int]) -> str:
    return f"{partitions[0]}-{partitions[-1]}" if partitions else "-"
