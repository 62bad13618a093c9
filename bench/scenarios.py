"""The benchmark's scenarios and how one runs against one broker.

A scenario is a layout of load groups (see :mod:`bench.load`) over a broker's nodes:

=================== ============================================================================
fanin-qos0/1        4 publishers -> 1 subscriber, publishers and subscriber at QoS 0 (or 1)
fanout-qos0         1 publisher -> 50 subscribers of one topic, QoS 0
latency-qos0/1      1 publisher at a steady rate (1,000 msg/s) -> 1 subscriber; end-to-end p50/p99
cluster-*           the same on 3 Headwater nodes: publishers on node 1, subscribers on node 2
routing             3 nodes, a 12-partition log, a fixed mix over 48 device topics; each node's
                    subscriber needs a third of them: bytes each node fetches vs. the whole log
paced-qos1          4 publishers -> 1 subscriber, QoS 1, open loop paced at 20,000 msg/s in all
                    (:mod:`bench.paced`): offered, PUBACKed, lost, duplicates, p50/p99/max
cluster-paced-qos1  the same, publishers on node 1, subscriber on node 2
workers             Headwater on one node with ``--workers 1`` then ``--workers 2``: fan-in QoS 0
                    and QoS 1 on each (:mod:`bench.worker_scaling`)
=================== ============================================================================

Throughput runs publish flat out (QoS 0: pre-encoded batches, TCP backpressure only; QoS 1: a
window of in-flight packets per connection) for ``warmup + duration`` seconds; the rate reported
is messages *arriving at subscribers* during ``duration``.  Loss compares everything the
subscribers received (after a drain) with what was published times the subscribers per message.

Publishers run in one worker process and subscribers in another (fan-out: ``--sub-procs``).
Topics are unique per run (``bench/<run tag>.../t``), so no run sees another's messages.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

from bench.brokers import BenchKafka, Endpoint, RunningBroker, node_stats
from bench.cpu import CpuMeter, MachineMeter
from bench.load import ClientPlan, Group, GroupPlan, Report, Timing, shared_counters
from bench.log_bytes import high_watermarks, value_bytes
from router.partitioner import Router

Kind = Literal["throughput", "latency", "routing", "paced", "workers"]

READY_TIMEOUT = 60.0
ROUTING_PARTITIONS = 12
ROUTING_DEPTH = 2
ROUTING_NODES = 3
DEVICES_PER_PARTITION = 4


@dataclass(frozen=True, slots=True)
class Scenario:
    key: str
    number: str
    title: str
    kind: Kind
    qos: int = 0
    cluster: bool = False
    compare_to: str | None = None
    """For a cluster scenario: the single-node scenario the other brokers are shown from."""

    @property
    def metric(self) -> str:
        if self.kind == "latency":
            return "p50 / p99 ms"
        if self.kind == "routing":
            return "bytes fetched / log bytes"
        if self.kind == "paced":
            return "msgs/s delivered; lost; p99 ms"
        return "deliveries/s" if self.key.startswith("fanout") else "msgs/s delivered"


SCENARIOS: dict[str, Scenario] = {
    s.key: s
    for s in (
        Scenario("fanin-qos0", "1", "fan-in QoS 0, 4 pub -> 1 sub", "throughput", 0),
        Scenario("fanin-qos1", "2", "fan-in QoS 1, 4 pub -> 1 sub", "throughput", 1),
        Scenario("fanout-qos0", "3", "fan-out QoS 0, 1 pub -> 50 sub", "throughput", 0),
        Scenario("latency-qos0", "4a", "latency QoS 0 at a steady rate", "latency", 0),
        Scenario("latency-qos1", "4b", "latency QoS 1 at a steady rate", "latency", 1),
        Scenario(
            "cluster-fanin-qos0", "5a", "cross-node fan-in QoS 0 (pub n1, sub n2)",
            "throughput", 0, True, "fanin-qos0",
        ),
        Scenario(
            "cluster-fanin-qos1", "5b", "cross-node fan-in QoS 1 (pub n1, sub n2)",
            "throughput", 1, True, "fanin-qos1",
        ),
        Scenario(
            "cluster-latency-qos0", "6a", "cross-node latency QoS 0 (n1 -> n2)",
            "latency", 0, True, "latency-qos0",
        ),
        Scenario(
            "cluster-latency-qos1", "6b", "cross-node latency QoS 1 (n1 -> n2)",
            "latency", 1, True, "latency-qos1",
        ),
        Scenario("routing", "7", "interest routing, 3 nodes, P=12", "routing", 1, True),
        Scenario("paced-qos1", "8", "fan-in QoS 1, 4 pub -> 1 sub, paced", "paced", 1),
        Scenario(
            "cluster-paced-qos1", "9", "cross-node fan-in QoS 1 (pub n1, sub n2), paced",
            "paced", 1, True, "paced-qos1",
        ),
        Scenario("workers", "10", "worker scaling, 1 node, --workers 1 vs 2", "workers", 0),
    )
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Settings:
    duration: float = 10.0
    warmup: float = 2.0
    rate: float = 1000.0
    window: int = 100
    publishers: int = 4
    fanout: int = 50
    sub_procs: int = 1
    payload: int = 64
    routing_messages: int = 200
    """Messages per device topic in the routing scenario."""
    backlog: int = 1000
    """Bounded throughput runs: messages publishers may be ahead of subscribers (0: no such run)."""
    settle_max: float = 60.0
    """Before a run, wait up to this long for the brokers to finish the previous run's work."""
    drain_max: float = 10.0
    paced_rate: float = 20_000.0
    """Paced scenarios: messages per second scheduled, over all publishers."""
    paced_window: int = 1_000
    """Paced scenarios: unacknowledged QoS 1 PUBLISHes per publisher before its pacer waits."""
    workers: tuple[int, ...] = (1, 2)
    """Worker scaling: the ``--workers`` values compared."""


