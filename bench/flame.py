"""``python -m bench.flame``: where a message's microseconds go in one node, at full fan-in.

Issue 14, part 1: profile first.  One Kafka (started as ``python -m bench`` starts it, warmed up
the same way) and ONE Headwater node (``python -m frontend`` of this checkout, as
:class:`bench.brokers.NodeLaunch` starts it, with ``--stats-listen``) on a log topic created as
``bench`` creates the single-node one.  Then two runs, QoS 0 and QoS 1 fan-in (4 publishers -> 1
subscriber, 64-byte payloads, open loop as fast as the node takes them: :mod:`bench.load`'s
groups driven by :func:`bench.scenarios.drive`).  In each, after the warm-up:

1. a *measured window*: ``py-spy record --pid PID --duration S --rate 250 --gil --format raw``
   (``--gil``: only samples of the thread holding the GIL, i.e. Python running, idle threads
   left out), with the node's ``GET /stats`` counters and its CPU time (``utime + stime`` of
   ``/proc/PID/stat``, every thread; and of ``/proc/PID/task/PID/stat``, the event-loop thread
   alone) read just before and just after;
2. right after it, a second window of the same length recorded as an SVG flame graph
   (``--format flamegraph``: py-spy cannot write both formats from one recording).

The raw collapsed stacks are then summarised (:func:`summarise`, pure): every sample goes to
one bucket, that of the deepest frame a :data:`RULES` entry matches; the implied microseconds per
message of a bucket are its share of the samples times the event-loop thread's CPU microseconds
per message.  librdkafka's C threads are in the process's CPU time but not in the GIL samples.

The markdown section goes between ``<!-- profile:begin -->`` and ``<!-- profile:end -->`` of
``docs/benchmarks.md`` (after the main results' Details section when the markers are absent).
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterable
from contextlib import ExitStack
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import confluent_kafka

from bench.__main__ import SETTLED_CPU, SINGLE_PARTITIONS
from bench.brokers import (
    KAFKA_WARMUP,
    BenchKafka,
    NodeLaunch,
    RunningBroker,
    describe_checkout,
    node_has_stats,
    node_stats,
    start_headwater,
)
from bench.cpu import settle, waited_seconds
from bench.jobs import install_signal_handlers, work_directory
from bench.load import ClientPlan, GroupPlan, Mode, Timing
from bench.measure import CLOCK_TICKS, cpu_ticks
from bench.report import load_average, machine, python_version
from bench.scenarios import drive, sleep_until
from headwater.errors import HeadwaterError

BEGIN, END = "<!-- profile:begin -->", "<!-- profile:end -->"
DEFAULT_OUTPUT = Path("docs/benchmarks.md")
DEFAULT_SVG_DIR = Path("docs/flame")
SAMPLE_RATE = 250
PUBLISHERS = 4
PAYLOAD = 64
TOP = 15
SLACK = 3.0
"""Seconds the publishers keep going after the two windows' nominal end (py-spy's attach)."""

# -- the summary of collapsed stacks (pure) -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Bucket:
    key: str
    title: str
    covers: str


BUCKETS: tuple[Bucket, ...] = (
    Bucket("decode", "MQTT decode", "codec.py decode side (`Decoder`, `_decode_*`), `_Input.take`"),
    Bucket(
        "channel",
        "channel + session",
        "mqttcore/channel.py, session.py, message.py; connection.py's `_drain`/`run`",
    ),
    Bucket(
        "produce",
        "produce to Kafka",
        "publishing.py `produce`; log.py `produce`, `Outbox`, `_send_outbox` (librdkafka's "
        "`produce_batch`); record.encode; the partitioner",
    ),
    Bucket(
        "reports",
        "delivery reports",
        "log.py `_serve_producer` (`producer.poll`), `_deliver_reports`, the delivery callbacks; "
        "publishing.py's callbacks and acknowledgements",
    ),
    Bucket(
        "consume",
        "consume + record decode",
        "router/reader.py (`consumer.consume`), record.decode, catch-up",
    ),
    Bucket(
        "dispatch",
        "dispatch + match",
        "router/dispatch.py, index.py, subscriptions.py, delivery.py, backlog.py; "
        "`MqttConnection.deliver`",
    ),
    Bucket(
        "writes",
        "encode + socket writes",
        "codec.py encode side (`PublishTemplate`, `encode*`); connection.py `_Output`, `Writes` "
        "(`transport.write`)",
    ),
    Bucket("other", "event loop and other", "asyncio/uvloop callbacks, the log's pump, the rest"),
)
OTHER = "other"


@dataclass(frozen=True, slots=True)
class Rule:
    """Frames of ``file`` (a path as py-spy shows it, or its tail) whose qualified function name
    is in ``functions`` (``Name.*`` or ``_prefix*``: every name starting so; empty: any) go to
    ``bucket``."""

    bucket: str
    file: str
    functions: tuple[str, ...] = ()

    def matches(self, file: str, function: str) -> bool:
        if file != self.file and not file.endswith("/" + self.file):
            return False
        if not self.functions:
            return True
        return any(
            function.startswith(f[:-1]) if f.endswith("*") else function == f
            for f in self.functions
        )


def rule(bucket: str, file: str, functions: str = "") -> Rule:
    """A :class:`Rule`; ``functions`` separated by spaces."""
    return Rule(bucket, file, tuple(functions.split()))


CODEC, CONNECTION = "mqttcore/codec.py", "frontend/connection.py"
PUBLISHING, LOG, RECORD = "frontend/publishing.py", "router/log.py", "router/record.py"
RULES: tuple[Rule, ...] = (
    # the encode side of the codec; the rest of it decodes
    rule("writes", CODEC, "PublishTemplate.* encode* _encode* _publish_* _remaining_length "
         "_packet _binary _string"),
    rule("decode", CODEC),
    rule("decode", CONNECTION, "_Input.take _Input.__init__"),
    rule("writes", CONNECTION, "_Output.* Writes.*"),
    rule("dispatch", CONNECTION, "MqttConnection.deliver"),
    rule("channel", CONNECTION, "MqttConnection.*"),
    rule("channel", "mqttcore/channel.py"),
    rule("channel", "mqttcore/session.py"),
    rule("channel", "mqttcore/message.py"),
    rule("reports", PUBLISHING, "Publishing._produce.<locals>.*"),
    rule("produce", PUBLISHING, "Publishing.produce Publishing._produce Publishing._retry"),
    rule("reports", PUBLISHING),
    rule("reports", LOG, "KafkaLog._serve_producer KafkaLog._deliver_reports "
         "KafkaLog._reporter.<locals>.* KafkaLog._count_delivery LatencyHistogram.*"),
    rule("produce", LOG, "KafkaLog.produce KafkaLog._reporter Outbox.* KafkaLog._send_outbox "
         "KafkaLog._wake_pump"),
    rule("consume", RECORD, "decode _long _last_long _bytes _text"),
    rule("produce", RECORD),
    rule("produce", "router/partitioner.py"),
    rule("consume", "router/reader.py"),
    rule("consume", "router/catchup.py"),
    rule("writes", "router/delivery.py", "template_for"),
    *(
        rule("dispatch", f"router/{name}.py")
        for name in ("dispatch", "index", "subscriptions", "delivery", "backlog", "interest",
                     "shared", "topics")
    ),
)  # fmt: skip

FRAME = re.compile(r"^(?P<function>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def parse_frame(frame: str) -> tuple[str, str]:
    """``Class.method (path/file.py:123)`` -> (qualified function, file); a frame of another
    shape (a native one, a thread name) -> (the frame, "")."""
    found = FRAME.match(frame.strip())
    if found is None:
        return frame.strip(), ""
    return found["function"], found["file"]


def parse_collapsed(text: str) -> list[tuple[list[str], int]]:
    """py-spy's ``--format raw`` (Brendan Gregg's collapsed stacks): one ``root;...;leaf COUNT``
    per line -> (frames root first, count)."""
    stacks = []
    for line in text.splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        if stack and count.isdigit():
            stacks.append((stack.split(";"), int(count)))
    return stacks


def bucket_of(frames: list[str], rules: Iterable[Rule] = RULES) -> str:
    """The bucket of the deepest frame a rule matches (the first rule that matches it)."""
    rules = tuple(rules)
    for frame in reversed(frames):
        function, file = parse_frame(frame)
        for rule in rules:
            if rule.matches(file, function):
                return rule.bucket
    return OTHER


def function_of(frame: str) -> str:
    """A frame without its line number: ``Class.method (path/file.py)``."""
    function, file = parse_frame(frame)
    return f"{function} ({file})" if file else function


@dataclass(slots=True)
class Summary:
    samples: int = 0
    buckets: dict[str, int] = field(default_factory=dict)
    """Bucket key -> samples, every bucket of :data:`BUCKETS` present."""
    self_samples: list[tuple[str, int, str]] = field(default_factory=list)
    """(function, samples with it as the leaf frame, its bucket), most first."""

    def share(self, samples: int) -> float:
        return samples / self.samples if self.samples else 0.0


def summarise(text: str, rules: Iterable[Rule] = RULES) -> Summary:
    """Collapsed stacks -> samples per bucket and per function (self samples)."""
    rules = tuple(rules)
    buckets = Counter({b.key: 0 for b in BUCKETS})
    own: Counter[str] = Counter()
    leaf_bucket: dict[str, str] = {}
    total = 0
    for frames, count in parse_collapsed(text):
        bucket = bucket_of(frames, rules)
        buckets[bucket] += count
        leaf = function_of(frames[-1])
        own[leaf] += count
        leaf_bucket.setdefault(leaf, bucket)
        total += count
    ranked = sorted(own.items(), key=lambda item: (-item[1], item[0]))
    return Summary(total, dict(buckets), [(f, n, leaf_bucket[f]) for f, n in ranked])


# -- measuring one node ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reading:
    at: float
    received: int
    sent: int
    produced: int
    process_cpu: float
    main_cpu: float
    main_waited: float
    """Seconds the event-loop thread was ready to run but waited for a CPU (the second field
    of /proc/PID/task/PID/schedstat, nanoseconds)."""

    @classmethod
    def take(cls, pid: int, stats_port: int) -> Reading:
        stats = node_stats(stats_port)
        process = cpu_ticks(Path(f"/proc/{pid}/stat").read_text()) / CLOCK_TICKS
        main = cpu_ticks(Path(f"/proc/{pid}/task/{pid}/stat").read_text()) / CLOCK_TICKS
        return cls(
            time.monotonic(),
            sum(stats["messages_received_by_qos"].values()),
            sum(stats["messages_sent_by_qos"].values()),
            int(stats["messages_produced"]),
            process,
            main,
            waited_seconds(pid),
        )


@dataclass(frozen=True, slots=True)
class Window:
    """What the node did between two readings."""

    seconds: float
    received: int
    sent: int
    produced: int
    process_cpu: float
    main_cpu: float
    main_waited: float

    @classmethod
    def between(cls, a: Reading, b: Reading) -> Window:
        return cls(
            b.at - a.at,
            b.received - a.received,
            b.sent - a.sent,
            b.produced - a.produced,
            b.process_cpu - a.process_cpu,
            b.main_cpu - a.main_cpu,
            b.main_waited - a.main_waited,
        )

    def per_message_us(self, cpu_seconds: float) -> float:
        return cpu_seconds / self.received * 1e6 if self.received else 0.0


def py_spy() -> str:
    beside = Path(sys.executable).with_name("py-spy")
    found = str(beside) if beside.exists() else shutil.which("py-spy")
    if found is None:
        raise RuntimeError("py-spy is not installed (pip install py-spy; in the test extra)")
    return found


def py_spy_version() -> str:
    try:
        return subprocess.run(
            [py_spy(), "--version"], capture_output=True, text=True, check=False
        ).stdout.strip()
    except (RuntimeError, OSError):
        return "py-spy not installed"


def record_argv(pid: int, seconds: int, fmt: str, out: Path) -> list[str]:
    return [
        py_spy(), "record", "--pid", str(pid), "--duration", str(seconds),
        "--rate", str(SAMPLE_RATE), "--gil", "--format", fmt, "-o", str(out),
    ]  # fmt: skip


def record(pid: int, seconds: int, fmt: str, out: Path) -> None:
    argv = record_argv(pid, seconds, fmt, out)
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=seconds + 60)
    if done.returncode != 0 or not out.exists():
        raise RuntimeError(f"{shlex.join(argv)} failed: {(done.stderr or done.stdout).strip()}")


class Recorder(threading.Thread):
    """From ``start``: the measured window (raw profile, readings around it), then the SVG's."""

    def __init__(
        self, pid: int, stats_port: int, start: float, seconds: int, raw: Path, svg: Path
    ) -> None:
        super().__init__(name="bench-flame-recorder", daemon=True)
        self.pid, self.stats_port, self.start_at = pid, stats_port, start
        self.seconds, self.raw, self.svg = seconds, raw, svg
        self.window: Window | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            sleep_until(self.start_at)
            before = Reading.take(self.pid, self.stats_port)
            record(self.pid, self.seconds, "raw", self.raw)
            after = Reading.take(self.pid, self.stats_port)
            self.window = Window.between(before, after)
            record(self.pid, self.seconds, "flamegraph", self.svg)
        except BaseException as exc:  # reported by the main thread
            self.error = exc


