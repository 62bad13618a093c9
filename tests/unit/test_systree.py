"""``$SYS`` (``frontend.systree``): a node's figures, the cluster's totals without a master, and
who reads what.  Over the real dispatcher and fakes of the log (``tests.unit.fakes``), no Kafka."""

from __future__ import annotations

import math
import os
from typing import Any

import pytest

from frontend.config import build_parser, config_from_args
from frontend.retained import MemoryRetainedStore, RetainedStore
from frontend.systree import (
    LOADS,
    NAMES,
    Figures,
    Sample,
    SysTree,
    Totals,
    sample,
    wants_totals,
)
from frontend.values import ConfigError
from mqttcore.message import Message, MessageStamps
from mqttcore.session import Session
from router.dispatch import Dispatcher
from router.partitioner import Router
from router.record import Record, wall_clock_stamps
from tests.unit.fakes import FakeClient, FakeLog

ROUTER = Router(4, 2)


def counts(received: int = 0, sent: int = 0) -> dict[str, int]:
    return {
        "messages/received": received,
        "messages/sent": sent,
        "bytes/received": 0,
        "bytes/sent": 0,
    }


def report(node: str, name: str, value: str, at_ms: int) -> Message:
    stamps = wall_clock_stamps(node)
    message = stamps.message(f"$SYS/brokers/{node}/{name}", value.encode(), 0, True, "")
    message.timestamp_ms = at_ms
    return message


# -- one node's figures -------------------------------------------------------------------------


def test_the_first_report_has_every_name_then_only_the_uptime_and_what_changed() -> None:
    figures = Figures("headwater version 1", started=100.0)
    first = figures.take(110.0, Sample(2, 5, counts(7, 9)))
    assert set(first) == set(NAMES)
    assert first["uptime"] == "10 seconds" and first["clients/connected"] == "2"
    assert first["messages/received"] == first["publish/messages/received"] == "7"
    assert first["messages/sent"] == first["publish/messages/sent"] == "9"
    assert figures.changed(first) == first
    figures.published(first)
    second = figures.take(120.0, Sample(3, 5, counts(7, 9)))
    assert figures.changed(second) == {"uptime": "20 seconds", "clients/connected": "3"}


def test_load_averages_are_mosquittos_decaying_rates_per_minute() -> None:
    figures = Figures("v", started=0.0)
    assert figures.take(0.0, Sample(0, 0, counts(0)))["load/messages/received/1min"] == "0.00"
    after = figures.take(60.0, Sample(0, 0, counts(received=120)))  # 120 a minute, for a minute
    assert after["load/messages/received/1min"] == f"{120 * (1 - math.exp(-1)):.2f}"
    assert after["load/messages/received/15min"] == f"{120 * (1 - math.exp(-60 / 900)):.2f}"
    assert after["load/messages/sent/1min"] == "0.00"


def test_a_sample_reads_the_stats_snapshot() -> None:
    stats: dict[str, Any] = {
        "clients": 4,
        "messages_delivered": 99,
        "messages_received_by_qos": {"0": 1, "1": 2, "2": 3},
        "messages_sent_by_qos": {"0": 10, "1": 0, "2": 1},
        "bytes_received": 500,
        "bytes_sent": 700,
    }
    assert sample(stats, 6) == Sample(
        4,
        6,
        {"messages/received": 6, "messages/sent": 11, "bytes/received": 500, "bytes/sent": 700},
    )


# -- the totals ---------------------------------------------------------------------------------


def test_totals_sum_the_counts_and_take_the_highest_uptime_and_version() -> None:
    totals = Totals()
    for node, clients, uptime, version, load in (
        ("n1", "2", "30 seconds", "headwater version 1.0", "1.25"),
        ("n2", "5", "90 seconds", "headwater version 1.1", "2.50"),
    ):
        totals.take(report(node, "clients/connected", clients, 1000))
        totals.take(report(node, "uptime", uptime, 1000))
        totals.take(report(node, "version", version, 1000))
        totals.take(report(node, LOADS[0], load, 1000))
    assert totals.combine(1000, 3000) == {
        "clients/connected": "7",
        "uptime": "90 seconds",
        "version": "headwater version 1.1",
        LOADS[0]: "3.75",
    }


