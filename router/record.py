"""The log record: one MQTT application message, Avro-encoded, as every front-end writes it.

Framing is Avro's *single-object encoding*: the two bytes ``C3 01``, the 8-byte little-endian
CRC-64-AVRO fingerprint of the schema's parsing canonical form, then the Avro binary datum.  Any
Avro library can read it; Spark strips the 10-byte header and applies ``from_avro`` with
``schemas/mqtt_message.avsc``.  A record whose header does not carry this schema's fingerprint is
refused, so a schema change can never be misread silently.

Beside the value, every record carries the Kafka headers of :func:`headers` (the MQTT metadata, as
UTF-8 text, and the kind of record: who wrote it) and, as its Kafka timestamp (CreateTime), the
message's own time: the same value as the datum's ``timestamp``.  Readers go by the value alone,
so records without headers (written before them) read the same.  The whole format, for Kafka
users, is docs/log.md.
"""

from __future__ import annotations

import functools
import json
import os
import time
from dataclasses import dataclass
from importlib import resources
from typing import Any

import fastavro
from fastavro.schema import fingerprint, to_parsing_canonical_form

from mqttcore.message import Message, MessageStamps

SCHEMA_TEXT: str = resources.files("schemas").joinpath("mqtt_message.avsc").read_text()
"""The schema, read as package data: an installed (non-editable) package finds it too."""
SCHEMA_JSON: dict[str, Any] = json.loads(SCHEMA_TEXT)
_PARSED = fastavro.parse_schema(SCHEMA_JSON)
FINGERPRINT: bytes = bytes.fromhex(fingerprint(to_parsing_canonical_form(_PARSED), "CRC-64-AVRO"))
"""The schema fingerprint, little-endian as single-object encoding puts it on the wire (fastavro's
hex digest is already in that byte order, as Java's ``SchemaNormalization`` returns it)."""
# The datum is written and read by hand below, in the schema's field order: for this one fixed
# schema that is ~5x faster than fastavro's generic writer and reader (bench in the test suite
# checks byte equality with fastavro, so the two can never drift).
HEADER: bytes = b"\xc3\x01" + FINGERPRINT
HEADER_SIZE = len(HEADER)


KIND_HEADER = "headwater.kind"
"""The header naming what kind of record this is, and so who wrote it (``docs/log.md``)."""
CLIENT = "client"
"""A client's PUBLISH, written by the node it is connected to."""
WILL = "will"
"""A will [MQTT-3.1.2-8], written by the node of the connection that ended (or that found it)."""
SYS = "sys"
"""A node's own ``$SYS/brokers/<node>/...`` report, written by that node."""
RETAINED_CLEAR = "retained-clear"
"""Any record with the RETAIN flag and an empty payload [MQTT-3.3.1-10], whoever wrote it: it
deletes its topic's retained message and carries no data."""
INBOUND = "inbound"
"""A record a Kafka producer wrote to the inbound topic, copied into the log by a node's relay."""
ANALYTICS = "analytics"
"""A result of a Spark job, written by its MQTT sink (``spark_streaming.mqtt_sink``)."""
EVENT = "event"
"""A client event (connected, disconnected, subscribed, ...) on ``$events/<event>``, written by
the node it happened on; the payload is a JSON object (``docs/log.md``)."""
KINDS = (CLIENT, WILL, SYS, RETAINED_CLEAR, INBOUND, ANALYTICS, EVENT)

TOPIC_HEADER = "mqtt.topic"
QOS_HEADER = "mqtt.qos"
RETAIN_HEADER = "mqtt.retain"
CLIENT_ID_HEADER = "mqtt.client_id"

_KIND_HEADERS = {kind: (KIND_HEADER, kind.encode()) for kind in KINDS}
_QOS_HEADERS = [(QOS_HEADER, str(qos).encode()) for qos in range(3)]
_RETAIN_HEADERS = ((RETAIN_HEADER, b"0"), (RETAIN_HEADER, b"1"))
# The tuples of constant headers are built once: per message only the topic's and the client
# id's are new (two small tuples and a list of five).