@dataclass(frozen=True, slots=True)
class RunSpec:
    name: str
    qos: int
    rate: float
    """Messages per second over all publishers; 0: open loop (as fast as the node takes)."""

    @property
    def title(self) -> str:
        load = f"paced at {self.rate:,.0f} msg/s in all" if self.rate else "open loop"
        return f"QoS {self.qos} fan-in, {PUBLISHERS} publishers -> 1 subscriber, {load}"


@dataclass(slots=True)
class Profiled:
    spec: RunSpec
    window: Window
    summary: Summary
    svg: Path
    raw: Path
    offered: float
    """Messages per second the publishers sent over the whole timed part of the run."""


@dataclass(frozen=True, slots=True)
class Options:
    seconds: int
    warmup: float
    window: int
    work: Path
    svg_dir: Path


def plans(spec: RunSpec, broker: RunningBroker, tag: str, window: int) -> list[list[GroupPlan]]:
    """The fan-in's groups, as ``bench.scenarios.run_throughput`` lays them out."""
    at = broker.endpoints[0]
    topics = [f"bench/{tag}-p{i}/t" for i in range(PUBLISHERS)]
    pubs = tuple(ClientPlan(f"{tag}-pub{i}", at, (t,), spec.qos) for i, t in enumerate(topics))
    sub = ClientPlan(f"{tag}-sub0", at, tuple(topics), spec.qos)
    mode: Mode = "paced" if spec.rate else "flood"
    return [
        [GroupPlan("subscribers0", "sub", (sub,), payload_size=PAYLOAD)],
        [
            GroupPlan(
                "publishers", "pub", pubs, mode=mode, rate=spec.rate / PUBLISHERS,
                window=window, payload_size=PAYLOAD,
            )
        ],
    ]  # fmt: skip


