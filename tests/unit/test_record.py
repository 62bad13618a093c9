"""The log record: the hand-written Avro codec against fastavro, and the single-object framing.

The reference for every byte is fastavro (datum) and the Avro specification (framing: ``C3 01``
then the 8-byte *little-endian* CRC-64-AVRO fingerprint of the schema's parsing canonical form,
as Java's ``SchemaNormalization.parsingFingerprint("CRC-64-AVRO", s)`` lays it out).  The
fingerprint is computed here twice, with fastavro and with the specification's own algorithm,
so the header cannot silently agree with a wrong implementation in the module under test.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
from pathlib import Path
from typing import Any

import fastavro
import pytest
from fastavro.schema import fingerprint, to_parsing_canonical_form
from hypothesis import given, settings
from hypothesis import strategies as st

from router import record
from router.record import Message, RecordError, wall_clock_stamps

SCHEMA_FILE = Path(__file__).resolve().parents[2] / "schemas" / "mqtt_message.avsc"


def _plain_schema() -> Any:
    """The schema without logical types: same bytes, but fastavro reads timestamps as ints."""
    schema = copy.deepcopy(json.loads(SCHEMA_FILE.read_text()))
    for field in schema["fields"]:
        if isinstance(field["type"], dict) and "logicalType" in field["type"]:
            field["type"] = field["type"]["type"]
    return fastavro.parse_schema(schema)


PLAIN = _plain_schema()
CANONICAL = to_parsing_canonical_form(fastavro.parse_schema(json.loads(SCHEMA_FILE.read_text())))


def _crc64_avro(data: bytes) -> int:
    """The Avro specification's 64-bit Rabin fingerprint ("Schema Fingerprints")."""
    empty = 0xC15D213AA4D7A795
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (empty & -(fp & 1))
        table.append(fp)
    fp = empty
    for byte in data:
        fp = (fp >> 8) ^ table[(fp ^ byte) & 0xFF]
    return fp


def _fastavro_record(message: Message) -> bytes:
    """The framed record as fastavro writes the datum, with the spec's header in front."""
    out = io.BytesIO()
    fastavro.schemaless_writer(out, PLAIN, _as_dict(message))
    header = b"\xc3\x01" + bytes.fromhex(fingerprint(CANONICAL, "CRC-64-AVRO"))
    return header + out.getvalue()


def _as_dict(message: Message) -> dict[str, Any]:
    return {
        "message_id": message.message_id,
        "topic": message.topic,
        "payload": message.payload,
        "qos": message.qos,
        "retain": message.retain,
        "client_id": message.client_id,
        "origin_node": message.origin_node,
        "timestamp": message.timestamp_ms,
    }


# Any Unicode scalar value: surrogates cannot be encoded as UTF-8 at all.
texts = st.text(st.characters(codec="utf-8"), max_size=40)
messages = st.builds(
    Message,
    topic=texts,
    payload=st.binary(max_size=300),
    qos=st.one_of(st.integers(0, 2), st.integers(-(2**31), 2**31 - 1)),
    retain=st.booleans(),
    client_id=texts,
    origin_node=texts,
    timestamp_ms=st.one_of(
        st.integers(-(2**63), 2**63 - 1),
        st.sampled_from([0, -1, 63, 64, -64, -65, 2**63 - 1, -(2**63), 1_700_000_000_000]),
    ),
    message_id=st.binary(min_size=16, max_size=16),
)


# -- the header --------------------------------------------------------------------------------


def test_crc64_avro_matches_the_specification_test_vector() -> None:
    # Avro's share/test/data/schema-tests.txt: the fingerprint of "null" is 7195948357588979594.
    assert _crc64_avro(b'"null"') == 7195948357588979594
    assert bytes.fromhex(fingerprint('"null"', "CRC-64-AVRO")) == (7195948357588979594).to_bytes(
        8, "little"
    )


