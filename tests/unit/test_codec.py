"""The MQTT 3.1.1 codec: round trips, chunking independence, fuzzing, and every validation rule.

Tests named after a rule cite its normative statement in a comment and check ``spec_id``.
"""

from __future__ import annotations

import ast
import dataclasses
import itertools
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqttcore import codec
from mqttcore.codec import (
    SHARED_PAYLOAD_BYTES,
    Decoder,
    PublishTemplate,
    encode,
    encode_publish,
    wire_bytes,
)
from mqttcore.errors import ConnectRefused, MalformedPacket, PacketTooLarge, ProtocolError
from mqttcore.packets import (
    SUBACK_FAILURE,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Pingreq,
    Pingresp,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
    Will,
)

# --------------------------------------------------------------------------------------------
# Strategies: every packet type with valid fields

texts = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=20)
topic_names = st.text(
    st.characters(codec="utf-8", exclude_characters="\x00+#"), min_size=1, max_size=20
)
payloads = st.binary(max_size=300)
packet_ids = st.integers(1, 0xFFFF)
qoss = st.integers(0, 2)

SOURCE = Path(__file__).parents[2] / "mqttcore" / "codec.py"


@st.composite
def publishes(draw: st.DrawFn) -> Publish:
    qos = draw(qoss)
    return Publish(
        topic=draw(topic_names),
        payload=draw(payloads),
        qos=qos,
        retain=draw(st.booleans()),
        dup=draw(st.booleans()) if qos else False,
        packet_id=draw(packet_ids) if qos else None,
    )


@st.composite
def connects(draw: st.DrawFn) -> Connect:
    name, level = draw(st.sampled_from([("MQTT", 4), ("MQIsdp", 3)]))
    username = draw(st.none() | texts)
    will = draw(st.none() | st.builds(Will, topic_names, payloads, qoss, st.booleans()))
    return Connect(
        client_id=draw(texts),
        clean_session=draw(st.booleans()),
        keep_alive=draw(st.integers(0, 0xFFFF)),
        username=username,
        password=draw(st.none() | payloads) if username is not None else None,
        will=will,
        protocol_name=name,
        protocol_level=level,
    )


PACKETS: dict[str, st.SearchStrategy[Packet]] = {
    "Connect": connects(),
    "Connack": st.builds(Connack, st.booleans(), st.integers(0, 5)),
    "Publish": publishes(),
    "Puback": st.builds(Puback, packet_ids),
    "Pubrec": st.builds(Pubrec, packet_ids),
    "Pubrel": st.builds(Pubrel, packet_ids),
    "Pubcomp": st.builds(Pubcomp, packet_ids),
    "Subscribe": st.builds(
        Subscribe,
        packet_ids,
        st.lists(st.tuples(texts, qoss), min_size=1, max_size=5).map(tuple),
    ),
    "Suback": st.builds(
        Suback,
        packet_ids,
        st.lists(st.sampled_from([0, 1, 2, SUBACK_FAILURE]), min_size=1, max_size=5).map(tuple),
    ),
    "Unsubscribe": st.builds(
        Unsubscribe, packet_ids, st.lists(texts, min_size=1, max_size=5).map(tuple)
    ),
    "Unsuback": st.builds(Unsuback, packet_ids),
    "Pingreq": st.just(Pingreq()),
    "Pingresp": st.just(Pingresp()),
    "Disconnect": st.just(Disconnect()),
}
packets = st.one_of(*PACKETS.values())


# --------------------------------------------------------------------------------------------
# Helpers


def raw(first: int, body: bytes) -> bytes:
    """A packet from a first byte and a hand-made body (the remaining length is computed)."""
    return bytes((first,)) + codec._remaining_length(len(body)) + body


def s(text: str | bytes) -> bytes:
    """A length-prefixed string field, from text or from raw (possibly invalid) bytes."""
    data = text.encode() if isinstance(text, str) else text
    return len(data).to_bytes(2, "big") + data


def connect_body(
    name: bytes = b"MQTT", level: int = 4, flags: int = 0x02, payload: bytes = s("c")
) -> bytes:
    return s(name) + bytes((level, flags)) + b"\x00\x3c" + payload


def rejects(data: bytes, error: type[ProtocolError] = MalformedPacket) -> ProtocolError:
    """Feed ``data`` to a fresh decoder and return the error it raises."""
    with pytest.raises(error) as info:
        Decoder().feed(data)
    return info.value


def split(stream: bytes, cuts: Sequence[int]) -> list[bytes]:
    bounds = [0, *sorted(set(cuts)), len(stream)]
    return [stream[a:b] for a, b in itertools.pairwise(bounds)]