def profile_run(spec: RunSpec, broker: RunningBroker, options: Options, tag: str) -> Profiled:
    pid, stats_port = broker.processes[0].pid, broker.stats_ports[0]
    raw = options.work / f"{spec.name}.raw"
    svg = options.svg_dir / f"{spec.name}.svg"
    sub_plans, pub_plans = plans(spec, broker, f"{tag}-{spec.name}", options.window)
    recorders: list[Recorder] = []

    def timing(start: float) -> Timing:
        measure_from = start + options.warmup
        recorder = Recorder(pid, stats_port, measure_from, options.seconds, raw, svg)
        recorder.start()
        recorders.append(recorder)
        end = measure_from + 2 * options.seconds + SLACK
        return Timing(start, measure_from, end, drain_max=5.0)

    run = drive(broker, sub_plans, pub_plans, timing, profile_name=spec.name)
    recorder = recorders[0]
    recorder.join(options.seconds * 2 + 120)
    if recorder.error is not None:
        raise RuntimeError(f"{spec.name}: {recorder.error}") from recorder.error
    if recorder.window is None:
        raise RuntimeError(f"{spec.name}: py-spy did not finish")
    offered = sum(r.sent_window for r in run.pubs) / run.window if run.window else 0.0
    summary = summarise(raw.read_text())
    return Profiled(spec, recorder.window, summary, svg, raw, offered)


