"""``python -m bench events``: what client events cost a CONNECT, events on against off.

One ``headwater dev up`` cluster of one node, started with a settings file (``HEADWATER_CONFIG``)
whose ``client-events`` a SIGHUP applies (``frontend.node.Node.reload``), the switch checked in
``/stats``.  For each CONNECT scenario of :mod:`bench.throughput`, one load run, cut into
``--runs`` rounds of three windows of ``--duration`` seconds: events on, off, and on again (the
control: how far two windows of one side differ is the measurement's own spread), which side
goes first rotating every round, each window after a switch and ``GUARD``.  The same node
process, Kafka, Redis and load serve every side, and the sides alternate every few seconds:
three clusters, one a side, differed by up to 4% with the same setting, and a whole run's
CONNECT/s by about 8% from the next run's (earlier versions of this tool), while two adjacent
3-second windows differ by about 7%.

Reported per scenario: each side's median CONNECT/s, the node's CPU a CONNECT and the share of a
core Kafka used, and the events written in its windows (``client_events_written``); the ratios
on / off (a round's two windows with events, on and control, against its window without) and
on / control (the measurement's own spread) as the geometric mean of the rounds' own ratios,
with a 95% bootstrap interval; and issue 24's verdict (CONNECT/s must not fall by more than 5%):
shown when the whole interval of on / off lies at or above 0.95.  At full load the node, its
Kafka, Redis and the load generator share the machine's cores: what Kafka spends writing the
events is taken from the node there, as it would not be on a cluster whose Kafka runs elsewhere.
"""

from __future__ import annotations

import datetime
import math
import os
import random
import signal
import statistics
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path

from bench import brokers, throughput
from bench.brokers import Broker
from bench.measure import Meter, Steal, machine, node_stats, settle, tree_cpu_seconds
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
GUARD = 0.5
"""Seconds after a switch before its window begins: the events handed over at the switch written
by Kafka, not counted in the next side's window."""
LAG = 0.75
"""Seconds later than its CONNECTs a window's events are counted: a node hands its events over
every 0.5 s or a little more (``frontend.events.FLUSH_SECONDS`` and the loop's lateness), timed
from the first event after a switch on, so a window begins in step with the hand-overs and
0.5 s counted at each end landed on one, missing the last of a window switched on (1.8-1.9
events a CONNECT where there are 2, ``ecd57dd``); 0.75 s falls between two."""
SWITCH_ALLOWANCE = 0.3
"""Seconds a switch and a window's readings take beside the window and its lag."""
RESAMPLES = 10_000
"""Bootstrap resamples of the rounds' ratios for the interval."""


@dataclass
class Run:
    settings: Settings
    rounds: int
    command: str
    keys: tuple[str, ...] = KEYS
    """The scenarios run (``--scenarios``), of :data:`KEYS`."""
    headwater: str = ""
    started: datetime.datetime = field(default_factory=lambda: datetime.datetime.now(datetime.UTC))
    seconds: float = 0.0
    warmed: float = 0.0
    """Seconds the Kafka warm-up took."""
    results: dict[tuple[str, str], list[Result]] = field(default_factory=dict)
    """(scenario, side) -> one result a round."""
    written: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    """(scenario, side) -> client events the node wrote, one count a round."""


def run(
    work: Path,
    s: Settings,
    rounds: int,
    headwater: brokers.Headwater,
    command: str,
    progress: Callable[[str], None],
    keys: tuple[str, ...] = KEYS,
) -> Run:
    out = Run(s, rounds, command, keys, headwater.version)
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
        for n, key in enumerate(keys):
            switch(broker, settings, True)
            settle([*broker.pids, *broker.services], SETTLED_CPU, s.settle_max)
            windows(out, broker, settings, key, 1000 * (n + 1), progress)
    out.seconds = time.monotonic() - started
    return out


def windows(
    out: Run, broker: Broker, settings: Path, key: str, base: int, progress: Callable[[str], None]
) -> None:
    """One load run of scenario ``key`` cut into ``out.rounds`` rounds of three windows, one a
    side, events switched before each (which side goes first rotating every round)."""
    s = out.settings
    each = GUARD + s.duration + LAG + SWITCH_ALLOWANCE
    whole = replace(s, duration=out.rounds * len(SIDES) * each + s.warmup + 2.0)
    load = threading.Thread(target=throughput.measure, args=(SCENARIOS[key], broker, whole, base))
    load.start()
    try:
        begun(broker, SWITCH_TIMEOUT + s.settle_max)
        time.sleep(s.warmup)
        for r in range(out.rounds):
            for side in SIDES[r % len(SIDES) :] + SIDES[: r % len(SIDES)]:
                switch(broker, settings, EVENTS[side])
                time.sleep(GUARD)  # the records just handed over, written by Kafka
                result, events = window(broker, key, s.duration)
                out.results.setdefault((key, side), []).append(result)
                out.written.setdefault((key, side), []).append(events)
            progress(f"{key}, round {r + 1}: " + ", ".join(
                f"{side} {out.results[(key, side)][-1].delivered:,.0f}/s" for side in SIDES
            ))  # fmt: skip
    finally:
        load.join()


