"""The fourteen MQTT 3.1.1 control packets, as plain immutable values.

Each class is named as the specification names the packet (section 3.x).  A packet value says
what is on the wire and nothing more: no connection state, no validation beyond what the type
system carries.  The decoder builds these from bytes; the encoder turns them back into bytes;
the channel consumes and produces them.  ``decode(encode(p)) == p`` holds for every valid ``p``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class PacketType(IntEnum):
    """The control packet type: the high nibble of the fixed header's first byte."""

    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14


class ConnackCode(IntEnum):
    """CONNACK return codes, [MQTT-3.2.2.3] table 3.1."""

    ACCEPTED = 0
    UNACCEPTABLE_PROTOCOL_VERSION = 1
    IDENTIFIER_REJECTED = 2
    SERVER_UNAVAILABLE = 3
    BAD_USERNAME_OR_PASSWORD = 4
    NOT_AUTHORIZED = 5


SUBACK_FAILURE = 0x80
"""SUBACK return code for a rejected topic filter [MQTT-3.9.3]."""


@dataclass(slots=True, frozen=True)
class Will:
    """The will message carried in a CONNECT (3.1.2.5 - 3.1.2.7)."""

    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False


@dataclass(slots=True, frozen=True)
class Connect:
    client_id: str
    clean_session: bool = True
    keep_alive: int = 0
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    protocol_name: str = "MQTT"
    protocol_level: int = 4


@dataclass(slots=True, frozen=True)
class Connack:
    session_present: bool
    return_code: int


@dataclass(slots=True, frozen=True)
class Publish:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None
    """Present exactly when ``qos > 0`` [MQTT-2.3.1-5]."""


@dataclass(slots=True, frozen=True)
class Puback:
    packet_id: int


@dataclass(slots=True, frozen=True)
class Pubrec:
    packet_id: int


@dataclass(slots=True, frozen=True)
class Pubrel:
    packet_id: int


@dataclass(slots=True, frozen=True)
class Pubcomp:
    packet_id: int


@dataclass(slots=True, frozen=True)
class Subscribe:
    packet_id: int
    topics: tuple[tuple[str, int], ...]
    """(topic filter, requested QoS) pairs, in the order the client sent them."""


@dataclass(slots=True, frozen=True)
class Suback:
    packet_id: int
    return_codes: tuple[int, ...]


@dataclass(slots=True, frozen=True)
class Unsubscribe:
    packet_id: int
    topics: tuple[str, ...]


@dataclass(slots=True, frozen=True)
class Unsuback:
    packet_id: int


@dataclass(slots=True, frozen=True)
class Pingreq:
    pass


@dataclass(slots=True, frozen=True)
class Pingresp:
    pass


@dataclass(slots=True, frozen=True)
class Disconnect:
    pass


Packet = (
    Connect
    | Connack
    | Publish
    | Puback
    | Pubrec
    | Pubrel
    | Pubcomp
    | Subscribe
    | Suback
    | Unsubscribe
    | Unsuback
    | Pingreq
    | Pingresp
    | Disconnect
)
