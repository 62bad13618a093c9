"""``python -m bench throughput``: issue 26's table, each broker driven by the same load generator.

Every broker is started first (``headwater dev up`` of one node, or two with ``--nodes 2``;
mosquitto; amqtt when named), Kafka is warmed by ``--kafka-warmup`` seconds of QoS 1 traffic
through the node, then each scenario runs against each broker in turn (mosquitto first), one run
at a time, after every broker has gone idle: a change in the machine's load hits them alike.
Payloads are 64 bytes; each run has ``--warmup`` seconds before a measured window of
``--duration`` seconds.  Publishers go to node 1, subscribers to the last node.

Figures: delivered messages per second in the window at the subscribers; latency send -> receive
of messages sent in the window (p50/p99); lost = QoS 1 PUBACKed and never received, QoS 0 sent and
never received, after a drain (until nothing came for 5 s at QoS 1, 2 s at QoS 0); each
open-loop scenario reports its loss; broker CPU microseconds per delivered
message (or per CONNECT cycle) = ``utime + stime`` of the broker's processes (``/proc``) over the
window, divided by what the window delivered.
"""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from bench import brokers, kafka_floor
from bench.brokers import Broker
from bench.load import Groups, Kind, Report, Role, Timing
from bench.measure import (
    KERNEL_COUNTERS,
    Meter,
    Steal,
    jit_seconds,
    machine,
    percentile,
    settle,
    tcp_counters,
    tree_cpu_seconds,
)
from bench.report import error_summary, fmt_pct, table, wrap

SETTLED_CPU = 0.15
"""Before a run, every broker's processes together use less than this share of a core."""
JIT_QUIET = 0.05
"""Kafka is warm once its JIT compiler threads used less than this share of a core through a
whole rotation of the warm-up's traffic (:func:`warm_kafka`)..."""
WARM_ROUND = 5.0
"""...of rounds this long each..."""
WARM_MAX = 180.0
"""...or after this long at most, warm or not (said under the table)."""
CLIENT_BOUND = 0.85
"""A load process busier than this share of a core may have limited the run: said in its cell."""
STEAL_SAID = 0.02
"""A run whose machine lost at least this share of its CPU time to the hypervisor says so in its
cell: a Kafka round trip alone reached p99 10-20 ms at 1,000 records/s here while 19% was stolen
(``steal`` of /proc/stat over the run)."""


@dataclass(frozen=True)
class Settings:
    duration: float = 10.0
    warmup: float = 2.0
    publishers: int = 4
    paced_rate: float = 20_000.0
    window: int = 64
    fanout: int = 50
    rate: float = 1_000.0
    in_flight: int = 200
    kafka_warmup: float = 20.0
    nodes: int = 1
    drain_max: float = 60.0
    settle_max: float = 30.0


@dataclass
class Result:
    key: str
    broker: str
    delivered: float = 0.0
    """Per second: messages at the subscribers, or CONNECT cycles completed."""
    cycles: int = 0
    """``bench.events``: CONNECTs in its window."""
    offered: float = 0.0
    sent: int = 0
    lost: int = 0
    duplicates: int = 0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    cpu_us: float = 0.0
    broker_cpu: float = 0.0
    """The broker's processes' share of a core in the window."""
    load_cpu: list[float] = field(default_factory=list)
    services_cpu: list[float] = field(default_factory=list)
    """Each of the broker's services' (Headwater: Kafka, Redis) share of a core in the window."""
    stolen: float = 0.0
    """The share of the machine's CPU time its hypervisor took in the window (``Steal``)."""
    error: str = ""
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Scenario:
    key: str
    title: str
    roles: Callable[[Broker, Settings, int], list[Role]]
    cell: Callable[[Result], str]
    qos: int = 0