def begun(broker: Broker, timeout: float) -> None:
    """Once the load's first connections reached the nodes."""
    first = opened(broker)
    deadline = time.monotonic() + timeout
    while opened(broker) == first:
        if time.monotonic() > deadline:
            raise RuntimeError("the load never connected")
        time.sleep(0.05)


def window(broker: Broker, key: str, seconds: float) -> tuple[Result, int]:
    """``seconds`` of the running load: CONNECTs (a second, and how many), the nodes' CPU a
    CONNECT, Kafka's share of a core; and the client events written, counted ``LAG`` later (a
    node hands events over together about every 0.5 s: a window holds a hand-over more or less)."""
    node, services = Meter(broker.pids, tree_cpu_seconds), Meter(broker.services)
    stolen, connects, since = Steal(), opened(broker), time.monotonic()
    time.sleep(LAG)
    events = written(broker)
    time.sleep(max(0.0, since + seconds - time.monotonic()))
    connects, took = opened(broker) - connects, time.monotonic() - since
    cpu, shares = sum(node.used()), [used / took for used in services.used()]
    stolen_share = stolen.share()
    time.sleep(LAG)
    events = written(broker) - events
    result = Result(key, broker.name, delivered=connects / took, cycles=connects)
    result.cpu_us, result.services_cpu = cpu / max(1, connects) * 1e6, shares
    result.stolen = stolen_share
    return result, events


def opened(broker: Broker) -> int:
    """MQTT connections the nodes have opened so far (one a CONNECT cycle)."""
    return sum(int(node_stats(url)["connections_opened"]) for url in broker.stats)


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


def ratios(run: Run, key: str, over: str = "off", figure: str = "delivered") -> list[float]:
    """Each round's ``figure`` (CONNECT/s; ``cpu_us``: the node's CPU a cycle) with events over
    the same round's side ``over``: against off, both windows with events (on and control, the
    geometric mean of the two: the round's every measurement of the side); against control, on
    alone (two windows of one side: the measurement's own spread)."""
    on, again = run.results.get((key, "on"), []), run.results.get((key, "control"), [])
    under = run.results.get((key, over), [])
    if over == "control":
        tops = [getattr(a, figure) for a in on]
    else:
        tops = [
            math.sqrt(getattr(a, figure) * getattr(b, figure))
            for a, b in zip(on, again, strict=True)
        ]
    pairs = zip(tops, (getattr(b, figure) for b in under), strict=True)
    return [a / b for a, b in pairs if b]


def geomean(values: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values else 0.0


def interval(values: list[float], seed: int = 0) -> tuple[float, float]:
    """95% bootstrap percentile interval of the geometric mean of ``values``."""
    pick = random.Random(seed).choices
    means = sorted(geomean(pick(values, k=len(values))) for _ in range(RESAMPLES))
    return means[int(0.025 * RESAMPLES)], means[int(0.975 * RESAMPLES) - 1]


def side_cell(results: list[Result], written: list[int]) -> str:
    """Medians over the rounds: CONNECT/s, the node's CPU a cycle, Kafka's share of a core, the
    share of the machine's CPU time stolen by its hypervisor; and the client events written in all
    its windows (none: the switch held)."""
    if not results:
        return "-"
    rate = statistics.median(r.delivered for r in results)
    node = statistics.median(r.cpu_us for r in results)
    kafka = statistics.median(r.services_cpu[0] if r.services_cpu else 0.0 for r in results)
    stolen = statistics.median(r.stolen for r in results)
    cycles = sum(r.cycles for r in results)
    return (
        f"{rate:,.0f} per s, node {node:.0f} us a cycle, Kafka {100 * kafka:.1f}% of a core, "
        f"{100 * stolen:.0f}% stolen, {sum(written):,} events written in {cycles:,} CONNECTs"
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
        for key in run.keys
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
        "How it ran: one cluster of one node, its Kafka warmed first as the throughput table's "
        f"is ({run.warmed:.0f} s); per scenario one load run cut into {run.rounds} rounds of "
        f"three windows of {s.duration:g} s, events on, off and on again (the control: how far "
        "two windows of one side differ), switched by SIGHUP (the node's settings file) and "
        f"checked in `/stats`, each window {GUARD:g} s after its switch, which side goes first "
        "rotating every round. Cells: medians over the rounds of CONNECT/s, the node's CPU a "
        "CONNECT, Kafka's share of a core and the share of the machine's CPU time its "
        "hypervisor took (steal of /proc/stat); the events the node wrote in all its windows, "
        f"counted {LAG:g} s later than the CONNECTs (`client_events_written` in `/stats`; a node "
        "hands its events over together twice a second, so a window's count holds a hand-over "
        "more or less). Ratios: the geometric mean of the rounds' own ratios (on / off: the "
        "round's two windows with events, on and control, against its window without; on / "
        f"control: two windows of one side), with its 95% bootstrap interval ({RESAMPLES:,} "
        "resamples of the rounds). The load generator is `bench/load.py`, as in the throughput "
        "table.",
    ]
    return wrap("events", lines)
