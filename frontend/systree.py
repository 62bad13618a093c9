"""``$SYS``: each node's own figures, and the cluster's totals, computed without a master.

*Per node.*  Every ``interval`` seconds a node publishes its figures under Mosquitto's names
(``src/sys_tree.c``) as retained QoS 0 messages ``$SYS/brokers/<node id>/<name>``, through the log
like any message (and into the retained store, as wills are), so any client on any node can read
any node's.  The uptime goes out every time (it is the node's heartbeat), the rest when changed,
all of it in the first report.  Clients never publish under ``$SYS`` (``frontend.auth``); these
are the node's own, handed to the log directly.

*Cluster totals.* ``$SYS/broker/<name>`` is computed by each node that has a local subscriber for
it, and by no other.  While it has one, the node reads every node's reports: those retained in the
store, then live from the log through a reader inside the node on ``$SYS/brokers/#``
(``router.dispatch.Watchers``: the ``$SYS/brokers`` partition is read only while someone here
wants a total).  It keeps each node's latest figures with their time, forgets a node not heard
from for ``STALE_AFTER`` intervals, and combines the rest (a sum; the highest uptime and version).
The totals go to its own subscribers only, never into the log (``Dispatcher.deliver_local``):
every node computes them from the same log, none is special, nothing is written N times.  A new
subscriber gets the current totals at once, RETAIN=1, through the retained path
(:class:`WithTotals`), changes afterwards as each interval computes them, RETAIN=0 [MQTT-3.3.1-9].

Figures come from the node's ``/stats`` snapshot, counters the parts keep anyway; nothing is
done per message here.  ``messages/*`` count PUBLISH packets, as ``publish/messages/*`` do (no
count of other packets is kept); ``clients/total`` and ``retained messages/count`` are not
published: nothing counts stored sessions or retained messages cheaply across the cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from frontend.outages import LOG_ERRORS, every, in_background
from frontend.retained import RetainedStore
from mqttcore import topics
from mqttcore.message import Message, MessageStamps
from router import record
from router.dispatch import Dispatcher
from router.log import KafkaLog
from router.record import Record

log = logging.getLogger("headwater.systree")

NODES_PREFIX = "$SYS/brokers/"
"""Each node's own figures: ``$SYS/brokers/<node id>/<name>``."""
TOTALS_PREFIX = "$SYS/broker/"
"""The cluster's totals: ``$SYS/broker/<name>``, Mosquitto's own topics."""
WATCHED = "$SYS/brokers/#"
STALE_AFTER = 3
"""Intervals without a report after which a node no longer counts in the totals."""

LOAD_WINDOWS = {"1min": 60.0, "5min": 300.0, "15min": 900.0}
"""Mosquitto's load averages: per minute, decaying over these many seconds."""
COUNTED = ("clients/connected", "subscriptions/count")
TOTALLED = ("messages/received", "messages/sent", "bytes/received", "bytes/sent")
"""Counters since the node started, each with its load averages."""
ALIASES = {
    "publish/messages/received": "messages/received",
    "publish/messages/sent": "messages/sent",
}
LOADS = tuple(f"load/{name}/{window}" for name in TOTALLED for window in LOAD_WINDOWS)
NAMES = ("version", "uptime", *COUNTED, *TOTALLED, *ALIASES, *LOADS)
"""Every name published, per node and as a total."""


def version() -> str:
    try:
        return f"headwater version {metadata.version('headwater')}"
    except metadata.PackageNotFoundError:
        return "headwater version unknown"


@dataclass(slots=True, frozen=True)
class Sample:
    """A node's counters at one moment."""

    clients: int
    subscriptions: int
    totals: dict[str, int]
    """Per name of ``TOTALLED``, the count since the node started."""


def sample(stats: Mapping[str, Any], subscriptions: int) -> Sample:
    """The figures of a ``/stats`` snapshot (``frontend.stats``) that ``$SYS`` publishes."""
    received, sent = stats.get("messages_received_by_qos", {}), stats.get("messages_sent_by_qos")
    return Sample(
        int(stats["clients"]),
        subscriptions,
        {
            "messages/received": sum(received.values()),
            "messages/sent": sum(sent.values()) if sent else int(stats["messages_delivered"]),
            "bytes/received": int(stats.get("bytes_received", 0)),
            "bytes/sent": int(stats.get("bytes_sent", 0)),
        },
    )


