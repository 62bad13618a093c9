"""Scenario 10 ``workers``: what a second worker process buys one Headwater node.

One node is started per ``--workers`` value compared (``python -m frontend --workers N``, all on
the run's Kafka, each its own log topic).  With N > 1 the node's process starts N workers that
share the MQTT port (``SO_REUSEPORT``); worker i is node ``<id>-<i>`` with its stats port at the
given port + (i - 1).  The fan-in scenarios (:func:`bench.scenarios.run_throughput`, QoS 0 and
QoS 1, open loop and bounded as rows 1 and 2) then run against each node in turn, interleaved as
the main run interleaves brokers.  Broker CPU is summed over the node's processes (its workers and
the parent, which is idle).

The kernel spreads the 4 publishers' and the subscriber's connections over the workers by hash of
the connection, so a message published on a worker other than the subscriber's reaches it through
Kafka, exactly as across nodes: the share that did is read off the workers' ``GET /stats``
(``messages_received_by_qos`` and ``messages_sent_by_qos`` over the run).
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import psutil

from bench.brokers import (
    START_TIMEOUT,
    STOP_TIMEOUT,
    BenchKafka,
    NodeLaunch,
    RunningBroker,
    node_stats,
    wait_serving,
)
from bench.cpu import settle
from bench.scenarios import SCENARIOS, Result, Settings, run_scenario
from headwater.services.ports import LOOPBACK, free_port
from headwater.services.process import ChildProcess

PARTITIONS = 12
KEYS = ("fanin-qos0", "fanin-qos1")
SETTLED_CPU = 0.15

Progress = Callable[[str], None]


def free_port_run(count: int, tries: int = 50) -> int:
    """The first of ``count`` consecutive free loopback ports."""
    for _ in range(tries):
        base = free_port()
        if all(port_free(base + k) for k in range(1, count)):
            return base
    raise RuntimeError(f"no {count} consecutive free ports found")


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def messages(stats: dict[str, Any], key: str) -> int:
    return sum(int(n) for n in stats.get(key, {}).values())


def crossed_share(
    before: list[dict[str, Any]], after: list[dict[str, Any]]
) -> tuple[float | None, str]:
    """Of the messages the workers received from publishers over a run, the share received on a
    worker other than the one that delivered most (the subscriber's); and a line per worker."""
    received = [
        messages(a, "messages_received_by_qos") - messages(b, "messages_received_by_qos")
        for b, a in zip(before, after, strict=True)
    ]
    sent = [
        messages(a, "messages_sent_by_qos") - messages(b, "messages_sent_by_qos")
        for b, a in zip(before, after, strict=True)
    ]
    total = sum(received)
    if not total:
        return None, ""
    home = max(range(len(sent)), key=sent.__getitem__)
    share = (total - received[home]) / total
    text = "; ".join(
        f"worker {k + 1}: received {r:,} from publishers, sent {s:,}"
        for k, (r, s) in enumerate(zip(received, sent, strict=True))
    )
    return share, text


class WorkerScaling:
    """The nodes of the scenario, and its runs against them."""

    def __init__(
        self, kafka: BenchKafka, settings: Settings, work: Path, launch: NodeLaunch, tag: str
    ) -> None:
        self.kafka = kafka
        self.settings = settings
        self.work = work
        self.launch = launch
        self.tag = tag
        self.nodes: dict[int, RunningBroker] = {}

    def start(self, stack: ExitStack, progress: Progress) -> None:
        """A node per ``--workers`` value, all started before any is waited on."""
        pending: list[tuple[int, ChildProcess, int, int, str]] = []
        for n in self.settings.workers:
            topic = self.kafka.create_topic(f"bench.{self.tag}.w{n}", PARTITIONS)
            port, stats = free_port(), free_port_run(n)
            argv = self.launch.argv(f"w{n}", port, stats, self.kafka.bootstrap, topic, PARTITIONS)
            child = ChildProcess.spawn(
                f"headwater-w{n}",
                [*argv, "--workers", str(n)],
                self.work / f"{topic}.log",
                env=self.launch.env(),
                cwd=self.launch.source,
            )
            stack.callback(child.stop, STOP_TIMEOUT)
            pending.append((n, child, port, stats, topic))
        for n, child, port, stats, topic in pending:
            wait_serving(child, port, START_TIMEOUT)
            stats_ports = [stats + k for k in range(n)] if self.launch.stats else []
            extra = wait_workers(child, n, stats_ports, START_TIMEOUT)
            self.nodes[n] = RunningBroker(
                "headwater",
                f"Headwater (1 node, --workers {n})",
                [(LOOPBACK, port)],
                [child],
                kafka=self.kafka.child,
                topic=topic,
                partitions=PARTITIONS,
                stats_ports=stats_ports,
                extra_pids=[extra],
            )
            progress(f"Headwater --workers {n}: up on port {port}, {1 + len(extra)} process(es)")

    def run(self, backlogs: tuple[int, ...], progress: Progress) -> Iterator[Result]:
        """Each fan-in run against each node in turn; every result as soon as it is in."""
        for key in KEYS:
            for backlog in backlogs:
                for n, node in self.nodes.items():
                    yield self.run_one(key, n, node, backlog, progress)

    def run_one(
        self, key: str, n: int, node: RunningBroker, backlog: int, progress: Progress
    ) -> Result:
        for each in self.nodes.values():  # a worker that exited was started again: new pid
            with contextlib.suppress(psutil.Error):
                parent = psutil.Process(each.processes[0].pid)
                each.extra_pids = [[p.pid for p in parent.children(recursive=True)]]
        pids = [pid for b in self.nodes.values() for pid in b.pids]
        waited = settle(pids, SETTLED_CPU, self.settings.settle_max)
        if waited >= self.settings.settle_max:
            progress(f"the nodes are still busy after {waited:.0f}s; running anyway")
        before = read_stats(node)
        tag = f"{self.tag}-w{n}-{key}-{backlog}"
        result = run_scenario(SCENARIOS[key], node, self.settings, tag, None, backlog)
        after = read_stats(node)
        result.variant = f"{key} {result.variant}"
        result.scenario, result.broker = "workers", f"headwater-w{n}"
        if before and after:
            result.cross_worker, text = crossed_share(before, after)
            if text and n > 1:
                result.notes.append(f"{result.variant}: {text}")
        return result


def read_stats(node: RunningBroker) -> list[dict[str, Any]]:
    try:
        return [node_stats(port) for port in node.stats_ports]
    except OSError:
        return []


def wait_workers(child: ChildProcess, n: int, stats_ports: list[int], timeout: float) -> list[int]:
    """Once every worker serves (its stats port answers; without stats ports: the parent has
    ``n`` children), the pids of the parent's descendants (none for ``--workers 1``)."""
    deadline = time.monotonic() + timeout
    parent = psutil.Process(child.pid)
    while True:
        kids = [p.pid for p in parent.children(recursive=True)]
        if stats_ports:
            ready = all(answers(port) for port in stats_ports)
        else:
            ready = n == 1 or len(kids) >= n
        if ready:
            return kids
        if time.monotonic() >= deadline:
            raise RuntimeError(
                f"{child.name}: {n} workers not all serving after {timeout:.0f} s "
                f"(log: {child.log_path})"
            )
        time.sleep(0.2)


def answers(port: int) -> bool:
    try:
        node_stats(port)
    except OSError:
        return False
    return True


# -- the report's section ---------------------------------------------------------------------


def section(results: list[Result], workers: tuple[int, ...]) -> list[str]:
    """The worker scaling table: msgs/s per ``--workers`` value and the last over the first."""
    ours = [r for r in results if r.scenario == "workers"]
    if not ours:
        return []
    runs = {(r.variant, r.broker): r for r in ours if r.variant}
    if not runs:  # the nodes did not start
        return ["## Worker scaling (#10)", "", *[f"Failed: {r.error}" for r in ours]]
    first, last = workers[0], workers[-1]
    head = " | ".join(f"--workers {n}: msgs/s, broker CPU" for n in workers)
    lines = [
        "## Worker scaling (#10)",
        "",
        "One Headwater node started with each `--workers` value; broker CPU is summed over the "
        "node's processes (its workers and the idle parent), as a share of one core. Messages "
        "published on one worker and delivered by another reach it through Kafka, as across "
        "nodes: the last column gives their share (from the workers' `GET /stats`).",
        "",
        f"| Scenario | {head} | {last} / {first} workers | Published on another worker |",
        "|---|" + "---|" * len(workers) + "---|---|",
    ]
    variants = list(dict.fromkeys(v for v, _ in runs))
    for variant in variants:
        cells, by_n = [], {}
        for n in workers:
            r = runs.get((variant, f"headwater-w{n}"))
            by_n[n] = r
            cells.append(workers_cell(r))
        a, b = by_n.get(first), by_n.get(last)
        scale = "n/a"
        if a is not None and b is not None and a.ok and b.ok and a.delivered:
            scale = f"{b.delivered / a.delivered:.2f}x"
        crossed = b.cross_worker if b is not None else None
        cross = f"{crossed:.0%}" if crossed is not None else "not measured"
        key, _, kind = variant.partition(" ")
        title = f"{SCENARIOS[key].title}, {'open loop' if kind == 'flood' else 'bounded'}"
        lines.append(f"| {title} | " + " | ".join(cells) + f" | {scale} | {cross} |")
    return [*lines, "", *SIXTEEN_CORES]


SIXTEEN_CORES = [
    "What to expect with more cores (reasoned from the profile, not measured here): this machine's "
    "2 cores also run Kafka and the load generators, so a second worker mostly competes for the "
    "same cores. Where each worker has a core to itself, what a worker does for its own clients "
    "divides over the workers: decoding and producing their PUBLISHes, acknowledging them, "
    "writing to their subscribers. What does not divide is reading: every worker with a "
    "subscriber fetches and decodes every record of the partitions that subscriber needs, so a "
    "topic subscribed to on all 16 workers of a 16-core node is read 16 times, and one hot "
    "subscriber gets no more than one worker delivers. Fan-in from many publishers and fan-out to "
    "subscribers spread over the workers should grow close to the number of cores until Kafka "
    "(a broker of its own, on other cores) or the network is the limit; size Kafka for it.",
]


def workers_cell(result: Result | None) -> str:
    if result is None:
        return "not run"
    if not result.ok:
        return f"failed: {result.error.splitlines()[0][:80] if result.error else '?'}"
    cpu = sum(result.broker_cpu)
    return f"{result.delivered:,.0f} (loss {result.loss:.1%}), CPU {cpu:.0%}"