def outcome(
    chunks: Sequence[bytes | bytearray | memoryview],
    max_size: int = codec.MAX_PACKET_SIZE,
) -> tuple[list[Packet], tuple[type, str] | None]:
    """The packets decoded from ``chunks`` and the error that stopped decoding, if any.

    The error is raised by ``feed``, or, when the same call completed packets before it, kept
    in ``decoder.error`` (and raised by the next call)."""
    decoder = Decoder(max_size)
    decoded: list[Packet] = []
    try:
        for chunk in chunks:
            decoded += decoder.feed(chunk)
    except ProtocolError as e:
        return decoded, (type(e), e.spec_id)
    if decoder.error is not None:
        return decoded, (type(decoder.error), decoder.error.spec_id)
    return decoded, None


as_buffer_types: list[Callable[[bytes], bytes | bytearray | memoryview]] = [
    bytes,
    bytearray,
    memoryview,
]


# --------------------------------------------------------------------------------------------
# Round trips and chunking


@pytest.mark.parametrize("kind", sorted(PACKETS))
@given(data=st.data())
def test_round_trip(kind: str, data: st.DataObject) -> None:
    packet = data.draw(PACKETS[kind])
    assert Decoder().feed(encode(packet)) == [packet]


@given(publishes())
def test_decoded_publish_is_an_ordinary_frozen_value(packet: Publish) -> None:
    (decoded,) = Decoder().feed(bytearray(encode(packet)))
    assert isinstance(decoded, Publish)
    assert type(decoded.payload) is bytes
    assert decoded == packet and hash(decoded) == hash(packet)
    with pytest.raises(dataclasses.FrozenInstanceError):
        decoded.qos = 2  # type: ignore[misc]


@settings(deadline=None)
@given(st.lists(packets, min_size=1, max_size=15), st.data())
def test_any_chunking_gives_the_same_packets(items: list[Packet], data: st.DataObject) -> None:
    stream = b"".join(encode(p) for p in items)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=20))
    as_type = data.draw(st.sampled_from(as_buffer_types))
    byte_by_byte = [stream[i : i + 1] for i in range(len(stream))]
    assert outcome([stream]) == (items, None)
    assert outcome(byte_by_byte) == (items, None)
    assert outcome([as_type(c) for c in split(stream, cuts)]) == (items, None)


def test_partial_packet_waits_for_the_rest() -> None:
    data = encode(Publish("a/b", b"payload", 1, packet_id=7))
    decoder = Decoder()
    assert decoder.feed(data[:1]) == []
    assert decoder.feed(data[1:5]) == []
    assert decoder.feed(data[5:] + data[:3]) == [Publish("a/b", b"payload", 1, packet_id=7)]
    assert decoder.feed(b"") == []
    assert decoder.feed(data[3:]) == [Publish("a/b", b"payload", 1, packet_id=7)]


def test_large_publish_in_small_chunks() -> None:
    packet = Publish("big", bytes(range(256)) * 4096, 2, packet_id=9)
    data = encode(packet)
    decoder = Decoder()
    decoded: list[Packet] = []
    for i in range(0, len(data), 1000):
        decoded += decoder.feed(memoryview(data)[i : i + 1000])
    assert decoded == [packet]
    assert type(packet.payload) is bytes


# --------------------------------------------------------------------------------------------
# Fuzzing: only the protocol error family, and the same first error whatever the chunking

REQUIRED_FLAGS = {1: 0, 2: 0, 4: 0, 5: 0, 6: 2, 7: 0, 8: 2, 9: 0, 10: 2, 11: 0, 12: 0, 13: 0, 14: 0}
"""Packet type -> the fixed-header flags it must carry (table 2.2); PUBLISH (3) has its own."""

max_sizes = st.sampled_from([2, 5, 64, 1000, codec.MAX_PACKET_SIZE])


@settings(deadline=None)
@given(st.binary(max_size=400), st.lists(st.integers(0, 400), max_size=10), max_sizes)
def test_random_bytes_raise_only_protocol_errors(
    stream: bytes, cuts: list[int], max_size: int
) -> None:
    check_chunking_independence(stream, cuts, max_size)


@st.composite
def mutated_streams(draw: st.DrawFn) -> bytes:
    stream = bytearray(b"".join(encode(p) for p in draw(st.lists(packets, max_size=6))))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["set", "insert", "delete", "truncate"]))
        at = draw(st.integers(0, len(stream)))
        if op == "set" and at < len(stream):
            stream[at] = draw(st.integers(0, 255))
        elif op == "insert":
            stream[at:at] = draw(st.binary(min_size=1, max_size=4))
        elif op == "delete":
            del stream[at : at + draw(st.integers(1, 4))]
        else:
            del stream[at:]
    return bytes(stream)


@settings(deadline=None, max_examples=300)
@given(mutated_streams(), st.lists(st.integers(0, 2000), max_size=10), max_sizes)
def test_mutated_packets_raise_only_protocol_errors(
    stream: bytes, cuts: list[int], max_size: int
) -> None:
    check_chunking_independence(stream, cuts, max_size)


valid_first_bytes = st.sampled_from(
    [(ptype << 4) | flags for ptype, flags in REQUIRED_FLAGS.items()] + list(range(0x30, 0x40))
)