def fanin(kind: Kind, qos: int) -> Callable[[Broker, Settings, int], list[Role]]:
    def roles(b: Broker, s: Settings, base: int) -> list[Role]:
        pub = Role(kind, b.endpoints[0], s.publishers, f"p{base}", first=base, qos=qos,
                   rate=s.paced_rate / s.publishers, window=s.window,
                   stamped=kind != "flood0")  # fmt: skip
        sub = Role("sub", b.endpoints[-1], 1, f"s{base}", filter="lg/#", qos=qos,
                   stamped=kind != "flood0")  # fmt: skip
        return [sub, pub]

    return roles


def fanout(b: Broker, s: Settings, base: int) -> list[Role]:
    topic, half = f"fo/{base}", s.fanout // 2
    subs = [
        Role("sub", b.endpoints[-1], n, f"s{base}-{k}", first=k * half, filter=topic, stamped=False)
        for k, n in enumerate((half, s.fanout - half))
    ]
    return [*subs, Role("flood0", b.endpoints[0], 1, f"p{base}", topic=topic, stamped=False)]


def latency(qos: int) -> Callable[[Broker, Settings, int], list[Role]]:
    def roles(b: Broker, s: Settings, base: int) -> list[Role]:
        topic = f"lat/{base}"
        sub = Role("sub", b.endpoints[-1], 1, f"s{base}", filter=topic, qos=qos)
        return [sub, Role("paced", b.endpoints[0], 1, f"p{base}", topic=topic, first=base,
                          qos=qos, rate=s.rate)]  # fmt: skip

    return roles


def connects(
    clean: bool, subscribe: bool, paced: bool = False
) -> Callable[[Broker, Settings, int], list[Role]]:
    def roles(b: Broker, s: Settings, base: int) -> list[Role]:
        return [Role("churn", b.endpoints[0], s.in_flight, f"c{base}", clean=clean,
                     subscribe=subscribe, rate=s.rate if paced else 0.0)]  # fmt: skip

    return roles


def rate_cell(r: Result) -> str:
    return f"{r.delivered:,.0f} msg/s, {r.cpu_us:.1f} us, lost {fmt_pct(loss(r))}"


def paced_cell(r: Result) -> str:
    return (
        f"{r.delivered:,.0f} msg/s delivered (offered {r.offered:,.0f}/s), p50 "
        f"{ms(r.p50_ms)}, p99 {ms(r.p99_ms)}, {r.lost:,} lost, {r.cpu_us:.1f} us"
    )


def dropped_cell(r: Result) -> str:
    return f"{r.delivered:,.0f} msg/s, {fmt_pct(loss(r))} dropped ({r.lost:,}), {r.cpu_us:.1f} us"


def fanout_cell(r: Result) -> str:
    return f"{r.delivered:,.0f} deliveries/s, {r.cpu_us:.1f} us, lost {fmt_pct(loss(r))}"


def latency_cell(r: Result) -> str:
    return f"p99 {ms(r.p99_ms)} (p50 {ms(r.p50_ms)}), lost {r.lost:,}"


def connect_cell(r: Result) -> str:
    return f"{r.delivered:,.0f} per s, {r.cpu_us:.0f} us each"


def ms(value: float) -> str:
    return f"{value / 1000:.1f} s" if value >= 1000 else f"{value:.2f} ms"


def loss(r: Result) -> float:
    return r.lost / r.sent if r.sent else 0.0