@dataclass(slots=True)
class NodeShare:
    node: str
    partitions: list[int]
    value_bytes: int
    share: float
    received: int
    expected: int
    computed_bytes: int
    """Value bytes of the new records in ``partitions``, read back from Kafka."""


@dataclass(slots=True)
class Result:
    scenario: str
    broker: str
    label: str
    variant: str = ""
    """Throughput runs: "flood" (open loop) or "bounded" (publishers at most ``backlog``
    messages ahead of the subscribers)."""
    ok: bool = True
    error: str = ""
    offered: float = 0.0
    delivered: float = 0.0
    sent: int = 0
    received: int = 0
    expected: int = 0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    max_ms: float = 0.0
    samples: int = 0
    load_cpu: dict[str, float] = field(default_factory=dict)
    broker_cpu: list[float] = field(default_factory=list)
    kafka_cpu: float | None = None
    broker_waited: list[float] = field(default_factory=list)
    """Paced runs: per node, the share of the window its main thread waited for a CPU."""
    other_cpu: float | None = None
    """Cores used by processes outside the benchmark during the window."""
    shares: list[NodeShare] = field(default_factory=list)
    log_bytes: int = 0
    notes: list[str] = field(default_factory=list)
    scheduled_rate: float = 0.0
    """Paced runs: messages per second the schedule called for."""
    acked: int = 0
    """Paced runs: distinct messages PUBACKed by the broker."""
    lost: int | None = None
    """Paced runs: PUBACKed and never received after the drain."""
    duplicates: int = 0
    cross_worker: float | None = None
    """Worker scaling: share of the messages published on a worker other than the
    subscriber's (they reach it through Kafka)."""

    @property
    def loss(self) -> float:
        if self.lost is not None:
            return self.lost / self.acked if self.acked else 0.0
        if self.expected <= 0:
            return 0.0
        return max(0, self.expected - self.received) / self.expected

    @property
    def schedule_share(self) -> float:
        """Paced runs: the share of the schedule actually sent during the measured window."""
        return self.offered / self.scheduled_rate if self.scheduled_rate else 0.0


# -- driving load groups ----------------------------------------------------------------------


@dataclass(slots=True)
class Run:
    pubs: list[Report]
    subs: list[Report]
    broker_cpu: list[float]
    kafka_cpu: float | None
    other_cpu: float
    """Cores the rest of the machine used meanwhile."""
    window: float


