"""``python -m bench.scale``: what a fleet costs Headwater, beside mosquitto (issue 11, item 6).

Every scenario runs against a fresh broker: Headwater nodes (``python -m frontend``) on the run's
Kafka (started here, warmed up) and Redis (started here; each broker its own key prefix), then a
fresh mosquitto.  The figures, and how each is taken, are in :mod:`bench.scale_report`:

``idle``     N connections (half cleanSession=0), each subscribed at QoS 1 to its own
             ``fleet/<id>/cmd``, keep-alive 60 s (:mod:`bench.fleet` PINGREQs at a steady N / 60
             per second).  Memory per connection from the broker's VmRSS; then, over an idle
             window, broker CPU (utime + stime) and Redis commands/s (``INFO``, ours excluded).
``connect``  a burst of clean-session CONNECTs with a bounded number awaiting CONNACK, then one of
             persistent ones: CONNACK/s, refusals, p50/p99.
``fanin``    publishers paced open loop (QoS 1) into one subscriber that PUBACKs everything
             (:mod:`bench.fanin`): offered, PUBACKed, received, lost, duplicates, p99.
``storm``    S clients (half persistent, all subscribed at QoS 1) on a 3-node cluster, connected
             directly round robin (client i on node i mod 3; no load balancer); they leave, each
             persistent session is published K QoS 1 messages, then every client reconnects at
             once to the *next* node, so that every session moves.  mosquitto: its one node.

The load generators are ``--workers`` processes (:mod:`bench.jobs`), each holding at most 18,000
sockets.  Everything started is stopped on return, exception, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import shlex
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from importlib import metadata
from pathlib import Path
from typing import Any

import redis

from bench.brokers import (
    START_TIMEOUT,
    STOP_TIMEOUT,
    BenchKafka,
    NodeLaunch,
    describe_checkout,
    mosquitto_version,
    snapshot_source,
    start_mosquitto,
    wait_serving,
)
from bench.cpu import settle
from bench.fanin import Drain, OpenPublishers, OpenSubscriber, PublishPaced, account
from bench.fleet import (
    ConnectFleet,
    ConnectReport,
    DisconnectFleet,
    FleetStatus,
    Member,
    StatusReport,
    publish_owed,
)
from bench.jobs import (
    Job,
    Worker,
    install_signal_handlers,
    raise_file_limit,
    run_all,
    work_directory,
)
from bench.load import ClientPlan, Timing
from bench.measure import (
    ProcessMeter,
    RedisReading,
    Window,
    commands_between,
    redis_reading,
)
from bench.scale_report import (
    BROKERS,
    DRAIN_IDLE,
    DRAIN_MAX,
    FILTERS,
    SCENARIOS,
    Burst,
    Bursts,
    Fanin,
    Figures,
    Idle,
    Latency,
    Outcome,
    ScaleRun,
    ScaleSettings,
    Storm,
    render,
    summary,
    write_section,
)
from headwater.errors import HeadwaterError
from headwater.services.kafka_admin import ensure_topic
from headwater.services.ports import LOOPBACK, free_port
from headwater.services.process import ChildProcess
from headwater.services.redis_server import LocalRedis
from router.topics import messages_topic

Endpoint = tuple[str, int]

PARTITIONS = 12
SOCKETS_PER_WORKER = 18_000
SETTLE_SHARE = 0.10
"""Before a measurement, wait until the broker's processes use less than this share of a core
over half a second..."""
SETTLE_MAX = 20.0
"""...or for this many seconds at most."""
OWED_WAIT = 60.0
"""After the storm's last CONNACK, seconds to wait for the owed messages at most."""
ACK_WAIT = 10.0
"""Fan-in: after the schedule ends, seconds to wait for the publishers' last PUBACKs at most."""


def quick(settings: ScaleSettings) -> ScaleSettings:
    """``--quick``: the same scenarios, smaller and shorter."""
    return replace(
        settings, idle_clients=1_000, idle_window=10.0, burst=1_000, storm_clients=1_500,
        fanin_seconds=3.0, kafka_warmup=5.0,
    )  # fmt: skip