# -- the report -----------------------------------------------------------------------------------


@dataclass(slots=True)
class Context:
    started: datetime.datetime
    command: str
    headwater: str
    kafka: str
    output: Path
    load_before: str
    load_after: str = ""


def versions() -> str:
    try:
        uvloop = metadata.version("uvloop")
    except metadata.PackageNotFoundError:
        uvloop = "not installed"
    return (
        f"{python_version()}, uvloop {uvloop}, confluent-kafka "
        f"{metadata.version('confluent-kafka')} (librdkafka {confluent_kafka.libversion()[0]}), "
        f"{py_spy_version()}"
    )


def link(svg: Path, output: Path) -> str:
    """A link to ``svg`` that works from the markdown file ``output``."""
    target = os.path.relpath(svg.resolve(), output.resolve().parent)
    return f"[{svg.as_posix()}]({Path(target).as_posix()})"


def run_lines(p: Profiled, output: Path) -> list[str]:
    w, s = p.window, p.summary
    main_us = w.per_message_us(w.main_cpu)
    rest_us = w.per_message_us(w.process_cpu - w.main_cpu)
    gil_seconds = s.samples / SAMPLE_RATE
    gil_us = gil_seconds / w.received * 1e6 if w.received else 0.0
    lines = [
        f"### {p.spec.title}",
        "",
        f"- Taken in: **{w.received / w.seconds:,.0f} msgs/s** ({w.received:,} PUBLISHes in "
        f"{w.seconds:.1f} s, the node's `messages_received_by_qos`); written to the subscriber "
        f"{w.sent / w.seconds:,.0f}/s; acknowledged by Kafka {w.produced / w.seconds:,.0f}/s "
        f"(`messages_produced`: QoS 1 only); publishers offered {p.offered:,.0f}/s.",
        f"- Node process CPU: {w.process_cpu / w.seconds:.0%} of a core = "
        f"**{w.per_message_us(w.process_cpu):.1f} µs/msg**: the event-loop thread "
        f"{main_us:.1f} µs/msg, the other threads (librdkafka's C threads) {rest_us:.1f} µs/msg.",
        f"- The event-loop thread ran {w.main_cpu / w.seconds:.0%} of the window and was ready "
        f"to run but waited for a CPU {w.main_waited / w.seconds:.0%} of it (`schedstat`): the "
        "time a PUBACK that arrived meanwhile waited too.",
        f"- GIL samples: {s.samples:,} at {SAMPLE_RATE}/s (the GIL held "
        f"{gil_seconds / w.seconds:.0%} of the window, {gil_us:.1f} µs/msg of wall time: more "
        "than the thread's CPU when it is descheduled holding the GIL).",
        f"- Flame graph: {link(p.svg, output)} (the window right after the measured one).",
        "",
        "| Bucket | Covers | Samples | Share | µs/msg |",
        "|---|---|---:|---:|---:|",
    ]
    for b in BUCKETS:
        n = s.buckets.get(b.key, 0)
        lines.append(
            f"| {b.title} | {b.covers} | {n:,} | {s.share(n):.1%} | {s.share(n) * main_us:.2f} |"
        )
    lines += [
        f"| **all** | | {s.samples:,} | 100% | {main_us:.2f} |",
        "",
        f"Top {TOP} functions by self samples (the leaf frame):",
        "",
        "| # | Function | Self samples | Share | µs/msg | Bucket |",
        "|---:|---|---:|---:|---:|---|",
    ]
    titles = {b.key: b.title for b in BUCKETS}
    for k, (function, n, bucket) in enumerate(s.self_samples[:TOP], 1):
        shown = function.replace("|", "\\|")
        lines.append(
            f"| {k} | `{shown}` | {n:,} | {s.share(n):.1%} | {s.share(n) * main_us:.2f} | "
            f"{titles.get(bucket, bucket)} |"
        )
    return lines