def test_a_node_not_heard_from_within_the_horizon_drops_out() -> None:
    totals = Totals()
    totals.take(report("n1", "clients/connected", "2", 1000))
    totals.take(report("n2", "clients/connected", "5", 1000))
    totals.take(report("n1", "uptime", "9 seconds", 4000))  # n1's heartbeat; n2 is silent
    assert totals.combine(4000, 3000) == {"clients/connected": "7", "uptime": "9 seconds"}
    assert totals.combine(4001, 3000) == {"clients/connected": "2", "uptime": "9 seconds"}
    assert totals.nodes == ["n1"]  # forgotten, not only left out


def test_an_older_report_arriving_late_does_not_replace_a_newer_one() -> None:
    totals = Totals()
    totals.take(report("n1", "clients/connected", "4", 2000))  # live
    totals.take(report("n1", "clients/connected", "1", 1000))  # retained, read afterwards
    assert totals.combine(2000, 3000) == {"clients/connected": "4"}


def test_other_topics_and_unknown_names_are_not_counted() -> None:
    totals = Totals()
    totals.take(report("n1", "heap/current", "5", 1000))
    other = report("n1", "clients/connected", "5", 1000)
    other.topic = "$SYS/broker/clients/connected"
    totals.take(other)
    assert totals.combine(1000, 3000) == {} and totals.nodes == []


@pytest.mark.parametrize(
    ("topic_filter", "wanted"),
    [
        ("$SYS/broker/clients/connected", True),
        ("$SYS/broker/load/+/received/1min", True),
        ("$SYS/#", True),
        ("$SYS/+/uptime", True),
        ("$SYS/brokers/#", False),
        ("$SYS/broker/heap/current", False),
        ("#", False),
        ("a/b", False),
    ],
)
def test_which_filters_want_the_totals(topic_filter: str, wanted: bool) -> None:
    assert wants_totals(topic_filter) is wanted


# -- two nodes on one log -----------------------------------------------------------------------


class Node:
    def __init__(self, cluster: Cluster, node_id: str) -> None:
        self.log = FakeLog(cluster.partitions)
        self.dispatcher = Dispatcher(self.log, ROUTER)  # type: ignore[arg-type]
        self.tree = SysTree(
            node_id,
            1.0,
            MessageStamps(node_id, lambda: int(cluster.now * 1000), os.urandom(8)),
            self.log,  # type: ignore[arg-type]
            self.dispatcher,
            lambda: {
                "clients": self.dispatcher.client_count,
                "messages_delivered": self.dispatcher.counters.messages_delivered,
            },
            clock=lambda: cluster.now,
        )
        self.retained = self.tree.serving(cluster.retained)

    async def client(self, client_id: str, *filters: str) -> FakeClient:
        client = FakeClient(Session(client_id, clean=True))
        self.dispatcher.attach(client.session, client)
        _, new = await self.dispatcher.subscribe(client.session, [(f, 0) for f in filters])
        self.dispatcher.activate(client.session, new)
        return client


class Cluster:
    """Nodes on one log: what each produces is appended, stored if retained, and read by all."""

    def __init__(self) -> None:
        self.partitions: dict[int, list[Message]] = {}
        self.retained: RetainedStore = MemoryRetainedStore()
        self.now = 1000.0
        self.nodes: list[Node] = []

    def node(self, node_id: str) -> Node:
        self.nodes.append(Node(self, node_id))
        return self.nodes[-1]

    async def interval(self, *ticking: Node) -> None:
        """One interval: the ``ticking`` nodes report (all when none named), the log carries."""
        self.now += 1.0
        for node in ticking or self.nodes:
            await node.tree.tick()
        await self.carry()

    async def carry(self) -> None:
        for node in self.nodes:
            produced, node.log.produced = node.log.produced, []
            for message in produced:
                records = self.partitions.setdefault(ROUTER.route(message.topic)[0], [])
                rec = Record(ROUTER.route(message.topic)[0], len(records), 1, message)
                records.append(message)
                await self.retained.apply(message, rec.partition, rec.offset)
                for reader in self.nodes:
                    reader.dispatcher.dispatch([rec])


def payloads(client: FakeClient, topic: str) -> list[bytes]:
    return [p.payload for p in client.received() if p.topic == topic]


async def test_totals_count_every_node_and_reach_local_subscribers_only() -> None:
    cluster = Cluster()
    a, b = cluster.node("a"), cluster.node("b")
    watcher = await a.client("watcher", "$SYS/broker/clients/connected")
    others = [await b.client(f"b{i}", "x/y") for i in range(2)]
    await cluster.interval()  # reports written; a starts reading them
    await cluster.interval()
    assert payloads(watcher, "$SYS/broker/clients/connected")[-1] == b"3"
    assert all(c.received() == [] for c in others)
    # every report went into the log once, by its own node; no total did
    assert all(m.topic.startswith("$SYS/brokers/") for p in cluster.partitions.values() for m in p)