def progress(text: str) -> None:
    print(f"[scale {datetime.datetime.now():%H:%M:%S}] {text}", file=sys.stderr, flush=True)


# -- brokers and load workers -----------------------------------------------------------------


@dataclass(slots=True)
class Target:
    """A running broker: where clients connect, which processes are measured."""

    name: str
    label: str
    endpoints: list[Endpoint]
    pids: list[int]
    redis: bool = False


class Bench:
    """Kafka, Redis and the load workers of the whole run; brokers are started per scenario."""

    def __init__(
        self, settings: ScaleSettings, work: Path, stack: ExitStack, run: ScaleRun
    ) -> None:
        self.settings = settings
        self.work = work
        self.tag = uuid.uuid4().hex[:6]
        self.serial = 0
        self.kafka: BenchKafka | None = None
        self.redis_url = ""
        self.redis: redis.Redis | None = None
        self.service_pids: list[int] = []
        self.launch = NodeLaunch()
        if settings.headwater_rev:
            source, run.headwater = snapshot_source(settings.headwater_rev, work)
            self.launch = NodeLaunch(source=source)
        if "headwater" in settings.brokers:
            self.start_services(stack, run)
        self.workers = [Worker(f"fleet{i}") for i in range(settings.workers)]
        for worker in self.workers:
            stack.callback(worker.stop)

    def start_services(self, stack: ExitStack, run: ScaleRun) -> None:
        progress("starting Kafka and Redis")
        self.kafka = BenchKafka(self.work, stack, None)
        run.kafka = self.kafka.version
        local = LocalRedis(self.work / "redis")
        stack.callback(local.stop)
        self.redis_url = local.start()
        self.redis = redis.Redis.from_url(self.redis_url)
        stack.callback(self.redis.close)
        run.redis = f"{redis_version()} (started by the benchmark, no persistence)"
        kafka_child, redis_child = self.kafka.child, local.child
        self.service_pids = [c.pid for c in (kafka_child, redis_child) if c is not None]
        if self.settings.kafka_warmup > 0:
            progress(f"warming Kafka up for {self.settings.kafka_warmup:.0f} s")
            self.kafka.warm_up(self.settings.kafka_warmup)

    def start(self, broker: str, nodes: int, stack: ExitStack) -> Target:
        if broker == "mosquitto":
            running = start_mosquitto(self.work, stack)
            pids = [p.pid for p in running.processes]
            return Target("mosquitto", running.label, running.endpoints, pids)
        return self.start_headwater(nodes, stack)

    def start_headwater(self, nodes: int, stack: ExitStack) -> Target:
        """``nodes`` nodes on a fresh log topic and Redis key prefix, all started before any is
        waited for."""
        assert self.kafka is not None
        self.serial += 1
        topic = f"scale.{self.tag}.{self.serial}"
        ensure_topic(self.kafka.bootstrap, topic, PARTITIONS, messages_topic(PARTITIONS).config)
        redis_args = ["--redis-url", self.redis_url, "--redis-prefix", f"{topic}:"]
        children, ports = [], []
        for i in range(1, nodes + 1):
            port = free_port()
            argv = self.launch.argv(f"n{i}", port, 0, self.kafka.bootstrap, topic, PARTITIONS)
            log = self.work / f"{topic}.n{i}.log"
            child = ChildProcess.spawn(
                f"headwater-n{i}",
                argv + redis_args,
                log,
                env=self.launch.env(),
                cwd=self.launch.source,
            )
            stack.callback(child.stop, STOP_TIMEOUT)
            children.append(child)
            ports.append(port)
        for child, port in zip(children, ports, strict=True):
            wait_serving(child, port, START_TIMEOUT)
        label = f"Headwater ({nodes} node{'s' if nodes > 1 else ''})"
        endpoints = [(LOOPBACK, p) for p in ports]
        return Target("headwater", label, endpoints, [c.pid for c in children], redis=True)

    # -- what the scenarios do with them

    def window(self, target: Target) -> Window:
        return Window(target.pids, [w.pid for w in self.workers], self.service_pids)

    def settle(self, target: Target) -> None:
        settle(target.pids, SETTLE_SHARE, SETTLE_MAX)

    def connect(
        self, members: Sequence[Member], in_flight: int, timeout: float = 60.0
    ) -> ConnectReport:
        """Connect ``members`` from every worker together, dealt out among them, ``in_flight``
        awaiting CONNACK in all (0: every one at once)."""
        n = len(self.workers)
        per_worker = max(1, in_flight // n) if in_flight else 0
        start_at = time.monotonic() + 0.3
        jobs = [
            ConnectFleet(
                tuple(members[k::n]), per_worker, self.settings.keep_alive, timeout, start_at
            )
            for k in range(n)
        ]
        wait = 2 * timeout + len(members) / 50
        return ConnectReport.merged(run_all(self.workers, jobs, wait))

    def status(self) -> StatusReport:
        return StatusReport.merged(self.on_all(FleetStatus()))

    def disconnect(self) -> int:
        return sum(self.on_all(DisconnectFleet()))

    def on_all(self, job: Job[Any], timeout: float = 60.0) -> list[Any]:
        return run_all(self.workers, [job] * len(self.workers), timeout)

    def redis_reading(self) -> RedisReading:
        assert self.redis is not None
        return redis_reading(self.redis.info("all"))


def redis_version() -> str:
    result = subprocess.run(
        ["redis-server", "--version"], capture_output=True, text=True, check=False
    )
    words = result.stdout.split()
    version = next((w for w in words if w.startswith("v=")), "v=?")
    return f"Redis {version[2:]}"


# -- the scenarios ----------------------------------------------------------------------------


def idle(bench: Bench, target: Target) -> Idle:
    s = bench.settings
    ids = [f"{bench.tag}-idle-{i}" for i in range(s.idle_clients)]
    members = [
        Member(cid, target.endpoints[0], i % 2 == 0, f"fleet/{cid}/cmd")
        for i, cid in enumerate(ids)
    ]
    bench.settle(target)
    meter = ProcessMeter(target.pids)
    rss_before = meter.rss_kib()
    progress(f"{target.label}: {len(members):,} clients connect and subscribe")
    connect = bench.connect(members, s.in_flight)
    bench.settle(target)
    rss_connected = meter.rss_kib()
    progress(f"{target.label}: idle for {s.idle_window:g} s")
    before = bench.redis_reading() if target.redis else None
    window = bench.window(target)
    time.sleep(s.idle_window)
    usage = window.usage()
    after = bench.redis_reading() if target.redis else None
    rss_after = meter.rss_kib()
    total, calls = commands_between(before, after) if before and after else (None, {})
    status = bench.status()
    progress(f"{target.label}: one more client subscribes to {FILTERS:,} filters")
    filters, rss_filters = asyncio.run(asyncio.wait_for(filter_cost(bench, target, meter), 120))
    bench.disconnect()
    return Idle(
        s.idle_clients, connect, rss_before, rss_connected, rss_after, usage, total, calls, status,
        filters, rss_filters,
    )  # fmt: skip


async def filter_cost(bench: Bench, target: Target, meter: ProcessMeter) -> tuple[int, int]:
    """One clean-session client subscribes to :data:`FILTERS` distinct filters, 100 per
    SUBSCRIBE: (filters granted, KiB the broker's RSS grew by while it held them)."""
    reader, writer = await asyncio.open_connection(*target.endpoints[0])
    try:
        client = f"{bench.tag}-filters"
        writer.write(_packet(0x10, _text("MQTT") + bytes((4, 2, 0, 60)) + _text(client)))
        await _read_packet(reader)  # CONNACK
        bench.settle(target)
        before = meter.rss_kib()
        granted = 0
        for first in range(0, FILTERS, 100):
            names = (f"fleet/{client}/f{i}/cmd" for i in range(first, min(first + 100, FILTERS)))
            body = b"".join(_text(name) + b"\x01" for name in names)
            writer.write(_packet(0x82, (first // 100 + 1).to_bytes(2, "big") + body))
            codes = (await _read_packet(reader))[2:]
            granted += sum(code < 0x80 for code in codes)
        bench.settle(target)
        return granted, meter.rss_kib() - before
    finally:
        writer.close()


def _text(value: str) -> bytes:
    raw = value.encode()
    return len(raw).to_bytes(2, "big") + raw


def _packet(first: int, body: bytes) -> bytes:
    size, length = len(body), bytearray()
    while True:
        size, digit = size >> 7, size & 0x7F
        length.append(digit | (0x80 if size else 0))
        if not size:
            return bytes((first,)) + bytes(length) + body


async def _read_packet(reader: asyncio.StreamReader) -> bytes:
    """The body of the next packet from the broker."""
    await reader.readexactly(1)
    size, shift = 0, 0
    while True:
        digit = (await reader.readexactly(1))[0]
        size |= (digit & 0x7F) << shift
        shift += 7
        if digit < 0x80:
            return await reader.readexactly(size)


def bursts(bench: Bench, target: Target) -> Bursts:
    return Bursts(burst(bench, target, clean=True), burst(bench, target, clean=False))


def burst(bench: Bench, target: Target, clean: bool) -> Burst:
    s = bench.settings
    kind = "clean" if clean else "persistent"
    at = target.endpoints[0]
    members = [Member(f"{bench.tag}-{kind}-{i}", at, clean) for i in range(s.burst)]
    bench.settle(target)
    progress(f"{target.label}: {s.burst:,} {kind}-session CONNECTs, {s.in_flight} in flight")
    window = bench.window(target)
    report = bench.connect(members, s.in_flight)
    usage = window.usage()
    bench.disconnect()
    return Burst(clean, report, usage, Latency.of(report))


def storm(bench: Bench, target: Target) -> Storm:
    s = bench.settings
    ends, n = target.endpoints, len(target.endpoints)
    ids = [f"{bench.tag}-storm-{i}" for i in range(s.storm_clients)]

    def member(i: int, node: int) -> Member:
        persistent = i % 2 == 1
        topic = f"fleet/{ids[i]}/cmd"
        return Member(ids[i], ends[node % n], not persistent, topic, s.owed if persistent else 0)

    bench.settle(target)
    progress(f"{target.label}: {s.storm_clients:,} clients connect and subscribe")
    leave = bench.connect([member(i, i) for i in range(s.storm_clients)], s.in_flight)
    bench.disconnect()
    bench.settle(target)
    owed = [
        (f"fleet/{ids[i]}/cmd", f"{ids[i]}:{k}".encode())
        for k in range(s.owed)
        for i in range(1, s.storm_clients, 2)
    ]
    progress(f"{target.label}: {len(owed):,} QoS 1 messages to the sessions away")
    published = asyncio.run(publish_owed(ends[0], f"{bench.tag}-owner", owed))
    bench.settle(target)
    progress(f"{target.label}: all {s.storm_clients:,} reconnect at once")
    window = bench.window(target)
    back = bench.connect([member(i, i + 1) for i in range(s.storm_clients)], 0, s.storm_timeout)
    status = wait_for_owed(bench, time.monotonic() + OWED_WAIT)
    usage = window.usage()
    bench.disconnect()
    leave.latencies, leave.handshakes = [], []
    return Storm(
        n, s.storm_clients, s.storm_clients // 2, s.owed, leave, published, back, status, usage,
        Latency.of(back),
    )  # fmt: skip


def wait_for_owed(bench: Bench, deadline: float) -> StatusReport:
    """The fleet's status once every owed message has arrived, or at ``deadline``."""
    while True:
        status = bench.status()
        if status.owed_received >= status.owed or time.monotonic() >= deadline:
            return status
        time.sleep(0.25)


def fanin(bench: Bench, target: Target) -> Fanin:
    s = bench.settings
    at = target.endpoints[0]
    topics = [f"bench/{bench.tag}-p{i}/t" for i in range(s.fanin_publishers)]
    pubs = tuple(ClientPlan(f"{bench.tag}-pub{i}", at, (t,), 1) for i, t in enumerate(topics))
    sub = ClientPlan(f"{bench.tag}-fanin-sub", at, tuple(topics), 1)
    publisher, subscriber = bench.workers[0], bench.workers[-1]
    bench.settle(target)
    subscriber.submit(OpenSubscriber(sub))
    subscriber.result(30)
    publisher.submit(OpenPublishers(pubs, s.fanin_rate / s.fanin_publishers, s.fanin_window))
    publisher.result(30)
    start = time.monotonic() + 0.5
    timing = Timing(start, start, start + s.fanin_seconds, ack_wait=ACK_WAIT)
    progress(f"{target.label}: QoS 1 fan-in at {s.fanin_rate:,.0f} msg/s for {s.fanin_seconds:g} s")
    window = bench.window(target)
    publisher.submit(PublishPaced(timing))
    pub_reports = publisher.result(s.fanin_seconds + ACK_WAIT + 30)
    usage = window.usage()
    acked = sum(len(set(p.acked)) for p in pub_reports)
    subscriber.submit(Drain(acked, DRAIN_IDLE, DRAIN_MAX))
    sub_report = subscriber.result(DRAIN_MAX + 30)
    accounting = account(pub_reports, sub_report)
    sub_report.seen = {}
    return Fanin(s.fanin_rate, s.fanin_seconds, accounting, sub_report, usage)


RUNS: dict[str, tuple[Callable[[Bench, Target], Figures], Callable[[ScaleSettings], int]]] = {
    "idle": (idle, lambda s: 1),
    "connect": (bursts, lambda s: 1),
    "fanin": (fanin, lambda s: 1),
    "storm": (storm, lambda s: s.storm_nodes),
}
"""Scenario -> (what measures it, Headwater nodes it needs)."""

FAILURES = (RuntimeError, TimeoutError, OSError, HeadwaterError, redis.RedisError)
"""What fails one scenario on one broker, not the run."""


def run_one(bench: Bench, scenario: str, broker: str) -> Outcome:
    measure_with, nodes_for = RUNS[scenario]
    nodes = nodes_for(bench.settings) if broker == "headwater" else 1
    outcome = Outcome(scenario, broker, broker)
    with ExitStack() as stack:
        try:
            target = bench.start(broker, nodes, stack)
            outcome.label = target.label
            outcome.figures = measure_with(bench, target)
        except FAILURES as exc:
            outcome.error = str(exc).strip() or type(exc).__name__
        finally:
            with_workers_clean(bench)
    return outcome


def with_workers_clean(bench: Bench) -> None:
    """Close whatever a scenario left open in the workers (a failed one may leave much)."""
    try:
        bench.disconnect()
    except (RuntimeError, TimeoutError, OSError) as exc:
        progress(f"could not close the load workers' connections: {exc}")


# -- the run ----------------------------------------------------------------------------------


def measure(settings: ScaleSettings, work: Path, command: str) -> ScaleRun:
    """Every chosen scenario against every chosen broker, Headwater first."""
    check_sockets(settings)
    raise_file_limit()  # the brokers started from here inherit it
    run = ScaleRun(settings, command, datetime.datetime.now(datetime.UTC))
    run.headwater = describe_checkout()
    run.mosquitto = mosquitto_version()
    run.load = load_versions()
    started = time.monotonic()
    with ExitStack() as stack:
        bench = Bench(settings, work, stack, run)
        for scenario in settings.scenarios:
            for broker in settings.brokers:
                outcome = run_one(bench, scenario, broker)
                run.outcomes.append(outcome)
                progress(f"{outcome.label}, {scenario}: {summary(settings, outcome)}")
    run.seconds = time.monotonic() - started
    return run


def check_sockets(settings: ScaleSettings) -> None:
    most = max(settings.idle_clients, settings.storm_clients, settings.burst)
    per_worker = -(-most // settings.workers)
    if per_worker > SOCKETS_PER_WORKER:
        raise SystemExit(
            f"bench.scale: {per_worker:,} sockets per load process is more than "
            f"{SOCKETS_PER_WORKER:,}: give more --workers"
        )


def load_versions() -> str:
    try:
        return f"uvloop {metadata.version('uvloop')}"
    except metadata.PackageNotFoundError:
        return "asyncio (uvloop not installed)"


# -- the command line -------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    d = ScaleSettings()
    p = argparse.ArgumentParser(
        prog="python -m bench.scale",
        description="Fleet-scale benchmark of Headwater beside mosquitto (issue 11): memory and "
        "idle cost of idle connections, CONNECT rate, a reconnect storm, paced QoS 1 fan-in.",
    )
    p.add_argument("--quick", action="store_true", help="smoke run: small and short (~1.5 min)")
    p.add_argument("--scenarios", default=",".join(SCENARIOS), help="[%(default)s]")
    p.add_argument("--brokers", default=",".join(BROKERS), help="[%(default)s]")
    p.add_argument("--idle-clients", type=int, default=d.idle_clients, help="[%(default)s]")
    p.add_argument("--idle-window", type=float, default=d.idle_window, help="s [%(default)s]")
    p.add_argument("--keep-alive", type=int, default=d.keep_alive, help="s [%(default)s]")
    p.add_argument("--burst", type=int, default=d.burst, help="connects per burst [%(default)s]")
    p.add_argument("--in-flight", type=int, default=d.in_flight, help="[%(default)s]")
    p.add_argument("--storm-clients", type=int, default=d.storm_clients, help="[%(default)s]")
    p.add_argument("--storm-nodes", type=int, default=d.storm_nodes, help="[%(default)s]")
    p.add_argument("--owed", type=int, default=d.owed, help="QoS 1 per session [%(default)s]")
    p.add_argument("--fanin-rate", type=float, default=d.fanin_rate, help="msg/s [%(default)s]")
    p.add_argument("--fanin-seconds", type=float, default=d.fanin_seconds, help="[%(default)s]")
    p.add_argument("--fanin-window", type=int, default=d.fanin_window, help="[%(default)s]")
    p.add_argument("--workers", type=int, default=d.workers, help="load processes [%(default)s]")
    p.add_argument(
        "--headwater-rev",
        metavar="REV",
        help="run the nodes from this git commit (git archive into the work dir) instead of "
        "this checkout's files",
    )
    p.add_argument("--output", type=Path, help="also write the section into this markdown file")
    p.add_argument("--work-dir", type=Path, help="logs and configs here (default: a temp dir)")
    return p


def settings_from(args: argparse.Namespace) -> ScaleSettings:
    settings = ScaleSettings(
        idle_clients=args.idle_clients,
        idle_window=args.idle_window,
        keep_alive=args.keep_alive,
        burst=args.burst,
        in_flight=args.in_flight,
        storm_clients=args.storm_clients,
        storm_nodes=args.storm_nodes,
        owed=args.owed,
        fanin_rate=args.fanin_rate,
        fanin_seconds=args.fanin_seconds,
        fanin_window=args.fanin_window,
        workers=args.workers,
        headwater_rev=args.headwater_rev,
        scenarios=choose(args.scenarios, SCENARIOS, "scenarios"),
        brokers=choose(args.brokers, BROKERS, "brokers"),
    )
    return quick(settings) if args.quick else settings


def choose(spec: str, known: tuple[str, ...], what: str) -> tuple[str, ...]:
    names = {n.strip() for n in spec.split(",") if n.strip()}
    unknown = names - set(known)
    if unknown:
        raise SystemExit(f"bench.scale: unknown {what} {sorted(unknown)}; known: {list(known)}")
    return tuple(n for n in known if n in names)


def run_in(work_dir: Path | None, settings: ScaleSettings, command: str) -> ScaleRun:
    with ExitStack() as stack:
        work = work_directory(stack, work_dir, "hw-scale-")
        return measure(settings, work, command)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    settings = settings_from(args)
    install_signal_handlers()
    command = "python -m bench.scale " + shlex.join(sys.argv[1:] if argv is None else argv)
    try:
        run = run_in(args.work_dir, settings, command.strip())
    except KeyboardInterrupt:
        progress("interrupted: stopping everything that was started")
        return 130
    section = render(run)
    print(section)
    if args.output is not None:
        write_section(args.output, section)
        progress(f"section written to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
