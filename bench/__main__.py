"""``python -m bench``: run the chosen scenarios against the chosen brokers.

The fleet-scale scenarios (``scale``: :mod:`bench.scale`) run last, on brokers of their own, and
add their section to the report.

Every broker is started first (Kafka, a 1-node Headwater, a 3-node Headwater, mosquitto, amqtt:
those the scenarios need); then each scenario runs against each broker in turn, one run at a time,
the idle brokers waiting.  Interleaving runs this way spreads any change in the machine's load
over all brokers instead of over whichever ran last.  The worker-scaling scenario
(:mod:`bench.worker_scaling`) alone starts nodes of its own when its turn comes, and stops them
after it.  Every process started lives on an
``ExitStack`` unwound on return, exception, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import datetime
import shlex
import sys
import uuid
from contextlib import ExitStack
from dataclasses import replace
from importlib import metadata
from pathlib import Path

import confluent_kafka

from bench import hostile
from bench.brokers import (
    KAFKA_WARMUP,
    BenchKafka,
    NodeLaunch,
    RunningBroker,
    amqtt_version,
    describe_checkout,
    mosquitto_version,
    node_has_stats,
    snapshot_source,
    start_amqtt,
    start_headwater,
    start_mosquitto,
)
from bench.cpu import settle
from bench.jobs import install_signal_handlers, work_directory
from bench.paced import DRAIN_IDLE, run_paced
from bench.report import Environment, load_average, render
from bench.scale import quick as quick_scale
from bench.scale import run_in as run_scale_in
from bench.scale_report import BROKERS as SCALE_BROKERS
from bench.scale_report import ScaleSettings, write_section
from bench.scale_report import render as render_scale
from bench.scenarios import (
    ROUTING_NODES,
    ROUTING_PARTITIONS,
    SCENARIOS,
    Result,
    Settings,
    run_scenario,
)
from bench.worker_scaling import WorkerScaling
from headwater.errors import HeadwaterError

BROKERS = ("headwater", "mosquitto", "amqtt")
OTHER_BROKERS = ("mosquitto", "amqtt")
SCALE = "scale"
HOSTILE = "hostile"
SETTLED_CPU = 0.15
"""Before a run, every broker's processes together use less than this share of a core."""
DEFAULT_OUTPUT = Path("docs/benchmarks.md")
SINGLE_PARTITIONS = 12


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("--duration", type=float, default=10.0, help="measured seconds per run [10]")
    p.add_argument("--warmup", type=float, default=2.0, help="warm-up seconds per run [2]")
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 2 s runs, 0.5 s warm-up, small routing mix; writes no report "
        "unless --output is given",
    )
    p.add_argument(
        "--scenarios",
        default="all",
        help="comma-separated keys, or all / single / cluster [all]: "
        + ", ".join([*SCENARIOS, SCALE])
        + f", {HOSTILE} ({SCALE}: bench.scale's fleet scenarios, smaller with --quick; "
        f"{HOSTILE}: bench.hostile's probes of issue 20, run only when named)",
    )
    p.add_argument("--brokers", default=",".join(BROKERS), help="comma-separated [all three]")
    p.add_argument(
        "--kafka-bootstrap",
        help="use this Kafka instead of starting one (its bench topics are deleted afterwards)",
    )
    p.add_argument("--output", type=Path, help=f"report file [{DEFAULT_OUTPUT}]")
    p.add_argument("--no-write", action="store_true", help="print the report only")
    p.add_argument("--rate", type=float, default=1000.0, help="latency runs: msgs/s [1000]")
    p.add_argument("--window", type=int, default=100, help="QoS 1 in flight per publisher [100]")
    p.add_argument(
        "--paced-rate",
        type=float,
        default=20_000.0,
        help="paced scenarios: msgs/s scheduled over all publishers [20000]",
    )
    p.add_argument(
        "--paced-window",
        type=int,
        default=1_000,
        help="paced scenarios: unacknowledged QoS 1 PUBLISHes per publisher before its pacer "
        "waits [1000]",
    )
    p.add_argument(
        "--workers",
        default="1,2",
        help="worker scaling: the node's --workers values compared [1,2]",
    )
    p.add_argument("--publishers", type=int, default=4, help="fan-in publishers [4]")
    p.add_argument("--fanout", type=int, default=50, help="fan-out subscribers [50]")
    p.add_argument("--sub-procs", type=int, default=1, help="processes for subscribers [1]")
    p.add_argument(
        "--backlog",
        type=int,
        default=1000,
        help="throughput scenarios also run bounded: publishers at most this many messages "
        "ahead of the subscribers; 0 runs open loop only [1000]",
    )
    p.add_argument(
        "--routing-messages", type=int, default=200, help="routing: messages per topic [200]"
    )
    p.add_argument(
        "--variants",
        default="flood,bounded",
        help="throughput variants to run: flood (open loop), bounded [flood,bounded]",
    )
    p.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="run Headwater nodes under bench.profile_node: one profile per run into DIR",
    )
    p.add_argument(
        "--profiler",
        choices=("auto", "yappi", "cprofile"),
        default="auto",
        help="with --profile: yappi (all threads) if installed, else cProfile [auto]",
    )
    p.add_argument(
        "--headwater-rev",
        metavar="REV",
        help="run the nodes from this git commit (extracted with git archive into the work "
        "dir) instead of this checkout's files",
    )
    p.add_argument("--work-dir", type=Path, help="logs and configs here (default: a temp dir)")
    return p