def render(results: list[Profiled], ctx: Context, options: Options) -> str:
    lines = [
        BEGIN,
        "## Profile: where a message's microseconds go (one node, fan-in)",
        "",
        f"Measured {ctx.started:%Y-%m-%d %H:%M %Z} on {machine()} (load average before "
        f"{ctx.load_before}, after {ctx.load_after}); Headwater {ctx.headwater}; {versions()}; "
        f"Kafka {ctx.kafka}. Command: `{ctx.command}`.",
        "",
        "How: one Headwater node (`python -m frontend --stats-listen ...`, log topic of "
        f"{SINGLE_PARTITIONS} partitions) on one Kafka; per run, bench.load's fan-in ("
        f"{PUBLISHERS} publishers -> 1 subscriber, {PAYLOAD}-byte payloads, QoS 1 with "
        f"{options.window} in flight per publisher) and, after {options.warmup:g} s of warm-up, "
        f"`py-spy record --pid PID --duration {options.seconds} --rate {SAMPLE_RATE} --gil "
        "--format raw`, with the node's `GET /stats` counters and its CPU time (`utime + stime` "
        "of /proc/PID/stat for the process, of /proc/PID/task/PID/stat for the event-loop "
        "thread) read just before and after; then a second window of the same length for the "
        "SVG (`--format flamegraph`). `--gil` keeps only samples of a thread holding the GIL: "
        "Python (and C called from Python with the GIL held, e.g. `producer.poll`, "
        "`transport.write`) and no idle thread. Each sample counts once, in the bucket of its "
        "deepest frame that a rule of `bench/flame.py` matches (`RULES`); µs/msg of a bucket = "
        "its share of the samples x the event-loop thread's CPU µs per message taken in. "
        "librdkafka's C threads (batching, compression, the network) are in the process CPU but "
        "not in GIL samples. `__create_fn__.<locals>.__init__ (<string>)` is a dataclass's "
        "generated `__init__` (its caller's bucket). py-spy pauses the node for each sample, "
        "so the rates here are a little below an unprofiled node's.",
    ]
    for p in results:
        lines += ["", *run_lines(p, ctx.output)]
    return "\n".join([*lines, END, ""])


