"""The scale benchmark's settings, what each scenario measured, and its markdown section.

Every cell comes from the figures of the run; nothing is hard-coded but the targets, which are
issue 11's.  The targets are Headwater's: the verdict column judges Headwater's figure alone, and
mosquitto's figure stands beside it for scale.  A figure measured while a load-generator process
or the whole machine was saturated is flagged (client- or machine-bound): it is then a lower
bound of what the broker can do, not its limit.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from bench.fanin import Accounting, SubscriberReport
from bench.fleet import ConnectReport, StatusReport
from bench.measure import KERNEL_COUNTERS, Usage, bottleneck, percentile
from bench.report import machine

SCENARIOS = ("idle", "connect", "fanin", "storm")
BROKERS = ("headwater", "mosquitto")
BEGIN, END = "<!-- scale:begin -->", "<!-- scale:end -->"

TARGET_KIB = 4.0
FILTERS = 1_000
"""Filters of the per-subscription figure: Headwater's default ``--max-subscriptions``."""
TARGET_CPU = 0.02
TARGET_REDIS = 50.0
TARGET_CLEAN = 5_000.0
TARGET_PERSISTENT = 2_000.0
DRAIN_IDLE, DRAIN_MAX = 10.0, 60.0
"""Fan-in: once the publishers are done, the subscriber waits for every PUBACKed message, until
none has arrived for ``DRAIN_IDLE`` seconds, ``DRAIN_MAX`` seconds at most."""
BEHIND = 0.99
"""Publishers that sent less than this share of their schedule fell behind it."""


@dataclass(frozen=True, slots=True)
class ScaleSettings:
    idle_clients: int = 10_000
    idle_window: float = 30.0
    keep_alive: int = 60
    burst: int = 5_000
    in_flight: int = 200
    storm_clients: int = 15_000
    storm_nodes: int = 3
    owed: int = 2
    storm_timeout: float = 90.0
    """Per reconnecting client: seconds to its CONNACK (SYN retries included)."""
    fanin_rate: float = 20_000.0
    fanin_seconds: float = 10.0
    fanin_publishers: int = 4
    fanin_window: int = 1_000
    """QoS 1 PUBLISH packets in flight per publisher: the pacer waits only when the broker has
    this many unacknowledged."""
    workers: int = 2
    kafka_warmup: float = 20.0
    headwater_rev: str | None = None
    """Run the nodes from this commit instead of the checkout."""
    scenarios: tuple[str, ...] = SCENARIOS
    brokers: tuple[str, ...] = BROKERS


# -- what was measured ------------------------------------------------------------------------


@dataclass(slots=True)
class Idle:
    clients: int
    connect: ConnectReport
    rss_before: int
    """KiB, before the connects."""
    rss_connected: int
    rss_after: int
    """KiB, at the end of the idle window."""
    usage: Usage
    redis_total: int | None
    redis_calls: dict[str, int]
    status: StatusReport
    filters: int = 0
    """Distinct filters one more client was granted, after the idle window (``filters``)."""
    rss_filters: int = 0
    """KiB the broker's RSS grew by while it took them."""

    @property
    def kib_per_connection(self) -> float:
        grown = max(self.rss_connected, self.rss_after) - self.rss_before
        return grown / self.connect.connected if self.connect.connected else 0.0

    @property
    def kib_per_filter(self) -> float:
        return self.rss_filters / self.filters if self.filters else 0.0

    @property
    def redis_per_second(self) -> float | None:
        return None if self.redis_total is None else self.redis_total / self.usage.seconds


@dataclass(frozen=True, slots=True)
class Latency:
    """Percentiles of CONNECT times, in ms: from the start of the TCP connect to the CONNACK
    (``total``), and from the CONNECT sent to the CONNACK (``mqtt``)."""

    p50: float
    p99: float
    mqtt_p50: float
    mqtt_p99: float

    @classmethod
    def of(cls, report: ConnectReport) -> Latency:
        """The percentiles of ``report``, whose samples are then dropped (they are large)."""
        total = [x * 1000 for x in report.latencies]
        mqtt = [x * 1000 for x in report.handshakes]
        report.latencies, report.handshakes = [], []
        return cls(
            percentile(total, 50), percentile(total, 99), percentile(mqtt, 50), percentile(mqtt, 99)
        )


