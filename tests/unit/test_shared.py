"""The pure parts of shared subscriptions: Kafka group ids, member choice, the bounds, and
SUBACK codes of the filters a bound refuses (``router.shared``, ``mqttcore.channel``)."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import OFFSET_STORED, KafkaError, KafkaException, TopicPartition
from hypothesis import given
from hypothesis import strategies as st

from frontend.config import config_from_args
from frontend.config_file import parse_args
from frontend.values import ConfigError
from mqttcore.channel import AddSubscriptions
from mqttcore.packets import SUBACK_FAILURE
from mqttcore.session import Session
from router.partitioner import Router
from router.shared import ShareGroup, ShareGroups, ShareLimits, group_id

names = st.text(st.sampled_from("ab.:/1"), min_size=1, max_size=6)


def test_a_dot_in_the_share_name_makes_another_group_id() -> None:
    assert group_id("q1", "p.t/x") != group_id("q1.p", "t/x")


@given(names, names, names, names)
def test_group_ids_are_injective(g1: str, f1: str, g2: str, f2: str) -> None:
    assert (group_id(g1, f1) == group_id(g2, f2)) == ((g1, f1) == (g2, f2))


def group(*members: str) -> ShareGroup:
    shared = ShareGroup(None, "t", "g", "a/#", frozenset(), lambda g, r: None)  # type: ignore[arg-type]
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


class SlowCoordinator:
    """A consumer whose group coordinator does not say the committed offsets in time."""

    def __init__(self) -> None:
        self.assigned: list[tuple[int, int]] = []

    def committed(self, partitions: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT))

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        self.assigned += [(tp.partition, tp.offset) for tp in partitions]

    def pause(self, partitions: list[TopicPartition]) -> None:
        pass


def test_an_assignment_whose_offsets_kafka_does_not_say_is_taken_at_the_stored_ones() -> None:
    shared = group("alice")
    shared.wanted = frozenset({0, 1})
    shared.start_offsets = {0: 5, 1: 7}
    consumer = SlowCoordinator()
    shared._on_assign(consumer, [TopicPartition("t", 0), TopicPartition("t", 1)])  # type: ignore[arg-type]
    assert consumer.assigned == [(0, OFFSET_STORED), (1, OFFSET_STORED)]
    assert shared.assigned == {0, 1}


class FakeGroupLog:
    class settings:
        topic = "t"

    def __init__(self) -> None:
        self.opened: list[str] = []

    def consumer(self, group_id: str, **config: Any) -> Any:
        self.opened.append(group_id)
        return object()


def test_bounds_refuse_past_the_node_and_the_client() -> None:
    log = FakeGroupLog()
    shares = ShareGroups(log, Router(4, 2), ShareLimits(per_node=2, per_client=2), print)  # type: ignore[arg-type]
    one, two = Session("one", True, 1, 0), Session("two", True, 1, 0)
    assert shares.admit(one, [("$share/a/x", 1), ("$share/b/x", 1), ("plain", 0)]) == set()
    assert shares.admit(one, [("$share/a/x", 0), ("$share/a/y", 0)]) == {"$share/a/y"}
    assert shares.admit(two, [("$share/a/x", 1), ("$share/c/x", 1)]) == {"$share/c/x"}
    assert len(log.opened) == 2 and shares.refused == 2
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
    assert (config.max_share_groups, config.max_share_groups_per_client) == (32, 8)
    with pytest.raises(ConfigError, match="--max-share-groups-per-client"):
        config_from_args(parse_args([*required, "--max-share-groups-per-client", "-1"]))