SCENARIOS = {
    s.key: s
    for s in (
        Scenario("fanin-qos0", "QoS 0 fan-in: 4 publishers flooding `lg/<i>` in writes of 32 "
                 "PUBLISHes (TCP backpressure honoured), 1 subscriber on `lg/#`",
                 fanin("flood0", 0), rate_cell),
        Scenario("fanin-qos1-paced", "QoS 1 fan-in paced at 20,000/s in all (one PUBLISH per "
                 "write, on schedule whatever is acknowledged), 1 QoS 1 subscriber acking all",
                 fanin("paced", 1), paced_cell, 1),
        Scenario("fanin-qos1-flood", "QoS 1 fan-in, publishers flooding (window 64 each)",
                 fanin("flood1", 1), dropped_cell, 1),
        Scenario("fanout-qos0", "QoS 0 fan-out 1 -> 50", fanout, fanout_cell),
        Scenario("latency-qos0", "latency at 1,000 msg/s, QoS 0", latency(0), latency_cell),
        Scenario("latency-qos1", "latency at 1,000 msg/s, QoS 1", latency(1), latency_cell, 1),
        Scenario("connect-clean", "CONNECT then DISCONNECT, 200 in flight, one asyncio client "
                 "process: clean", connects(True, False), connect_cell),
        Scenario("connect-persistent", "the same: persistent", connects(False, False),
                 connect_cell),
        Scenario("connect-sub-clean", "the same with a SUBSCRIBE (QoS 1) between: clean",
                 connects(True, True), connect_cell),
        Scenario("connect-sub-persistent", "the same with a SUBSCRIBE (QoS 1) between: "
                 "persistent", connects(False, True), connect_cell),
        Scenario("connect-clean-paced", "CONNECT then DISCONNECT started at 1,000/s (--rate), "
                 "clean: the node's CPU per cycle at one load", connects(True, False, True),
                 connect_cell),
        Scenario("connect-persistent-paced", "the same: persistent", connects(False, False, True),
                 connect_cell),
    )
}  # fmt: skip


def measure(scenario: Scenario, broker: Broker, s: Settings, base: int) -> Result:
    """One run: the load processes connect, the window is measured, the reports are merged."""
    roles = scenario.roles(broker, s, base)
    result = Result(scenario.key, broker.name)
    groups = Groups(roles)
    try:
        groups.ready()
        t0 = time.monotonic() + 0.5
        idle = 5.0 if scenario.qos else 2.0  # a QoS 1 backlog may pause while the node catches up
        timing = Timing(t0, t0 + s.warmup, t0 + s.warmup + s.duration, idle, s.drain_max)
        groups.go(timing)
        time.sleep(max(0.0, timing.measure_from - time.monotonic()))
        node, load = Meter(broker.pids, tree_cpu_seconds), Meter(groups.pids)
        services, stolen = Meter(broker.services), Steal()
        kernel = tcp_counters()
        time.sleep(max(0.0, timing.end - time.monotonic()))
        node_cpu, result.load_cpu = sum(node.used()), [c / s.duration for c in load.used()]
        result.broker_cpu = node_cpu / s.duration
        result.services_cpu = [c / s.duration for c in services.used()]
        result.stolen = stolen.share()
        grown = {k: n - kernel.get(k, 0) for k, n in tcp_counters().items()}
        reports = groups.reports(s.drain_max + 60.0)
    finally:
        groups.close()
    subs, pubs = Report(), Report()
    for role, report in zip(roles, reports, strict=True):
        (subs if role.kind in ("sub", "churn") else pubs).merge(report)
    account(result, roles, subs, pubs, s.duration)
    done = subs.done_window or subs.received_window
    result.cpu_us = node_cpu / max(1, done) * 1e6
    if subs.errors:
        result.notes.append(f"{len(subs.errors):,} failed cycles, e.g. {subs.errors[0]}")
    result.notes += [f"{n:,} {KERNEL_COUNTERS[k]}" for k, n in grown.items() if n > 0]
    if result.stolen >= STEAL_SAID:
        result.notes.append(f"{result.stolen:.0%} of the machine's CPU time stolen")
    if max(result.load_cpu, default=0.0) >= CLIENT_BOUND:
        result.notes.append(
            f"client-bound: a load process used {max(result.load_cpu):.0%} of a core"
        )
    return result


def account(result: Result, roles: list[Role], subs: Report, pubs: Report, seconds: float) -> None:
    result.delivered = (subs.done_window or subs.received_window) / seconds
    result.offered = pubs.sent_window / seconds
    latencies = sorted(subs.latencies)
    result.p50_ms = percentile(latencies, 50) * 1000
    result.p99_ms = percentile(latencies, 99) * 1000
    result.duplicates = subs.duplicates
    if pubs.acked:
        result.sent = sum(len(a) for a in pubs.acked.values())
        subs.acked = pubs.acked
        result.lost = subs.lost()
    else:
        copies = sum(r.clients for r in roles if r.kind == "sub")
        result.sent = pubs.sent * copies
        result.lost = max(0, result.sent - subs.received)