def split_scale(spec: str) -> tuple[str, bool]:
    """The scenarios spec without ``scale``, and whether the scale scenarios run (with "all")."""
    if spec in ("all", "single", "cluster"):
        return spec, spec == "all"
    keys = [k.strip() for k in spec.split(",") if k.strip()]
    return ",".join(k for k in keys if k != SCALE), SCALE in keys


def split_hostile(spec: str) -> tuple[str, bool]:
    """The scenarios spec without ``hostile``, and whether the hostile probes run (only when
    named: "all" does not include them)."""
    keys = [k.strip() for k in spec.split(",") if k.strip()]
    if HOSTILE not in keys:
        return spec, False
    return ",".join(k for k in keys if k != HOSTILE), True


def run_hostile(args: argparse.Namespace, brokers: list[str], work: Path, command: str) -> str:
    """bench.hostile's probes on the chosen brokers it knows; its markdown section."""
    progress("running bench.hostile")
    run = hostile.run(
        work / "hostile", brokers, command, progress, args.kafka_bootstrap, args.headwater_rev
    )
    return hostile.render(run)


def run_scale(args: argparse.Namespace, brokers: list[str], work: Path, command: str) -> str:
    """bench.scale's scenarios on the chosen brokers it knows; its markdown section."""
    settings = ScaleSettings(
        brokers=tuple(b for b in SCALE_BROKERS if b in brokers),
        headwater_rev=args.headwater_rev,
        kafka_warmup=KAFKA_WARMUP,
    )
    settings = quick_scale(settings) if args.quick else settings
    progress("running bench.scale" + (" (quick)" if args.quick else ""))
    return render_scale(run_scale_in(work / "scale", settings, command))


def choose_scenarios(spec: str) -> list[str]:
    if spec == "all":
        return list(SCENARIOS)
    if spec in ("single", "cluster"):
        return [k for k, s in SCENARIOS.items() if s.cluster == (spec == "cluster")]
    keys = [k.strip() for k in spec.split(",") if k.strip()]
    unknown = [k for k in keys if k not in SCENARIOS]
    if unknown:
        raise SystemExit(f"python -m bench: unknown scenarios {unknown}; known: {list(SCENARIOS)}")
    return keys


def choose_brokers(spec: str) -> list[str]:
    names = [b.strip() for b in spec.split(",") if b.strip()]
    unknown = [b for b in names if b not in BROKERS]
    if unknown:
        raise SystemExit(f"python -m bench: unknown brokers {unknown}; known: {list(BROKERS)}")
    return [b for b in BROKERS if b in names]


def settings_from(args: argparse.Namespace) -> Settings:
    settings = Settings(
        duration=args.duration,
        warmup=args.warmup,
        rate=args.rate,
        window=args.window,
        publishers=args.publishers,
        fanout=args.fanout,
        sub_procs=args.sub_procs,
        routing_messages=args.routing_messages,
        backlog=args.backlog,
        paced_rate=args.paced_rate,
        paced_window=args.paced_window,
        workers=tuple(int(w) for w in args.workers.split(",") if w.strip()),
    )
    if args.quick:
        settings = replace(
            settings, duration=2.0, warmup=0.5, routing_messages=20, drain_max=3.0, settle_max=15.0
        )
    return settings


