"""MQTT 3.1.1 wire format: an incremental decoder and an encoder, with no I/O.

Decoding.  :class:`Decoder` keeps one ``bytearray`` for a trailing partial packet.  ``feed``
parses from a read offset, either straight over the caller's ``bytes`` (when nothing is
buffered, the usual case) or over the buffer after appending to it, and returns every complete
packet as a value of :mod:`.packets`.  Consumed bytes are dropped once per call, never per
packet, and only the unconsumed tail is ever copied into the buffer, so the work is linear in
the bytes received however they are split.  PUBLISH bodies are decoded here (the hot path),
every other packet's by :mod:`.bodies`.  Invariants:

* the same byte stream gives the same packets, and the same first error, whatever the chunking:
  every check on a packet runs in a fixed order, and only on bytes of that packet;
* the fixed header (type, flags, remaining length, exact lengths of the fixed-size packets, and
  the maximum packet size) is checked as soon as it is complete, before any body is buffered;
* a server's decoder (given :class:`ConnectBounds`) buffers nothing for a stranger: the first
  packet must be a CONNECT [MQTT-3.1.0-1], checked at its first byte, and its size is checked
  against the CONNECT bound (fields plus will message) as soon as its remaining length is read;
  once decoded, its will message and the rest are checked against their own bounds;
* decoding finds only :class:`~.errors.ProtocolError` subclasses, each citing the spec.  The
  packets completed before a malformed one are still returned, in order; the error is kept in
  ``error`` and raised by the next ``feed``, so the caller handles what came first (a CONNECT,
  a DISCONNECT) before it closes the connection;
* validation stops at what bytes alone can tell: a SUBSCRIBE's topic filters are returned as
  strings (the channel answers SUBACK 0x80 for a bad one), and connection state is not checked.

Encoding.  :func:`encode` turns any of the fourteen packets into bytes.  The PUBLISH hot path is
:class:`PublishTemplate`: built once per (message, QoS), it holds the encoded fixed header, topic
and payload, so each subscriber costs one ``bytes`` join with a fresh packet identifier, or, for a
large payload, only a header of its own (:data:`Wire`).  The
encoder trusts its input to be a valid packet; it raises ``ValueError`` only for values the wire
format cannot carry (QoS 3, a packet identifier without QoS, a field over 65535 bytes).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, Final

from .bodies import (
    BODY_DECODERS,
    SUPPORTED_PROTOCOLS,
    Reader,
    decode_connect,
    topic_name_error,
    truncated,
)
from .errors import MalformedPacket, PacketTooLarge, ProtocolError
from .packets import (
    Connack,
    Connect,
    Disconnect,
    Packet,
    PacketType,
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
)

__all__ = [
    "DEFAULT_MAX_CONNECT_SIZE",
    "DEFAULT_MAX_WILL_SIZE",
    "MAX_PACKET_SIZE",
    "SHARED_PAYLOAD_BYTES",
    "SUPPORTED_PROTOCOLS",
    "ConnectBounds",
    "Decoder",
    "PublishTemplate",
    "Wire",
    "encode",
    "encode_publish",
    "wire_bytes",
]

MAX_PACKET_SIZE: Final = 268_435_455
"""The largest remaining length a four-byte variable length integer can carry (2.2.3)."""

DEFAULT_MAX_CONNECT_SIZE: Final = 16 * 1024
"""A CONNECT's bytes besides its will message.  Client ids and user names are tens of bytes;
16 KiB leaves room for a password that is a token (a JWT is 1-2 KB)."""
DEFAULT_MAX_WILL_SIZE: Final = 16 * 1024
"""A will message: a last-gasp status of a few KB at most.  With the fields' bound, 32 KiB is
the most a stranger's CONNECT makes a node hold before the client is known."""


_U16: Final = struct.Struct(">H")

_REQUIRED_FLAGS: Final = {
    PacketType.PUBREL: (0b0010, "MQTT-3.6.1-1"),
    PacketType.SUBSCRIBE: (0b0010, "MQTT-3.8.1-1"),
    PacketType.UNSUBSCRIBE: (0b0010, "MQTT-3.10.1-1"),
}
"""Fixed-header flags other than 0b0000 that a packet type must carry [MQTT-2.2.2-1]."""

