"""The subscription trie, checked against the brute-force matcher ``topics.matches``."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqttcore.topics import is_valid_filter, matches
from router.index import SubscriptionTrie

_LITERALS = ["", "$SYS", "a", "b"]


@st.composite
def filters(draw: st.DrawFn) -> str:
    levels = draw(st.lists(st.sampled_from([*_LITERALS, "+"]), min_size=0, max_size=4))
    if draw(st.booleans()) or not "/".join(levels):
        levels.append("#")
    return "/".join(levels)


topic_names = st.lists(st.sampled_from(_LITERALS), min_size=1, max_size=5).map("/".join)
keys = st.sampled_from(["c1", "c2", "c3"])
qoses = st.integers(min_value=0, max_value=2)
operations = st.lists(st.tuples(st.booleans(), filters(), keys, qoses), max_size=40)

Model = dict[tuple[str, str], int]


def _brute_force(model: Model, topic: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for (filter, key), qos in model.items():
        if matches(filter, topic):
            out[key] = max(qos, out.get(key, -1))
    return out


def _apply(
    trie: SubscriptionTrie[str], model: Model, ops: list[tuple[bool, str, str, int]]
) -> None:
    for is_add, filter, key, qos in ops:
        if is_add:
            assert trie.add(filter, key, qos) is ((filter, key) not in model)
            model[(filter, key)] = qos
        else:
            assert trie.remove(filter, key) is ((filter, key) in model)
            model.pop((filter, key), None)


@settings(max_examples=300)
@given(operations, st.lists(topic_names, min_size=1, max_size=10))
def test_match_equals_brute_force(ops: list[tuple[bool, str, str, int]], topics: list[str]) -> None:
    trie: SubscriptionTrie[str] = SubscriptionTrie()
    model: Model = {}
    _apply(trie, model, ops)
    assert len(trie) == len(model)
    assert trie.is_empty() is (not model)
    assert sorted(trie.filters()) == sorted({filter for filter, _ in model})
    for topic in topics:
        assert trie.match(topic) == _brute_force(model, topic)


@given(operations)
def test_removing_everything_prunes_every_node(ops: list[tuple[bool, str, str, int]]) -> None:
    trie: SubscriptionTrie[str] = SubscriptionTrie()
    model: Model = {}
    _apply(trie, model, ops)
    for filter, key in list(model):
        assert trie.remove(filter, key)
    assert trie.is_empty()
    assert trie._root.is_empty()
    assert list(trie.filters()) == []


@given(filters())
def test_generated_filters_are_valid(filter: str) -> None:
    assert is_valid_filter(filter)


def test_overlapping_subscriptions_deliver_once_at_highest_qos() -> None:
    trie: SubscriptionTrie[str] = SubscriptionTrie()
    trie.add("a/b", "c1", 0)
    trie.add("a/+", "c1", 2)
    trie.add("#", "c1", 1)
    trie.add("a/#", "c2", 1)
    assert trie.match("a/b") == {"c1": 2, "c2": 1}
    assert trie.match("a") == {"c1": 1, "c2": 1}
    assert trie.match("x") == {"c1": 1}


def test_add_replaces_qos_of_an_existing_subscription() -> None:
    trie: SubscriptionTrie[str] = SubscriptionTrie()
    assert trie.add("a/b", "c1", 2)
    assert not trie.add("a/b", "c1", 0)
    assert len(trie) == 1
    assert trie.match("a/b") == {"c1": 0}


def test_remove_unknown_subscription() -> None:
    trie: SubscriptionTrie[str] = SubscriptionTrie()
    trie.add("a/b", "c1", 1)
    assert not trie.remove("a/b", "c2")
    assert not trie.remove("a/c", "c1")
    assert not trie.remove("a/#", "c1")
    assert not trie.remove("a", "c1")
    assert not trie.remove("a/b/c", "c1")
    assert len(trie) == 1


def test_remove_keeps_siblings_and_prunes_the_rest() -> None:
    trie: SubscriptionTrie[str] = SubscriptionTrie()
    trie.add("a/+/c", "c1", 1)
    trie.add("a/#", "c2", 1)
    trie.add("a/+", "c3", 1)
    assert trie.remove("a/+/c", "c1")
    assert trie.match("a/x/c") == {"c2": 1}
    assert trie.match("a/x") == {"c2": 1, "c3": 1}
    assert trie.remove("a/+", "c3")
    assert trie._root.children["a"].plus is None
    assert trie.remove("a/#", "c2")
    assert trie._root.is_empty()


def test_sport_hash_matches_sport() -> None:
    trie: SubscriptionTrie[str] = SubscriptionTrie()
    trie.add("sport/#", "c1", 1)
    assert trie.match("sport") == {"c1": 1}
    assert trie.match("sports") == {}


def test_plus_matches_empty_levels() -> None:
    trie: SubscriptionTrie[str] = SubscriptionTrie()
    trie.add("+/+", "c1", 1)
    trie.add("/+", "c2", 1)
    trie.add("+", "c3", 1)
    assert trie.match("/finance") == {"c1": 1, "c2": 1}
    assert trie.match("/") == {"c1": 1, "c2": 1}


def test_dollar_topics_skip_first_level_wildcards_mqtt_4_7_2_1() -> None:
    trie: SubscriptionTrie[str] = SubscriptionTrie()
    trie.add("#", "all", 0)
    trie.add("+/monitor/Clients", "plus", 0)
    trie.add("$SYS/#", "sys", 1)
    trie.add("$SYS/monitor/+", "mon", 2)
    assert trie.match("$SYS/monitor/Clients") == {"sys": 1, "mon": 2}
    assert trie.match("x/monitor/Clients") == {"all": 0, "plus": 0}


def test_filters_lists_each_distinct_filter_once() -> None:
    trie: SubscriptionTrie[str] = SubscriptionTrie()
    for filter in ["#", "/", "a/#", "a", "+/+", "a/+/b", "$SYS/x"]:
        trie.add(filter, "c1", 0)
        trie.add(filter, "c2", 0)
    assert sorted(trie.filters()) == sorted(["#", "/", "a/#", "a", "+/+", "a/+/b", "$SYS/x"])
    assert len(trie) == 14


def test_deep_filters_do_not_recurse() -> None:
    depth = 20_000
    trie: SubscriptionTrie[int] = SubscriptionTrie()
    trie.add("/".join(["+"] * depth), 1, 1)
    trie.add("/".join(["x"] * depth), 2, 2)
    assert trie.match("/".join(["x"] * depth)) == {1: 1, 2: 2}
    assert trie.remove("/".join(["+"] * depth), 1)
    assert len(list(trie.filters())) == 1


def test_rejects_invalid_qos() -> None:
    trie: SubscriptionTrie[str] = SubscriptionTrie()
    for qos in (-1, 3):
        with pytest.raises(ValueError):
            trie.add("a", "c1", qos)
    assert trie.is_empty()