@dataclass(slots=True)
class Burst:
    clean: bool
    connect: ConnectReport
    usage: Usage
    latency: Latency

    @property
    def rate(self) -> float:
        seconds = self.connect.seconds
        return self.connect.connected / seconds if seconds > 0 else 0.0


@dataclass(slots=True)
class Bursts:
    clean: Burst
    persistent: Burst


@dataclass(slots=True)
class Storm:
    nodes: int
    clients: int
    persistent: int
    owed_each: int
    leave: ConnectReport
    """The first connects and subscriptions."""
    published: int
    """Owed messages the broker PUBACKed."""
    storm: ConnectReport
    status: StatusReport
    usage: Usage
    latency: Latency

    @property
    def owed(self) -> int:
        """Messages owed in all (to every persistent session, connected again or not)."""
        return self.persistent * self.owed_each

    @property
    def messages_seconds(self) -> float | None:
        """From the start of the storm to the last owed message received."""
        if self.status.complete < self.persistent or not self.status.last_complete:
            return None
        return self.status.last_complete - self.storm.started


@dataclass(slots=True)
class Fanin:
    rate: float
    seconds: float
    accounting: Accounting
    subscriber: SubscriberReport
    usage: Usage

    @property
    def offered(self) -> float:
        return self.accounting.sent / self.seconds


Figures = Idle | Bursts | Storm | Fanin


@dataclass(slots=True)
class Outcome:
    scenario: str
    broker: str
    label: str
    figures: Figures | None = None
    error: str = ""


@dataclass(slots=True)
class ScaleRun:
    settings: ScaleSettings
    command: str
    started: datetime.datetime
    outcomes: list[Outcome] = field(default_factory=list)
    headwater: str = ""
    mosquitto: str = ""
    kafka: str = "not used"
    redis: str = "not used"
    load: str = ""
    seconds: float = 0.0

    def get(self, scenario: str, broker: str) -> Outcome | None:
        found = [o for o in self.outcomes if o.scenario == scenario and o.broker == broker]
        return found[0] if found else None


def usages(figures: Figures | None) -> list[tuple[str, Usage]]:
    if figures is None:
        return []
    if isinstance(figures, Bursts):
        return [("clean", figures.clean.usage), ("persistent", figures.persistent.usage)]
    return [("", figures.usage)]


def bottlenecks(outcome: Outcome) -> list[str]:
    cores = os.cpu_count() or 1
    found = [(what, bottleneck(u, cores)) for what, u in usages(outcome.figures)]
    return [f"{what + ': ' if what else ''}{note}" for what, note in found if note]


# -- cells ------------------------------------------------------------------------------------


def fmt_refusals(report: ConnectReport) -> str:
    if not report.failed:
        return "0 refused"
    parts = [f"CONNACK {code}: {n:,}" for code, n in sorted(report.refused.items())]
    if report.closed:
        parts.append(f"closed: {report.closed:,}")
    if report.timed_out:
        parts.append(f"no CONNACK: {report.timed_out:,}")
    return f"{report.failed:,} refused ({', '.join(parts)})"


def burst_cell(b: Burst) -> str:
    return (
        f"{b.rate:,.0f}/s ({b.connect.connected:,} in {b.connect.seconds:.2f} s; p50 "
        f"{b.latency.p50:,.1f} ms, p99 {b.latency.p99:,.1f} ms; {fmt_refusals(b.connect)})"
    )


def storm_cell(st: Storm) -> str:
    messages = st.messages_seconds
    upto = f", all owed messages after {messages:.1f} s" if messages is not None else ""
    return (
        f"last CONNACK after {st.storm.seconds:.1f} s{upto}; {fmt_refusals(st.storm)}; "
        f"sessions present {st.storm.session_present:,}/{st.persistent:,}; owed messages "
        f"received {st.status.owed_received:,}/{st.owed:,} ({st.status.duplicates:,} duplicates)"
    )


def fanin_cell(f: Fanin) -> str:
    a = f.accounting
    return (
        f"lost {a.lost:,} of {a.acked:,} PUBACKed; offered {f.offered:,.0f}/s; received "
        f"{a.distinct:,} ({a.duplicates:,} duplicates); p99 {f.subscriber.p99_ms:,.1f} ms"
    )


