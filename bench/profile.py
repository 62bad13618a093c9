"""``python -m bench profile``: where a message's microseconds go in one node, at full fan-in.

Issue 14, part 1: profile first.  One node of ``headwater dev up`` (its Kafka warmed by QoS 1
traffic first), then two runs, QoS 0 and QoS 1 fan-in (4 publishers -> 1 subscriber, 64-byte
payloads, as fast as the node takes them: :mod:`bench.load`'s ``flood0`` and ``flood1`` roles).
In each, after the warm-up:

1. a *measured window*: ``py-spy record --pid PID --duration S --rate 250 --gil --format raw``
   (``--gil``: only samples of the thread holding the GIL, i.e. Python running), with the node's
   ``GET /stats`` counters and its CPU time (``utime + stime`` of ``/proc/PID/stat``, every
   thread; and of ``/proc/PID/task/PID/stat``, the event-loop thread alone) read just before and
   just after;
2. right after it, a second window of the same length recorded as an SVG flame graph.

The raw collapsed stacks are then summarised (:func:`summarise`, pure): every sample goes to one
bucket, that of the deepest frame a :data:`RULES` entry matches; the microseconds per message of a
bucket are its share of the samples times the event-loop thread's CPU microseconds per message.
The rules name the product's files as py-spy prints them: strings, nothing imported.
"""

from __future__ import annotations

import datetime
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from dataclasses import dataclass, field, fields
from importlib import metadata
from pathlib import Path

import confluent_kafka

from bench.brokers import Broker, Headwater
from bench.load import Groups, Role, Timing
from bench.measure import (
    CLOCK_TICKS,
    cpu_ticks,
    load_average,
    machine,
    node_stats,
    python_version,
    settle,
    waited_seconds,
)
from bench.report import DEFAULT_OUTPUT, markers
from bench.throughput import SETTLED_CPU, warm_kafka

BEGIN, END = markers("profile")
SVG_DIR = Path("docs/flame")
SAMPLE_RATE = 250
PUBLISHERS = 4
WINDOW = 100
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


@dataclass(frozen=True, slots=True)
class Counts:
    """The node's counters and CPU times, read at once (a :class:`Reading`) or the difference of
    two readings (a :class:`Window`)."""

    received: int
    sent: int
    produced: int
    process_cpu: float
    main_cpu: float
    main_waited: float
    """Seconds the event-loop thread was ready to run but waited for a CPU (the second field
    of /proc/PID/task/PID/schedstat, nanoseconds)."""


@dataclass(frozen=True, slots=True)
class Reading(Counts):
    at: float

    @classmethod
    def take(cls, pid: int, stats_url: str) -> Reading:
        stats = node_stats(stats_url)
        process = cpu_ticks(Path(f"/proc/{pid}/stat").read_text()) / CLOCK_TICKS
        main = cpu_ticks(Path(f"/proc/{pid}/task/{pid}/stat").read_text()) / CLOCK_TICKS
        return cls(
            received=sum(stats["messages_received_by_qos"].values()),
            sent=sum(stats["messages_sent_by_qos"].values()),
            produced=int(stats["messages_produced"]),
            process_cpu=process,
            main_cpu=main,
            main_waited=waited_seconds(pid),
            at=time.monotonic(),
        )


@dataclass(frozen=True, slots=True)
class Window(Counts):
    """What the node did between two readings."""

    seconds: float

    @classmethod
    def between(cls, a: Reading, b: Reading) -> Window:
        done = {f.name: getattr(b, f.name) - getattr(a, f.name) for f in fields(Counts)}
        return cls(**done, seconds=b.at - a.at)

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
        self, pid: int, stats_url: str, start: float, seconds: int, raw: Path, svg: Path
    ) -> None:
        super().__init__(name="bench-flame-recorder", daemon=True)
        self.pid, self.stats_url, self.start_at = pid, stats_url, start
        self.seconds, self.raw, self.svg = seconds, raw, svg
        self.window: Window | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            time.sleep(max(0.0, self.start_at - time.monotonic()))
            before = Reading.take(self.pid, self.stats_url)
            record(self.pid, self.seconds, "raw", self.raw)
            after = Reading.take(self.pid, self.stats_url)
            self.window = Window.between(before, after)
            record(self.pid, self.seconds, "flamegraph", self.svg)
        except BaseException as exc:  # reported by the main thread
            self.error = exc


@dataclass(slots=True)
class Profiled:
    qos: int
    window: Window
    summary: Summary
    svg: Path
    offered: float

    @property
    def title(self) -> str:
        return f"QoS {self.qos} fan-in, {PUBLISHERS} publishers -> 1 subscriber, open loop"


