"""The benchmark's markdown report: setup, one results table, the targets' verdict, details.

Every figure comes from the :class:`bench.scenarios.Result` values of this run; nothing is
hard-coded.  Ratios are Headwater's value over the other broker's: for throughput higher is
better; for latency the ratio is of p99, where lower is better.  Cluster scenarios put the other
brokers' single-node result of the matching scenario beside Headwater's 3-node one.
"""

from __future__ import annotations

import datetime
import os
import platform
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from bench import targets
from bench.scenarios import SCENARIOS, Result, Scenario, Settings
from bench.worker_scaling import section as workers_section

TARGET_RATIO = 5.0
TARGET_P99_MS = 5.0
OTHERS = ("mosquitto", "amqtt")


@dataclass(slots=True)
class Environment:
    command: str
    started: datetime.datetime
    kafka: str
    versions: dict[str, str]
    load_before: str
    load_after: str = ""
    headwater: str = ""


def machine() -> str:
    model = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem_kib = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    debian = Path("/etc/debian_version")
    distro = f"Debian {debian.read_text().strip()}" if debian.exists() else platform.system()
    return (
        f"nproc {os.cpu_count()}, CPU {model}, RAM {mem_kib / 1024 / 1024:.1f} GiB, "
        f"{distro}, Linux {platform.release()}"
    )


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f}, {five:.2f}, {fifteen:.2f}"


def python_version() -> str:
    return f"{platform.python_implementation()} {sys.version.split()[0]}"


# -- cells ------------------------------------------------------------------------------------


def fmt_rate(value: float) -> str:
    return f"{value:,.0f}"


def fmt_pct(value: float) -> str:
    return f"{value * 100:.1f}%" if value >= 0.0005 or value == 0 else f"{value * 100:.2f}%"


def cell(result: Result | None, annotate: str = "") -> str:
    if result is None:
        return "not run"
    if not result.ok:
        return f"failed: {result.error.splitlines()[0][:80] if result.error else '?'}"
    suffix = f" {annotate}" if annotate else ""
    scenario = SCENARIOS[result.scenario]
    if scenario.kind == "latency":
        return f"{result.p50_ms:.2f} / {result.p99_ms:.2f}{suffix}"
    if scenario.kind == "routing":
        return ", ".join(f"{s.node} {fmt_pct(s.share)}" for s in result.shares)
    if scenario.kind == "paced":
        return (
            f"{fmt_rate(result.delivered)}; lost {result.lost or 0:,} of {result.acked:,}; "
            f"p99 {result.p99_ms:.1f}{suffix}"
        )
    return f"{fmt_rate(result.delivered)} (loss {fmt_pct(result.loss)}){suffix}"


COLLAPSED = 0.01
"""A throughput run that delivered less than this share of what was offered has collapsed: a ratio
against it says nothing, and the tables say so instead of printing one."""


def collapsed(result: Result) -> bool:
    return result.offered > 0 and result.delivered < COLLAPSED * result.offered * per_message(
        result
    )


def per_message(result: Result) -> float:
    return result.expected / result.sent if result.sent else 1.0


def ratio(head: Result | None, other: Result | None) -> float | None:
    if head is None or other is None or not head.ok or not other.ok:
        return None
    kind = SCENARIOS[head.scenario].kind
    if kind == "throughput":
        if collapsed(other) or not other.delivered:
            return None
        return head.delivered / other.delivered
    if kind in ("latency", "paced"):
        return head.p99_ms / other.p99_ms if other.p99_ms else None
    return None


def fmt_ratio(head: Result | None, other: Result | None, kind: str) -> str:
    value = ratio(head, other)
    if value is None:
        if kind == "throughput" and other is not None and other.ok and collapsed(other):
            return "n/m (other collapsed)"
        return "n/a"
    if kind in ("latency", "paced"):
        return f"p99 {value:.1f}x " + ("higher" if value >= 1 else "lower")
    return f"{value:.2f}x"


Row = tuple[Scenario, str]
"""A scenario and its variant ("flood" / "bounded" for throughput, "" otherwise)."""

VARIANTS = ("flood", "bounded", "")