def error_summary(error: str) -> str:
    """A failure on one line: its first line and, for a traceback, its last (the exception)."""
    lines = [line.strip() for line in error.strip().splitlines() if line.strip()]
    if not lines:
        return "?"
    return lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"


def failed_cell(outcome: Outcome | None) -> str:
    if outcome is None:
        return "not run"
    first = outcome.error.splitlines()[0][:120] if outcome.error else "?"
    return f"failed: {first}"


def verdict(met: bool, missed: str) -> str:
    return "met" if met else f"**missed**: {missed}"


def times(value: float, target: float) -> str:
    return f"{value / target:.2f}x the target" if target else ""


# -- rows -------------------------------------------------------------------------------------

Row = tuple[str, str, str, str, str, str]
"""#, scenario, Headwater, mosquitto, target, verdict."""


F = TypeVar("F", Idle, Bursts, Storm, Fanin)


def figures_of(outcome: Outcome | None, kind: type[F]) -> F | None:
    if outcome is None or not isinstance(outcome.figures, kind):
        return None
    return outcome.figures


def idle_rows(s: ScaleSettings, head: Outcome | None, other: Outcome | None) -> list[Row]:
    h, o = figures_of(head, Idle), figures_of(other, Idle)

    def cells(f: Idle | None, outcome: Outcome | None) -> tuple[str, str, str]:
        if f is None:
            return (failed_cell(outcome),) * 3
        rps = f.redis_per_second
        return (
            f"{f.kib_per_connection:.2f} KB",
            f"{f.usage.broker:.2%} of a core",
            "n/a (no Redis)" if rps is None else f"{rps:,.1f}/s",
        )

    hc, oc = cells(h, head), cells(o, other)
    hf, of = filter_cell(h, head), filter_cell(o, other)
    kib, cpu = (h.kib_per_connection, h.usage.broker) if h else (0.0, 0.0)
    rps = (h.redis_per_second or 0.0) if h else 0.0
    return [
        ("1", f"memory per idle connection: {s.idle_clients:,} idle, half persistent, one QoS 1 "
         f"subscription each, keep-alive {s.keep_alive} s", hc[0], oc[0], f"<= {TARGET_KIB:g} KB",
         verdict(kib <= TARGET_KIB, times(kib, TARGET_KIB)) if h else "-"),
        ("2a", f"broker CPU while they idle for {s.idle_window:g} s", hc[1], oc[1],
         f"<= {TARGET_CPU:.0%} of a core",
         verdict(cpu <= TARGET_CPU, times(cpu, TARGET_CPU)) if h else "-"),
        ("2b", "Redis commands/s meanwhile (all of them, ours excluded)", hc[2], oc[2],
         f"<= {TARGET_REDIS:g}/s", verdict(rps <= TARGET_REDIS, times(rps, TARGET_REDIS))
         if h else "-"),
        ("2c", f"memory per subscription: one more client subscribes to {FILTERS:,} distinct "
         "4-level QoS 1 filters (`fleet/<client>/f<i>/cmd`)", hf, of, "-", "-"),
    ]  # fmt: skip


def filter_cell(f: Idle | None, outcome: Outcome | None) -> str:
    if f is None:
        return failed_cell(outcome)
    if not f.filters:
        return "none granted"
    return f"{f.kib_per_filter * 1024:,.0f} B ({f.filters:,} granted)"


def connect_rows(s: ScaleSettings, head: Outcome | None, other: Outcome | None) -> list[Row]:
    h, o = figures_of(head, Bursts), figures_of(other, Bursts)
    rows: list[Row] = []
    for number, kind, target in (
        ("3a", "clean", TARGET_CLEAN),
        ("3b", "persistent", TARGET_PERSISTENT),
    ):
        hb: Burst | None = getattr(h, kind) if h else None
        ob: Burst | None = getattr(o, kind) if o else None
        title = f"CONNECT/s: {s.burst:,} {kind}-session connects, {s.in_flight} in flight"
        met = hb is not None and hb.rate >= target and hb.connect.failed == 0
        missed = ""
        if hb is not None:
            slow = f"{hb.rate / target:.0%} of the target rate" if hb.rate < target else ""
            missed = "; ".join(m for m in (slow, "refusals" if hb.connect.failed else "") if m)
        rows.append((
            number, title, burst_cell(hb) if hb else failed_cell(head),
            burst_cell(ob) if ob else failed_cell(other), f">= {target:,.0f}/s, 0 refused",
            verdict(met, missed) if hb else "-",
        ))  # fmt: skip
    return rows