@settings(deadline=None, max_examples=300)
@given(valid_first_bytes, st.binary(max_size=60), st.lists(st.integers(0, 70), max_size=5))
def test_random_bodies_raise_only_protocol_errors(first: int, body: bytes, cuts: list[int]) -> None:
    check_chunking_independence(raw(first, body), cuts, codec.MAX_PACKET_SIZE)


def check_chunking_independence(stream: bytes, cuts: list[int], max_size: int) -> None:
    cuts = [c for c in cuts if c <= len(stream)]
    whole, error = outcome([stream], max_size)
    one_by_one, error_1 = outcome([stream[i : i + 1] for i in range(len(stream))], max_size)
    chunked, error_n = outcome(split(stream, cuts), max_size)
    assert error == error_1 == error_n
    assert whole == one_by_one == chunked  # with an error: every packet before it, in order


# --------------------------------------------------------------------------------------------
# Fixed header


@pytest.mark.parametrize("first", [0x00, 0x0F, 0xF0, 0xFF])
def test_reserved_packet_types_are_malformed(first: int) -> None:  # 2.2.1
    assert rejects(bytes((first,))).spec_id == "MQTT-2.2.1"


FLAG_SPEC_IDS = {6: "MQTT-3.6.1-1", 8: "MQTT-3.8.1-1", 10: "MQTT-3.10.1-1"}


@pytest.mark.parametrize("ptype", sorted(REQUIRED_FLAGS))
def test_reserved_flags_must_match_table_2_2(ptype: int) -> None:  # [MQTT-2.2.2-1] [MQTT-2.2.2-2]
    for flags in range(16):
        first = bytes(((ptype << 4) | flags,))
        if flags == REQUIRED_FLAGS[ptype]:
            assert Decoder().feed(first) == []
        else:  # rejected from the first byte alone
            spec_id = FLAG_SPEC_IDS.get(ptype, "MQTT-2.2.2-1")
            assert rejects(first).spec_id == spec_id


REMAINING_LENGTHS = {
    0: b"\x00",
    127: b"\x7f",
    128: b"\x80\x01",
    16_383: b"\xff\x7f",
    16_384: b"\x80\x80\x01",
    2_097_151: b"\xff\xff\x7f",
    2_097_152: b"\x80\x80\x80\x01",
    268_435_455: b"\xff\xff\xff\x7f",
}


@pytest.mark.parametrize(("length", "encoded"), REMAINING_LENGTHS.items())
def test_remaining_length_boundaries(length: int, encoded: bytes) -> None:  # 2.2.3, table 2.4
    assert codec._remaining_length(length) == encoded
    header = b"\x30" + encoded
    # The decoder reads the length exactly: a maximum of header + length bytes lets it wait for
    # the body, one byte less refuses the packet from its header alone.
    if length:  # (a zero-length PUBLISH is complete, and malformed)
        assert Decoder(len(header) + length).feed(header) == []
    with pytest.raises(PacketTooLarge):
        Decoder(len(header) + length - 1).feed(header)


@pytest.mark.parametrize("length", [127, 128, 16_383, 16_384, 2_097_151, 2_097_152])
def test_remaining_length_boundaries_round_trip(length: int) -> None:
    packet = Publish("t", b"p" * (length - 3), 0)
    data = encode(packet)
    assert data[1 : 1 + len(REMAINING_LENGTHS[length])] == REMAINING_LENGTHS[length]
    assert Decoder().feed(data) == [packet]


def test_five_byte_remaining_length_is_malformed() -> None:  # 2.2.3
    error = rejects(b"\x30\xff\xff\xff\xff")  # the fifth byte need never arrive
    assert error.spec_id == "MQTT-2.2.3"
    assert not isinstance(error, PacketTooLarge)
    assert rejects(b"\x30\x80\x80\x80\x80\x01").spec_id == "MQTT-2.2.3"


def test_remaining_length_above_the_maximum_is_refused_from_the_header() -> None:
    decoder = Decoder(max_packet_size=1024)
    with pytest.raises(PacketTooLarge) as info:
        decoder.feed(b"\x30\x80\x80\x80\x7f")  # 266 MB announced; no body is ever fed
    assert info.value.spec_id == "MQTT-2.2.3"
    assert isinstance(info.value, MalformedPacket)


def test_maximum_packet_size_counts_the_fixed_header() -> None:
    fits = encode(Publish("t", b"x" * 95, 0))  # 2 + 3 + 95 = 100 bytes
    assert len(fits) == 100
    assert Decoder(max_packet_size=100).feed(fits) == [Publish("t", b"x" * 95, 0)]
    with pytest.raises(PacketTooLarge):
        Decoder(max_packet_size=99).feed(fits[:2])