class Table:
    """Results indexed by (scenario key, variant, broker name)."""

    def __init__(self, results: Iterable[Result], settings: Settings) -> None:
        self.settings = settings
        self.by_key = {(r.scenario, r.variant, r.broker): r for r in results}
        self.labels: dict[str, str] = {}
        for r in self.by_key.values():
            if r.broker not in self.labels or "1 node" in r.label:
                self.labels[r.broker] = r.label

    def get(self, row: Row, broker: str) -> Result | None:
        return self.by_key.get((row[0].key, row[1], broker))

    def rows(self) -> list[Row]:
        present = {(s, v) for s, v, _ in self.by_key}
        return [(sc, v) for key, sc in SCENARIOS.items() for v in VARIANTS if (key, v) in present]

    def other(self, row: Row, broker: str) -> tuple[Result | None, str]:
        """The other broker's result shown beside ``row`` (and a note where it comes from)."""
        scenario, variant = row
        if scenario.compare_to is None:
            return self.get(row, broker), ""
        source = SCENARIOS[scenario.compare_to]
        return self.get((source, variant), broker), f"(1 node, #{source.number})"

    def title(self, row: Row) -> str:
        scenario, variant = row
        if variant == "flood":
            return f"{scenario.title}, open loop"
        if variant == "bounded":
            return f"{scenario.title}, backlog <= {self.settings.backlog:,}"
        return scenario.title


# -- sections ---------------------------------------------------------------------------------