def drive(
    broker: RunningBroker,
    sub_plans: list[GroupPlan],
    pub_plans: list[GroupPlan],
    timing_for: Callable[[float], Timing],
    before_close: Callable[[], None] | None = None,
    profile_name: str = "run",
    fixed: bool = False,
) -> Run:
    """Start the groups (subscribers first), run them on one timeline, collect their reports;
    ``before_close`` runs once everything is delivered, while the clients are still connected."""
    with ExitStack() as stack:
        delivered = shared_counters(len(sub_plans))
        subs = [Group(p, delivered) for p in sub_plans]
        for g in subs:
            stack.callback(g.stop)
        for g in subs:
            g.expect("ready", READY_TIMEOUT)
        pubs = [Group(p, delivered) for p in pub_plans]
        for g in pubs:
            stack.callback(g.stop)
        for g in pubs:
            g.expect("ready", READY_TIMEOUT)
        timing = timing_for(time.monotonic() + 0.5)
        for g in subs + pubs:
            g.send("go", timing)
        meter = CpuMeter(broker.pids)
        kafka_meter = CpuMeter([broker.kafka.pid]) if broker.kafka is not None else None
        ours = broker.pids + [g.process.pid or 0 for g in subs + pubs]
        ours += [os.getpid()] + ([broker.kafka.pid] if broker.kafka is not None else [])
        machine = MachineMeter(ours)
        sleep_until(timing.measure_from)
        meter.restart()
        machine.restart()
        if kafka_meter is not None:
            kafka_meter.restart()
        for profile in broker.profiles:
            profile.request()  # the warm-up's profile: overwritten below
        if not fixed:  # a fixed-count run ends when its reports come, ``end`` is a deadline
            sleep_until(timing.end)
        asked = [profile.request() for profile in broker.profiles]
        window = min(time.monotonic(), timing.end) - timing.measure_from
        broker_cpu = [used / window for used in broker.cpu_per_node(meter.used())]
        other_cpu = machine.others() / window
        kafka_cpu = kafka_meter.used()[0] / window if kafka_meter is not None else None
        wait = timing.ack_wait + timing.drain_max + 30.0
        wait = max(wait, timing.end - time.monotonic() + wait)
        pub_reports = [g.expect("report", wait) for g in pubs]
        sub_reports = [g.expect("report", wait) for g in subs]
        if before_close is not None:
            before_close()
    for k, (profile, at) in enumerate(zip(broker.profiles, asked, strict=True), 1):
        profile.keep(at, f"{profile_name}.n{k}.prof")
    return Run(pub_reports, sub_reports, broker_cpu, kafka_cpu, other_cpu, window)


def sleep_until(when: float) -> None:
    delay = when - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def timeline(settings: Settings) -> Callable[[float], Timing]:
    def at(start: float) -> Timing:
        measure_from = start + settings.warmup
        return Timing(
            start=start,
            measure_from=measure_from,
            end=measure_from + settings.duration,
            drain_max=settings.drain_max,
        )

    return at


def split(items: list[ClientPlan], parts: int) -> list[tuple[ClientPlan, ...]]:
    parts = max(1, min(parts, len(items)))
    return [tuple(items[i::parts]) for i in range(parts)]


def common_result(scenario: Scenario, broker: RunningBroker, run: Run) -> Result:
    result = Result(scenario.key, broker.name, broker.label)
    result.sent = sum(r.sent for r in run.pubs)
    result.received = sum(r.received for r in run.subs)
    result.offered = sum(r.sent_window for r in run.pubs) / run.window
    result.delivered = sum(r.received_window for r in run.subs) / run.window
    result.load_cpu = {r.name: r.cpu_share for r in run.pubs + run.subs}
    result.broker_cpu = run.broker_cpu
    result.kafka_cpu = run.kafka_cpu
    result.other_cpu = run.other_cpu
    for report in run.pubs + run.subs:
        result.notes.extend(report.errors)
    return result


# -- the scenarios ----------------------------------------------------------------------------


def endpoints_for(scenario: Scenario, broker: RunningBroker) -> tuple[Endpoint, Endpoint]:
    """(publisher endpoint, subscriber endpoint): node 1 and node 2 in a cluster scenario."""
    if scenario.cluster:
        return broker.endpoints[0], broker.endpoints[1]
    return broker.endpoints[0], broker.endpoints[0]