_FIXED_LENGTHS: Final = {
    PacketType.CONNACK: 2,
    PacketType.PUBACK: 2,
    PacketType.PUBREC: 2,
    PacketType.PUBREL: 2,
    PacketType.PUBCOMP: 2,
    PacketType.UNSUBACK: 2,
    PacketType.PINGREQ: 0,
    PacketType.PINGRESP: 0,
    PacketType.DISCONNECT: 0,
}
"""Packet types whose remaining length is fixed by the spec (sections 3.x.1)."""


def _header_rule(first: int) -> tuple[int, int] | None:
    """(packet type, required remaining length or -1), or None when the first byte is invalid."""
    ptype = first >> 4
    if ptype == 0 or ptype == 15:
        return None
    flags, _ = _REQUIRED_FLAGS.get(PacketType(ptype), (0, ""))
    if ptype != PacketType.PUBLISH and first & 0x0F != flags:
        return None
    return ptype, _FIXED_LENGTHS.get(PacketType(ptype), -1)


_HEADER_RULES: Final = tuple(_header_rule(first) for first in range(256))
"""Indexed by the fixed header's first byte, so the per-packet header check is one lookup."""


def _header_error(first: int) -> MalformedPacket:
    ptype = first >> 4
    if ptype == 0 or ptype == 15:
        return MalformedPacket("MQTT-2.2.1", f"reserved control packet type {ptype}")
    name = PacketType(ptype).name
    flags, spec_id = _REQUIRED_FLAGS.get(PacketType(ptype), (0, "MQTT-2.2.2-1"))
    return MalformedPacket(spec_id, f"{name} fixed header flags must be {flags:04b}")


# --------------------------------------------------------------------------------------------
# Decoding


@dataclass(frozen=True, slots=True)
class ConnectBounds:
    """What a server's decoder expects first: a CONNECT of at most ``fields`` bytes (the whole
    packet, fixed header included, less its will message) and a will message of at most ``will``
    bytes.  One value per node, shared by its connections."""

    fields: int = DEFAULT_MAX_CONNECT_SIZE
    will: int = DEFAULT_MAX_WILL_SIZE