def write_section(path: Path, section: str) -> None:
    """``section`` in place of the one between the markers; else after the Details section of
    the main results (before the next heading or marker after ``## Details``); else at the end."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + section.rstrip("\n") + rest.split(END, 1)[1]
    else:
        lines = text.splitlines(keepends=True)
        heads = [k for k, line in enumerate(lines) if line.startswith(("## ", "# ", "<!--"))]
        details = [k for k in heads if lines[k].strip() == "## Details"]
        end = next((k for k in heads if details and k > details[0]), None)
        if end is None:
            text = text.rstrip("\n") + "\n\n" + section
        else:
            head = "".join(lines[:end]).rstrip("\n") + "\n\n"
            text = head + section.rstrip("\n") + "\n\n" + "".join(lines[end:])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


# -- the command ----------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.flame", description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=int, default=10, help="seconds per py-spy window [10]")
    p.add_argument("--warmup", type=float, default=2.0, help="warm-up seconds per run [2]")
    p.add_argument("--rate-qos0", type=float, default=0.0, help="msgs/s in all; 0: open loop [0]")
    p.add_argument("--rate-qos1", type=float, default=0.0, help="msgs/s in all; 0: open loop [0]")
    p.add_argument("--window", type=int, default=100, help="QoS 1 in flight per publisher [100]")
    p.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help=f"[{DEFAULT_OUTPUT}]")
    p.add_argument(
        "--svg-dir",
        type=Path,
        help=f"flame graphs here [{DEFAULT_SVG_DIR}; with --no-write a new directory in /tmp]",
    )
    p.add_argument("--no-write", action="store_true", help="print the section only")
    p.add_argument("--kafka-bootstrap", help="use this Kafka instead of starting one")
    p.add_argument(
        "--kafka-warmup",
        type=float,
        default=KAFKA_WARMUP,
        help=f"seconds of untimed records through a Kafka started here [{KAFKA_WARMUP:g}]",
    )
    p.add_argument("--work-dir", type=Path, help="logs and raw profiles here [a temp dir]")
    return p


def progress(text: str) -> None:
    print(f"[bench.flame {datetime.datetime.now():%H:%M:%S}] {text}", file=sys.stderr, flush=True)


def profile_all(args: argparse.Namespace, options: Options, ctx: Context) -> list[Profiled]:
    specs = [RunSpec("qos0", 0, args.rate_qos0), RunSpec("qos1", 1, args.rate_qos1)]
    tag = uuid.uuid4().hex[:6]
    results = []
    with ExitStack() as stack:
        progress("starting Kafka" if not args.kafka_bootstrap else "using Kafka")
        kafka = BenchKafka(options.work, stack, args.kafka_bootstrap)
        ctx.kafka = kafka.version
        if kafka.local is not None and args.kafka_warmup > 0:
            progress(f"warming Kafka up for {args.kafka_warmup:g} s")
            progress(f"warm-up: {kafka.warm_up(args.kafka_warmup):,} records through Kafka")
        topic = kafka.create_topic(f"bench.{tag}.1n", SINGLE_PARTITIONS)
        launch = NodeLaunch(stats=node_has_stats(None))
        if not launch.stats:
            raise RuntimeError("python -m frontend has no --stats-listen")
        broker = start_headwater(kafka, topic, SINGLE_PARTITIONS, 1, options.work, stack, launch)
        progress(f"{broker.label}: up on {broker.endpoints}, pid {broker.processes[0].pid}")
        for spec in specs:
            waited = settle(broker.pids, SETTLED_CPU, 30.0)
            progress(f"{spec.name}: {spec.title} (node idle after {waited:.1f} s)")
            result = profile_run(spec, broker, options, tag)
            results.append(result)
            progress(f"{spec.name}: {summary_line(result)}")
    return results


def summary_line(p: Profiled) -> str:
    w, s = p.window, p.summary
    main_us = w.per_message_us(w.main_cpu)
    top = sorted(BUCKETS, key=lambda b: -s.buckets.get(b.key, 0))[:4]
    buckets = ", ".join(
        f"{b.title} {s.share(s.buckets.get(b.key, 0)):.0%}"
        f" ({s.share(s.buckets.get(b.key, 0)) * main_us:.1f} µs)"
        for b in top
    )
    return (
        f"{w.received / w.seconds:,.0f} msgs/s in, process CPU "
        f"{w.per_message_us(w.process_cpu):.1f} µs/msg (event loop {main_us:.1f}), "
        f"{s.samples:,} GIL samples: {buckets}"
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    install_signal_handlers()
    command = "python -m bench.flame " + shlex.join(sys.argv[1:] if argv is None else argv)
    svg_dir = args.svg_dir
    if svg_dir is None:
        svg_dir = Path(tempfile.mkdtemp(prefix="hw-flame-")) if args.no_write else DEFAULT_SVG_DIR
    svg_dir.mkdir(parents=True, exist_ok=True)
    ctx = Context(
        started=datetime.datetime.now().astimezone(),
        command=command.strip(),
        headwater=describe_checkout(),
        kafka="?",
        output=args.output,
        load_before=load_average(),
    )
    with ExitStack() as stack:
        work = work_directory(stack, args.work_dir, "hw-flame-")
        options = Options(args.seconds, args.warmup, args.window, work, svg_dir)
        try:
            results = profile_all(args, options, ctx)
        except KeyboardInterrupt:
            progress("interrupted: stopping everything that was started")
            return 130
        except (HeadwaterError, RuntimeError, OSError) as exc:
            progress(f"error: {exc}")
            return 1
    ctx.load_after = load_average()
    section = render(results, ctx, options)
    print(section)
    for p in results:
        progress(f"flame graph: {p.svg}")
    if not args.no_write:
        write_section(args.output, section)
        progress(f"section written to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