def test_header_is_magic_then_little_endian_fingerprint_of_the_canonical_schema() -> None:
    expected = b"\xc3\x01" + _crc64_avro(CANONICAL.encode()).to_bytes(8, "little")
    assert bytes.fromhex(fingerprint(CANONICAL, "CRC-64-AVRO")) == expected[2:]
    assert expected == record.HEADER
    assert record.encode(wall_clock_stamps("n").message("t", b"", 0, False, "c"))[:10] == expected


def test_the_module_reads_the_schema_file_in_the_repository() -> None:
    assert json.loads(SCHEMA_FILE.read_text()) == record.SCHEMA_JSON


# -- byte equality with fastavro ---------------------------------------------------------------


@settings(deadline=None, max_examples=200)
@given(messages)
def test_encode_equals_fastavro_byte_for_byte(message: Message) -> None:
    assert record.encode(message) == _fastavro_record(message)


@settings(deadline=None, max_examples=200)
@given(messages)
def test_decode_reads_what_fastavro_writes(message: Message) -> None:
    if 0 <= message.qos <= 2:
        assert record.decode(_fastavro_record(message)) == message
    else:  # well-formed Avro, but no MQTT message: refused rather than passed on
        with pytest.raises(record.RecordError, match="QoS"):
            record.decode(_fastavro_record(message))


@settings(deadline=None)
@given(messages)
def test_fastavro_reads_what_encode_writes(message: Message) -> None:
    value = record.encode(message)
    assert value[:10] == record.HEADER
    datum = fastavro.schemaless_reader(io.BytesIO(value[10:]), PLAIN)
    assert datum == _as_dict(message)


def test_created_messages_have_unique_16_byte_ids_and_round_trip() -> None:
    stamps = wall_clock_stamps("n")
    created = [stamps.message("a/b", b"x", 1, True, "c") for _ in range(1000)]
    assert len({m.message_id for m in created}) == 1000
    assert all(len(m.message_id) == 16 for m in created)
    assert [record.decode(record.encode(m)) for m in created] == created


# -- refusals ----------------------------------------------------------------------------------


@settings(deadline=None, max_examples=500)
@given(st.binary(max_size=200))
def test_random_bytes_raise_only_record_error(data: bytes) -> None:
    with contextlib.suppress(RecordError):
        record.decode(data)


@settings(deadline=None, max_examples=500)
@given(st.binary(max_size=200))
def test_random_datum_after_a_valid_header_raises_only_record_error(data: bytes) -> None:
    try:
        message = record.decode(record.HEADER + data)
    except RecordError:
        return
    assert len(message.message_id) == 16


@settings(deadline=None)
@given(messages, st.data())
def test_a_corrupted_datum_raises_only_record_error(message: Message, data: st.DataObject) -> None:
    value = bytearray(record.encode(message))
    position = data.draw(st.integers(10, len(value) - 1))
    value[position] = data.draw(st.integers(0, 255))
    with contextlib.suppress(RecordError):
        record.decode(bytes(value))


@given(messages, st.data())
def test_any_wrong_header_byte_is_refused(message: Message, data: st.DataObject) -> None:
    value = bytearray(record.encode(message))
    position = data.draw(st.integers(0, 9))
    value[position] ^= data.draw(st.integers(1, 255))
    with pytest.raises(RecordError):
        record.decode(bytes(value))


def test_a_record_of_another_schema_is_refused() -> None:
    other = json.loads(SCHEMA_FILE.read_text())
    other["fields"] = other["fields"][:-1]  # a different schema: no timestamp
    parsed = fastavro.parse_schema(other)
    header = b"\xc3\x01" + bytes.fromhex(
        fingerprint(to_parsing_canonical_form(parsed), "CRC-64-AVRO")
    )
    message = wall_clock_stamps("n").message("t", b"p", 1, False, "c")
    datum = io.BytesIO()
    fastavro.schemaless_writer(datum, parsed, _as_dict(message))
    with pytest.raises(RecordError):
        record.decode(header + datum.getvalue())