async def test_a_node_reads_the_reports_only_while_a_local_client_wants_a_total() -> None:
    cluster = Cluster()
    a, b = cluster.node("a"), cluster.node("b")
    sys_partition = ROUTER.route("$SYS/brokers/a/uptime")[0]
    await cluster.interval()
    assert a.log.reader.assigned() == [] and b.log.reader.assigned() == []
    watcher = await a.client("watcher", "$SYS/broker/#")
    await cluster.interval()
    assert sys_partition in a.log.reader.assigned() and b.log.reader.assigned() == []
    a.dispatcher.unsubscribe(watcher.session, ["$SYS/broker/#"])
    await cluster.interval()
    assert a.log.reader.assigned() == []


async def test_a_node_that_stops_reporting_drops_out_after_three_intervals() -> None:
    cluster = Cluster()
    a, b = cluster.node("a"), cluster.node("b")
    watcher = await a.client("watcher", "$SYS/broker/clients/connected")
    await b.client("b1")
    await cluster.interval()
    await cluster.interval()
    assert payloads(watcher, "$SYS/broker/clients/connected") == [b"2"]
    for _ in range(3):
        await cluster.interval(a)
    assert payloads(watcher, "$SYS/broker/clients/connected") == [b"2"]
    await cluster.interval(a)
    assert payloads(watcher, "$SYS/broker/clients/connected") == [b"2", b"1"]


async def test_a_new_subscriber_gets_the_current_totals_at_once_from_the_stored_reports() -> None:
    cluster = Cluster()
    a, b = cluster.node("a"), cluster.node("b")
    await b.client("b1")
    await cluster.interval()  # nobody reads the reports yet: they are only stored
    found = await a.retained.match("$SYS/broker/clients/+")
    assert {(r.message.topic, r.message.payload) for r in found} == {
        ("$SYS/broker/clients/connected", b"1")
    }
    assert all(r.offset < 0 and r.message.retain for r in found)
    stored = await a.retained.match("$SYS/brokers/b/clients/connected")
    assert [r.message.payload for r in stored] == [b"1"]


async def test_with_no_interval_nothing_is_reported_and_the_store_is_left_alone() -> None:
    log = FakeLog()
    dispatcher = Dispatcher(log, ROUTER)  # type: ignore[arg-type]
    stamps = wall_clock_stamps("n")
    tree = SysTree("n", 0.0, stamps, log, dispatcher, dict)  # type: ignore[arg-type]
    store = MemoryRetainedStore()
    assert tree.serving(store) is store
    tree.start()
    assert log.produced == []


# -- configuration ------------------------------------------------------------------------------


def test_the_interval_is_a_flag_and_a_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    base = ["--node-id", "n", "--kafka-bootstrap", "127.0.0.1:9092"]

    def interval(*argv: str) -> float:
        return config_from_args(build_parser().parse_args([*base, *argv])).sys_interval

    assert interval() == 10.0 and interval("--sys-interval", "0") == 0.0
    monkeypatch.setenv("HEADWATER_SYS_INTERVAL", "2.5")
    assert interval() == 2.5
    with pytest.raises(ConfigError, match="--sys-interval / HEADWATER_SYS_INTERVAL"):
        interval("--sys-interval", "-1")


class FailingOnce(MemoryRetainedStore):
    def __init__(self) -> None:
        super().__init__()
        self.failures = 1

    async def match(self, topic_filter: str) -> list[Record]:
        if self.failures:
            self.failures -= 1
            raise ConnectionError("Redis away")
        return await super().match(topic_filter)


async def test_stored_reports_that_cannot_be_read_are_read_again_next_interval() -> None:
    cluster = Cluster()
    cluster.retained = FailingOnce()
    a, b = cluster.node("a"), cluster.node("b")
    await b.client("b1")
    await cluster.interval(b)  # b's figures, stored: b sends them again only when they change
    watcher = await a.client("watcher", "$SYS/broker/clients/connected")
    with pytest.raises(ConnectionError):
        await a.tree.tick()
    await cluster.carry()  # a's own first report
    assert a.log.reader.assigned() == [ROUTER.route("$SYS/broker/x")[0]]  # the client's own only
    await cluster.interval()
    assert payloads(watcher, "$SYS/broker/clients/connected") == [b"2"]