def summary(r: Result) -> str:
    return r.error or SCENARIOS[r.key].cell(r) + "".join(f"; {n}" for n in r.notes)


@dataclass
class Run:
    settings: Settings
    command: str
    headwater: str = ""
    mosquitto: str = ""
    started: datetime.datetime = field(default_factory=lambda: datetime.datetime.now(datetime.UTC))
    seconds: float = 0.0
    warmed: tuple[float, float] | None = None
    """Headwater's Kafka warm-up: (seconds, the JIT compilers' share of a core in its last
    rotation)."""
    labels: dict[str, str] = field(default_factory=dict)
    results: list[Result] = field(default_factory=list)
    kafka_floor: kafka_floor.Floor | None = None
    """Kafka alone at the latency rows' pace, on Headwater's Kafka (if a latency row ran)."""


WARM_TRAFFIC: tuple[tuple[Kind, int], ...] = (("paced", 1), ("flood0", 0), ("flood1", 1))
"""The warm-up's rounds, in turn: Kafka's produce and fetch paths as the scenarios use them,
the catch-up's reads of a subscriber behind included."""


def warm_kafka(broker: Broker, seconds: float) -> tuple[float, float]:
    """Fan-in traffic through the node, untimed, until Kafka's JIT has compiled what the runs
    will use: rounds of :data:`WARM_TRAFFIC` in turn, for at least ``seconds`` and then until a
    whole rotation in which Kafka's JIT compiler threads used less than :data:`JIT_QUIET` of a
    core (at most :data:`WARM_MAX`).  The seconds it took, and that share in the last rotation.
    A fixed 20 s of QoS 1 left the compilers at 15-20% of a core through the first measured
    run, 60 s after Kafka started."""
    if seconds <= 0:
        return 0.0, 0.0
    s = Settings(duration=WARM_ROUND, warmup=0.0, paced_rate=5_000.0, drain_max=10.0)
    started = time.monotonic()
    while True:
        rotation, compilers = time.monotonic(), Meter(broker.services, jit_seconds)
        for n, (kind, qos) in enumerate(WARM_TRAFFIC):
            measure(Scenario("warm", "", fanin(kind, qos), paced_cell, qos), broker, s, 9_000 + n)
        share = sum(max(0.0, u) for u in compilers.used()) / (time.monotonic() - rotation)
        took = time.monotonic() - started
        if (took >= seconds and share < JIT_QUIET) or took >= WARM_MAX:
            return took, share


def run(
    work: Path,
    names: list[str],
    keys: list[str],
    s: Settings,
    headwater: brokers.Headwater,
    command: str,
    progress: Callable[[str], None],
    workers: tuple[int, ...] = (1,),
) -> Run:
    """Every chosen broker, then every scenario against each in turn."""
    out = Run(s, command, headwater.version, brokers.mosquitto_version())
    started = time.monotonic()
    with ExitStack() as stack:
        targets: list[Broker] = []
        kafka_at = ""
        for name in sorted(names, key=lambda n: n == "headwater"):
            for w in workers if name == "headwater" else (1,):
                broker = (
                    headwater.start(work, stack, s.nodes, w)
                    if name == "headwater"
                    else brokers.start(name, work, stack, headwater)
                )
                if w > 1:
                    broker.name, broker.label = (
                        f"headwater-w{w}",
                        f"{broker.label[:-1]}, {w} workers)",
                    )
                out.labels[broker.name] = broker.label
                progress(f"{broker.label} up: {', '.join(str(e.port) for e in broker.endpoints)}")
                if name == "headwater":
                    progress(f"warming Kafka up for {s.kafka_warmup:.0f} s or more")
                    out.warmed = warm_kafka(broker, s.kafka_warmup)
                    kafka_at = broker.state.get("kafka", "")
                    progress(f"Kafka warm after {out.warmed[0]:.0f} s")
                targets.append(broker)
        pids = [p for b in targets for p in b.pids]
        for n, key in enumerate(keys):
            for broker in targets:
                settle(pids, SETTLED_CPU, s.settle_max)
                try:
                    result = measure(SCENARIOS[key], broker, s, 100 * (n + 1))
                except (RuntimeError, OSError) as exc:
                    result = Result(key, broker.name, error=f"FAILED: {error_summary(str(exc))}")
                out.results.append(result)
                progress(f"{key}, {broker.label}: {summary(result)}")
        if kafka_at and any(SCENARIOS[k].cell is latency_cell for k in keys):
            out.kafka_floor = kafka_floor.measure(kafka_at, s.rate, s.duration)
            progress(f"Kafka alone: {floor_text(out.kafka_floor)}")
    out.seconds = time.monotonic() - started
    return out