def run_throughput(
    scenario: Scenario, broker: RunningBroker, settings: Settings, tag: str, backlog: int
) -> Result:
    """One throughput run: open loop (``backlog`` 0) or bounded (publishers at most ``backlog``
    messages ahead of the subscribers)."""
    pub_at, sub_at = endpoints_for(scenario, broker)
    qos = scenario.qos
    if scenario.key.startswith("fanout"):
        topic = f"bench/{tag}/t"
        publishers = [ClientPlan(f"{tag}-pub0", pub_at, (topic,), qos)]
        subscribers = [
            ClientPlan(f"{tag}-sub{i}", sub_at, (topic,), qos) for i in range(settings.fanout)
        ]
        per_message = settings.fanout
    else:
        topics = [f"bench/{tag}-p{i}/t" for i in range(settings.publishers)]
        publishers = [ClientPlan(f"{tag}-pub{i}", pub_at, (t,), qos) for i, t in enumerate(topics)]
        subscribers = [ClientPlan(f"{tag}-sub0", sub_at, tuple(topics), qos)]
        per_message = 1
    sub_plans = [
        GroupPlan(f"subscribers{i}", "sub", clients, payload_size=settings.payload, slot=i)
        for i, clients in enumerate(split(subscribers, settings.sub_procs))
    ]
    pub_plans = [
        GroupPlan(
            "publishers", "pub", tuple(publishers), window=settings.window,
            payload_size=settings.payload, backlog=backlog, per_message=per_message,
        )
    ]  # fmt: skip
    variant = "bounded" if backlog else "flood"
    run = drive(
        broker, sub_plans, pub_plans, timeline(settings), profile_name=f"{scenario.key}-{variant}"
    )
    result = common_result(scenario, broker, run)
    result.variant = variant
    result.expected = result.sent * per_message
    return result


def run_latency(scenario: Scenario, broker: RunningBroker, settings: Settings, tag: str) -> Result:
    pub_at, sub_at = endpoints_for(scenario, broker)
    topic = f"bench/{tag}/lat"
    sub = ClientPlan(f"{tag}-sub", sub_at, (topic,), scenario.qos)
    pub = ClientPlan(f"{tag}-pub", pub_at, (topic,), scenario.qos)
    sub_plans = [GroupPlan("subscriber", "sub", (sub,), timestamps=True)]
    pub_plans = [
        GroupPlan(
            "publisher", "pub", (pub,), mode="paced", rate=settings.rate,
            window=settings.window, payload_size=settings.payload,
        )
    ]  # fmt: skip
    run = drive(broker, sub_plans, pub_plans, timeline(settings), profile_name=scenario.key)
    result = common_result(scenario, broker, run)
    result.expected = result.sent
    latencies = sorted(ns for r in run.subs for ns in r.latencies_ns)
    result.samples = len(latencies)
    if latencies:
        result.p50_ms = percentile(latencies, 50) / 1e6
        result.p99_ms = percentile(latencies, 99) / 1e6
        result.max_ms = latencies[-1] / 1e6
    else:
        result.ok = False
        result.error = "no latency samples arrived"
    return result


def percentile(ordered: list[int], pct: float) -> float:
    if len(ordered) == 1:
        return float(ordered[0])
    return statistics.quantiles(ordered, n=100, method="inclusive")[int(pct) - 1]


# -- interest routing -------------------------------------------------------------------------


def routing_devices(router: Router, per_partition: int) -> dict[int, list[str]]:
    """Device ids whose topics ``bench/<device>/t`` fill every partition ``per_partition`` times."""
    devices: dict[int, list[str]] = {p: [] for p in range(router.num_partitions)}
    i = 0
    while any(len(d) < per_partition for d in devices.values()):
        device = f"dev{i}"
        found = devices[router.partition_for_topic(f"bench/{device}/t")]
        if len(found) < per_partition:
            found.append(device)
        i += 1
    return devices


def node_partitions(num_partitions: int, nodes: int) -> list[list[int]]:
    """Contiguous thirds (for 3 nodes) of the partitions."""
    size = num_partitions // nodes
    return [list(range(k * size, (k + 1) * size)) for k in range(nodes)]