class Runner:
    """Runs scenarios against one broker after another and collects the results."""

    def __init__(self, args: argparse.Namespace, settings: Settings, work: Path) -> None:
        self.args = args
        self.settings = settings
        self.work = work
        self.tag = uuid.uuid4().hex[:6]
        self.results: list[Result] = []
        self.kafka_version = "not used"
        source, self.headwater_version = None, describe_checkout()
        if args.headwater_rev:
            source, self.headwater_version = snapshot_source(args.headwater_rev, work)
        self.launch = NodeLaunch(args.profile, node_has_stats(source), source, args.profiler)

    def run(self, keys: list[str], brokers: list[str]) -> None:
        """Start every broker needed, then run each scenario (and variant) against each broker
        in turn, so that a change in the machine's load hits all brokers alike."""
        with ExitStack() as stack:
            targets, kafka = self.start_targets(keys, brokers, stack)
            for key in keys:
                scenario = SCENARIOS[key]
                if scenario.kind == "workers":
                    if kafka is not None:
                        self.run_workers(kafka)
                    continue
                names = ["cluster"] if scenario.cluster else ["headwater", *OTHER_BROKERS]
                for backlog in self.backlogs(key):
                    for name in names:
                        if name in targets:
                            self.run_one(key, targets[name], kafka, backlog, targets)

    def run_workers(self, kafka: BenchKafka) -> None:
        """Worker scaling: its own Headwater nodes, stopped once it is done (the run's stack
        would keep them, idle, through the scenarios after it)."""
        scaling = WorkerScaling(kafka, self.settings, self.work, self.launch, self.tag)
        with ExitStack() as own:
            try:
                scaling.start(own, progress)
            except (HeadwaterError, RuntimeError, OSError) as exc:  # e.g. a node without --workers
                progress(f"worker scaling: the nodes did not start: {exc}")
                self.results.append(
                    Result("workers", "headwater", "Headwater", ok=False, error=str(exc))
                )
                return
            for result in scaling.run(self.backlogs("fanin-qos0"), progress):
                self.results.append(result)
                progress(f"{result.label}: {summary(result)}")

    def backlogs(self, key: str) -> tuple[int, ...]:
        if SCENARIOS[key].kind != "throughput":
            return (0,)
        variants = {v.strip() for v in self.args.variants.split(",")}
        backlogs = [0] if "flood" in variants else []
        if "bounded" in variants and self.settings.backlog:
            backlogs.append(self.settings.backlog)
        return tuple(backlogs)

    def start_targets(
        self, keys: list[str], brokers: list[str], stack: ExitStack
    ) -> tuple[dict[str, RunningBroker], BenchKafka | None]:
        single = any(not SCENARIOS[k].cluster and SCENARIOS[k].kind != "workers" for k in keys)
        cluster = any(SCENARIOS[k].cluster for k in keys)
        targets: dict[str, RunningBroker] = {}
        kafka = None
        if "headwater" in brokers and keys:
            progress("starting Kafka" if not self.args.kafka_bootstrap else "using Kafka")
            kafka = BenchKafka(self.work, stack, self.args.kafka_bootstrap)
            self.kafka_version = kafka.version
            if kafka.local is not None:
                progress(f"warming Kafka up for {KAFKA_WARMUP:.0f} s")
                progress(f"warm-up: {kafka.warm_up():,} records through Kafka")
            for name, nodes, wanted in (
                ("headwater", 1, single),
                ("cluster", ROUTING_NODES, cluster),
            ):
                if wanted:
                    partitions = ROUTING_PARTITIONS if nodes > 1 else SINGLE_PARTITIONS
                    topic = kafka.create_topic(f"bench.{self.tag}.{nodes}n", partitions)
                    targets[name] = start_headwater(
                        kafka, topic, partitions, nodes, self.work, stack, self.launch
                    )
        for name in OTHER_BROKERS:
            if name in brokers and single:
                start = start_mosquitto if name == "mosquitto" else start_amqtt
                targets[name] = start(self.work, stack)
        for target in targets.values():
            progress(f"{target.label}: up on {target.endpoints}")
        return targets, kafka

    def run_one(
        self,
        key: str,
        broker: RunningBroker,
        kafka: BenchKafka | None,
        backlog: int,
        targets: dict[str, RunningBroker],
    ) -> None:
        pids = [pid for t in targets.values() for pid in t.pids]
        waited = settle(pids, SETTLED_CPU, self.settings.settle_max)
        if waited >= self.settings.settle_max:
            progress(f"brokers still busy after {waited:.0f}s; running anyway")
        tag = f"{self.tag}-{broker.name[:2]}-{key}-{backlog}"
        if SCENARIOS[key].kind == "paced":
            result = run_paced(SCENARIOS[key], broker, self.settings, tag)
        else:
            result = run_scenario(SCENARIOS[key], broker, self.settings, tag, kafka, backlog)
        if waited >= self.settings.settle_max:
            result.notes.append(f"the brokers were still busy {waited:.0f}s after the last run")
        self.results.append(result)
        progress(f"{broker.label}: {summary(result)}")