@pytest.mark.parametrize(
    ("first", "length"),
    [
        (0x20, 3),  # CONNACK
        (0x40, 1),  # PUBACK
        (0x50, 3),  # PUBREC
        (0x62, 0),  # PUBREL
        (0x70, 4),  # PUBCOMP
        (0xB0, 3),  # UNSUBACK
        (0xC0, 1),  # PINGREQ
        (0xD0, 2),  # PINGRESP
        (0xE0, 1),  # DISCONNECT
    ],
)
def test_fixed_size_packets_with_another_length_are_malformed(first: int, length: int) -> None:
    # Rejected from the fixed header alone, before the body arrives (sections 3.x.1).
    assert rejects(bytes((first, length))).spec_id == "MQTT-2.2.3"


# --------------------------------------------------------------------------------------------
# PUBLISH


def test_publish_qos3_is_malformed() -> None:  # [MQTT-3.3.1-4]
    assert rejects(raw(0x36, s("a") + b"\x00\x01")).spec_id == "MQTT-3.3.1-4"


def test_publish_qos0_with_dup_is_malformed() -> None:  # [MQTT-3.3.1-2]
    assert rejects(raw(0x38, s("a"))).spec_id == "MQTT-3.3.1-2"


@pytest.mark.parametrize("first", [0x32, 0x34, 0x3A])
def test_publish_packet_id_zero_is_malformed(first: int) -> None:  # [MQTT-2.3.1-1]
    assert rejects(raw(first, s("a") + b"\x00\x00payload")).spec_id == "MQTT-2.3.1-1"


INVALID_UTF8 = [
    b"\xff",
    b"a\x80",
    b"\xc0\xaf",  # overlong "/"
    b"\xed\xa0\x80",  # U+D800, a surrogate
    b"\xed\xbf\xbf",  # U+DFFF
    b"\xf4\x90\x80\x80",  # above U+10FFFF
    b"\xe2\x82",  # truncated sequence
]


@pytest.mark.parametrize("topic", INVALID_UTF8)
def test_publish_topic_ill_formed_utf8_is_malformed(topic: bytes) -> None:  # [MQTT-1.5.3-1]
    assert rejects(raw(0x30, s(topic) + b"payload")).spec_id == "MQTT-1.5.3-1"


def test_publish_topic_with_null_is_malformed() -> None:  # [MQTT-1.5.3-2]
    assert rejects(raw(0x30, s("a\x00b"))).spec_id == "MQTT-1.5.3-2"


def test_publish_empty_topic_is_malformed() -> None:  # [MQTT-4.7.3-1]
    assert rejects(raw(0x32, s("") + b"\x00\x01")).spec_id == "MQTT-4.7.3-1"


@pytest.mark.parametrize("topic", ["+", "a/+", "#", "a/#", "a/b#", "sport+"])
def test_publish_topic_with_wildcards_is_malformed(topic: str) -> None:  # [MQTT-3.3.2-2]
    assert rejects(raw(0x30, s(topic))).spec_id == "MQTT-3.3.2-2"


def test_publish_payload_may_be_empty() -> None:
    assert Decoder().feed(raw(0x31, s("a/b"))) == [Publish("a/b", b"", 0, retain=True)]
    assert Decoder().feed(raw(0x3C, s("a") + b"\x00\x05")) == [
        Publish("a", b"", 2, dup=True, packet_id=5)
    ]


def test_publish_topic_beyond_the_packet_is_malformed() -> None:  # 2.2.3
    assert rejects(raw(0x30, b"\x00\x05abc")).spec_id == "MQTT-2.2.3"
    assert rejects(raw(0x30, b"\x00")).spec_id == "MQTT-2.2.3"
    assert rejects(raw(0x30, b"")).spec_id == "MQTT-2.2.3"


def test_publish_qos1_without_packet_id_is_malformed() -> None:  # 2.2.3
    assert rejects(raw(0x32, s("abc"))).spec_id == "MQTT-2.2.3"
    assert rejects(raw(0x32, s("abc") + b"\x01")).spec_id == "MQTT-2.2.3"


def test_publish_topic_may_hold_any_other_unicode() -> None:
    topic = "温度/ŝ/\U0001f600/\u200b/\ufeff/$SYS"
    assert Decoder().feed(encode(Publish(topic, b"x"))) == [Publish(topic, b"x")]


# --------------------------------------------------------------------------------------------
# CONNECT


def test_connect_minimal() -> None:
    assert Decoder().feed(raw(0x10, connect_body())) == [Connect("c", True, 60)]


def test_connect_empty_client_id_is_left_to_the_channel() -> None:
    assert Decoder().feed(raw(0x10, connect_body(payload=s("")))) == [Connect("", True, 60)]


def test_connect_mqtt_3_1_is_accepted() -> None:
    decoded = Decoder().feed(raw(0x10, connect_body(b"MQIsdp", 3)))
    assert decoded == [Connect("c", True, 60, protocol_name="MQIsdp", protocol_level=3)]


