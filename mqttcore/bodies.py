"""MQTT 3.1.1 packet bodies: the variable header and payload of every packet type but PUBLISH
(whose hot path is in :mod:`.codec`), decoded with the checks the spec puts on them.

:class:`Reader` reads one body sequentially; running past its end is malformed, and so is a
byte left over where the spec says the body ends.  Each decoder of :data:`BODY_DECODERS` is
handed a body whose fixed header :class:`~.codec.Decoder` has checked already (type, flags,
exact lengths), and raises only :class:`~.errors.ProtocolError` subclasses, citing the spec.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Final

from .errors import ConnectRefused, MalformedPacket, ProtocolError
from .packets import (
    SUBACK_FAILURE,
    Connack,
    Connect,
    Disconnect,
    Packet,
    PacketType,
    Pingreq,
    Pingresp,
    Puback,
    Pubcomp,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
    Will,
)

__all__ = [
    "BODY_DECODERS",
    "SUPPORTED_PROTOCOLS",
    "Reader",
    "decode_connect",
    "topic_name_error",
    "truncated",
]

SUPPORTED_PROTOCOLS: Final = {"MQTT": 4, "MQIsdp": 3}
"""Protocol name -> the one level accepted with it: MQTT 3.1.1, and MQTT 3.1 as Mosquitto does."""

_U16: Final = struct.Struct(">H")
_SUBACK_CODES: Final = frozenset((0, 1, 2, SUBACK_FAILURE))


def _decode_utf8(raw: bytes | bytearray) -> str:
    """A UTF-8 encoded string's value [MQTT-1.5.3-1] [MQTT-1.5.3-2]."""
    try:
        text = raw.decode()  # strict: rejects surrogates and overlong forms
    except UnicodeDecodeError:
        raise MalformedPacket("MQTT-1.5.3-1", "ill-formed UTF-8 string") from None
    if "\x00" in text:
        raise MalformedPacket("MQTT-1.5.3-2", "string contains U+0000")
    return text


def _check_topic_name(topic: str) -> str:
    """A PUBLISH or will topic name: non-empty, no U+0000, no wildcards."""
    if "+" in topic or "#" in topic or "\x00" in topic or not topic:
        raise topic_name_error(topic)
    return topic


def topic_name_error(topic: str) -> MalformedPacket:
    if not topic:
        return MalformedPacket("MQTT-4.7.3-1", "topic name must not be empty")
    if "\x00" in topic:
        return MalformedPacket("MQTT-1.5.3-2", "string contains U+0000")
    return MalformedPacket("MQTT-3.3.2-2", "topic name must not contain wildcards")


def truncated(what: str) -> MalformedPacket:
    return MalformedPacket("MQTT-2.2.3", f"{what} runs past the remaining length")


class Reader:
    """Sequential reads over one packet body (not the hot path); overruns are malformed."""

    __slots__ = ("_data", "_pos")

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0

    def at_end(self) -> bool:
        return self._pos == len(self._data)

    def take(self, n: int, what: str) -> bytes:
        pos = self._pos
        if pos + n > len(self._data):
            raise truncated(what)
        self._pos = pos + n
        return self._data[pos : pos + n]

    def rest(self) -> bytes:
        data = self._data[self._pos :]
        self._pos = len(self._data)
        return data

    def u8(self, what: str) -> int:
        return self.take(1, what)[0]

    def u16(self, what: str) -> int:
        value: int = _U16.unpack(self.take(2, what))[0]
        return value

    def binary(self, what: str) -> bytes:
        """Binary data: a two-byte length, then that many bytes (1.5.3, 3.1.3.4)."""
        return self.take(self.u16(what), what)

    def string(self, what: str) -> str:
        return _decode_utf8(self.binary(what))

    def packet_id(self) -> int:
        packet_id = self.u16("packet identifier")
        if packet_id == 0:
            raise MalformedPacket("MQTT-2.3.1-1", "packet identifier must be non-zero")
        return packet_id


def decode_connect(r: Reader) -> Connect:
    name = r.string("protocol name")
    level = r.u8("protocol level")
    _check_protocol(name, level)
    flags = r.u8("connect flags")
    _check_connect_flags(flags)
    keep_alive = r.u16("keep alive")
    client_id = r.string("client identifier")
    will = _read_will(r, flags) if flags & 0x04 else None
    username = r.string("user name") if flags & 0x80 else None
    password = r.binary("password") if flags & 0x40 else None
    if not r.at_end():
        raise MalformedPacket("MQTT-3.1.3-1", "bytes after the last CONNECT payload field")
    return Connect(client_id, bool(flags & 0x02), keep_alive, username, password, will, name, level)