def summary(result: Result) -> str:
    if not result.ok:
        return f"{result.scenario} FAILED: {result.error}"
    kind = SCENARIOS[result.scenario].kind
    if kind == "latency":
        return (
            f"{result.scenario}: p50 {result.p50_ms:.2f} ms, p99 {result.p99_ms:.2f} ms, "
            f"{result.samples} samples, loss {result.loss:.2%}"
        )
    if kind == "routing":
        shares = ", ".join(f"{s.node} {s.share:.1%}" for s in result.shares)
        return f"{result.scenario}: {shares}; delivered {result.received}/{result.expected}"
    if kind == "paced":
        return (
            f"{result.scenario}: offered {result.offered:,.0f}/s ({result.schedule_share:.1%} "
            f"of schedule), delivered {result.delivered:,.0f}/s, lost {result.lost or 0:,} of "
            f"{result.acked:,} PUBACKed, {result.duplicates:,} duplicates, p50/p99/max "
            f"{result.p50_ms:.1f}/{result.p99_ms:.1f}/{result.max_ms:.1f} ms, broker CPU "
            + ", ".join(f"{c:.0%}" for c in result.broker_cpu)
        )
    return (
        f"{result.scenario} {result.variant}: {result.delivered:,.0f}/s delivered "
        f"(offered {result.offered:,.0f}/s), loss {result.loss:.2%}, broker CPU "
        + ", ".join(f"{c:.0%}" for c in result.broker_cpu)
    )


def progress(text: str) -> None:
    print(f"[bench {datetime.datetime.now():%H:%M:%S}] {text}", file=sys.stderr, flush=True)


def versions() -> dict[str, str]:
    found = {
        "mosquitto": mosquitto_version(),
        "amqtt": amqtt_version(),
        "confluent-kafka": metadata.version("confluent-kafka"),
        "librdkafka": confluent_kafka.libversion()[0],
    }
    try:
        found["uvloop"] = metadata.version("uvloop")
    except metadata.PackageNotFoundError:
        found["uvloop"] = "not installed"
    return found