def headers(message: Message, kind: str = CLIENT) -> list[tuple[str, bytes]]:
    """The Kafka headers of a log record: ``mqtt.topic``, ``mqtt.qos``, ``mqtt.retain`` (``0`` or
    ``1``), ``mqtt.client_id`` (UTF-8 text), then ``headwater.kind``: ``kind`` (one of
    :data:`KINDS`, naming who wrote it), or :data:`RETAINED_CLEAR` for a retained message with an
    empty payload.  Consumers read the metadata without decoding the Avro value."""
    if message.retain and not message.payload:
        kind = RETAINED_CLEAR
    return [
        (TOPIC_HEADER, message.topic.encode()),
        _QOS_HEADERS[message.qos],
        _RETAIN_HEADERS[message.retain],
        (CLIENT_ID_HEADER, message.client_id.encode()),
        _KIND_HEADERS[kind],
    ]


class RecordError(ValueError):
    """A log record that is not a Headwater message of this schema."""


@dataclass(slots=True, init=False)
class Record:
    """A message read back from the log, with its place in it; never changed once made (not
    ``frozen``: a compiled class makes its own ``__init__``, see ``mqttcore.message.Message``)."""

    partition: int
    offset: int
    size: int
    message: Message

    def __init__(self, partition: int, offset: int, size: int, message: Message) -> None:
        self.partition = partition
        self.offset = offset
        self.size = size
        self.message = message