@pytest.mark.parametrize("name", [b"MQTX", b"mqtt", b"", b"MQIsdpX", b"HTTP"])
def test_connect_unknown_protocol_name_closes_without_connack(name: bytes) -> None:
    error = rejects(raw(0x10, connect_body(name)), ProtocolError)  # [MQTT-3.1.2-1]
    assert error.spec_id == "MQTT-3.1.2-1"
    assert error.connack_code is None
    assert not isinstance(error, ConnectRefused)


@pytest.mark.parametrize(("name", "level"), [(b"MQTT", 3), (b"MQTT", 5), (b"MQIsdp", 4)])
def test_connect_unsupported_level_is_refused_with_connack_1(name: bytes, level: int) -> None:
    error = rejects(raw(0x10, connect_body(name, level)), ConnectRefused)  # [MQTT-3.1.2-2]
    assert error.spec_id == "MQTT-3.1.2-2"
    assert error.connack_code == 1


def test_connect_mqtt5_is_refused_before_its_properties_are_read() -> None:  # [MQTT-3.1.2-2]
    # An MQTT 5 CONNECT: properties length 5, session expiry interval 0x11 = 0.
    body = s("MQTT") + b"\x05\x02\x00\x3c" + b"\x05\x11\x00\x00\x00\x00" + s("c")
    assert rejects(raw(0x10, body), ConnectRefused).connack_code == 1


def test_connect_reserved_flag_is_malformed() -> None:  # [MQTT-3.1.2-3]
    assert rejects(raw(0x10, connect_body(flags=0x03))).spec_id == "MQTT-3.1.2-3"


@pytest.mark.parametrize("flags", [0x08, 0x10, 0x18])
def test_connect_will_qos_without_will_is_malformed(flags: int) -> None:  # [MQTT-3.1.2-13]
    # [MQTT-3.1.2-11]: with the will flag 0, will QoS and will retain must be 0.
    assert rejects(raw(0x10, connect_body(flags=flags))).spec_id == "MQTT-3.1.2-13"


def test_connect_will_retain_without_will_is_malformed() -> None:  # [MQTT-3.1.2-15]
    assert rejects(raw(0x10, connect_body(flags=0x20))).spec_id == "MQTT-3.1.2-15"


def test_connect_will_qos3_is_malformed() -> None:  # [MQTT-3.1.2-14]
    payload = s("c") + s("will/t") + s(b"bye")
    assert rejects(raw(0x10, connect_body(flags=0x1C, payload=payload))).spec_id == (
        "MQTT-3.1.2-14"
    )


def test_connect_password_without_username_is_malformed() -> None:  # [MQTT-3.1.2-22]
    payload = s("c") + s(b"secret")
    assert rejects(raw(0x10, connect_body(flags=0x42, payload=payload))).spec_id == (
        "MQTT-3.1.2-22"
    )


def test_connect_payload_in_order() -> None:  # [MQTT-3.1.3-1]
    payload = s("id") + s("will/t") + s(b"\x00bye") + s("user") + s(b"\xffpw")
    decoded = Decoder().feed(raw(0x10, connect_body(flags=0xF4, payload=payload)))
    will = Will("will/t", b"\x00bye", qos=2, retain=True)
    assert decoded == [Connect("id", False, 60, "user", b"\xffpw", will)]


def test_connect_extra_bytes_after_payload_are_malformed() -> None:  # [MQTT-3.1.3-1]
    assert rejects(raw(0x10, connect_body(payload=s("c") + b"\x00"))).spec_id == "MQTT-3.1.3-1"


@pytest.mark.parametrize(
    ("flags", "payload"),
    [
        (0x06, s("c")),  # will flag, no will topic
        (0x06, s("c") + s("t")),  # will flag, no will message
        (0x82, s("c")),  # user name flag, no user name
        (0xC2, s("c") + s("u")),  # password flag, no password
        (0xC2, s("c") + s("u") + b"\x00\x05abc"),  # password shorter than its length
        (0x02, b"\x00"),  # client id length cut
        (0x02, b""),  # no client id
    ],
)
def test_connect_missing_payload_fields_are_malformed(flags: int, payload: bytes) -> None:
    assert rejects(raw(0x10, connect_body(flags=flags, payload=payload))).spec_id == "MQTT-2.2.3"


def test_connect_truncated_variable_header_is_malformed() -> None:
    for cut in range(len(connect_body(payload=b""))):
        assert rejects(raw(0x10, connect_body(payload=b"")[:cut])).spec_id == "MQTT-2.2.3"


@pytest.mark.parametrize("topic", ["a/+", "#", ""])
def test_connect_will_topic_is_a_topic_name(topic: str) -> None:  # [MQTT-3.3.2-2] [MQTT-4.7.3-1]
    payload = s("c") + s(topic) + s(b"bye")
    error = rejects(raw(0x10, connect_body(flags=0x06, payload=payload)))
    assert error.spec_id == ("MQTT-4.7.3-1" if not topic else "MQTT-3.3.2-2")


