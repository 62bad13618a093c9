"""The relays' pure parts (``router.relays``): ``--export`` parsing, the inbound record rules, the
JSON export value, and the list setting that carries exports (flags, variable, file)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from frontend.config import config_from_args
from frontend.config_file import parse_args
from frontend.values import ConfigError
from mqttcore.message import MessageStamps
from router.relay_records import Export, RelayError, inbound_message, json_value, parse_export

STAMPS = MessageStamps("n1", lambda: 1_700_000_000_000, b"\x00" * 8)


@pytest.mark.parametrize(
    ("text", "export"),
    [
        ("plant/#=plant.json:json", Export("plant/#", "plant.json", "json")),
        ("plant/#=plant.json", Export("plant/#", "plant.json", "json")),
        ("a/+/b=raw-out_1:raw", Export("a/+/b", "raw-out_1", "raw")),
        ("x=y=z", Export("x=y", "z", "json")),
        ("$SYS/#=sys", Export("$SYS/#", "sys", "json")),
    ],
)
def test_an_export_is_filter_topic_and_format(text: str, export: Export) -> None:
    assert parse_export(text) == export


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("plant/#", "FILTER=KAFKA_TOPIC"),
        ("=out", "FILTER=KAFKA_TOPIC"),
        ("a/#=out:avro", "json or raw"),
        ("a/#=", "Kafka topic"),
        ("a/#=has space", "Kafka topic"),
        ("a/#=..", "Kafka topic"),
        ("a/#/b=out", "MQTT topic filter"),
        ("a+=out", "MQTT topic filter"),
        ("$share/g/a=out", "MQTT topic filter"),
    ],
)
def test_a_bad_export_says_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(RelayError, match=says):
        parse_export(text)


@pytest.mark.parametrize(
    ("key", "headers", "reason"),
    [
        (None, [], "no_topic"),
        (b"", [], "bad_topic"),
        (b"\xff\xfe", [], "bad_topic"),
        (b"a/+", [], "bad_topic"),
        (b"a/#", [], "bad_topic"),
        (b"a\x00b", [], "bad_topic"),
        (b"/" * 200, [], "bad_topic"),
        (b"x" * 65536, [], "bad_topic"),
        (b"$SYS/brokers/n1/uptime", [], "bad_topic"),
        (b"a", [("mqtt.qos", b"3")], "bad_header"),
        (b"a", [("mqtt.qos", b"one")], "bad_header"),
        (b"a", [("mqtt.retain", b"true")], "bad_header"),
        (b"a", [("mqtt.qos", None)], "bad_header"),
    ],
)
def test_an_invalid_inbound_record_is_skipped_with_its_reason(
    key: bytes | None, headers: list[tuple[str, bytes | None]], reason: str
) -> None:
    assert inbound_message(key, b"p", headers, 0, STAMPS) == reason


def test_an_inbound_record_is_a_message_of_its_time() -> None:
    message = inbound_message(
        "cmd/välve".encode(), b"open", [("mqtt.qos", b"2"), ("mqtt.retain", b"1")], 1234, STAMPS
    )
    assert not isinstance(message, str)
    assert (message.topic, message.payload, message.qos, message.retain) == (
        "cmd/välve", b"open", 2, True,
    )  # fmt: skip
    assert (message.client_id, message.origin_node, message.timestamp_ms) == ("", "n1", 1234)
    plain = inbound_message(b"cmd/x", None, None, 0, STAMPS)
    assert not isinstance(plain, str)
    assert (plain.payload, plain.qos, plain.retain) == (b"", 0, False)
    assert plain.timestamp_ms == 1_700_000_000_000  # no record time: the node's clock


def test_the_json_value_carries_text_or_base64() -> None:
    text = STAMPS.message("plant/a", "21.5 °C".encode(), 1, False, "press")
    assert json.loads(json_value(text)) == {
        "topic": "plant/a", "payload": "21.5 °C", "qos": 1, "retain": False,
        "client_id": "press", "timestamp": 1_700_000_000_000,
    }  # fmt: skip
    binary = json.loads(json_value(STAMPS.message("plant/b", b"\xff\x00", 0, True, "")))
    assert binary["payload_encoding"] == "base64"
    assert base64.b64decode(binary["payload"]) == b"\xff\x00"


BASE = ["--node-id", "n1", "--kafka-bootstrap", "k:9092"]


def test_exports_come_from_repeated_flags_the_variable_or_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert config_from_args(parse_args(BASE)).export == []
    assert config_from_args(parse_args(BASE)).inbound_topic == "headwater.inbound"
    flags = [*BASE, "--export", "a/#=a", "--export", "b=b:raw"]
    assert config_from_args(parse_args(flags)).export == [
        Export("a/#", "a"),
        Export("b", "b", "raw"),
    ]
    config = tmp_path / "node.toml"
    config.write_text('export = ["f/#=from.file"]\ninbound-topic = ""\n')
    from_file = config_from_args(parse_args([*BASE, "--config", str(config)]))
    assert (from_file.export, from_file.inbound_topic) == ([Export("f/#", "from.file")], "")
    monkeypatch.setenv("HEADWATER_EXPORT", "v/#=v1\nw/#=v2:raw\n")
    assert config_from_args(parse_args([*BASE, "--config", str(config)])).export == [
        Export("v/#", "v1"), Export("w/#", "v2", "raw")
    ]  # fmt: skip
    flagged = parse_args([*BASE, "--config", str(config), "--export", "z=z"])
    assert config_from_args(flagged).export == [Export("z", "z")]  # flags replace the rest


def test_a_bad_export_or_inbound_topic_stops_start_up_naming_the_flag(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--export / HEADWATER_EXPORT: 'a=b:xml'"):
        config_from_args(parse_args([*BASE, "--export", "a=b:xml"]))
    with pytest.raises(ConfigError, match="--inbound-topic / HEADWATER_INBOUND_TOPIC"):
        config_from_args(parse_args([*BASE, "--inbound-topic", "no/slashes"]))
    config = tmp_path / "node.toml"
    config.write_text('export = "a=b"\n')
    with pytest.raises(ConfigError, match=r"export in .*node\.toml: 'a=b' is not a list"):
        parse_args([*BASE, "--config", str(config)])