def results_table(table: Table) -> list[str]:
    other_labels = [table.labels.get(b, b) for b in OTHERS]
    lines = [
        f"| # | Scenario | Metric | Headwater | {other_labels[0]} | {other_labels[1]} "
        "| Headwater/amqtt | Headwater/mosquitto |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in table.rows():
        sc = row[0]
        head = table.get(row, "headwater")
        others = [table.other(row, b) for b in OTHERS]
        head_cell = cell(head, "(3 nodes)" if sc.cluster and sc.kind != "routing" else "")
        other_cells = ["n/a" if sc.kind == "routing" else cell(r, note) for r, note in others]
        ratios = [fmt_ratio(head, r, sc.kind) for r, _ in reversed(others)]
        lines.append(
            f"| {sc.number} | {table.title(row)} | {sc.metric} | {head_cell} | "
            f"{other_cells[0]} | {other_cells[1]} | {ratios[0]} | {ratios[1]} |"
        )
    return lines


def verdict(table: Table, settings: Settings) -> list[str]:
    """The earlier issue's targets (Headwater >= 5x amqtt, p99 < 5 ms), kept for comparison."""
    lines = ["### The earlier issue's targets", ""]
    checks: list[str] = []
    met = True
    for row in table.rows():
        if row[0].kind != "throughput":
            continue
        head = table.get(row, "headwater")
        amqtt, _ = table.other(row, "amqtt")
        value = ratio(head, amqtt)
        name = f"{row[0].number} {table.title(row)}"
        if value is None and head is not None and amqtt is not None and head.ok and amqtt.ok:
            # amqtt collapsed: the target holds only if Headwater did not
            ok = not collapsed(head)
            met &= ok
            checks.append(
                f"{name}: amqtt delivered {amqtt.delivered:,.0f}/s of {amqtt.offered:,.0f}/s "
                f"offered, Headwater {head.delivered:,.0f}/s of {head.offered:,.0f}/s "
                f"({'met' if ok else 'NOT met: both collapsed'})"
            )
            continue
        if value is None:
            checks.append(f"{name}: not measured")
            met = False
            continue
        ok = value >= TARGET_RATIO
        met &= ok
        checks.append(f"{name}: {value:.2f}x ({'met' if ok else 'NOT met'})")
    lines.append(
        f"- **Headwater >= {TARGET_RATIO:g}x amqtt in every throughput scenario: "
        f"{'met' if met and checks else 'NOT met'}.**"
    )
    lines += [f"  - {c}" for c in checks]
    p99_checks: list[str] = []
    p99_met = True
    for row in table.rows():
        head = table.get(row, "headwater")
        if row[0].kind != "latency" or head is None:
            continue
        name = f"{row[0].number} {table.title(row)}"
        if not head.ok:
            p99_checks.append(f"{name}: failed")
            p99_met = False
            continue
        ok = head.p99_ms < TARGET_P99_MS
        p99_met &= ok
        p99_checks.append(f"{name}: p99 {head.p99_ms:.2f} ms ({'met' if ok else 'NOT met'})")
    lines.append(
        f"- **Headwater p99 < {TARGET_P99_MS:g} ms at {settings.rate:,.0f} msg/s: "
        f"{'met' if p99_met and p99_checks else 'NOT met'}.**"
    )
    lines += [f"  - {c}" for c in p99_checks]
    return lines


def routing_section(table: Table) -> list[str]:
    result = table.get((SCENARIOS["routing"], ""), "headwater")
    if result is None:
        return []
    lines = ["## Interest routing (#7)", ""]
    if not result.ok:
        return [*lines, f"Failed: {result.error}"]
    lines += [
        f"{result.sent:,} QoS 1 messages over 48 topics `bench/<device>/t` on a 12-partition log "
        f"({result.log_bytes:,} record value bytes); each node's subscriber needs the devices of "
        "4 partitions.",
        "",
        "| Node | Partitions assigned | Bytes fetched | Share of log | Computed from Kafka "
        "| Delivered / expected |",
        "|---|---|---|---|---|---|",
    ]
    for s in result.shares:
        lines.append(
            f"| {s.node} | {', '.join(map(str, s.partitions))} | {s.value_bytes:,} | "
            f"{fmt_pct(s.share)} | {s.computed_bytes:,} | {s.received:,} / {s.expected:,} |"
        )
    lines += ["", *[f"- {n}" for n in result.notes]]
    return lines


def details_table(results: list[Result]) -> list[str]:
    lines = [
        "## Details",
        "",
        "Offered = published during the measured window; delivered = arrived at subscribers during "
        "it; loss = 1 - received / expected over the whole run after a drain (expected = published "
        "x subscribers per message). CPU is a share of one core during the window: broker = the "
        "broker's own processes (per node), load = the load generator processes; others' CPU = "
        "cores used meanwhile by processes that are not the benchmark's (this machine is shared).",
        "",
        "| Scenario | Broker | Offered/s | Delivered/s | p50 / p99 / max ms | Sent | Received "
        "| Expected | Loss | Broker CPU | Kafka CPU | Load CPU | Others' CPU |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        sc = SCENARIOS[r.scenario]
        name = f"{sc.number} {sc.key}" + (f" ({r.variant})" if r.variant else "")
        if not r.ok:
            error = r.error.splitlines()[0][:120] if r.error else "?"
            lines.append(f"| {name} | {r.label} | failed: {error} |" + " |" * 10)
            continue
        timed = sc.kind in ("latency", "paced")
        lat = f"{r.p50_ms:.2f} / {r.p99_ms:.2f} / {r.max_ms:.2f}" if timed else ""
        broker_cpu = ", ".join(f"{c * 100:.0f}%" for c in r.broker_cpu)
        kafka_cpu = f"{r.kafka_cpu * 100:.0f}%" if r.kafka_cpu is not None else ""
        load_cpu = ", ".join(f"{k} {v * 100:.0f}%" for k, v in r.load_cpu.items())
        others = f"{r.other_cpu:.2f} cores" if r.other_cpu is not None else ""
        offered = fmt_rate(r.offered) if sc.kind != "routing" else ""
        delivered = fmt_rate(r.delivered) if sc.kind != "routing" else ""
        lines.append(
            f"| {name} | {r.label} | {offered} | {delivered} | {lat} | "
            f"{r.sent:,} | {r.received:,} | {r.expected:,} | {fmt_pct(r.loss)} | {broker_cpu} | "
            f"{kafka_cpu} | {load_cpu} | {others} |"
        )
    notes = [
        f"- {r.label}, {r.scenario}: {n}"
        for r in results
        for n in r.notes
        if r.scenario != "routing"
    ]
    return lines + (["", *notes] if notes else [])


def paced_details(results: list[Result]) -> list[str]:
    """The paced runs' own accounting, one row per broker."""
    paced = [r for r in results if SCENARIOS[r.scenario].kind == "paced"]
    if not paced:
        return []
    lines = [
        "### Paced QoS 1 fan-in (#8, #9)",
        "",
        "Offered = sent per second during the measured window (and the share of the schedule "
        "that is; Sent covers the whole run, warm-up included); PUBACKed = distinct messages "
        "the broker acknowledged; lost = PUBACKed and never received after the drain; "
        "duplicates = copies received more than once; latency = send -> receive of the first "
        "copy, for messages sent in the measured window. Waited for a CPU = the share of the "
        "window the broker's main thread (a Headwater node's event loop) was ready to run but "
        "waited for one of the machine's cores (/proc/PID/task/PID/schedstat): a PUBACK that "
        "arrived meanwhile waited as long, so with a window of 32 messages in flight a "
        "subscriber's rate is bounded by it.",
        "",
        "| Scenario | Broker | Offered/s (of schedule) | Delivered/s | Sent | PUBACKed | Lost "
        "| Duplicates | p50 / p99 / max ms | Broker CPU | Waited for a CPU | Kafka CPU "
        "| Load CPU |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in paced:
        sc = SCENARIOS[r.scenario]
        name = f"{sc.number} {sc.key}"
        if not r.ok:
            error = r.error.splitlines()[0][:120] if r.error else "?"
            lines.append(f"| {name} | {r.label} | failed: {error} |" + " |" * 10)
            continue
        broker_cpu = ", ".join(f"{c * 100:.0f}%" for c in r.broker_cpu)
        kafka_cpu = f"{r.kafka_cpu * 100:.0f}%" if r.kafka_cpu is not None else ""
        load_cpu = ", ".join(f"{k} {v * 100:.0f}%" for k, v in r.load_cpu.items())
        waited = ", ".join(f"{w * 100:.0f}%" for w in r.broker_waited)
        lines.append(
            f"| {name} | {r.label} | {fmt_rate(r.offered)} ({r.schedule_share:.1%}) | "
            f"{fmt_rate(r.delivered)} | {r.sent:,} | {r.acked:,} | {r.lost or 0:,} | "
            f"{r.duplicates:,} | {r.p50_ms:.2f} / {r.p99_ms:.2f} / {r.max_ms:.2f} | "
            f"{broker_cpu} | {waited} | {kafka_cpu} | {load_cpu} |"
        )
    return lines


def others_summary(results: list[Result]) -> str:
    values = [r.other_cpu for r in results if r.other_cpu is not None]
    if not values:
        return "not measured"
    mean = sum(values) / len(values)
    return f"mean {mean:.2f} cores, max {max(values):.2f} cores (of {os.cpu_count()})"


def render(results: list[Result], settings: Settings, env: Environment, how: list[str]) -> str:
    table = Table(results, settings)
    v = env.versions
    lines = [
        "# Benchmarks",
        "",
        "Generated by `bench/` (`make bench`); every figure below is measured by that run.",
        "",
        "## Setup",
        "",
        "| | |",
        "|---|---|",
        f"| Date | {env.started:%Y-%m-%d %H:%M %Z} |",
        f"| Machine | {machine()} |",
        f"| Load average (1, 5, 15 min) | before the run {env.load_before}; after it "
        f"{env.load_after} |",
        f"| Other processes' CPU during measured windows | {others_summary(results)} |",
        f"| Headwater | {env.headwater} |",
        f"| Python | {python_version()}; uvloop {v.get('uvloop', '-')} |",
        f"| Kafka | {env.kafka}; confluent-kafka {v.get('confluent-kafka', '?')} "
        f"(librdkafka {v.get('librdkafka', '?')}) |",
        f"| mosquitto | {v.get('mosquitto', '?')} (Debian package) |",
        f"| amqtt | {v.get('amqtt', '?')} |",
        f"| Command | `{env.command}` |",
        f"| Timing | warm-up {settings.warmup:g} s, measured {settings.duration:g} s per "
        f"throughput/latency run; payload {settings.payload} bytes |",
        "",
        "How it was run:",
        "",
        *[f"- {h}" for h in how],
        "",
        "## Results",
        "",
        "Throughput cells: messages delivered per second at the subscribers during the measured "
        "window (loss over the whole run, after a drain); *open loop* and *bounded* are explained "
        "under Setup. Latency cells: p50 / p99 in ms, end to end (publisher send time in the "
        "payload, measured at the subscriber). Ratios are Headwater / other: for throughput "
        "higher is better; for latency they compare p99, lower is better. n/m: the other broker "
        f"delivered less than {COLLAPSED:.0%} of what was offered (collapsed), so no ratio is "
        "meaningful. Paced cells (rows 8-9): messages delivered per second; messages lost of "
        "those the broker PUBACKed; p99 send -> receive in ms (the ratio compares p99). Rows 5-6 "
        "and 9 put mosquitto's and amqtt's single-node result beside Headwater's 3-node one.",
        "",
        *results_table(table),
        "",
        *targets.render(
            lambda key, variant, broker: table.by_key.get((key, variant, broker)),
            settings.rate,
            settings.paced_rate,
        ),
        "",
        *verdict(table, settings),
        "",
        *routing_section(table),
        "",
        *workers_section(results, settings.workers),
        "",
        *details_table(results),
        "",
        *paced_details(results),
        "",
    ]
    return "\n".join(lines)
