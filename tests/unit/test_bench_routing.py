"""``python -m bench routing``: the layout that puts each node's subscribers on a third of the
partitions (Kafka's partitioner written out in bench/, checked against Kafka's own test vectors
and the product's router), the roles that carry it over real sockets, and the table."""

from __future__ import annotations

import shutil
import time
from contextlib import ExitStack
from pathlib import Path

import pytest

from bench import brokers, routing
from bench.__main__ import ALL, COMMANDS
from bench.brokers import Broker
from bench.load import Groups, Role, Timing
from bench.mqtt import Endpoint
from router.partitioner import Router


def test_murmur2_is_kafkas() -> None:
    # org.apache.kafka.common.utils.UtilsTest.testMurmur2 (Java's signed ints, as unsigned)
    cases = {b"21": -973932308, b"foobar": -790332482, b"a-little-bit-long-string": -985981536,
             b"a-little-bit-longer-string": -1486304829, b"abc": 479470107,
             b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971}  # fmt: skip
    assert {k: routing.murmur2(k) for k in cases} == {k: v & 0xFFFFFFFF for k, v in cases.items()}


def test_the_bench_puts_a_topic_where_the_nodes_do() -> None:
    router = Router(12, 2)
    topics = [f"rt/d{i}/t" for i in range(500)] + ["a", "a/b", "a/b/c/d", "dev/é/x"]
    assert [routing.partition_of(t, 12) for t in topics] == [
        router.partition_for_topic(t) for t in topics
    ]


def test_each_node_needs_its_third_of_the_partitions() -> None:
    s = routing.Settings()
    wanted = routing.plan(s)
    assert [len(mine) for mine in wanted] == [16, 16, 16]
    assert [sorted({routing.partition_of(t, 12) for t in mine}) for mine in wanted] == [
        [0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]
    ]  # fmt: skip
    assert len({t for mine in wanted for t in mine}) == 48


def test_every_topic_has_one_publisher_and_ids_do_not_collide() -> None:
    at = [Endpoint("127.0.0.1", p) for p in (1, 2, 3)]
    wanted = routing.plan(routing.Settings())
    rs = routing.roles(Broker("headwater", "hw", at, []), wanted, routing.Settings())
    subs, pubs = rs[:3], rs[3:]
    assert [set(r.filters) for r in subs] == [set(mine) for mine in wanted]
    published = {r.topic_of(r.first + k): r.first + k for r in pubs for k in range(r.clients)}
    assert set(published) == {t for mine in wanted for t in mine}
    assert sorted(published.values()) == list(range(48))
    assert [r.at.port for r in pubs] == [1, 2, 3] and {r.rate for r in pubs} == {50.0}


def test_the_table_gives_each_nodes_share_of_the_log() -> None:
    out = routing.Outcome(routing.Settings(), "python -m bench routing", "this checkout at abc")
    out.records, out.bytes = 9_600, 1_251_025
    out.nodes = [
        routing.NodeShare("node 1", [0, 1, 2, 3], [0, 1, 2, 3], 3_200, 420_025, 3_200, 3_200, 0)
    ]
    section = routing.render(out)
    assert section.startswith("<!-- routing:begin -->\n## Interest routing")
    assert (
        "| node 1 | 0-3 | 0, 1, 2, 3 | 3,200 / 9,600 (33.3%) | 420,025 / 1,251,025 (33.6%) | "
        "3,200 / 3,200 | 0 |" in section
    )
    assert "routing" in COMMANDS and "routing" in ALL


@pytest.mark.skipif(
    shutil.which("mosquitto") is None and not Path("/usr/sbin/mosquitto").exists(),
    reason="mosquitto is not installed",
)
def test_a_subscriber_of_some_topics_gets_only_those(tmp_path: Path) -> None:
    """The roles routing uses, over real sockets: one SUBSCRIBE of several filters, one
    publisher connection per listed topic."""
    with ExitStack() as stack:
        at = brokers.start_mosquitto(tmp_path, stack).endpoints[0]
        sub = Role("sub", at, 1, "s", filters=("rt/a/t", "rt/c/t"), qos=1)
        pub = Role("paced", at, 3, "p", topics=("rt/a/t", "rt/b/t", "rt/c/t"), first=7, qos=1,
                   rate=20.0)  # fmt: skip
        groups = Groups([sub, pub])
        try:
            groups.ready()
            start = time.monotonic() + 0.2
            groups.go(Timing(start, start, start + 1.0, drain_idle=0.5, drain_max=5.0))
            got, sent = groups.reports(30.0)
        finally:
            groups.close()
    assert {p: len(s) for p, s in sent.acked.items()} == {7: 20, 8: 20, 9: 20}
    assert {p: len(s) for p, s in got.got.items()} == {7: 20, 9: 20}
    assert got.received == 40