class Decoder:
    """Bytes in, packets out, for one connection's inbound stream (see the module docstring).

    With ``first`` (a server's decoder), the stream must open with a CONNECT within those
    bounds; without it (a client's decoder, which reads a CONNACK first) any packet may come."""

    __slots__ = ("_buf", "_first", "_max_size", "error")

    def __init__(
        self, max_packet_size: int = MAX_PACKET_SIZE, first: ConnectBounds | None = None
    ) -> None:
        self._buf: bytearray | None = None
        """A packet's first bytes while the rest has not arrived (None: nothing waiting)."""
        self._max_size = max_packet_size
        self._first = first
        """The CONNECT's bounds while it is awaited; None once it is decoded (or not awaited)."""
        self.error: ProtocolError | None = None
        """The violation found after the packets last returned; the stream ends there."""

    def buffered(self) -> int:
        """Bytes held for a packet not complete yet."""
        return 0 if self._buf is None else len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[Packet]:
        """Buffer ``data`` and return every packet it completes, in stream order.

        A malformed packet ends the stream: the packets before it are returned and the error is
        left in ``error``; any later call raises it."""
        if self.error is not None:
            raise self.error
        buf = self._buf
        source: bytes | bytearray
        if buf is not None:
            buf += data
            source = buf
        elif isinstance(data, bytes):
            source = data  # nothing buffered: parse the caller's bytes without copying them
        else:
            source = buf = self._buf = bytearray(data)
        packets: list[Packet] = []
        try:
            pos = self._decode_packets(source, packets)
        except ProtocolError as error:
            self.error = error
            self._buf = None  # the stream ends here: nothing of it is kept
            if not packets:
                raise
            return packets
        if source is buf:
            del buf[:pos]
            if not buf:
                self._buf = None
        elif pos < len(source):
            self._buf = bytearray(memoryview(source)[pos:])
        return packets

    def _decode_packets(self, source: bytes | bytearray, packets: list[Packet]) -> int:
        """Append the complete packets in ``source`` to ``packets``; return the bytes consumed."""
        pos = 0
        end = len(source)
        if self._first is not None:
            pos = self._decode_first(source, end, packets)
            if not pos:
                return 0
        while pos < end:
            first = source[pos]
            rule = _HEADER_RULES[first]
            if rule is None:
                raise _header_error(first)
            if pos + 1 < end and source[pos + 1] < 0x80:
                start, length = pos + 2, source[pos + 1]
            else:
                header = _read_remaining_length(source, pos, end)
                if header is None:
                    return pos
                start, length = header
            ptype, required = rule
            if (required >= 0 and length != required) or start - pos + length > self._max_size:
                raise self._length_error(required, start - pos + length)
            stop = start + length
            if stop > end:
                return pos
            if ptype == PacketType.PUBLISH:
                packets.append(_decode_publish(first, source, start, stop))
            else:
                packets.append(BODY_DECODERS[ptype](Reader(bytes(source[start:stop]))))
            pos = stop
        return pos

    def _decode_first(self, source: bytes | bytearray, end: int, packets: list[Packet]) -> int:
        """The CONNECT that must open the stream, appended: the bytes it took, or 0 while it is
        incomplete.  Checked at its first byte, then at its remaining length."""
        bounds = self._first
        assert bounds is not None
        if not end:
            return 0
        if source[0] >> 4 != PacketType.CONNECT:
            kind = source[0] >> 4
            name = PacketType(kind).name if 0 < kind < 15 else f"type {kind}"
            raise ProtocolError("MQTT-3.1.0-1", f"the first packet must be CONNECT, not {name}")
        if _HEADER_RULES[source[0]] is None:
            raise _header_error(source[0])
        header = _read_remaining_length(source, 0, end)
        if header is None:
            return 0
        size, bound = header[0] + header[1], min(bounds.fields + bounds.will, self._max_size)
        if size > bound:
            raise PacketTooLarge("MQTT-2.2.3", f"CONNECT of {size} bytes exceeds {bound}")
        if size > end:
            return 0
        start = header[0]
        connect = decode_connect(Reader(bytes(source[start:size])))
        _check_connect_size(connect, size, bounds)
        packets.append(connect)
        self._first = None
        return size

    def _length_error(self, required: int, size: int) -> MalformedPacket:
        if size > self._max_size:
            return PacketTooLarge(
                "MQTT-2.2.3", f"packet of {size} bytes exceeds the maximum of {self._max_size}"
            )
        return MalformedPacket("MQTT-2.2.3", f"remaining length must be {required}")


def _check_connect_size(connect: Connect, size: int, bounds: ConnectBounds) -> None:
    """A decoded CONNECT of ``size`` bytes against the will's bound and the fields' bound."""
    will = len(connect.will.payload) if connect.will is not None else 0
    if will > bounds.will:
        raise PacketTooLarge(
            "MQTT-3.1.3.3", f"will message of {will} bytes exceeds the maximum of {bounds.will}"
        )
    if size - will > bounds.fields:
        raise PacketTooLarge(
            "MQTT-2.2.3",
            f"CONNECT of {size - will} bytes besides its will message exceeds the maximum of "
            f"{bounds.fields}",
        )


def _read_remaining_length(buf: bytes | bytearray, pos: int, end: int) -> tuple[int, int] | None:
    """(body start, remaining length) of the packet at ``pos``, or None if still incomplete."""
    value = 0
    shift = 0
    i = pos + 1
    while i < end:
        byte = buf[i]
        value |= (byte & 0x7F) << shift
        i += 1
        if byte < 0x80:
            return i, value
        shift += 7
        if shift == 28:
            raise MalformedPacket("MQTT-2.2.3", "remaining length longer than four bytes")
    return None