class Figures:
    """One node's figures under Mosquitto's names, from successive samples."""

    def __init__(self, version_: str, started: float) -> None:
        self.version = version_
        self.started = started
        self._loads = dict.fromkeys(LOADS, 0.0)
        self._last: tuple[float, Sample] | None = None
        self._published: dict[str, str] = {}

    def take(self, now: float, current: Sample) -> dict[str, str]:
        """Every figure at ``now`` (call once per interval: the load averages move on)."""
        self._update_loads(now, current)
        figures = {
            "version": self.version,
            "uptime": f"{int(now - self.started)} seconds",
            "clients/connected": str(current.clients),
            "subscriptions/count": str(current.subscriptions),
        }
        figures.update((name, str(count)) for name, count in current.totals.items())
        figures.update((alias, figures[name]) for alias, name in ALIASES.items())
        figures.update((name, f"{load:.2f}") for name, load in self._loads.items())
        return figures

    def _update_loads(self, now: float, current: Sample) -> None:
        """Mosquitto's: the rate per minute over the interval, into a decaying average."""
        last, self._last = self._last, (now, current)
        if last is None or now <= last[0]:
            return
        elapsed = now - last[0]
        for name, count in current.totals.items():
            per_minute = (count - last[1].totals.get(name, 0)) * 60.0 / elapsed
            for window, seconds in LOAD_WINDOWS.items():
                load = f"load/{name}/{window}"
                decay = math.exp(-elapsed / seconds)
                self._loads[load] = per_minute + decay * (self._loads[load] - per_minute)

    def changed(self, figures: Mapping[str, str]) -> dict[str, str]:
        """What to publish of ``figures``: the uptime, and what differs from the last published."""
        published = self._published
        return {n: v for n, v in figures.items() if n == "uptime" or published.get(n) != v}

    def published(self, figures: Mapping[str, str]) -> None:
        self._published.update(figures)


def parse_report(topic: str) -> tuple[str, str] | None:
    """``$SYS/brokers/<node>/<name>`` -> (node, name), for a name we publish."""
    if not topic.startswith(NODES_PREFIX):
        return None
    node, _, name = topic[len(NODES_PREFIX) :].partition("/")
    return (node, name) if node and name in NAMES else None


class Totals:
    """The latest figures of every node, and their combination: the cluster's totals."""

    def __init__(self) -> None:
        self._reports: dict[str, dict[str, tuple[int, str]]] = {}
        """node -> name -> (time in ms, value)."""
        self._heard: dict[str, int] = {}

    def take(self, message: Message) -> None:
        """A node's report, live or retained: kept if newer than what is kept of it."""
        parsed = parse_report(message.topic)
        if parsed is None:
            return
        node, name = parsed
        at = message.timestamp_ms
        figures = self._reports.setdefault(node, {})
        if at >= figures.get(name, (-1, ""))[0]:
            figures[name] = (at, message.payload.decode("utf-8", "replace"))
        self._heard[node] = max(at, self._heard.get(node, at))

    def combine(self, now_ms: int, horizon_ms: int) -> dict[str, str]:
        """The totals of the nodes heard from within ``horizon_ms``; the others are forgotten."""
        for node, heard in list(self._heard.items()):
            if now_ms - heard > horizon_ms:
                del self._heard[node], self._reports[node]
        totals: dict[str, str] = {}
        for name in NAMES:
            values = [f[name][1] for f in self._reports.values() if name in f]
            if values:
                with contextlib.suppress(ValueError):
                    totals[name] = _combined(name, values)
        return totals

    @property
    def nodes(self) -> list[str]:
        return sorted(self._heard)

    def clear(self) -> None:
        self._reports.clear()
        self._heard.clear()


def _combined(name: str, values: list[str]) -> str:
    if name == "version":
        return max(values)
    if name == "uptime":
        return f"{max(int(v.split()[0]) for v in values)} seconds"
    if name in LOADS:
        return f"{sum(float(v) for v in values):.2f}"
    return str(sum(int(v) for v in values))


def wants_totals(topic_filter: str) -> bool:
    """Whether ``topic_filter`` matches any total."""
    return topic_filter.startswith("$SYS/") and any(
        topics.matches(topic_filter, TOTALS_PREFIX + name) for name in NAMES
    )