def run_routing(
    scenario: Scenario, broker: RunningBroker, kafka: BenchKafka, settings: Settings
) -> Result:
    assert broker.topic is not None
    router = Router(broker.partitions, ROUTING_DEPTH)
    devices = routing_devices(router, DEVICES_PER_PARTITION)
    node_sets = node_partitions(broker.partitions, len(broker.endpoints))
    sub_topics = [tuple(f"bench/{d}/t" for p in parts for d in devices[p]) for parts in node_sets]
    subscribers = [
        ClientPlan(f"routing-sub{k + 1}", at, topics, 1)
        for k, (at, topics) in enumerate(zip(broker.endpoints, sub_topics, strict=True))
    ]
    all_topics = sorted(f"bench/{d}/t" for ds in devices.values() for d in ds)
    publishers = [  # each node publishes a third of the topics, so most traffic crosses nodes
        ClientPlan(f"routing-pub{k + 1}", at, tuple(all_topics[k :: len(broker.endpoints)]), 1)
        for k, at in enumerate(broker.endpoints)
    ]
    m = settings.routing_messages
    expected = [len(t) * m for t in sub_topics]
    sub_plans = [GroupPlan("subscribers", "sub", tuple(subscribers), expected=sum(expected))]
    pub_plans = [
        GroupPlan(
            "publishers", "pub", tuple(publishers), mode="fixed", count=m,
            window=settings.window, payload_size=settings.payload, backlog=settings.backlog,
        )
    ]  # fmt: skip

    def fixed(start: float) -> Timing:
        return Timing(start, start, start + 120.0, drain_idle=3.0, drain_max=0.0)

    stats_before = [node_stats(port) for port in broker.stats_ports]
    stats_after: list[dict[str, Any]] = []
    before = high_watermarks(kafka.bootstrap, broker.topic, broker.partitions)
    run = drive(
        broker, sub_plans, pub_plans, fixed,
        before_close=lambda: stats_after.extend(node_stats(p) for p in broker.stats_ports),
        profile_name=scenario.key,
        fixed=True,
    )  # fmt: skip
    after = high_watermarks(kafka.bootstrap, broker.topic, broker.partitions)
    per_partition = value_bytes(kafka.bootstrap, broker.topic, before, after)
    total = sum(b.value_bytes for b in per_partition.values())
    result = Result(scenario.key, broker.name, broker.label)
    result.sent = sum(r.sent for r in run.pubs)
    result.received = sum(r.received for r in run.subs)
    result.expected = sum(expected)
    result.log_bytes = total
    received = run.subs[0].per_client
    for k, parts in enumerate(node_sets):
        needed = sorted(set().union(*(router.partitions_for_filter(t) for t in sub_topics[k])))
        computed = sum(per_partition[p].value_bytes for p in needed)
        share = NodeShare(
            f"n{k + 1}", needed, computed, computed / total if total else 0.0,
            received[k], expected[k], computed,
        )  # fmt: skip
        if stats_after:
            fetched = stats_after[k]["bytes_fetched"] - stats_before[k]["bytes_fetched"]
            share.partitions = sorted(int(p) for p in stats_after[k]["assigned_partitions"])
            share.value_bytes, share.share = fetched, fetched / total if total else 0.0
        result.shares.append(share)
        if needed != parts:
            result.notes.append(f"n{k + 1} needs partitions {needed}, planned {parts}")
    if stats_after:
        result.notes.append(
            "bytes fetched: each node's own `bytes_fetched` counter (GET /stats) over the run; "
            "partitions: the node's `assigned_partitions` while subscribed; 'computed' = value "
            "bytes of those partitions' new records read back from Kafka"
        )
    else:
        result.notes.append(
            "bytes fetched per node computed from Kafka: value bytes of the new records in the "
            "partitions its subscriptions need (router.partitions_for_filter); the nodes expose "
            "no fetch counter"
        )
    return result


def run_scenario(
    scenario: Scenario,
    broker: RunningBroker,
    settings: Settings,
    tag: str,
    kafka: BenchKafka | None,
    backlog: int = 0,
) -> Result:
    """One run of a scenario against one running broker (a throughput scenario: open loop, or
    bounded to ``backlog``); a failure becomes a failed result."""
    run: Callable[[], Result]
    variant = ""
    if scenario.kind == "throughput":
        variant = "bounded" if backlog else "flood"
        run = partial(run_throughput, scenario, broker, settings, tag, backlog)
    else:
        run = partial(run_other, scenario, broker, settings, tag, kafka)
    try:
        return run()
    except (RuntimeError, TimeoutError, OSError) as exc:
        failed = Result(scenario.key, broker.name, broker.label, ok=False, error=str(exc))
        failed.variant = variant
        return failed


def run_other(
    scenario: Scenario,
    broker: RunningBroker,
    settings: Settings,
    tag: str,
    kafka: BenchKafka | None,
) -> Result:
    if scenario.kind == "latency":
        return run_latency(scenario, broker, settings, tag)
    assert kafka is not None
    return run_routing(scenario, broker, kafka, settings)