def _fast_publish_constructor() -> Callable[[str, bytes, int, bool, bool, int | None], Publish]:
    """``Publish(...)`` without the frozen dataclass's six ``object.__setattr__`` calls.

    That generic path is half the cost of decoding a small PUBLISH.  Setting the slots through
    their descriptors builds an equal value; if ``Publish`` ever stops being a slotted dataclass
    of exactly these fields, the plain constructor is used instead.
    """
    names = ("topic", "payload", "qos", "retain", "dup", "packet_id")
    slots = getattr(Publish, "__slots__", ())
    if tuple(f.name for f in fields(Publish)) != names or tuple(slots) != names:
        return Publish
    set_topic, set_payload, set_qos, set_retain, set_dup, set_packet_id = (
        Publish.__dict__[name].__set__ for name in names
    )
    new = object.__new__

    def construct(
        topic: str, payload: bytes, qos: int, retain: bool, dup: bool, packet_id: int | None
    ) -> Publish:
        packet: Publish = new(Publish)
        set_topic(packet, topic)
        set_payload(packet, payload)
        set_qos(packet, qos)
        set_retain(packet, retain)
        set_dup(packet, dup)
        set_packet_id(packet, packet_id)
        return packet

    return construct


_new_publish: Final = _fast_publish_constructor()

_COPY_VIA_MEMORYVIEW: Final = 1024
"""Payloads above this size are copied out of a ``bytearray`` once, through a memoryview."""


def _decode_publish(first: int, source: bytes | bytearray, start: int, stop: int) -> Publish:
    """The hot path: works on offsets into the decoder's source; copies topic and payload once."""
    qos = (first >> 1) & 0x03
    if qos == 3:
        raise MalformedPacket("MQTT-3.3.1-4", "PUBLISH QoS must not be 3")
    dup = first & 0x08 != 0
    if dup and not qos:
        raise MalformedPacket("MQTT-3.3.1-2", "DUP must be 0 for a QoS 0 PUBLISH")
    if stop - start < 2:
        raise truncated("PUBLISH topic name length")
    offset = start + 2 + ((source[start] << 8) | source[start + 1])
    packet_id = None
    if qos:
        if offset + 2 > stop:
            raise truncated("PUBLISH topic name and packet identifier")
        packet_id = (source[offset] << 8) | source[offset + 1]
        if not packet_id:
            raise MalformedPacket("MQTT-2.3.1-1", "PUBLISH packet identifier must be non-zero")
        offset += 2
    elif offset > stop:
        raise truncated("PUBLISH topic name")
    try:
        topic = source[start + 2 : offset - 2 if qos else offset].decode()  # strict UTF-8
    except UnicodeDecodeError:
        raise MalformedPacket("MQTT-1.5.3-1", "ill-formed UTF-8 topic name") from None
    if "+" in topic or "#" in topic or "\x00" in topic or not topic:
        raise topic_name_error(topic)
    if type(source) is bytes:
        payload = source[offset:stop]
    elif stop - offset <= _COPY_VIA_MEMORYVIEW:
        payload = bytes(source[offset:stop])
    else:
        payload = bytes(memoryview(source)[offset:stop])
    return _new_publish(topic, payload, qos, first & 0x01 != 0, dup, packet_id)


# --------------------------------------------------------------------------------------------
# Encoding


def _remaining_length(n: int) -> bytes:
    """The variable length encoding of ``n`` (2.2.3)."""
    if n < 0x80:
        return _SMALL_LENGTHS[n]
    if n > MAX_PACKET_SIZE:
        raise ValueError(f"remaining length {n} exceeds {MAX_PACKET_SIZE}")
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL_LENGTHS: Final = tuple(bytes((n,)) for n in range(0x80))


def _packet(first: int, body: bytes) -> bytes:
    return b"".join((bytes((first,)), _remaining_length(len(body)), body))


def _binary(data: bytes) -> bytes:
    if len(data) > 0xFFFF:
        raise ValueError(f"field of {len(data)} bytes exceeds 65535")
    return _U16.pack(len(data)) + data