def _check_protocol(name: str, level: int) -> None:
    expected = SUPPORTED_PROTOCOLS.get(name)
    if expected is None:
        raise ProtocolError("MQTT-3.1.2-1", f"unsupported protocol name {name!r}")
    if level != expected:
        raise ConnectRefused(1, "MQTT-3.1.2-2", f"unsupported protocol level {level} for {name}")


def _check_connect_flags(flags: int) -> None:
    if flags & 0x01:
        raise MalformedPacket("MQTT-3.1.2-3", "reserved CONNECT flag must be 0")
    will_qos = (flags >> 3) & 0x03
    if not flags & 0x04:
        if will_qos:
            raise MalformedPacket("MQTT-3.1.2-13", "will QoS must be 0 without a will")
        if flags & 0x20:
            raise MalformedPacket("MQTT-3.1.2-15", "will retain must be 0 without a will")
    elif will_qos == 3:
        raise MalformedPacket("MQTT-3.1.2-14", "will QoS must not be 3")
    if flags & 0xC0 == 0x40:
        raise MalformedPacket("MQTT-3.1.2-22", "password flag set without user name flag")


def _read_will(r: Reader, flags: int) -> Will:
    topic = _check_topic_name(r.string("will topic"))
    payload = r.binary("will message")
    return Will(topic, payload, (flags >> 3) & 0x03, bool(flags & 0x20))


def _decode_connack(r: Reader) -> Connack:
    ack_flags = r.u8("connect acknowledge flags")
    if ack_flags & 0xFE:
        raise MalformedPacket("MQTT-3.2.2.1", "reserved connect acknowledge flags must be 0")
    return_code = r.u8("return code")
    if return_code > 5:
        raise MalformedPacket("MQTT-3.2.2.3", f"reserved CONNACK return code {return_code}")
    return Connack(bool(ack_flags), return_code)


def _decode_subscribe(r: Reader) -> Subscribe:
    packet_id = r.packet_id()
    topics: list[tuple[str, int]] = []
    while not r.at_end():
        topic_filter = r.string("topic filter")
        qos = r.u8("requested QoS")
        if qos > 2:
            raise MalformedPacket("MQTT-3-8.3-4", f"invalid requested QoS byte {qos:#04x}")
        topics.append((topic_filter, qos))
    if not topics:
        raise MalformedPacket("MQTT-3.8.3-3", "SUBSCRIBE must carry at least one topic filter")
    return Subscribe(packet_id, tuple(topics))


def _decode_suback(r: Reader) -> Suback:
    packet_id = r.packet_id()
    codes = tuple(r.rest())
    if not codes:
        raise MalformedPacket("MQTT-3.9.3", "SUBACK must carry at least one return code")
    if not _SUBACK_CODES.issuperset(codes):
        raise MalformedPacket("MQTT-3.9.3-2", "reserved SUBACK return code")
    return Suback(packet_id, codes)


def _decode_unsubscribe(r: Reader) -> Unsubscribe:
    packet_id = r.packet_id()
    topics: list[str] = []
    while not r.at_end():
        topics.append(r.string("topic filter"))
    if not topics:
        raise MalformedPacket("MQTT-3.10.3-2", "UNSUBSCRIBE must carry at least one topic filter")
    return Unsubscribe(packet_id, tuple(topics))


BODY_DECODERS: Final[dict[int, Callable[[Reader], Packet]]] = {
    PacketType.CONNECT: decode_connect,
    PacketType.CONNACK: _decode_connack,
    PacketType.PUBACK: lambda r: Puback(r.packet_id()),
    PacketType.PUBREC: lambda r: Pubrec(r.packet_id()),
    PacketType.PUBREL: lambda r: Pubrel(r.packet_id()),
    PacketType.PUBCOMP: lambda r: Pubcomp(r.packet_id()),
    PacketType.SUBSCRIBE: _decode_subscribe,
    PacketType.SUBACK: _decode_suback,
    PacketType.UNSUBSCRIBE: _decode_unsubscribe,
    PacketType.UNSUBACK: lambda r: Unsuback(r.packet_id()),
    PacketType.PINGREQ: lambda r: Pingreq(),
    PacketType.PINGRESP: lambda r: Pingresp(),
    PacketType.DISCONNECT: lambda r: Disconnect(),
}
"""Body decoders for every type but PUBLISH; exact lengths were checked with the header."""