def warmed(run: Run) -> str:
    """How Headwater's Kafka was warmed up, for the text under the table."""
    if run.warmed is None:
        return "Kafka not warmed up"
    took, share = run.warmed
    quiet = "" if share < JIT_QUIET else f", still compiling at WARM_MAX ({WARM_MAX:g} s)"
    return (
        f"Kafka warmed first by {took:.0f} s of fan-in traffic (QoS 1 paced, QoS 0 and QoS 1 "
        f"floods in turn) until its JIT compilers used {100 * share:.1f}% of a core over a "
        f"whole turn{quiet}"
    )


def floor_text(floor: kafka_floor.Floor) -> str:
    return (
        f"p50 {ms(floor.p50_ms)}, p99 {ms(floor.p99_ms)} ({floor.received:,} of {floor.sent:,} "
        f"read; {floor.stolen:.0%} of the machine's CPU time stolen meanwhile)"
    )


def floor_sentence(run: Run) -> str:
    """The Kafka-alone figure under the latency rows, if it was measured."""
    if run.kafka_floor is None:
        return ""
    return (
        f"Kafka alone at the latency rows' pace, on Headwater's Kafka after every scenario "
        f"(`bench/kafka_floor.py`: a node's producer settings, a consumer blocking in its own "
        f"thread): {floor_text(run.kafka_floor)}, the floor under Headwater's latency rows. "
    )


def machine_rows(run: Run) -> list[str]:
    """Where the machine's CPU went in each run: what the load generator and the broker's
    services left to the broker."""
    cores = os.cpu_count() or 1
    rows = []
    for r in run.results:
        if r.error:
            continue
        load, stolen = sum(r.load_cpu), r.stolen * cores
        idle = max(0.0, cores - r.broker_cpu - sum(r.services_cpu) - load - stolen)
        services = ", ".join(f"{c:.0%}" for c in r.services_cpu) or "-"
        rows.append([
            f"`{r.key}`", run.labels[r.broker], f"{r.broker_cpu:.0%}", services, f"{load:.0%}",
            f"{stolen:.0%}", f"{idle:.0%}",
        ])  # fmt: skip
    head = ["run", "broker", "its processes", "its Kafka, Redis", "load generator", "stolen",
            "idle"]  # fmt: skip
    return [
        f"Where the machine's {cores} cores went in each measured window, in shares of one core "
        "(`/proc`: each process's utime + stime, the hypervisor's steal):",
        "",
        *table(head, rows),
    ]


def ratio(a: Result | None, b: Result | None) -> str:
    if a is None or b is None or a.error or b.error or not b.delivered or "latency" in a.key:
        return ""
    return f"{a.delivered / b.delivered:.2f}x"


def times_mosquitto(h: Result, m: Result | None, at_least: float) -> bool:
    return m is not None and not m.error and h.delivered >= at_least * m.delivered