def storm_rows(s: ScaleSettings, head: Outcome | None, other: Outcome | None) -> list[Row]:
    h, o = figures_of(head, Storm), figures_of(other, Storm)
    title = (
        f"reconnect storm: {s.storm_clients:,} clients ({s.storm_clients // 2:,} persistent, each "
        f"owed {s.owed} QoS 1 messages) reconnect at once; Headwater: {s.storm_nodes} nodes, "
        f"clients connected directly round robin, each back on the next node"
    )
    missed = ""
    if h is not None:
        missed = ", ".join(
            what
            for what, bad in (
                ("refusals", h.storm.failed > 0),
                ("sessions missing", h.storm.session_present < h.persistent),
                ("messages missing", h.status.owed_received < h.owed),
            )
            if bad
        )
    return [
        ("4", title, storm_cell(h) if h else failed_cell(head),
         storm_cell(o) + " (1 node)" if o else failed_cell(other),
         "0 refused; every session present, with every owed message",
         verdict(not missed, missed) if h else "-"),
    ]  # fmt: skip


def fanin_rows(s: ScaleSettings, head: Outcome | None, other: Outcome | None) -> list[Row]:
    h, o = figures_of(head, Fanin), figures_of(other, Fanin)
    title = (
        f"QoS 1 fan-in paced at {s.fanin_rate:,.0f} msg/s for {s.fanin_seconds:g} s, "
        f"{s.fanin_publishers} publishers -> 1 subscriber"
    )
    lost = h.accounting.lost if h else 0
    return [
        ("5", title, fanin_cell(h) if h else failed_cell(head),
         fanin_cell(o) if o else failed_cell(other), "0 lost",
         verdict(lost == 0, f"{lost:,} lost") if h else "-"),
    ]  # fmt: skip


ROWS: dict[str, Callable[[ScaleSettings, Outcome | None, Outcome | None], list[Row]]] = {
    "idle": idle_rows,
    "connect": connect_rows,
    "storm": storm_rows,
    "fanin": fanin_rows,
}


def summary(settings: ScaleSettings, outcome: Outcome) -> str:
    """One line of an outcome, for progress output."""
    if outcome.figures is None:
        return failed_cell(outcome)
    rows = ROWS[outcome.scenario](settings, outcome, None)
    return "; ".join(f"#{r[0]} {r[2]}" for r in rows)


# -- details ----------------------------------------------------------------------------------


def mib(kib: int) -> str:
    return f"{kib / 1024:,.1f} MiB"


def cpu_text(u: Usage) -> str:
    load = ", ".join(f"{x:.0%}" for x in u.load)
    services = f", Kafka + Redis {u.services:.0%}" if u.services else ""
    return (
        f"broker {u.broker:.1%} of a core, load processes {load}{services}; machine "
        f"{u.machine:.2f} cores busy, {u.others:.2f} of them by other processes; over "
        f"{u.seconds:.1f} s"
    )


def connect_text(r: ConnectReport) -> str:
    text = f"{r.connected:,}/{r.attempted:,} connected in {r.seconds:.1f} s ({fmt_refusals(r)})"
    if r.subscribed or r.subscribe_failed:
        text += f", {r.subscribed:,} subscribed, {r.subscribe_failed:,} SUBSCRIBE failures"
    if r.errors:
        top = sorted(r.errors.items(), key=lambda kv: -kv[1])[:3]
        text += "; errors: " + "; ".join(f"{n:,}x {e}" for e, n in top)
    return text


def idle_details(f: Idle) -> list[str]:
    st = f.status
    lines = [
        f"connects: {connect_text(f.connect)}",
        f"RSS {mib(f.rss_before)} before, {mib(f.rss_connected)} once connected, "
        f"{mib(f.rss_after)} after the window, +{f.rss_filters:,} KiB for {f.filters:,} filters "
        "of one more client",
        f"CPU during the window: {cpu_text(f.usage)}",
        f"keep-alive: {st.pings:,} PINGREQ sent since connecting, {st.pongs:,} PINGRESP; "
        f"{st.open:,} of {st.devices:,} connections still open, {st.lost:,} closed by the broker",
    ]
    if f.redis_total is not None:
        top = sorted(f.redis_calls.items(), key=lambda kv: -kv[1])[:6]
        per_s = ", ".join(f"{name} {n / f.usage.seconds:,.1f}/s" for name, n in top)
        lines.append(f"Redis: {f.redis_total:,} commands in {f.usage.seconds:.1f} s ({per_s})")
    return lines


