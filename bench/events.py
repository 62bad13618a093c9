"""``python -m bench events``: what client events cost a CONNECT, events on against off.

Three ``headwater dev up`` clusters of one node each from the same source: one with
``--client-events yes`` (the default), one with ``no`` (``HEADWATER_CLIENT_EVENTS``), and a
control, on as the first: how far two like clusters differ is the measurement's own spread, the
yardstick of the on / off difference.  All three are up for the whole run, each Kafka warmed as
``throughput`` warms it (its JIT compiling through the first runs was the largest bias of on/off
runs made one cluster at a time).  Then ``--runs`` rounds of the CONNECT scenarios of
:mod:`bench.throughput`, the clusters taking turns (which goes first rotating every round), each
run after all of them went idle.

Reported per scenario: each side's median CONNECT/s, the node's CPU a cycle and the share of a
core its Kafka used over the measured window; the ratios on / off and on / control as the
geometric mean of the rounds' own ratios, with a 95% bootstrap interval; and issue 24's verdict
(CONNECT/s must not fall by more than 5%): shown when the whole interval of on / off lies at or
above 0.95.  At full load the node, its Kafka, Redis and the load generator share the machine's
cores: what Kafka spends writing the events is taken from the node there, as it would not be on
a cluster whose Kafka runs elsewhere.
"""

from __future__ import annotations

import datetime
import math
import random
import statistics
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from bench import brokers, throughput
from bench.brokers import Broker
from bench.measure import machine, settle
from bench.report import table, wrap
from bench.throughput import SCENARIOS, SETTLED_CPU, Result, Settings

KEYS = ("connect-clean", "connect-persistent", "connect-clean-paced")
"""At full load, clean and persistent; and the node's CPU a cycle at one load."""
BOUND = 0.95
"""Issue 24: CONNECT/s with events at least this share of CONNECT/s without."""
SIDES = ("on", "off", "control")
EVENTS = {"on": "yes", "off": "no", "control": "yes"}
"""Each cluster's ``--client-events``."""
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
    warmed: dict[str, float] = field(default_factory=dict)
    """Seconds each side's Kafka warm-up took."""
    results: dict[tuple[str, str], list[Result]] = field(default_factory=dict)
    """(scenario, side) -> one result a round."""


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
    with ExitStack() as stack:
        sides: dict[str, Broker] = {}
        for side in SIDES:
            env = {"HEADWATER_CLIENT_EVENTS": EVENTS[side]}
            sides[side] = broker = headwater.start(work, stack, env=env)
            progress(f"events {side}: up on {broker.endpoints[0].port}; warming its Kafka")
            out.warmed[side] = throughput.warm_kafka(broker, s.kafka_warmup)[0]
        pids = [p for b in sides.values() for p in (*b.pids, *b.services)]
        for r in range(rounds):
            order = SIDES[r % len(SIDES) :] + SIDES[: r % len(SIDES)]
            for n, key in enumerate(KEYS):
                for side in order:
                    settle(pids, SETTLED_CPU, s.settle_max)
                    base = 1000 * (r + 1) + 100 * n + 10 * SIDES.index(side)
                    result = throughput.measure(SCENARIOS[key], sides[side], s, base)
                    out.results.setdefault((key, side), []).append(result)
                    progress(f"round {r + 1}, {key}, events {side}: {throughput.summary(result)}")
    out.seconds = time.monotonic() - started
    return out


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


def side_cell(results: list[Result]) -> str:
    """Medians over the rounds: CONNECT/s, the node's CPU a cycle, Kafka's share of a core."""
    if not results:
        return "-"
    rate = statistics.median(r.delivered for r in results)
    node = statistics.median(r.cpu_us for r in results)
    kafka = statistics.median(r.services_cpu[0] if r.services_cpu else 0.0 for r in results)
    return f"{rate:,.0f} per s, node {node:.0f} us a cycle, Kafka {100 * kafka:.1f}% of a core"


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
        [SCENARIOS[key].title, *(side_cell(run.results.get((key, side), [])) for side in SIDES),
         ratio_cell(run, key), ratio_cell(run, key, "control"), cpu_ratio_cell(run, key),
         verdict(run, key)]
        for key in KEYS
    ]  # fmt: skip
    warmed = ", ".join(f"{side} {secs:.0f} s" for side, secs in run.warmed.items())
    lines = [
        "## Client events' cost a CONNECT (issue 24)",
        "",
        "| | |",
        "|---|---|",
        f"| Date | {run.started:%Y-%m-%d %H:%M} UTC |",
        f"| Machine | {machine()} |",
        f"| Headwater | {run.headwater}, three `headwater dev up` clusters of one node |",
        f"| Command | `{run.command}` |",
        f"| Took | {run.seconds / 60:.1f} min |",
        "",
        *table(head, rows),
        "",
        f"How it ran: the clusters with events on, off, and on again (the control: how far two "
        f"like clusters differ) up for the whole run, each Kafka warmed first as the throughput "
        f"table's is ({warmed}); then {run.rounds} rounds of the scenarios, the clusters taking "
        f"turns (which goes first rotating every round), each run {s.warmup:g} s of warm-up and "
        f"{s.duration:g} s measured after all went idle. Cells: medians over the rounds; Kafka's "
        "share of a core over the measured window. Ratios: the geometric mean of the rounds' own "
        f"ratios, with its 95% bootstrap interval ({RESAMPLES:,} resamples of the rounds). The "
        "load generator is `bench/load.py`, as in the throughput table.",
    ]
    return wrap("events", lines)