@given(messages, st.data())
def test_every_truncation_is_refused(message: Message, data: st.DataObject) -> None:
    value = record.encode(message)
    cut = data.draw(st.integers(0, len(value) - 1))
    with pytest.raises(RecordError):
        record.decode(value[:cut])


@given(messages, st.binary(min_size=1, max_size=20))
def test_trailing_bytes_are_refused(message: Message, extra: bytes) -> None:
    with pytest.raises(RecordError):
        record.decode(record.encode(message) + extra)


def test_ill_formed_utf8_in_a_string_is_refused() -> None:
    value = record.encode(Message("ab", b"", 0, False, "c", "n", 0, bytes(16)))
    topic_at = 10 + 16 + 1  # header, message id, one-byte length
    assert value[topic_at : topic_at + 2] == b"ab"
    broken = value[:topic_at] + b"\xed\xa0" + value[topic_at + 2 :]  # a lone surrogate's start
    with pytest.raises(RecordError):
        record.decode(broken)


def test_negative_length_is_refused() -> None:
    value = record.encode(Message("", b"", 0, False, "c", "n", 0, bytes(16)))
    length_at = 10 + 16
    assert value[length_at] == 0
    with pytest.raises(RecordError):
        record.decode(value[:length_at] + b"\x01" + value[length_at + 1 :])  # zig-zag -1


def test_overlong_varint_is_refused() -> None:
    value = record.encode(Message("t", b"", 0, False, "c", "n", 0, bytes(16)))
    with pytest.raises(RecordError):
        record.decode(value[:-1] + b"\xff" * 11 + b"\x01")


# -- a template: the records of one topic, encoded once ------------------------------------------

shared = st.tuples(texts, st.integers(0, 2), st.booleans(), texts, st.sampled_from(record.KINDS))
each = st.tuples(
    st.binary(max_size=1100),  # one- and two-byte lengths, and past the template's table
    st.text(st.characters(codec="utf-8"), max_size=600),
    st.one_of(st.integers(-(2**63), 2**63 - 1), st.sampled_from([0, -1, 64, 1_795_710_131_042])),
    st.binary(min_size=16, max_size=16),
)


@settings(deadline=None, max_examples=300)
@given(shared, st.lists(each, min_size=1, max_size=5))
def test_a_template_writes_encode_s_value_and_headers_byte_for_byte(
    common: tuple[str, int, bool, str, str], records: list[tuple[bytes, str, int, bytes]]
) -> None:
    topic, qos, retain, origin, kind = common
    batch = [Message(topic, p, qos, retain, c, origin, t, i) for p, c, t, i in records]
    template = record.Template(batch[0], kind)
    for message in batch:
        client = message.client_id.encode()
        if retain and not message.payload:  # clears a retained message: its own kind
            assert not template.fits(message, kind)
            continue
        assert template.fits(message, kind)
        assert template.value(message, client) == record.encode(message)
        assert template.headers(client) == record.headers(message, kind)


def test_a_template_fits_only_its_own_records() -> None:
    message = Message("a/b", b"x", 1, False, "c", "node1", 5, bytes(16))
    template = record.Template(message, record.EVENT)
    assert template.fits(message, record.EVENT)
    for other in (
        Message("a/c", b"x", 1, False, "c", "node1", 5, bytes(16)),
        Message("a/b", b"x", 0, False, "c", "node1", 5, bytes(16)),
        Message("a/b", b"x", 1, True, "c", "node1", 5, bytes(16)),
        Message("a/b", b"x", 1, False, "c", "node2", 5, bytes(16)),
    ):
        assert not template.fits(other, record.EVENT)
    assert not template.fits(message, record.CLIENT)
    assert template.fits(Message("a/b", b"y", 1, False, "d", "node1", 6, bytes(16)), record.EVENT)