def wall_clock_stamps(origin_node: str) -> MessageStamps:
    """Stamps for messages received by this process: the wall clock in milliseconds (the record's
    timestamp, what Spark windows on) and 8 random bytes of id prefix per process."""
    return MessageStamps(origin_node, lambda: time.time_ns() // 1_000_000, os.urandom(8))


def _varint(n: int) -> bytes:
    """Avro's zig-zag variable-length encoding of a long."""
    z = (n << 1) ^ (n >> 63)
    if z < 0x80:
        return _BYTE[z]
    if z < 0x4000:  # two bytes: payloads and topics of 64 to 8,191 bytes
        return bytes(((z & 0x7F) | 0x80, z >> 7))
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


_BYTE = [bytes([i]) for i in range(256)]


_LENGTHS = [_varint(n) for n in range(1024)]
"""Zig-zag varints of 0..1023, one or two bytes each: string lengths, the QoS."""


def _small(n: int) -> bytes:
    """``_varint(n)``, from the table for 0..1023."""
    return _LENGTHS[n] if 0 <= n < 1024 else _varint(n)


@functools.lru_cache(maxsize=64)
def _timestamp(ms: int) -> bytes:
    """The varint of a timestamp: every message received in the same millisecond shares it."""
    return _varint(ms)


def encode(message: Message) -> bytes:
    """The framed record value for ``message``: header, then the datum in field order."""
    topic = message.topic.encode()
    client = message.client_id.encode()
    origin = message.origin_node.encode()
    payload = message.payload
    return b"".join((
        HEADER,
        message.message_id,
        _small(len(topic)), topic,
        _small(len(payload)), payload,
        _small(message.qos),
        b"\x01" if message.retain else b"\x00",
        _small(len(client)), client,
        _small(len(origin)), origin,
        _timestamp(message.timestamp_ms),
    ))  # fmt: skip


def _prefixed(data: bytes) -> bytes:
    """``data`` after its length, as the datum writes a string or bytes field."""
    return _small(len(data)) + data


class Template:
    """What the records of one topic written with one QoS, RETAIN flag, origin node and kind
    share, encoded once (a burst of client events: a few topics, hundreds of records each).

    Invariant: for a message it :meth:`fits`, ``value(message, client)`` is ``encode(message)``
    and ``headers(client)`` is ``headers(message, kind)``, byte for byte, ``client`` being the
    message's client id in UTF-8 (tests/unit/test_record.py compares them); per record only the
    message id, payload, client id and time are new: one join and one header tuple."""

    __slots__ = (
        "_after_payload", "_head", "_kind", "_last_ms", "_last_time", "_origin", "_tail", "_topic",
        "shared",
    )  # fmt: skip

    def __init__(self, message: Message, kind: str) -> None:
        self.shared = (message.topic, message.qos, message.retain, message.origin_node)
        """What a message shares with these records (and ``kind``, the caller's)."""
        self._kind = kind
        topic = message.topic.encode()
        self._topic = _prefixed(topic)
        qos = message.qos
        self._after_payload = _small(qos) + (b"\x01" if message.retain else b"\x00")
        self._origin = _prefixed(message.origin_node.encode())
        self._head = ((TOPIC_HEADER, topic), _QOS_HEADERS[qos], _RETAIN_HEADERS[message.retain])
        self._tail = _KIND_HEADERS[kind]
        self._last_ms = message.timestamp_ms
        self._last_time = _varint(message.timestamp_ms)
        """The last time's varint: a burst's records share a few milliseconds."""

    def fits(self, message: Message, kind: str) -> bool:
        """Whether ``message`` is one of these records: same topic, QoS, RETAIN flag, origin and
        kind, and not the clearing of a retained message (its own kind: :func:`headers`)."""
        topic, qos, retain, origin = self.shared
        return (
            message.topic == topic and message.qos == qos and message.retain == retain
            and message.origin_node == origin and kind == self._kind
            and not (retain and not message.payload)
        )  # fmt: skip

    def value(self, message: Message, client: bytes) -> bytes:
        """:func:`encode`'s bytes for ``message`` (which :meth:`fits`)."""
        payload = message.payload
        ms = message.timestamp_ms
        if ms != self._last_ms:
            self._last_ms, self._last_time = ms, _varint(ms)
        return b"".join((
            HEADER, message.message_id, self._topic, _small(len(payload)), payload,
            self._after_payload, _small(len(client)), client, self._origin, self._last_time,
        ))  # fmt: skip

    def headers(self, client: bytes) -> list[tuple[str, bytes]]:
        """:func:`headers`' list for a message of client id ``client`` (which :meth:`fits`)."""
        head = self._head
        return [head[0], head[1], head[2], (CLIENT_ID_HEADER, client), self._tail]


def _long(data: bytes, pos: int) -> tuple[int, int]:
    """The zig-zag varint at ``pos`` and the position after it."""
    if pos < len(data) and data[pos] < 0x80:  # one byte: lengths of short strings, QoS
        z = data[pos]
        return (z >> 1) ^ -(z & 1), pos + 1
    shift = z = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise RecordError("truncated or oversized varint")
        byte = data[pos]
        pos += 1
        z |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (z >> 1) ^ -(z & 1), pos
        shift += 7


@functools.lru_cache(maxsize=64)
def _last_long(tail: bytes) -> int:
    """The varint that is exactly ``tail`` (the record's last field, the timestamp)."""
    value, end = _long(tail, 0)
    if end != len(tail):
        raise RecordError("trailing bytes after the record")
    return value


def _bytes(value: bytes, pos: int) -> tuple[bytes, int]:
    """The length-prefixed bytes at ``pos`` and the position after them.  A length below 64 is
    one byte (zig-zag: even, below 0x80), read in line; any other goes through :func:`_long`."""
    size = value[pos] if pos < len(value) else 0x80
    if size < 0x80 and not size & 1:
        size, pos = size >> 1, pos + 1
    else:
        size, pos = _long(value, pos)
    end = pos + size
    if size < 0 or end > len(value):
        raise RecordError("truncated record")
    return value[pos:end], end


def _text(value: bytes, pos: int) -> tuple[str, int]:
    """The length-prefixed UTF-8 string at ``pos`` and the position after it."""
    raw, end = _bytes(value, pos)
    try:
        return raw.decode(), end
    except UnicodeDecodeError as exc:
        raise RecordError(f"ill-formed string: {exc}") from exc


def decode(value: bytes) -> Message:
    """The message in a framed record value; :class:`RecordError` if it is not one.

    Straight-line code over positions, not a reader object: this runs for every message every
    subscribing node fetches."""
    if value[:HEADER_SIZE] != HEADER:
        raise RecordError("record does not carry the MqttMessage single-object header")
    pos = HEADER_SIZE + 16
    if pos > len(value):
        raise RecordError("truncated record")
    message_id = value[HEADER_SIZE:pos]
    topic, pos = _text(value, pos)
    payload, pos = _bytes(value, pos)
    if pos + 2 > len(value):
        raise RecordError("truncated record")
    qos, flag = value[pos], value[pos + 1]
    if qos > 4 or qos & 1:  # zig-zag 0, 1, 2 are the bytes 0, 2, 4
        raise RecordError(f"QoS {_long(value, pos)[0]} is not 0, 1 or 2")
    if flag > 1:
        raise RecordError("retain flag is not a boolean")
    client_id, pos = _text(value, pos + 2)
    origin, pos = _text(value, pos)
    timestamp = _last_long(value[pos:])
    return Message(topic, payload, qos >> 1, flag == 1, client_id, origin, timestamp, message_id)