@pytest.mark.parametrize("bad", INVALID_UTF8)
def test_connect_strings_must_be_well_formed_utf8(bad: bytes) -> None:  # [MQTT-1.5.3-1]
    for flags, payload in [
        (0x02, s(bad)),  # client identifier [MQTT-3.1.3-4]
        (0x06, s("c") + s(bad) + s(b"")),  # will topic
        (0x82, s("c") + s(bad)),  # user name
    ]:
        error = rejects(raw(0x10, connect_body(flags=flags, payload=payload)))
        assert error.spec_id == "MQTT-1.5.3-1"
    assert rejects(raw(0x10, connect_body(bad))).spec_id == "MQTT-1.5.3-1"  # protocol name


def test_connect_strings_must_not_contain_null() -> None:  # [MQTT-1.5.3-2]
    for flags, payload in [(0x02, s("a\x00")), (0x82, s("c") + s("\x00"))]:
        error = rejects(raw(0x10, connect_body(flags=flags, payload=payload)))
        assert error.spec_id == "MQTT-1.5.3-2"


def test_connect_password_is_binary() -> None:
    payload = s("c") + s("u") + s(b"\xed\xa0\x80\x00")
    decoded = Decoder().feed(raw(0x10, connect_body(flags=0xC2, payload=payload)))
    assert decoded == [Connect("c", True, 60, "u", b"\xed\xa0\x80\x00")]


# --------------------------------------------------------------------------------------------
# SUBSCRIBE, UNSUBSCRIBE and the acknowledgements


def test_subscribe_packet_id_zero_is_malformed() -> None:  # [MQTT-2.3.1-1]
    assert rejects(raw(0x82, b"\x00\x00" + s("a") + b"\x00")).spec_id == "MQTT-2.3.1-1"


def test_subscribe_without_filters_is_malformed() -> None:  # [MQTT-3.8.3-3]
    assert rejects(raw(0x82, b"\x00\x01")).spec_id == "MQTT-3.8.3-3"


@pytest.mark.parametrize("qos", [0x03, 0x04, 0x40, 0x80, 0xFF])
def test_subscribe_invalid_requested_qos_is_malformed(qos: int) -> None:  # [MQTT-3-8.3-4]
    body = b"\x00\x01" + s("a") + b"\x01" + s("b") + bytes((qos,))
    assert rejects(raw(0x82, body)).spec_id == "MQTT-3-8.3-4"


def test_subscribe_missing_qos_byte_is_malformed() -> None:
    assert rejects(raw(0x82, b"\x00\x01" + s("a"))).spec_id == "MQTT-2.2.3"


@pytest.mark.parametrize("bad", INVALID_UTF8)
def test_subscribe_filter_ill_formed_utf8_is_malformed(bad: bytes) -> None:  # [MQTT-1.5.3-1]
    assert rejects(raw(0x82, b"\x00\x01" + s(bad) + b"\x00")).spec_id == "MQTT-1.5.3-1"


def test_subscribe_filter_with_null_is_malformed() -> None:  # [MQTT-1.5.3-2]
    assert rejects(raw(0x82, b"\x00\x01" + s("a\x00") + b"\x00")).spec_id == "MQTT-1.5.3-2"


def test_subscribe_invalid_filters_are_left_to_the_channel() -> None:  # SUBACK 0x80 there
    filters = ("a/#/b", "sport+", "", "#", "+/+")
    body = b"\x00\x07" + b"".join(s(f) + b"\x01" for f in filters)
    assert Decoder().feed(raw(0x82, body)) == [Subscribe(7, tuple((f, 1) for f in filters))]


def test_unsubscribe_without_filters_is_malformed() -> None:  # [MQTT-3.10.3-2]
    assert rejects(raw(0xA2, b"\x00\x01")).spec_id == "MQTT-3.10.3-2"


def test_unsubscribe_packet_id_zero_is_malformed() -> None:  # [MQTT-2.3.1-1]
    assert rejects(raw(0xA2, b"\x00\x00" + s("a"))).spec_id == "MQTT-2.3.1-1"


def test_unsubscribe_truncated_filter_is_malformed() -> None:
    assert rejects(raw(0xA2, b"\x00\x01" + s("a") + b"\x00\x09a")).spec_id == "MQTT-2.2.3"


@pytest.mark.parametrize("first", [0x40, 0x50, 0x62, 0x70, 0xB0])
def test_acknowledgement_packet_id_zero_is_malformed(first: int) -> None:  # [MQTT-2.3.1-1]
    assert rejects(bytes((first, 2, 0, 0))).spec_id == "MQTT-2.3.1-1"


@pytest.mark.parametrize("ack_flags", [0x02, 0x80, 0xFF])
def test_connack_reserved_flags_are_malformed(ack_flags: int) -> None:  # 3.2.2.1
    assert rejects(bytes((0x20, 2, ack_flags, 0))).spec_id == "MQTT-3.2.2.1"


def test_connack_reserved_return_code_is_malformed() -> None:  # 3.2.2.3
    assert rejects(b"\x20\x02\x00\x06").spec_id == "MQTT-3.2.2.3"