def tcp_text(latency: Latency, usage: Usage) -> str:
    kernel = ", ".join(
        f"{usage.kernel[name]:,} {what}"
        for name, what in KERNEL_COUNTERS.items()
        if name in usage.kernel
    )
    return (
        f"TCP up -> CONNACK p50 {latency.mqtt_p50:,.1f} ms, p99 {latency.mqtt_p99:,.1f} ms; the "
        f"kernel counted {kernel or 'nothing'} meanwhile"
    )


def bursts_details(f: Bursts) -> list[str]:
    return [
        f"{kind}: {connect_text(b.connect)}; {tcp_text(b.latency, b.usage)}; "
        f"CPU: {cpu_text(b.usage)}"
        for kind, b in (("clean", f.clean), ("persistent", f.persistent))
    ]


def storm_details(f: Storm) -> list[str]:
    st = f.status
    lines = [
        f"first connects: {connect_text(f.leave)}",
        f"owed messages PUBACKed before the storm: {f.published:,}/{f.owed:,}",
        f"storm: {connect_text(f.storm)}; TCP connect -> CONNACK p50 {f.latency.p50:,.0f} ms, "
        f"p99 {f.latency.p99:,.0f} ms; {tcp_text(f.latency, f.usage)}",
        f"CPU from the storm until every owed message arrived (or 60 s): {cpu_text(f.usage)}",
        f"sessions with all their messages: {st.complete:,}/{f.persistent:,}",
    ]
    if st.incomplete:
        lines.append("still missing messages, e.g.: " + ", ".join(st.incomplete))
    return lines


def fanin_details(f: Fanin) -> list[str]:
    a, sub = f.accounting, f.subscriber
    lines = [
        f"sent {a.sent:,} ({f.offered:,.0f}/s of {f.rate:,.0f}/s scheduled), PUBACKed "
        f"{a.acked:,}, never PUBACKed {a.unacked:,}; subscriber received {a.received:,} "
        f"({a.distinct:,} distinct)",
        f"latency send -> receive (first copies): p50 {sub.p50_ms:,.1f} ms, p99 "
        f"{sub.p99_ms:,.1f} ms, max {sub.max_ms:,.1f} ms",
        f"CPU while publishing: {cpu_text(f.usage)}",
    ]
    if f.offered < BEHIND * f.rate:
        lines.append(
            f"the publishers sent {f.offered / f.rate:.0%} of their schedule: the pacer waits "
            "while a publisher's window of unacknowledged PUBLISHes is full (the broker's PUBACKs "
            "were slow), or the publishing process could not keep up"
        )
    lines += a.problems
    return lines


def details(outcome: Outcome) -> list[str]:
    f = outcome.figures
    if f is None:
        return [f"failed: {error_summary(outcome.error)}"]
    if isinstance(f, Idle):
        lines = idle_details(f)
    elif isinstance(f, Bursts):
        lines = bursts_details(f)
    elif isinstance(f, Storm):
        lines = storm_details(f)
    else:
        lines = fanin_details(f)
    return lines + [f"**{note}**" for note in bottlenecks(outcome)]


TITLES = {
    "idle": "Idle connections (#1, #2)",
    "connect": "CONNECT bursts (#3)",
    "storm": "Reconnect storm (#4)",
    "fanin": "QoS 1 fan-in (#5)",
}


# -- the section ------------------------------------------------------------------------------


def setup(run: ScaleRun) -> list[str]:
    s = run.settings
    return [
        "| | |",
        "|---|---|",
        f"| Date | {run.started:%Y-%m-%d %H:%M} UTC |",
        f"| Machine | {machine()} |",
        f"| Headwater | {run.headwater} |",
        f"| mosquitto | {run.mosquitto} (no persistence, 32 messages in flight per client) |",
        f"| Kafka | {run.kafka} |",
        f"| Redis | {run.redis} |",
        f"| Load generator | {s.workers} processes ({run.load}); raw MQTT 3.1.1 on Headwater's "
        "codec; each process's open-file limit raised to its hard limit |",
        f"| Command | `{run.command}` |",
        f"| Took | {run.seconds / 60:.1f} min |",
    ]


