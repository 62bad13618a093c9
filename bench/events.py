"""``python -m bench events``: what client events cost a CONNECT, events on against off.

One ``headwater dev up`` cluster of one node, started with a settings file (``HEADWATER_CONFIG``)
whose ``client-events`` each run sets and a SIGHUP applies (``frontend.node.Node.reload``): on,
off, and on again (the control: how far two runs of the same side differ is the measurement's
own spread, the yardstick of the on / off difference).  The same node process, Kafka and Redis
serve every side, so nothing but the events differs between them: three clusters, one a side,
differed by up to 4% with the same setting (an earlier version of this tool).  Kafka is warmed
first as ``throughput`` warms it; then ``--runs`` rounds of the CONNECT scenarios of
:mod:`bench.throughput`, the sides taking turns (which goes first rotating every round), each
run after the machine went idle, the switch checked in ``/stats`` (``client_events``) before it
and the events the node wrote counted over it (``client_events_written``).

Reported per scenario: each side's median CONNECT/s, the node's CPU a cycle, the share of a core
Kafka used over the measured window and the events written a cycle; the ratios on / off and
on / control as the geometric mean of the rounds' own ratios, with a 95% bootstrap interval;
and issue 24's verdict (CONNECT/s must not fall by more than 5%): shown when the whole interval
of on / off lies at or above 0.95.  At full load the node, its Kafka, Redis and the load
generator share the machine's cores: what Kafka spends writing the events is taken from the node
there, as it would not be on a cluster whose Kafka runs elsewhere.
"""

from __future__ import annotations

import datetime
import math
import os
import random
import signal
import statistics
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from bench import brokers, throughput
from bench.brokers import Broker
from bench.measure import machine, node_stats, settle
from bench.report import table, wrap
from bench.throughput import SCENARIOS, SETTLED_CPU, Result, Settings

KEYS = ("connect-clean", "connect-persistent", "connect-clean-paced")
"""At full load, clean and persistent; and the node's CPU a cycle at one load."""
BOUND = 0.95
"""Issue 24: CONNECT/s with events at least this share of CONNECT/s without."""
SIDES = ("on", "off", "control")
EVENTS = {"on": True, "off": False, "control": True}
"""Each side's ``client-events``."""
SWITCH_TIMEOUT = 10.0
"""Seconds a node has to show a switch in ``/stats``."""
HELD = 1.0
"""Seconds the count of events written must hold to be a run's: a node hands its events over
up to 0.5 s after they happened (``frontend.events.FLUSH_SECONDS``)."""
RESAMPLES = 10_000
"""Bootstrap resamples of the rounds' ratios for the interval."""


@dataclass
class Run:
    settings: Settings
    rounds: int
    command: str
    headwater: str = ""
    started: datetime.datetime = field(default_factory=lambda: datetime.datetime.now(datetime.UTC))
    seconds: float = 0.0
    warmed: float = 0.0
    """Seconds the Kafka warm-up took."""
    results: dict[tuple[str, str], list[Result]] = field(default_factory=dict)
    """(scenario, side) -> one result a round."""
    written: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    """(scenario, side) -> client events the node wrote a cycle, one figure a round."""


def run(
    work: Path,
    s: Settings,
    rounds: int,
    headwater: brokers.Headwater,
    command: str,
    progress: Callable[[str], None],
) -> Run:
    out = Run(s, rounds, command, headwater.version)
    started = time.monotonic()
    settings = work / "events.toml"
    settings.parent.mkdir(parents=True, exist_ok=True)
    settings.write_text("client-events = true\n")
    # the variable would override the file (flag > variable > file): the file decides here
    os.environ.pop("HEADWATER_CLIENT_EVENTS", None)
    with ExitStack() as stack:
        broker = headwater.start(work, stack, env={"HEADWATER_CONFIG": str(settings)})
        progress(f"up on {broker.endpoints[0].port}; warming its Kafka")
        out.warmed = throughput.warm_kafka(broker, s.kafka_warmup)[0]
        pids = [*broker.pids, *broker.services]
        for r in range(rounds):
            order = SIDES[r % len(SIDES) :] + SIDES[: r % len(SIDES)]
            for n, key in enumerate(KEYS):
                for side in order:
                    switch(broker, settings, EVENTS[side])
                    settle(pids, SETTLED_CPU, s.settle_max)
                    before = written(broker)
                    base = 1000 * (r + 1) + 100 * n + 10 * SIDES.index(side)
                    result = throughput.measure(SCENARIOS[key], broker, s, base)
                    events = handed_over(broker) - before
                    a_cycle = events / result.cycles if result.cycles else 0.0
                    out.results.setdefault((key, side), []).append(result)
                    out.written.setdefault((key, side), []).append(a_cycle)
                    progress(
                        f"round {r + 1}, {key}, events {side}: {throughput.summary(result)}, "
                        f"{a_cycle:.2f} events a cycle"
                    )
    out.seconds = time.monotonic() - started
    return out


def switch(broker: Broker, settings: Path, on: bool) -> None:
    """Every node of ``broker`` writing client events or not, as ``settings`` now says."""
    settings.write_text(f"client-events = {'true' if on else 'false'}\n")
    for pid in broker.pids:
        os.kill(pid, signal.SIGHUP)
    deadline = time.monotonic() + SWITCH_TIMEOUT
    while any(node_stats(url)["client_events"] != on for url in broker.stats):
        if time.monotonic() > deadline:
            raise RuntimeError(f"a node did not switch client events {'on' if on else 'off'}")
        time.sleep(0.05)