@pytest.mark.parametrize("code", [3, 4, 0x7F, 0x81, 0xFF])
def test_suback_reserved_return_code_is_malformed(code: int) -> None:  # [MQTT-3.9.3-2]
    assert rejects(raw(0x90, b"\x00\x01\x00" + bytes((code,)))).spec_id == "MQTT-3.9.3-2"


def test_suback_without_return_codes_is_malformed() -> None:  # 3.9.3
    assert rejects(raw(0x90, b"\x00\x01")).spec_id == "MQTT-3.9.3"


def test_suback_packet_id_zero_is_malformed() -> None:  # [MQTT-2.3.1-1]
    assert rejects(raw(0x90, b"\x00\x00\x00")).spec_id == "MQTT-2.3.1-1"


# --------------------------------------------------------------------------------------------
# Encoding


def test_encoding_known_bytes() -> None:
    assert encode(Connack(True, 0)) == b"\x20\x02\x01\x00"
    assert encode(Puback(0x1234)) == b"\x40\x02\x12\x34"
    assert encode(Pubrel(1)) == b"\x62\x02\x00\x01"
    assert encode(Pingreq()) == b"\xc0\x00"
    assert encode(Pingresp()) == b"\xd0\x00"
    assert encode(Disconnect()) == b"\xe0\x00"
    assert encode(Suback(2, (0, 0x80))) == b"\x90\x04\x00\x02\x00\x80"
    assert encode(Subscribe(3, (("a/#", 1),))) == b"\x82\x08\x00\x03\x00\x03a/#\x01"
    assert encode(Unsubscribe(4, ("a",))) == b"\xa2\x05\x00\x04\x00\x01a"
    assert encode(Publish("a/b", b"hi", 1, True, True, 10)) == b"\x3b\x09\x00\x03a/b\x00\x0ahi"
    assert encode(Connect("c", keep_alive=60)) == (b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x3c\x00\x01c")


@given(publishes())
def test_encode_publish_matches_encode(packet: Publish) -> None:
    args = (packet.topic, packet.payload, packet.qos, packet.retain, packet.dup, packet.packet_id)
    assert encode_publish(*args) == encode(packet)


@given(topic_names, st.binary(max_size=70_000), qoss, packet_ids, st.booleans(), st.booleans())
@settings(deadline=None)
def test_publish_template_matches_encode(
    topic: str, payload: bytes, qos: int, packet_id: int, dup: bool, retain: bool
) -> None:
    template = PublishTemplate(topic, payload, qos)
    if qos:
        expected = Publish(topic, payload, qos, retain, dup, packet_id)
        assert template.to_bytes(packet_id, dup=dup, retain=retain) == encode(expected)
    else:
        expected = Publish(topic, payload, 0, retain)
        assert template.to_bytes(None, retain=retain) == encode(expected)
    assert Decoder().feed(encode(expected)) == [expected]


@given(topic_names, st.binary(max_size=2_000), qoss, packet_ids, st.booleans(), st.booleans())
def test_publish_template_to_wire_is_to_bytes_in_chunks(
    topic: str, payload: bytes, qos: int, packet_id: int, dup: bool, retain: bool
) -> None:
    template = PublishTemplate(topic, payload, qos)
    pid = packet_id if qos else None
    wire = template.to_wire(pid, dup=dup and qos > 0, retain=retain)
    assert wire_bytes(wire) == template.to_bytes(pid, dup=dup and qos > 0, retain=retain)
    assert isinstance(wire, tuple) == (qos > 0 and len(payload) >= SHARED_PAYLOAD_BYTES)


def test_publish_template_shares_a_large_payload_between_packet_ids() -> None:
    payload = bytes(SHARED_PAYLOAD_BYTES)
    template = PublishTemplate("a/b", payload, 1)
    first, second = template.to_wire(1), template.to_wire(2, dup=True)
    assert isinstance(first, tuple) and isinstance(second, tuple)
    assert first[1] is payload and second[1] is payload
    assert first[0][1:-2] == second[0][1:-2]  # only the first byte (DUP) and the id differ
    assert (first[0][-2:], second[0][-2:]) == (b"\0\1", b"\0\2")


def test_publish_template_rejects_mismatched_packet_ids() -> None:
    with pytest.raises(ValueError):
        PublishTemplate("t", b"", 1).to_bytes(None)
    with pytest.raises(ValueError):
        PublishTemplate("t", b"", 0).to_bytes(1)
    with pytest.raises(ValueError):
        PublishTemplate("t", b"", 0).to_bytes(None, dup=True)
    with pytest.raises(ValueError):
        PublishTemplate("t", b"", 3)


def test_encoder_rejects_what_the_wire_cannot_carry() -> None:
    with pytest.raises(ValueError):
        encode(Publish("t", b"", 1))
    with pytest.raises(ValueError):
        encode(Publish("t", b"", 0, packet_id=1))
    with pytest.raises(ValueError):
        encode(Publish("t" * 65_536, b""))
    with pytest.raises(ValueError):
        encode(Connect("c" * 65_536))


def test_codec_does_no_io() -> None:
    tree = ast.parse(SOURCE.read_text())  # the source, where codec may run compiled
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        (node.module or "").split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and not node.level
    }
    assert imported <= {"__future__", "struct", "collections", "dataclasses", "typing"}


