"""Shared subscriptions without Kafka: group ids, member choice, the bounds, SUBACK codes of
the filters a bound refuses, and a node's part in a group as its leases move (``router.shared``
with fakes of the share consumer; the Redis leases are tested against a real Redis in
``tests/integration/test_share_leases.py``)."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import TopicPartition
from hypothesis import given
from hypothesis import strategies as st

from frontend.config import config_from_args
from frontend.config_file import parse_args
from frontend.values import ConfigError
from mqttcore.channel import AddSubscriptions
from mqttcore.message import Message
from mqttcore.packets import SUBACK_FAILURE
from mqttcore.session import Session
from router.partitioner import Router
from router.record import Record
from router.retry import Retries
from router.shared import (
    LeaseError,
    LocalLeases,
    ShareGroup,
    ShareGroups,
    ShareLimits,
    ShareReader,
    group_id,
)

names = st.text(st.sampled_from("ab.:/1"), min_size=1, max_size=6)


def test_a_dot_in_the_share_name_makes_another_group_id() -> None:
    assert group_id("q1", "p.t/x") != group_id("q1.p", "t/x")


@given(names, names, names, names)
def test_group_ids_are_injective(g1: str, f1: str, g2: str, f2: str) -> None:
    assert (group_id(g1, f1) == group_id(g2, f2)) == ((g1, f1) == (g2, f2))


def group(
    *members: str, topic_filter: str = "a/#", delivered: list[Record] | None = None
) -> ShareGroup:
    got = delivered if delivered is not None else []
    shared = ShareGroup("g", topic_filter, frozenset({0, 1}), lambda g, r: got.append(r))
    shared.members = dict.fromkeys(members, 1)
    return shared


def test_pick_goes_round_robin_past_members_that_may_not_read() -> None:
    shared = group("alice", "bob", "carol")
    picks = [shared.pick(lambda m: m != "bob") for _ in range(4)]
    assert picks == ["carol", "alice", "carol", "alice"]
    assert shared.pick(lambda m: False) is None


def test_pick_takes_the_skipped_member_only_if_no_other_may() -> None:
    shared = group("alice", "bob")
    assert shared.pick(lambda m: True, skip="alice") == "bob"
    assert shared.pick(lambda m: m == "alice", skip="alice") == "alice"


def rec(partition: int, offset: int, topic: str = "a/b") -> Record:
    return Record(partition, offset, 10, Message(topic, b"x", 1, False, "c", "n", 0, b"i"))


class FakeConsumer:
    """The share consumer as :class:`ShareReader` uses it: assignments and fetched records."""

    def __init__(self) -> None:
        self.assigned: dict[int, int] = {}
        self.fetched: list[Record] = []

    def incremental_assign(self, tps: list[TopicPartition]) -> None:
        self.assigned.update({tp.partition: tp.offset for tp in tps})

    def incremental_unassign(self, tps: list[TopicPartition]) -> None:
        for tp in tps:
            del self.assigned[tp.partition]

    def consume(self, n: int, timeout: float) -> list[Record]:
        batch, self.fetched = self.fetched, []
        return batch


def reader() -> tuple[ShareReader, FakeConsumer]:
    shares = ShareReader("t", lambda raw: raw, Retries())
    consumer = FakeConsumer()
    shares.start(consumer)  # type: ignore[arg-type]
    return shares, consumer


def test_groups_on_one_partition_are_read_from_the_lowest_and_each_takes_from_its_own() -> None:
    shares, consumer = reader()
    first: list[Record] = []
    second: list[Record] = []
    ahead, behind = group("a", delivered=first), group("b", delivered=second)
    for g in (ahead, behind):
        g.held_until = float("inf")
    shares.gain(ahead, 0, 5)
    assert consumer.assigned == {0: 5}
    consumer.fetched = [rec(0, 5), rec(0, 6)]
    shares.serve()
    shares.gain(behind, 0, 3)  # reassigned lower: the other group skips what it had
    assert consumer.assigned == {0: 3}
    consumer.fetched = [rec(0, 3), rec(0, 4, topic="x/y"), rec(0, 5), rec(0, 6), rec(0, 7)]
    shares.serve()
    assert [r.offset for r in first] == [5, 6, 7]
    assert [r.offset for r in second] == [3, 5, 6, 7]  # 4 does not match a/#
    assert behind.offsets.due() == {0: 3}  # nothing acknowledged yet
    for r in second:
        behind.finished(r)
    assert behind.offsets.due() == {0: 8}
    shares.lose(ahead, [0])
    assert consumer.assigned == {0: 3}
    shares.lose(behind, [0])
    assert consumer.assigned == {}


def test_a_group_whose_leases_may_have_passed_is_not_served() -> None:
    shares, consumer = reader()
    got: list[Record] = []
    stale = group("a", delivered=got)
    stale.held_until = 0.0
    shares.gain(stale, 1, 0)
    consumer.fetched = [rec(1, 0)]
    shares.serve()
    assert got == [] and stale.positions == {} and consumer.assigned == {}


class FakeGroupLog:
    def __init__(self) -> None:
        self.reader = self
        self.shares, self.consumer = reader()

    async def high_watermarks(self, partitions: Any) -> dict[int, int]:
        return dict.fromkeys(partitions, 100)


class Dealt(LocalLeases):
    """Leases that hold only the partitions the test deals, and fail when told to."""

    def __init__(self) -> None:
        super().__init__()
        self.dealt: set[int] | None = None
        self.failing = False
        self.commits: list[dict[int, int]] = []

    async def hold(self, gid: str, wanted: Any, commits: Any, starts: Any) -> dict[int, int]:
        if self.failing:
            raise LeaseError("no answer")
        self.commits.append(dict(commits))
        held = await super().hold(gid, wanted, commits, starts)
        return {p: o for p, o in held.items() if self.dealt is None or p in self.dealt}


async def test_a_group_reads_what_it_is_dealt_and_commits_what_was_acknowledged() -> None:
    log = FakeGroupLog()
    delivered: list[Record] = []
    shares = ShareGroups(log, Router(4, 1), ShareLimits(), lambda g, r: delivered.append(r))
    leases = shares.leases = Dealt()
    session = Session("one", True, 1, 0)
    joined = shares.join(session, "$share/g/#", ("g", "#"), 1)
    assert joined is not None
    await shares.start(joined)
    assert log.consumer.assigned == dict.fromkeys(range(4), 100)
    log.consumer.fetched = [rec(2, 100, "a"), rec(2, 101, "b")]
    log.shares.serve()
    joined.finished(delivered[0])
    leases.dealt = {0, 1}  # another member came: 2 and 3 go to it
    await shares._step(joined)
    assert leases.commits[-1] == {2: 101}  # 101 not acknowledged: delivered again by the next
    assert log.consumer.assigned == {0: 100, 1: 100}
    leases.failing = True
    await shares._step(joined)
    assert shares.lease_failures == 1 and log.consumer.assigned == {0: 100, 1: 100}
    shares.leave(("g", "#"), "one")
    assert log.consumer.assigned == {} and shares.groups == {}
    leases.failing = False
    await shares.stop()


def test_bounds_refuse_past_the_node_and_the_client() -> None:
    shares = ShareGroups(FakeGroupLog(), Router(4, 2), ShareLimits(per_node=2, per_client=2), print)
    one, two = Session("one", True, 1, 0), Session("two", True, 1, 0)
    assert shares.admit(one, [("$share/a/x", 1), ("$share/b/x", 1), ("plain", 0)]) == set()
    assert shares.admit(one, [("$share/a/x", 0), ("$share/a/y", 0)]) == {"$share/a/y"}
    assert shares.admit(two, [("$share/a/x", 1), ("$share/c/x", 1)]) == {"$share/c/x"}
    assert len(shares.groups) == 2 and shares.refused == 2
    assert sorted(one.subscriptions) == ["$share/a/x", "$share/b/x"]


def test_refusing_answers_0x80_for_the_refused_filters_only() -> None:
    request = AddSubscriptions(7, [("a", 0), ("$share/g/b", 1), ("c", 2)], (0, 128, 1, 2))
    refused = request.refusing({"$share/g/b"})
    assert refused.return_codes == (0, SUBACK_FAILURE, SUBACK_FAILURE, 2)
    assert refused.granted == [("a", 0), ("c", 2)]
    assert request.refusing(set()) is request


def test_the_bounds_are_settings_with_finite_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HEADWATER_MAX_SHARE_GROUPS", "HEADWATER_MAX_SHARE_GROUPS_PER_CLIENT"):
        monkeypatch.delenv(name, raising=False)
    required = ["--node-id", "n1", "--kafka-bootstrap", "k:9092"]
    config = config_from_args(parse_args(required))
    assert (config.max_share_groups, config.max_share_groups_per_client) == (256, 8)
    with pytest.raises(ConfigError, match="--max-share-groups-per-client"):
        config_from_args(parse_args([*required, "--max-share-groups-per-client", "-1"]))