def written(broker: Broker) -> int:
    """Client events the nodes have handed to the log so far."""
    return sum(int(node_stats(url)["client_events_written"]) for url in broker.stats)


def handed_over(broker: Broker) -> int:
    """:func:`written` once the events of a run's last cycles went too: the count once it held
    ``HELD`` seconds (or after ``SWITCH_TIMEOUT``)."""
    deadline = time.monotonic() + SWITCH_TIMEOUT
    last, since = written(broker), time.monotonic()
    while time.monotonic() - since <= HELD and time.monotonic() < deadline:
        time.sleep(0.1)
        if (now := written(broker)) != last:
            last, since = now, time.monotonic()
    return last


def ratios(run: Run, key: str, over: str = "off", figure: str = "delivered") -> list[float]:
    """A round's ``figure`` (CONNECT/s; ``cpu_us``: the node's CPU a cycle) with events over
    the same round's on side ``over``, round by round."""
    on, off = run.results.get((key, "on"), []), run.results.get((key, over), [])
    pairs = [(getattr(a, figure), getattr(b, figure)) for a, b in zip(on, off, strict=True)]
    return [a / b for a, b in pairs if b]


def geomean(values: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values else 0.0


def interval(values: list[float], seed: int = 0) -> tuple[float, float]:
    """95% bootstrap percentile interval of the geometric mean of ``values``."""
    pick = random.Random(seed).choices
    means = sorted(geomean(pick(values, k=len(values))) for _ in range(RESAMPLES))
    return means[int(0.025 * RESAMPLES)], means[int(0.975 * RESAMPLES) - 1]


def side_cell(results: list[Result], written: list[float]) -> str:
    """Medians over the rounds: CONNECT/s, the node's CPU a cycle, Kafka's share of a core, the
    client events written a cycle."""
    if not results:
        return "-"
    rate = statistics.median(r.delivered for r in results)
    node = statistics.median(r.cpu_us for r in results)
    kafka = statistics.median(r.services_cpu[0] if r.services_cpu else 0.0 for r in results)
    events = statistics.median(written) if written else 0.0
    return (
        f"{rate:,.0f} per s, node {node:.0f} us a cycle, Kafka {100 * kafka:.1f}% of a core, "
        f"{events:.2f} events a cycle"
    )


def ratio_cell(run: Run, key: str, over: str = "off") -> str:
    found = ratios(run, key, over)
    if not found:
        return "-"
    low, high = interval(found)
    return f"{geomean(found):.3f} (95%: {low:.3f}-{high:.3f}, {len(found)} rounds)"


def cpu_ratio_cell(run: Run, key: str) -> str:
    found = ratios(run, key, figure="cpu_us")
    return f"{geomean(found):.3f}" if found else "-"


def verdict(run: Run, key: str) -> str:
    found = ratios(run, key)
    if not found or key.endswith("-paced"):
        return ""  # a paced run's CONNECT/s is the pace: its CPU a cycle is the figure
    if interval(found)[0] >= BOUND:
        return f"met (the interval >= {BOUND:g})"
    if geomean(found) >= BOUND:
        return f"not shown (the interval reaches under {BOUND:g})"
    return f"NOT met (under {BOUND:g})"


def render(run: Run) -> str:
    s = run.settings
    head = ["scenario", *(f"events {side}" for side in SIDES), "CONNECT/s on / off",
            "on / control", "node CPU a cycle on / off", "issue 24's bound"]  # fmt: skip
    rows = [
        [SCENARIOS[key].title,
         *(side_cell(run.results.get((key, side), []), run.written.get((key, side), []))
           for side in SIDES),
         ratio_cell(run, key), ratio_cell(run, key, "control"), cpu_ratio_cell(run, key),
         verdict(run, key)]
        for key in KEYS
    ]  # fmt: skip
    lines = [
        "## Client events' cost a CONNECT (issue 24)",
        "",
        "| | |",
        "|---|---|",
        f"| Date | {run.started:%Y-%m-%d %H:%M} UTC |",
        f"| Machine | {machine()} |",
        f"| Headwater | {run.headwater}, one `headwater dev up` cluster of one node |",
        f"| Command | `{run.command}` |",
        f"| Took | {run.seconds / 60:.1f} min |",
        "",
        *table(head, rows),
        "",
        "How it ran: one cluster whose node's settings file each run sets to events on, off, or "
        "on again (the control: how far two runs of one side differ), applied by SIGHUP and "
        "checked in `/stats`; its Kafka warmed first as the throughput table's is "
        f"({run.warmed:.0f} s); then {run.rounds} rounds of the scenarios, the sides taking turns "
        f"(which goes first rotating every round), each run {s.warmup:g} s of warm-up and "
        f"{s.duration:g} s measured after the machine went idle. Cells: medians over the rounds; "
        "Kafka's share of a core over the measured window; the events the node wrote a cycle "
        "(`client_events_written` in `/stats`). Ratios: the geometric mean of the rounds' own "
        f"ratios, with its 95% bootstrap interval ({RESAMPLES:,} resamples of the rounds). The "
        "load generator is `bench/load.py`, as in the throughput table.",
    ]
    return wrap("events", lines)