def test_packets_before_a_malformed_one_are_returned_then_the_error_is_raised() -> None:
    decoder = Decoder()
    ping = encode(Pingreq())
    assert decoder.feed(ping + ping + b"\x00\x00") == [Pingreq(), Pingreq()]
    assert decoder.error is not None and decoder.error.spec_id == "MQTT-2.2.1"
    with pytest.raises(MalformedPacket):
        decoder.feed(ping)


# -- a server's decoder: nothing buffered for a stranger ----------------------------------------

SERVER = codec.ConnectBounds(fields=64, will=32)


def server_decoder(max_packet_size: int = codec.MAX_PACKET_SIZE) -> Decoder:
    return Decoder(max_packet_size, SERVER)


@pytest.mark.parametrize("first", [0x30, 0x32, 0x82, 0xC0, 0xE0, 0x20, 0x00, 0xF0])
def test_a_first_packet_that_is_no_connect_is_refused_at_its_first_byte(first: int) -> None:
    # [MQTT-3.1.0-1] the first packet sent from the client to the server MUST be a CONNECT
    decoder = server_decoder()
    with pytest.raises(ProtocolError) as info:
        decoder.feed(bytes((first,)))
    assert info.value.spec_id == "MQTT-3.1.0-1"
    assert decoder.buffered() == 0


def test_a_stranger_announcing_a_large_publish_is_refused_before_anything_is_held() -> None:
    header = b"\x30" + codec._remaining_length(16 * 1024 * 1024)
    decoder = server_decoder()
    with pytest.raises(ProtocolError):
        decoder.feed(header + bytes(1024 * 1024))
    assert decoder.buffered() == 0
    with pytest.raises(ProtocolError):  # and the stream ends there
        decoder.feed(encode(Connect("c")))


def test_a_connect_over_its_bound_is_refused_at_its_remaining_length() -> None:
    header = b"\x10" + codec._remaining_length(SERVER.fields + SERVER.will)  # 2 + 96 bytes
    with pytest.raises(PacketTooLarge):
        server_decoder().feed(header)
    fits = b"\x10" + codec._remaining_length(SERVER.fields + SERVER.will - 2)
    decoder = server_decoder()
    assert decoder.feed(fits) == []
    assert decoder.buffered() == len(fits)


def test_the_connect_bound_is_the_maximum_packet_size_when_that_is_smaller() -> None:
    with pytest.raises(PacketTooLarge):
        server_decoder(max_packet_size=40).feed(b"\x10" + codec._remaining_length(39))


def test_a_will_message_over_its_bound_is_refused() -> None:
    will = Will("w", b"x" * (SERVER.will + 1))
    with pytest.raises(PacketTooLarge, match="will message of 33 bytes"):
        server_decoder().feed(encode(Connect("c", will=will)))
    at_bound = Connect("c", will=Will("w", b"x" * SERVER.will))
    assert server_decoder().feed(encode(at_bound)) == [at_bound]


def test_the_fields_of_a_connect_are_bounded_besides_its_will() -> None:
    small = Connect("c", username="u", password=b"p" * 40)  # 58 bytes in all
    assert server_decoder().feed(encode(small)) == [small]
    with pytest.raises(PacketTooLarge, match="besides its will message"):
        server_decoder().feed(encode(Connect("c", username="u", password=b"p" * 50)))


def test_after_its_connect_a_server_decodes_any_packet_whatever_the_chunking() -> None:
    connect = Connect("c", will=Will("w", b"bye"))
    packets: list[Packet] = [
        connect,
        Publish("a/b", b"x" * 200, 1, packet_id=3),
        Pingreq(),
        Disconnect(),
    ]
    data = b"".join(encode(p) for p in packets)
    for size in (1, 2, 3, 7, len(data)):
        decoder = server_decoder()
        out = [p for i in range(0, len(data), size) for p in decoder.feed(data[i : i + size])]
        assert out == packets
    assert server_decoder().feed(data) == packets


def test_a_client_decoder_awaits_no_connect() -> None:
    assert Decoder().feed(encode(Connack(False, 0))) == [Connack(False, 0)]


def test_a_decoding_error_drops_what_was_buffered() -> None:
    decoder = Decoder()
    assert decoder.feed(b"\x30\x7f" + bytes(20)) == []
    assert decoder.buffered() == 22
    with pytest.raises(MalformedPacket):
        decoder.feed(bytes(200))  # the PUBLISH's topic length runs past its end
    assert decoder.buffered() == 0