def _string(text: str) -> bytes:
    return _binary(text.encode("utf-8"))


def _publish_head(topic: bytes, body_size: int, first: int) -> bytes:
    """Fixed header and topic name; ``body_size`` counts the packet id and payload too."""
    if len(topic) > 0xFFFF:
        raise ValueError(f"topic of {len(topic)} bytes exceeds 65535")
    return b"".join(
        (
            bytes((first,)),
            _remaining_length(2 + len(topic) + body_size),
            _U16.pack(len(topic)),
            topic,
        )
    )


def _publish_first_byte(qos: int, dup: bool, retain: bool) -> int:
    if not 0 <= qos <= 2:
        raise ValueError(f"invalid QoS {qos}")
    return 0x30 | (0x08 if dup else 0) | (qos << 1) | (0x01 if retain else 0)


def encode_publish(
    topic: str, payload: bytes, qos: int, retain: bool, dup: bool, packet_id: int | None
) -> bytes:
    """One PUBLISH packet; ``packet_id`` must be given exactly when ``qos > 0``."""
    if (packet_id is None) != (qos == 0):
        raise ValueError("a PUBLISH carries a packet identifier exactly when QoS > 0")
    first = _publish_first_byte(qos, dup, retain)
    if packet_id is None:
        return _publish_head(topic.encode("utf-8"), len(payload), first) + payload
    head = _publish_head(topic.encode("utf-8"), 2 + len(payload), first)
    return b"".join((head, _U16.pack(packet_id), payload))


SHARED_PAYLOAD_BYTES: Final = 512
"""From this payload size on, :meth:`PublishTemplate.to_wire` gives a QoS 1/2 PUBLISH as two
chunks sharing the payload.  Below it one join is cheaper: a second chunk costs a tuple and a
bytes object (about 90 bytes) and a step in every writer, more than copying a short payload."""

Wire = bytes | tuple[bytes, bytes]
"""One packet on its way to the client: its bytes, or a PUBLISH as two chunks (its own bytes up
to the packet identifier, then the payload: the same object for every subscriber)."""


def wire_bytes(data: Wire) -> bytes:
    """``data`` as one ``bytes`` (a copy if it is in chunks)."""
    return data if isinstance(data, bytes) else data[0] + data[1]


class PublishTemplate:
    """One application message pre-encoded at one QoS, for delivery to many subscribers.

    ``to_bytes`` varies only what differs per subscriber: the packet identifier and the DUP and
    RETAIN flags, which live in the first byte alone.  The rest of the fixed header and the topic
    name are encoded once; the usual QoS 0 packet (not retained) is built once, on first use,
    and returned without copying; any other packet is one join.  ``to_wire`` is the same packet
    without the copy of a payload of :data:`SHARED_PAYLOAD_BYTES` or more: the subscribers'
    packets differ in the packet id only, so each gets its own header chunk and all of them the
    one ``payload`` object.
    """

    __slots__ = ("_plain", "_rest", "payload", "qos")

    def __init__(self, topic: str, payload: bytes, qos: int) -> None:
        if not 0 <= qos <= 2:
            raise ValueError(f"invalid QoS {qos}")
        topic_bytes = topic.encode("utf-8")
        if len(topic_bytes) > 0xFFFF:
            raise ValueError(f"topic of {len(topic_bytes)} bytes exceeds 65535")
        body_size = len(payload) + (2 if qos else 0)
        self.qos = qos
        self.payload = payload
        self._rest = b"".join(
            (_remaining_length(2 + len(topic_bytes) + body_size), _U16.pack(len(topic_bytes)),
             topic_bytes)
        )  # fmt: skip
        self._plain: bytes | None = None

    def to_bytes(self, packet_id: int | None, dup: bool = False, retain: bool = False) -> bytes:
        """The PUBLISH for one subscriber; ``packet_id`` is given exactly when QoS > 0."""
        first = _FIRST_BYTES[(self.qos << 2) | (2 if dup else 0) | (1 if retain else 0)]
        if packet_id is None:
            if self.qos or dup:
                raise ValueError("QoS > 0 needs a packet identifier; QoS 0 cannot be DUP")
            if retain:
                return b"".join((first, self._rest, self.payload))
            if self._plain is None:
                self._plain = b"".join((first, self._rest, self.payload))
            return self._plain
        if not self.qos:
            raise ValueError("a QoS 0 PUBLISH carries no packet identifier")
        return b"".join((first, self._rest, _U16.pack(packet_id), self.payload))

    def to_wire(self, packet_id: int | None, dup: bool = False, retain: bool = False) -> Wire:
        """``to_bytes``, with a large QoS 1/2 payload shared instead of copied."""
        if packet_id is None or len(self.payload) < SHARED_PAYLOAD_BYTES:
            return self.to_bytes(packet_id, dup, retain)
        if not self.qos:
            raise ValueError("a QoS 0 PUBLISH carries no packet identifier")
        first = _FIRST_BYTES[(self.qos << 2) | (2 if dup else 0) | (1 if retain else 0)]
        return b"".join((first, self._rest, _U16.pack(packet_id))), self.payload


