"""MQTT 3.1.1 section 4.7: topic names, topic filters, matching, shared subscriptions, and
Headwater's history subscriptions."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqttcore.errors import MalformedPacket
from mqttcore.topics import (
    MAX_TOPIC_LEVELS,
    history_start_ms,
    is_valid_filter,
    judged_filter,
    matches,
    original_topic,
    parse_history,
    parse_shared,
    validate_topic_filter,
    validate_topic_name,
)


def _spec_id(validate: Callable[[str], None], text: str) -> str:
    with pytest.raises(MalformedPacket) as info:
        validate(text)
    return info.value.spec_id


# -- topic names ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a", "/", "a/b", "/finance", "Accounts payable", "$SYS/x", "ü/€"])
def test_valid_topic_names(name: str) -> None:
    validate_topic_name(name)


def test_topic_name_empty_mqtt_4_7_3_1() -> None:
    assert _spec_id(validate_topic_name, "") == "MQTT-4.7.3-1"


@pytest.mark.parametrize("name", ["+", "a/+", "a/#", "#", "a+b", "sport/tennis#"])
def test_topic_name_wildcards_mqtt_3_3_2_2_and_4_7_1_1(name: str) -> None:
    assert _spec_id(validate_topic_name, name) == "MQTT-3.3.2-2"


def test_topic_name_null_character_mqtt_4_7_3_2() -> None:
    assert _spec_id(validate_topic_name, "a/\x00/b") == "MQTT-4.7.3-2"


def test_topic_name_length_mqtt_4_7_3_3() -> None:
    validate_topic_name("a" * 65535)
    assert _spec_id(validate_topic_name, "a" * 65536) == "MQTT-4.7.3-3"


def test_topic_name_length_counts_utf8_bytes_mqtt_4_7_3_3() -> None:
    validate_topic_name("€" * 21845)  # 3 bytes each: 65535 bytes
    assert _spec_id(validate_topic_name, "€" * 21845 + "a") == "MQTT-4.7.3-3"
    assert _spec_id(validate_topic_filter, "€" * 21846) == "MQTT-4.7.3-3"


def test_error_message_cites_the_spec() -> None:
    with pytest.raises(MalformedPacket, match=r"^\[MQTT-3\.3\.2-2\] "):
        validate_topic_name("a/+")


# -- topic filters ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "filter",
    # The valid examples of 4.7.1.2 and 4.7.1.3, and a few more.
    [
        "#",
        "sport/tennis/#",
        "+",
        "+/tennis/#",
        "sport/+/player1",
        "/",
        "+/+",
        "/+",
        "a//b",
        "$SYS/#",
    ],
)
def test_valid_filters(filter: str) -> None:
    validate_topic_filter(filter)
    assert is_valid_filter(filter)


def test_filter_empty_mqtt_4_7_3_1() -> None:
    assert _spec_id(validate_topic_filter, "") == "MQTT-4.7.3-1"
    assert not is_valid_filter("")


@pytest.mark.parametrize("filter", ["sport/tennis#", "sport/tennis/#/ranking", "#/a", "##", "a/#/"])
def test_multi_level_wildcard_alone_and_last_mqtt_4_7_1_2(filter: str) -> None:
    assert _spec_id(validate_topic_filter, filter) == "MQTT-4.7.1-2"
    assert not is_valid_filter(filter)


@pytest.mark.parametrize("filter", ["sport+", "+sport", "a/b+/c", "++", "+a/#"])
def test_single_level_wildcard_whole_level_mqtt_4_7_1_3(filter: str) -> None:
    assert _spec_id(validate_topic_filter, filter) == "MQTT-4.7.1-3"
    assert not is_valid_filter(filter)


def test_filter_null_character_mqtt_4_7_3_2() -> None:
    assert _spec_id(validate_topic_filter, "a/\x00") == "MQTT-4.7.3-2"
    assert not is_valid_filter("\x00")


def test_filter_length_mqtt_4_7_3_3() -> None:
    assert is_valid_filter("a" * 65535)
    assert _spec_id(validate_topic_filter, "a" * 65536) == "MQTT-4.7.3-3"


def test_200_levels_are_the_most_a_name_or_filter_may_have() -> None:
    assert MAX_TOPIC_LEVELS == 200  # Mosquitto's TOPIC_HIERARCHY_LIMIT
    deepest, deeper = "/".join("a" * 200), "/".join("a" * 201)
    validate_topic_name(deepest)
    assert _spec_id(validate_topic_name, deeper) == "MQTT-4.7.1"
    assert _spec_id(validate_topic_name, "/" * 200) == "MQTT-4.7.1"  # empty levels count
    for valid in (deepest, "/".join("+" * 200), "/".join("a" * 199) + "/#", f"$share/g/{deepest}"):
        assert is_valid_filter(valid), valid
    for deep in (deeper, "/".join("+" * 201), deepest + "/#", f"$share/g/{deeper}"):
        assert _spec_id(validate_topic_filter, deep) == "MQTT-4.7.1", deep


def test_levels_are_counted_before_the_filter_is_split() -> None:
    filter = "a/" * 30_000 + "x#"  # would be MQTT-4.7.1-2, but the level count comes first
    assert _spec_id(validate_topic_filter, filter) == "MQTT-4.7.1"


_TEXT = st.text(alphabet=st.sampled_from("ab/+#$\x00€"), max_size=12)


@given(_TEXT)
def test_validators_raise_only_malformed_packet(text: str) -> None:
    for validate in (validate_topic_name, validate_topic_filter):
        try:
            validate(text)
        except MalformedPacket as exc:
            assert exc.spec_id.startswith("MQTT-")


@given(_TEXT)
def test_valid_names_are_valid_filters(text: str) -> None:
    if _accepts(validate_topic_name, text):
        assert is_valid_filter(text)


def _accepts(validate: Callable[[str], None], text: str) -> bool:
    try:
        validate(text)
    except MalformedPacket:
        return False
    return True


# -- matching (4.7.1, 4.7.2, 4.7.3 examples) --------------------------------------------------


@pytest.mark.parametrize(
    ("filter", "topic", "expected"),
    [
        # 4.7.1.2: '#' matches the parent level and any number of children.
        ("sport/tennis/player1/#", "sport/tennis/player1", True),
        ("sport/tennis/player1/#", "sport/tennis/player1/ranking", True),
        ("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon", True),
        ("sport/#", "sport", True),
        ("#", "anything/at/all", True),
        ("#", "/", True),
        # 4.7.1.3: '+' matches exactly one level, which may be empty.
        ("sport/tennis/+", "sport/tennis/player1", True),
        ("sport/tennis/+", "sport/tennis/player2", True),
        ("sport/tennis/+", "sport/tennis/player1/ranking", False),
        ("sport/+", "sport", False),
        ("sport/+", "sport/", True),
        ("+/+", "/finance", True),
        ("/+", "/finance", True),
        ("+", "/finance", False),
        ("sport/+/player1", "sport/tennis/player1", True),
        ("+/tennis/#", "sport/tennis", True),
        # 4.7.2: wildcards at the first level do not match '$' topics [MQTT-4.7.2-1].
        ("#", "$SYS/monitor/Clients", False),
        ("+/monitor/Clients", "$SYS/monitor/Clients", False),
        ("$SYS/#", "$SYS/monitor/Clients", True),
        ("$SYS/#", "$SYS", True),
        ("$SYS/monitor/+", "$SYS/monitor/Clients", True),
        ("+", "$", False),
        ("a/+", "a/$x", True),
        # 4.7.3: case sensitive, spaces allowed, a leading '/' makes a distinct level.
        ("ACCOUNTS", "Accounts", False),
        ("Accounts payable", "Accounts payable", True),
        ("/finance", "finance", False),
        ("finance", "/finance", False),
        ("/", "/", True),
        ("a/b", "a/b/c", False),
        ("a/b/c", "a/b", False),
    ],
)
def test_matches_spec_examples(filter: str, topic: str, expected: bool) -> None:
    assert matches(filter, topic) is expected


@given(st.lists(st.sampled_from(["", "a", "b", "$x"]), min_size=1, max_size=5))
def test_a_topic_matches_itself_and_hash(levels: list[str]) -> None:
    topic = "/".join(levels)
    assert matches(topic, topic)
    assert matches("#", topic) is not topic.startswith("$")


# -- shared subscriptions ($share/<group>/<filter>, MQTT 5.0 4.8.2) ---------------------------


@pytest.mark.parametrize(
    ("filter", "expected"),
    [
        ("$share/g/a/b", ("g", "a/b")),
        ("$share/g/#", ("g", "#")),
        ("$share/group-1/+/x", ("group-1", "+/x")),
        ("$share/g//", ("g", "/")),
        ("$share/g/$SYS/#", ("g", "$SYS/#")),
        ("a/b", None),
        ("$share", None),
        ("$sharex/g/a", None),
    ],
)
def test_parse_shared(filter: str, expected: tuple[str, str] | None) -> None:
    assert parse_shared(filter) == expected


@pytest.mark.parametrize(
    ("filter", "spec_id"),
    [
        ("$share/", "MQTT-4.8.2-1"),
        ("$share//a", "MQTT-4.8.2-1"),
        ("$share/g", "MQTT-4.8.2-2"),
        ("$share/g/", "MQTT-4.8.2-2"),
        ("$share/g+/a", "MQTT-4.8.2-2"),
        ("$share/#/a", "MQTT-4.8.2-2"),
        ("$share/+", "MQTT-4.8.2-2"),
        ("$share/g/a/#/b", "MQTT-4.7.1-2"),
        ("$share/g/a+", "MQTT-4.7.1-3"),
    ],
)
def test_malformed_shared_filters(filter: str, spec_id: str) -> None:
    assert _spec_id(validate_topic_filter, filter) == spec_id
    assert not is_valid_filter(filter)
    assert parse_shared(filter) is None


def test_plain_filters_named_share_stay_plain() -> None:
    assert is_valid_filter("$share")
    assert parse_shared("$share") is None


# -- history subscriptions ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("filter", "expected"),
    [
        ("$history/10m/a/#", ("10m", "a/#")),
        ("$history/earliest/#", ("earliest", "#")),
        ("$history/2026-11-26T09:00:00Z/+/t", ("2026-11-26T09:00:00Z", "+/t")),
        ("$history/7d/$SYS/#", ("7d", "$SYS/#")),
        ("$history/90s//", ("90s", "/")),
        ("a/b", None),
        ("$history", None),
    ],
)
def test_parse_history(filter: str, expected: tuple[str, str] | None) -> None:
    assert parse_history(filter) == expected


@pytest.mark.parametrize(
    "filter",
    [
        "$history/",
        "$history/10m",
        "$history/10m/",
        "$history//a",
        "$history/10/a",
        "$history/m/a",
        "$history/-1m/a",
        "$history/1.5h/a",
        "$history/10w/a",
        "$history/\u0661m/a",  # a digit, but not an ASCII one
        "$history/1234567890123s/a",  # more digits than any retention needs
        "$history/yesterday/a",
        "$history/2026-11-26T09:00:00/a",
        "$history/2026-02-30T00:00:00Z/a",
        "$history/10m/$share/g/a",
        "$history/10m/$history/1m/a",
        "$history/10m/a/#/b",
        "$history/10m/a+",
    ],
)
def test_malformed_history_filters(filter: str) -> None:
    assert not is_valid_filter(filter)
    assert parse_history(filter) is None


def test_history_starts() -> None:
    now = 1_800_000_000_000
    assert history_start_ms("earliest", now) is None
    assert history_start_ms("90s", now) == now - 90_000
    assert history_start_ms("10m", now) == now - 600_000
    assert history_start_ms("2h", now) == now - 7_200_000
    assert history_start_ms("7d", now) == now - 604_800_000
    assert history_start_ms("1970-01-01T00:00:10Z", now) == 10_000
    assert history_start_ms("999999999999d", now) == 0  # never before the epoch (Kafka's -1, -2)


def test_history_is_judged_by_the_filter_and_topic_inside() -> None:
    assert judged_filter("$history/10m/a/#") == "a/#"
    assert judged_filter("$share/g/a/#") == "a/#"
    assert judged_filter("a/#") == "a/#"
    assert original_topic("$history/10m/a/b") == "a/b"
    assert original_topic("$history/2026-11-26T09:00:00Z/$SYS/x") == "$SYS/x"
    assert original_topic("a/b") == "a/b"
    assert not matches("#", "$history/10m/a/b")  # [MQTT-4.7.2-1]
