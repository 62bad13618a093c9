"""What the relays read and write (``router.relays``): an inbound record becomes a log record, a log
record an export's JSON or raw record; the ``--export`` and ``--inbound-topic`` values.  Pure: no
Kafka client here, only the records' parts (docs/log.md describes both formats)."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE
from confluent_kafka import Message as KafkaMessage

from mqttcore import topics
from mqttcore.errors import MalformedPacket
from mqttcore.message import Message, MessageStamps
from router import record
from router.partitioner import Router

INBOUND_TOPIC = "headwater.inbound"
"""The default inbound topic (``--inbound-topic``)."""
FORMATS = ("json", "raw")
INVALID = ("no_topic", "bad_topic", "bad_header")
"""Why an inbound record is skipped (``/stats``: ``inbound_skipped_<reason>``)."""


class RelayError(ValueError):
    """A relay that cannot be configured as written."""


# -- exports: the setting and the values --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Export:
    """One ``--export``: the messages ``filter`` matches, into ``topic``, as ``format``."""

    filter: str
    topic: str
    format: str = "json"


_KAFKA_TOPIC_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def kafka_topic_name(name: str) -> bool:
    """Whether Kafka takes ``name`` as a topic's: 1-249 of ``[a-zA-Z0-9._-]``, not . or .."""
    return 0 < len(name) <= 249 and set(name) <= _KAFKA_TOPIC_CHARS and name not in (".", "..")


def inbound_topic_name(text: str) -> str:
    """``--inbound-topic``: a Kafka topic name, or "" (no inbound relay)."""
    if text and not kafka_topic_name(text):
        raise RelayError(f"{text!r} is not a Kafka topic name ([a-zA-Z0-9._-])")
    return text


def parse_export(text: str) -> Export:
    """``FILTER=KAFKA_TOPIC[:json|raw]`` (the last ``=`` splits: a filter may hold one); JSON by
    default.  :class:`RelayError` names what is wrong."""
    mqtt_filter, sep, rest = text.rpartition("=")
    if not sep or not mqtt_filter:
        raise RelayError(f"{text!r} is not FILTER=KAFKA_TOPIC[:json|raw]")
    kafka_topic, colon, kind = rest.partition(":")
    kind = kind if colon else "json"
    if kind not in FORMATS:
        raise RelayError(f"{text!r}: format {kind!r} is not json or raw")
    if not kafka_topic_name(kafka_topic):
        raise RelayError(f"{text!r}: {kafka_topic!r} is not a Kafka topic name ([a-zA-Z0-9._-])")
    if mqtt_filter.startswith(topics.SHARE_PREFIX) or not topics.is_valid_filter(mqtt_filter):
        raise RelayError(f"{text!r}: {mqtt_filter!r} is not an MQTT topic filter [MQTT-4.7.1]")
    return Export(mqtt_filter, kafka_topic, kind)


def json_value(message: Message) -> bytes:
    """One JSON object: ``topic``, ``payload`` (text when UTF-8, else base64 with
    ``"payload_encoding": "base64"``), ``qos``, ``retain``, ``client_id``, ``timestamp`` (ms)."""
    body: dict[str, object] = {"topic": message.topic}
    try:
        body["payload"] = message.payload.decode()
    except UnicodeDecodeError:
        body["payload"] = base64.b64encode(message.payload).decode()
        body["payload_encoding"] = "base64"
    body.update(
        qos=message.qos,
        retain=message.retain,
        client_id=message.client_id,
        timestamp=message.timestamp_ms,
    )
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


# -- what a relay writes ------------------------------------------------------------------------


@dataclass(slots=True)
class Output:
    """One record a relay writes; ``partition`` -1: chosen by librdkafka from the key."""

    topic: str
    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]]
    timestamp: int
    partition: int = -1
    retained: Message | None = None
    """A retained message, applied to the store once written."""


Convert = Callable[[KafkaMessage], "Output | str | None"]
"""A source record -> what to write, or why it is skipped (counted), or None: not this relay's."""


Headers = Sequence[tuple[str, str | bytes | None]]


def _header(headers: Headers | None, name: str) -> bytes | None:
    """The first header ``name`` of a record (a missing value: empty), None if it has none."""
    for key, value in headers or ():
        if key == name:
            return value.encode() if isinstance(value, str) else value or b""
    return None


def _headers_of(source: KafkaMessage) -> Headers:
    found = source.headers()
    return list(found.items()) if isinstance(found, dict) else found or []


def inbound_message(
    key: bytes | None,
    value: bytes | None,
    headers: Headers | None,
    timestamp_ms: int,
    stamps: MessageStamps,
) -> Message | str:
    """The message an inbound record carries, or the reason (one of :data:`INVALID`) it is none."""
    if key is None:
        return "no_topic"
    try:
        topic = key.decode()
        topics.validate_topic_name(topic)
    except (UnicodeDecodeError, MalformedPacket):
        return "bad_topic"
    if topic.startswith("$"):
        return "bad_topic"
    qos = {None: 0, b"0": 0, b"1": 1, b"2": 2}.get(_header(headers, record.QOS_HEADER), -1)
    retain = {None: False, b"0": False, b"1": True}.get(_header(headers, record.RETAIN_HEADER))
    if qos < 0 or retain is None:
        return "bad_header"
    message = stamps.message(topic, value or b"", qos, retain, "")
    if timestamp_ms > 0:
        message.timestamp_ms = timestamp_ms
    return message


def inbound_converter(router: Router, log_topic: str, stamps: MessageStamps) -> Convert:
    """An inbound record -> its log record, partitioned and keyed as a client's PUBLISH is."""

    def convert(source: KafkaMessage) -> Output | str | None:
        kind, ts = source.timestamp()
        found = inbound_message(
            source.key(),
            source.value(),
            _headers_of(source),
            ts if kind != TIMESTAMP_NOT_AVAILABLE else 0,
            stamps,
        )
        if isinstance(found, str):
            return found
        partition, key = router.route(found.topic)
        return Output(
            log_topic,
            key,
            record.encode(found),
            record.headers(found, kind=record.INBOUND),
            found.timestamp_ms,  # CreateTime: the message's own time, as every record's
            partition,
            found if found.retain else None,
        )

    return convert


def export_converter(export: Export) -> Convert:
    """A log record -> its copy in the export's topic, if the filter matches a message."""
    raw = export.format == "raw"

    def convert(source: KafkaMessage) -> Output | str | None:
        try:
            message = record.decode(source.value() or b"")
        except (record.RecordError, IndexError):
            return "undecodable"
        if (message.retain and not message.payload) or not topics.matches(
            export.filter, message.topic
        ):
            return None
        if raw:
            kind = _header(_headers_of(source), record.KIND_HEADER)
            known = kind.decode(errors="replace") if kind else record.CLIENT
            value, headers = message.payload, _raw_headers(message, known)
        else:
            value, headers = json_value(message), []
        return Output(export.topic, message.topic.encode(), value, headers, message.timestamp_ms)

    return convert


def _raw_headers(message: Message, kind: str) -> list[tuple[str, bytes]]:
    return record.headers(message, kind=kind if kind in record.KINDS else record.CLIENT)