_FIRST_BYTES = [
    bytes((0x30 | (qos << 1) | (0x08 if flags & 2 else 0) | (flags & 1),))
    for qos in range(4)
    for flags in range(4)
]
"""PUBLISH first bytes indexed by (qos << 2) | (dup << 1) | retain."""


def _encode_connect(p: Connect) -> bytes:
    flags = 0x02 if p.clean_session else 0
    parts = [_string(p.client_id)]
    if p.will is not None:
        flags |= 0x04 | (p.will.qos << 3) | (0x20 if p.will.retain else 0)
        parts += (_string(p.will.topic), _binary(p.will.payload))
    if p.username is not None:
        flags |= 0x80
        parts.append(_string(p.username))
    if p.password is not None:
        flags |= 0x40
        parts.append(_binary(p.password))
    variable = _string(p.protocol_name) + bytes((p.protocol_level, flags)) + _U16.pack(p.keep_alive)
    return _packet(0x10, variable + b"".join(parts))


def _encode_subscribe(p: Subscribe) -> bytes:
    body = b"".join(_string(topic) + bytes((qos,)) for topic, qos in p.topics)
    return _packet(0x82, _U16.pack(p.packet_id) + body)


def _encode_unsubscribe(p: Unsubscribe) -> bytes:
    return _packet(0xA2, _U16.pack(p.packet_id) + b"".join(_string(t) for t in p.topics))


def _encode_ack(first: int) -> Callable[[Puback | Pubrec | Pubrel | Pubcomp | Unsuback], bytes]:
    prefix = bytes((first, 2))
    return lambda p: prefix + _U16.pack(p.packet_id)


def _encode_publish(p: Publish) -> bytes:
    return encode_publish(p.topic, p.payload, p.qos, p.retain, p.dup, p.packet_id)


def _encode_connack(p: Connack) -> bytes:
    return bytes((0x20, 2, 1 if p.session_present else 0, p.return_code))


def _encode_suback(p: Suback) -> bytes:
    return _packet(0x90, _U16.pack(p.packet_id) + bytes(p.return_codes))


_ENCODERS: Final[dict[type, Callable[[Any], bytes]]] = {
    Connect: _encode_connect,
    Connack: _encode_connack,
    Publish: _encode_publish,
    Puback: _encode_ack(0x40),
    Pubrec: _encode_ack(0x50),
    Pubrel: _encode_ack(0x62),
    Pubcomp: _encode_ack(0x70),
    Subscribe: _encode_subscribe,
    Suback: _encode_suback,
    Unsubscribe: _encode_unsubscribe,
    Unsuback: _encode_ack(0xB0),
    Pingreq: lambda p: b"\xc0\x00",
    Pingresp: lambda p: b"\xd0\x00",
    Disconnect: lambda p: b"\xe0\x00",
}


def encode(packet: Packet) -> bytes:
    """The wire bytes of any MQTT 3.1.1 control packet."""
    return _ENCODERS[type(packet)](packet)