def how_it_ran(s: ScaleSettings) -> list[str]:
    return [
        "Each scenario ran against a fresh broker, Headwater first, then mosquitto. Headwater "
        "nodes log to one Kafka and keep sessions in one Redis (each broker its own key prefix), "
        "both started by the benchmark; the broker, Kafka, Redis and the load generators share "
        "the machine.",
        f"#1-2: clients connect {s.in_flight} at a time; every connection sends PINGREQ every "
        f"{s.keep_alive} s, the first at a random point of its first period, so the fleet pings "
        f"at a steady N/{s.keep_alive} per second. Memory = growth of the broker's VmRSS "
        "(/proc/<pid>/status) from before the connects to the larger of 'connected' and 'after "
        "the window', over the connections made (KB = 1024 bytes). CPU = utime + stime of "
        "/proc/<pid>/stat over the window. Redis = growth of INFO total_commands_processed over "
        "the window, less our one INFO.",
        "#3: a CONNECT's time runs from the start of the TCP connect to the CONNACK; the rate is "
        "CONNACKs over the time from the first connect to the last CONNACK. Refused = CONNACK "
        "code != 0, a socket closed or reset before the CONNACK, or no CONNACK within 60 s. "
        "The details give the kernel's listen-queue overflows and SYN retransmissions over each "
        "burst: a SYN dropped for a full listen queue is sent again after 1 s, which shows in "
        "the p99 and stretches a short burst.",
        f"#4: the clients connect and subscribe ({s.in_flight} at a time), send DISCONNECT; each "
        f"persistent session is then published {s.owed} QoS 1 messages (every one PUBACKed); "
        f"then every client reconnects at once (no bound on connects in flight; "
        f"{s.storm_timeout:g} s each to get its CONNACK), persistent ones expecting "
        "session-present = 1 and their messages, clean ones subscribing again.",
        f"#5: bench.load's open-loop pacer: each publisher sends on schedule whatever the "
        f"subscriber does, up to {s.fanin_window:,} unacknowledged PUBLISHes; the subscriber "
        "PUBACKs every PUBLISH. Lost = (publisher, sequence number) PUBACKed to the publisher and "
        "never received, after a drain (until every PUBACKed message has arrived, or none "
        f"for {DRAIN_IDLE:g} s, {DRAIN_MAX:g} s at most).",
        "A figure marked client-bound was measured while a load process used >= 85% of a core, "
        "machine-bound while >= 90% of the machine's cores were busy: the broker may do better "
        "on a machine of its own.",
    ]


def render(run: ScaleRun) -> str:
    s = run.settings
    rows: list[Row] = []
    for scenario in SCENARIOS:
        if scenario in s.scenarios:
            rows += ROWS[scenario](
                s, run.get(scenario, "headwater"), run.get(scenario, "mosquitto")
            )
    lines = [
        BEGIN,
        "## Scale: idle fleets, CONNECT bursts, reconnect storms, paced fan-in",
        "",
        "Generated by `bench/scale.py`; the targets are issue 11's, judged on Headwater's figures.",
        "",
        *setup(run),
        "",
        "| # | Scenario | Headwater | mosquitto | Target | Headwater vs target |",
        "|---|---|---|---|---|---|",
        *[f"| {' | '.join(row)} |" for row in rows],
        "",
        "How it ran:",
        "",
        *[f"- {line}" for line in how_it_ran(s)],
        "",
        "### Details",
    ]
    for scenario in SCENARIOS:
        for outcome in (o for o in run.outcomes if o.scenario == scenario):
            lines += ["", f"{TITLES[scenario]}, {outcome.label}:", ""]
            lines += [f"- {line}" for line in details(outcome)]
    return "\n".join([*lines, END, ""])


def write_section(path: Path, section: str, markers: tuple[str, str] = (BEGIN, END)) -> None:
    """Put ``section`` into ``path`` in place of the one between the ``markers`` (by default
    the scale section's), or at the end."""
    begin, end = markers
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + section.rstrip("\n") + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