def profile_run(qos: int, b: Broker, seconds: int, work: Path, svg_dir: Path) -> Profiled:
    raw, svg = work / f"qos{qos}.raw", svg_dir / f"qos{qos}.svg"
    at, warmup = b.endpoints[0], 2.0
    pubs = Role("flood1" if qos else "flood0", at, PUBLISHERS, f"fp{qos}", first=qos * 10,
                qos=qos, window=WINDOW, stamped=bool(qos))  # fmt: skip
    sub = Role("sub", at, 1, f"fs{qos}", filter="lg/#", qos=qos, stamped=bool(qos))
    groups = Groups([sub, pubs])
    try:
        groups.ready()
        t0 = time.monotonic() + 0.5
        timing = Timing(t0, t0 + warmup, t0 + warmup + 2 * seconds + SLACK, 1.0, 10.0)
        stats_url = b.stats[0]
        recorder = Recorder(b.pids[0], stats_url, timing.measure_from, seconds, raw, svg)
        recorder.start()
        groups.go(timing)
        reports = groups.reports(2 * seconds + 120)
    finally:
        groups.close()
    recorder.join(2 * seconds + 120)
    if recorder.error is not None or recorder.window is None:
        raise RuntimeError(f"qos{qos}: py-spy: {recorder.error or 'did not finish'}")
    offered = reports[1].sent_window / (2 * seconds + SLACK)
    return Profiled(qos, recorder.window, summarise(raw.read_text()), svg, offered)


@dataclass(slots=True)
class ProfileRun:
    command: str
    headwater: str
    seconds: int
    output: Path
    started: datetime.datetime = field(default_factory=lambda: datetime.datetime.now(datetime.UTC))
    load_before: str = field(default_factory=load_average)
    load_after: str = ""
    results: list[Profiled] = field(default_factory=list)


def run(
    work: Path, hw: Headwater, command: str, progress: Callable[[str], None], seconds: int,
    svg_dir: Path = SVG_DIR, output: Path = DEFAULT_OUTPUT,
) -> ProfileRun:  # fmt: skip
    out = ProfileRun(command, hw.version, seconds, output)
    svg_dir.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        b = hw.start(work, stack)
        warm = 3.0 if seconds < 5 else 20.0
        progress(f"profile: {b.label} up, pid {b.pids[0]}; warming Kafka up for {warm:g} s")
        warm_kafka(b, warm)
        for qos in (0, 1):
            settle(b.pids, SETTLED_CPU, 30.0)
            out.results.append(profile_run(qos, b, seconds, work, svg_dir))
            progress(f"profile qos{qos}: {summary_line(out.results[-1])}")
    out.load_after = load_average()
    return out


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
        f"### {p.title}",
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


def render(run: ProfileRun) -> str:
    lines = [
        BEGIN,
        "## Profile: where a message's microseconds go (one node, fan-in)",
        "",
        f"Measured {run.started:%Y-%m-%d %H:%M} UTC on {machine()} (load average before "
        f"{run.load_before}, after {run.load_after}); Headwater {run.headwater}; {versions()}. "
        f"Command: `{run.command}`.",
        "",
        "How: one node of `headwater dev up`; per run, bench.load's fan-in ("
        f"{PUBLISHERS} publishers -> 1 subscriber, 64-byte payloads, QoS 1 with {WINDOW} in "
        "flight per publisher) and, after 2 s of warm-up, "
        f"`py-spy record --pid PID --duration {run.seconds} --rate {SAMPLE_RATE} --gil "
        "--format raw`, with the node's `GET /stats` counters and its CPU time (`utime + stime` "
        "of /proc/PID/stat for the process, of /proc/PID/task/PID/stat for the event-loop "
        "thread) read just before and after; then a second window of the same length for the "
        "SVG (`--format flamegraph`). `--gil` keeps only samples of a thread holding the GIL. "
        "Each sample counts once, in the bucket of its deepest frame that a rule of "
        "`bench/profile.py` matches (`RULES`); µs/msg of a bucket = its share of the samples x "
        "the event-loop thread's CPU µs per message taken in. librdkafka's C threads are in the "
        "process CPU but not in GIL samples. py-spy pauses the node for each sample, so the "
        "rates here are a little below an unprofiled node's.",
    ]
    for p in run.results:
        lines += ["", *run_lines(p, run.output)]
    return "\n".join([*lines, END, ""])


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