def how_it_ran(settings: Settings) -> list[str]:
    each = settings.paced_rate / max(1, settings.publishers)
    return [
        "All brokers were started first (Headwater 1 node and 3 nodes on one Kafka, mosquitto, "
        "amqtt), each on 127.0.0.1 with a fresh port and the same limits where it has them "
        "(32 QoS 1/2 messages in flight and 1000 queued per client for mosquitto and Headwater; "
        "amqtt bounds neither); then every scenario ran against each "
        "broker in turn, one run at a time, after waiting (up to "
        f"{settings.settle_max:.0f} s) for every broker to go idle. The Kafka JVM, the brokers "
        "and the load generators share the machine's cores.",
        f"A Kafka the benchmark starts (1 GiB heap, ZGC) first carries {KAFKA_WARMUP:.0f} s of "
        "untimed records, so that its JIT has compiled the produce and fetch paths before the "
        "first scenario; the Headwater nodes get no warm-up beyond each run's own.",
        "Load generators are raw asyncio sockets (uvloop) with Headwater's codec: publishers in "
        f"one worker process, subscribers in {settings.sub_procs} other(s). QoS 0 publishers write "
        "pre-encoded batches; QoS 1 publishers keep "
        f"{settings.window} PUBLISH packets in flight per connection; subscribers count messages "
        "as they arrive and PUBACK QoS 1 ones.",
        "Each throughput scenario runs twice. *Open loop*: publishers send as fast as TCP takes "
        "the bytes, whatever the subscribers receive, so a broker that accepts more than it "
        "delivers builds a backlog (and may drop). *Bounded*: the publishers stay at most "
        f"{settings.backlog:,} messages ahead of what the subscribers have received (shared "
        "counters between the processes), which measures the rate a broker sustains end to end; "
        "if nothing arrives for 0.5 s the outstanding messages are written off as lost so a "
        "dropping broker cannot stall the run.",
        f"Latency runs publish at a steady {settings.rate:,.0f} msg/s with the send time "
        "(monotonic clock) in the payload; the subscriber records arrival - send for messages "
        "sent in the measured window.",
        f"Interest routing: topic log with {ROUTING_PARTITIONS} partitions, routing depth 2, "
        f"{settings.routing_messages} QoS 1 messages per device topic, published by one client "
        "on each node.",
        f"Paced QoS 1 fan-in (rows 8, 9): {settings.publishers} publishers -> 1 subscriber, open "
        f"loop at {settings.paced_rate:,.0f} msg/s in all ({each:,.0f} "
        "each, bench.load's pacer as bench.scale's fan-in uses it): each publisher sends on "
        "schedule whatever the subscriber does, every payload stamped with its send time and "
        "sequence number; its packet identifiers come from a window of "
        f"{settings.paced_window:,} unacknowledged PUBLISHes that only the broker's PUBACKs "
        "refill, so it waits for the broker (which acknowledges once the message is durable), "
        "never for the subscriber, and the share of the schedule sent shows when it had to. The "
        "subscriber PUBACKs everything and keeps every (topic, sequence) it receives. After the "
        "schedule and the last PUBACKs, it drains (until every PUBACKed message is in, or none "
        f"has arrived for {min(DRAIN_IDLE, settings.drain_max):g} s); lost = PUBACKed and never "
        "received, duplicates = received more than once, latency = send -> receive of first "
        "copies sent in the measured window. The schedule runs through the warm-up and the "
        "measured window: rates, CPU and latency are of the measured window, the accounting of "
        "the whole run. Row 9 publishes on node 1 and subscribes on node 2.",
        "Worker scaling (#10): one Headwater node per `--workers` value ("
        + ", ".join(str(n) for n in settings.workers)
        + "), started for that scenario alone and stopped after it; the fan-in scenarios (rows "
        "1, 2, open loop and bounded) run against each in turn. With N > 1 workers share the "
        "MQTT port through SO_REUSEPORT, so the kernel spreads the "
        f"{settings.publishers + 1} connections over them by hash: a message published on a "
        "worker other than the subscriber's crosses through Kafka, as between nodes, and the "
        "table gives the share that did (workers' GET /stats). Broker CPU is summed over the "
        "node's processes (the parent is idle).",
    ]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    spec, with_hostile = split_hostile(args.scenarios)
    spec, with_scale = split_scale(spec)
    keys = choose_scenarios(spec) if spec else []
    brokers = choose_brokers(args.brokers)
    settings = settings_from(args)
    install_signal_handlers()
    command = "python -m bench " + shlex.join(sys.argv[1:] if argv is None else argv)
    env = Environment(
        command=command.strip(),
        started=datetime.datetime.now().astimezone(),
        kafka="not used",
        versions=versions(),
        load_before=load_average(),
    )
    with ExitStack() as stack:
        work = work_directory(stack, args.work_dir, "hw-bench-")
        if args.profile is not None:
            args.profile = args.profile.resolve()
        runner = Runner(args, settings, work)
        section = hostile_section = ""
        try:
            if keys:
                runner.run(keys, brokers)
            if with_scale:
                section = run_scale(args, brokers, work, command.strip())
            if with_hostile:
                hostile_section = run_hostile(args, brokers, work, command.strip())
        except KeyboardInterrupt:
            progress("interrupted: stopping everything that was started")
            return 130
        except HeadwaterError as exc:
            progress(f"error: {exc}")
            return 1
        finally:
            env.kafka = runner.kafka_version
            env.headwater = runner.headwater_version
    env.load_after = load_average()
    text = render(runner.results, settings, env, how_it_ran(settings)) if keys else ""
    text = "\n".join(part for part in (text, section, hostile_section) if part)
    print(text)
    output = args.output or (None if args.quick else DEFAULT_OUTPUT)
    if output is not None and not args.no_write:
        output.parent.mkdir(parents=True, exist_ok=True)
        if keys:
            output.write_text(text)
        else:  # the scale and hostile sections alone replace their parts of the report
            if section:
                write_section(output, section)
            if hostile_section:
                write_section(output, hostile_section, (hostile.BEGIN, hostile.END))
        progress(f"report written to {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