TARGETS: dict[str, tuple[str, Callable[[Result, Result | None], bool]]] = {
    "fanin-qos0": (">= 0.5x mosquitto", lambda h, m: times_mosquitto(h, m, 0.5)),
    "fanin-qos1-paced": (">= 19,000 msg/s, p99 <= 50 ms, 0 lost",
                         lambda h, m: h.delivered >= 19_000 and h.p99_ms <= 50 and not h.lost),
    "fanout-qos0": (">= 1.5x mosquitto and >= 500,000/s",
                    lambda h, m: times_mosquitto(h, m, 1.5) and h.delivered >= 500_000),
    "latency-qos0": ("p99 <= 3 ms", lambda h, m: h.p99_ms <= 3),
    "latency-qos1": ("p99 <= 3 ms", lambda h, m: h.p99_ms <= 3),
    **{k: (">= mosquitto", lambda h, m: times_mosquitto(h, m, 1.0))
       for k in ("connect-clean", "connect-persistent", "connect-sub-clean",
                 "connect-sub-persistent")},
}  # fmt: skip
"""Issue 26's "done when", judged on Headwater's row of this run (mosquitto: the same run's)."""


def verdict(h: Result | None, m: Result | None) -> str:
    if h is None or h.key not in TARGETS or h.error:
        return ""
    text, met = TARGETS[h.key]
    if "mosquitto" in text and (m is None or m.error):
        return f"not judged: no mosquitto figure ({text})"
    return f"{'met' if met(h, m) else 'NOT met'} ({text})"


def render(run: Run) -> str:
    s = run.settings
    names = list(run.labels)
    found = {(r.key, r.broker): r for r in run.results}
    first = "headwater" if "headwater" in names else names[0]
    others = [n for n in names if n != first]
    head = ["scenario (64-byte payloads)", *(run.labels[n] for n in others), run.labels[first]]
    head += [f"ratio vs {run.labels[n]}" for n in others[:1]] + ["issue 26's target"]
    rows = []
    for key in dict.fromkeys(r.key for r in run.results):
        cells = [summary(found[key, n]) if (key, n) in found else "-" for n in [*others, first]]
        extra = [ratio(found.get((key, first)), found.get((key, others[0])))] if others else []
        judged = verdict(found.get((key, "headwater")), found.get((key, "mosquitto")))
        rows.append([SCENARIOS[key].title, *cells, *extra, judged])
    where = (
        "one node"
        if s.nodes == 1
        else f"{s.nodes} nodes: publishers on node 1, subscriber on node {s.nodes}"
    )
    lines = [
        "## Throughput, latency and CONNECT rates (issue 26's scenarios)",
        "",
        "| | |",
        "|---|---|",
        f"| Date | {run.started:%Y-%m-%d %H:%M} UTC |",
        f"| Machine | {machine()} |",
        f"| Headwater | {run.headwater}, `headwater dev up`, {where} |",
        f"| mosquitto | {run.mosquitto} (its defaults: 20 in flight, 1000 queued) |",
        f"| Command | `{run.command}` |",
        f"| Took | {run.seconds / 60:.1f} min |",
        "",
        *table(head, rows),
        "",
        f"How it ran: {s.warmup:g} s warm-up then {s.duration:g} s measured per run; "
        f"{warmed(run)}. {floor_sentence(run)}The load generator is `bench/load.py` "
        "(raw MQTT 3.1.1 on its own codec, one process per role: publishers, subscribers). "
        "us = broker CPU (utime + stime of /proc/<pid>/stat, every process of the broker) per "
        "delivered message or per CONNECT cycle over the measured window. Lost: QoS 1 PUBACKed "
        "and never received after a drain; QoS 0 sent and never received. Stolen: the share of "
        "the machine's CPU time its hypervisor gave elsewhere in the window (steal of "
        f"/proc/stat), said from {STEAL_SAID:.0%}. The last column "
        "judges Headwater's row by issue 26's targets (ratios against mosquitto in this run).",
        "",
        *machine_rows(run),
    ]
    return wrap("throughput", lines)