class SysTree:
    """This node's ``$SYS``: its reports every interval, and the totals while they are wanted."""

    def __init__(
        self,
        node_id: str,
        interval: float,
        stamps: MessageStamps,
        log_: KafkaLog,
        dispatcher: Dispatcher,
        snapshot: Callable[[], Mapping[str, Any]],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.node_id = node_id
        self.interval = interval
        self.stamps = stamps
        self.log = log_
        self.dispatcher = dispatcher
        self.snapshot = snapshot
        self.clock = clock
        self.figures = Figures(version(), clock())
        self.totals = Totals()
        self.retained: RetainedStore | None = None
        self.reports_published = 0
        self._aggregating = False
        self._starting = asyncio.Lock()
        self._delivered: dict[str, str] = {}
        self._task: asyncio.Task[None] | None = None

    @property
    def enabled(self) -> bool:
        return self.interval > 0

    def serving(self, store: RetainedStore) -> RetainedStore:
        """The retained store the node should use: ``store``, giving the totals too."""
        self.retained = store
        return WithTotals(store, self) if self.enabled else store

    def start(self) -> None:
        if self.enabled:
            work = every(self.interval, self.tick, "$SYS report")
            self._task = asyncio.get_running_loop().create_task(work)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._stop_aggregating()

    async def tick(self) -> None:
        """One interval: publish this node's figures, then serve the totals if wanted."""
        self.publish_own()
        await self.serve_totals()

    # -- this node's report ---------------------------------------------------------------------

    def publish_own(self) -> None:
        current = sample(self.snapshot(), self.dispatcher.subscription_count)
        figures = self.figures.take(self.clock(), current)
        if not self.log.available:
            return  # what changed goes out once the log takes writes again
        sent: dict[str, str] = {}
        for name, value in self.figures.changed(figures).items():
            topic = f"{NODES_PREFIX}{self.node_id}/{name}"
            message = self.stamps.message(topic, value.encode(), 0, True, "")
            if not self.log.produce(message, self._stored(message), kind=record.SYS):
                break  # the producer queue is full: the rest next time
            sent[name] = value
        self.reports_published += len(sent)
        self.figures.published(sent)

    def _stored(self, message: Message) -> Callable[[int, int, str | None], None]:
        def stored(partition: int, offset: int, error: str | None) -> None:
            if error is None and self.retained is not None:
                work = self.retained.apply(message, partition, offset)
                in_background(work, "", f"storing {message.topic}")

        return stored

    # -- the cluster's totals -------------------------------------------------------------------

    def wanted_here(self) -> bool:
        """Whether a client of this node is subscribed to a total."""
        granted = self.dispatcher.subscriptions.granted
        return any(granted(TOTALS_PREFIX + name) for name in NAMES)

    async def serve_totals(self) -> None:
        if not self.wanted_here():
            self._stop_aggregating()
            return
        await self._start_aggregating()
        totals = self.current()
        for name, value in totals.items():
            if self._delivered.get(name) != value:
                message = self.stamps.message(TOTALS_PREFIX + name, value.encode(), 0, True, "")
                self.dispatcher.deliver_local(message)
        self._delivered = totals

    def current(self) -> dict[str, str]:
        """The totals now, from the reports heard within ``STALE_AFTER`` intervals."""
        horizon_ms = int(STALE_AFTER * self.interval * 1000)
        return self.totals.combine(int(self.clock() * 1000), horizon_ms)

    async def retained_totals(self, topic_filter: str) -> list[Record]:
        """The totals ``topic_filter`` matches, as retained messages for a new subscriber (none
        while the log cannot be read: they come with the next interval that can)."""
        try:
            await self._start_aggregating()
        except LOG_ERRORS as exc:
            log.warning("$SYS totals not read: %s", exc)
            return []
        found = []
        for name, value in self.current().items():
            topic = TOTALS_PREFIX + name
            if topics.matches(topic_filter, topic):
                message = self.stamps.message(topic, value.encode(), 0, True, "")
                found.append(Record(0, -1, 0, message))  # before any start offset: delivered
        return found

    async def _start_aggregating(self) -> None:
        """Read the reports from now on, and the retained ones (their latest values)."""
        async with self._starting:
            if self._aggregating:
                return
            await self.dispatcher.watchers.watch(WATCHED, self._heard)
            self._aggregating = True
            try:
                stored = await self.retained.match(WATCHED) if self.retained else []
            except Exception:  # figures sent only on change would stay missing: retry later
                self._stop_aggregating()
                raise
            for rec in stored:
                self.totals.take(rec.message)

    def _heard(self, rec: Record) -> None:
        self.totals.take(rec.message)

    def _stop_aggregating(self) -> None:
        if self._aggregating:
            self._aggregating = False
            self.dispatcher.watchers.unwatch(WATCHED)
            self.totals.clear()
            self._delivered = {}


class WithTotals:
    """A retained store that also gives the cluster's totals a new subscription matches."""

    def __init__(self, store: RetainedStore, systree: SysTree) -> None:
        self.store = store
        self.systree = systree

    async def apply(self, message: Message, partition: int, offset: int) -> None:
        await self.store.apply(message, partition, offset)

    async def scan(self, topic_filter: str) -> AsyncIterator[list[Record]]:
        async for batch in self.store.scan(topic_filter):
            yield batch
        if wants_totals(topic_filter):
            yield await self.systree.retained_totals(topic_filter)

    async def match(self, topic_filter: str) -> list[Record]:
        found = await self.store.match(topic_filter)
        if wants_totals(topic_filter):
            found += await self.systree.retained_totals(topic_filter)
        return found
