"""The load generator's own MQTT 3.1.1: the few packets a client sends, framing of what comes back.

Nothing here comes from Headwater (tests/unit/test_architecture.py checks that bench/ imports no
package of the product): a bug in the product's codec cannot hide one in the broker.  Encoders
return ``bytes``; :func:`split_all` takes every whole packet off the front of a receive buffer in
one pass (one ``del`` per call, never per packet) as (first byte, body) pairs, and
:func:`parse_publish` reads a PUBLISH body.  :class:`Stream` is a plain asyncio-streams client for
probes that send a few packets and read the answers one by one.

An :class:`Endpoint` is where a client connects: a Headwater node of ``headwater dev up`` listens
behind HAProxy with ``--proxy-protocol``, so a client that goes to the node directly (to choose
its node) first sends the PROXY v2 header HAProxy would (:func:`proxy_v2`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import NamedTuple


class Endpoint(NamedTuple):
    host: str
    port: int
    proxy: bool = False
    """Open with a PROXY v2 header (a node behind HAProxy, reached directly)."""

    def hello(self) -> bytes:
        """What a connection writes before its CONNECT."""
        return proxy_v2(self.host, self.port) if self.proxy else b""


def proxy_v2(host: str, port: int) -> bytes:
    """A PROXY protocol v2 header for a TCP/IPv4 connection from ``host`` to ``host:port``."""
    addr = bytes(int(x) for x in host.split("."))
    body = addr + addr + (40000).to_bytes(2, "big") + port.to_bytes(2, "big")
    return b"\r\n\r\n\x00\r\nQUIT\n" + bytes((0x21, 0x11)) + len(body).to_bytes(2, "big") + body


Login = tuple[str, str]
"""A user name and password, for a broker that refuses anonymous clients."""
CONNACK, PUBLISH, PUBACK, SUBACK, PINGRESP = 2, 3, 4, 9, 13
DISCONNECT = bytes((0xE0, 0))
PINGREQ = bytes((0xC0, 0))


def varint(n: int) -> bytes:
    """The Remaining Length encoding [MQTT-2.2.3]."""
    out = bytearray()
    while True:
        n, digit = n >> 7, n & 0x7F
        out.append(digit | (0x80 if n else 0))
        if not n:
            return bytes(out)


def text(s: str) -> bytes:
    raw = s.encode()
    return len(raw).to_bytes(2, "big") + raw


def packet(first: int, body: bytes) -> bytes:
    return bytes((first,)) + varint(len(body)) + body


def connect(
    client_id: str,
    clean: bool = True,
    login: Login | None = None,
    keep_alive: int = 60,
    will: tuple[str, bytes, int] | None = None,
) -> bytes:
    flags, payload = (0x02 if clean else 0), text(client_id)
    if will is not None:
        flags |= 0x04 | will[2] << 3
        payload += text(will[0]) + len(will[1]).to_bytes(2, "big") + will[1]
    if login is not None:
        flags |= 0xC0
        payload += text(login[0]) + text(login[1])
    head = text("MQTT") + bytes((4, flags)) + keep_alive.to_bytes(2, "big")
    return packet(0x10, head + payload)


def subscribe(packet_id: int, filters: Sequence[str], qos: int = 1) -> bytes:
    body = b"".join(text(f) + bytes((qos,)) for f in filters)
    return packet(0x82, packet_id.to_bytes(2, "big") + body)


def publish(
    topic: str, payload: bytes, packet_id: int = 0, retain: bool = False, qos: int = 1
) -> bytes:
    """A PUBLISH; QoS 1 unless ``qos`` is 0 (then ``packet_id`` is left out)."""
    pid = packet_id.to_bytes(2, "big") if qos else b""
    return packet(0x30 | qos << 1 | retain, text(topic) + pid + payload)


def puback(packet_id: int) -> bytes:
    return bytes((0x40, 2)) + packet_id.to_bytes(2, "big")


PUBACKS: tuple[bytes, ...] = tuple(puback(i) if i else b"" for i in range(65536))
"""Every PUBACK a subscriber may send, encoded once."""


def split_packet(buf: bytearray) -> tuple[int, bytes] | None:
    """Take the first whole packet off ``buf``: (first byte, body); None if it is incomplete."""
    found, used = _next(buf, 0)
    if found is None:
        return None
    del buf[:used]
    return found


def split_all(buf: bytearray) -> list[tuple[int, bytes]]:
    """Take every whole packet off the front of ``buf``."""
    out, pos = [], 0
    while True:
        found, end = _next(buf, pos)
        if found is None:
            break
        out.append(found)
        pos = end
    if pos:
        del buf[:pos]
    return out


def _next(buf: bytearray, start: int) -> tuple[tuple[int, bytes] | None, int]:
    length, shift, pos = 0, 0, start + 1
    while True:
        if pos >= len(buf):
            return None, start
        length |= (buf[pos] & 0x7F) << shift
        shift, pos = shift + 7, pos + 1
        if buf[pos - 1] < 0x80:
            break
    if len(buf) < pos + length:
        return None, start
    return (buf[start], bytes(buf[pos : pos + length])), pos + length


class Publish(NamedTuple):
    topic: str
    payload: bytes
    qos: int
    packet_id: int
    retain: bool


def parse_publish(first: int, body: bytes) -> Publish:
    size = int.from_bytes(body[:2], "big")
    qos = (first >> 1) & 3
    at = 2 + size
    packet_id = int.from_bytes(body[at : at + 2], "big") if qos else 0
    payload = body[at + 2 :] if qos else body[at:]
    return Publish(body[2:at].decode(), payload, qos, packet_id, bool(first & 1))


class Stream:
    """One raw MQTT connection on asyncio streams: sends bytes, reads whole packets."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.buf = bytearray()

    @classmethod
    async def open(cls, at: Endpoint) -> Stream:
        stream = cls(*await asyncio.open_connection(at.host, at.port))
        stream.send(at.hello())
        return stream

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    async def next(self, timeout: float) -> tuple[int, bytes] | None:
        """The next packet; None once the broker closed the connection; TimeoutError if none
        came within ``timeout``."""
        deadline = time.monotonic() + timeout
        while (found := split_packet(self.buf)) is None:
            try:
                data = await asyncio.wait_for(
                    self.reader.read(1 << 16), deadline - time.monotonic()
                )
            except (ConnectionError, OSError):
                return None
            if not data:
                return None
            self.buf += data
        return found

    async def expect(self, kind: int, timeout: float = 10.0) -> bytes | None:
        """The body of the next packet of type ``kind`` (others skipped); None if closed."""
        while (found := await self.next(timeout)) is not None:
            if found[0] >> 4 == kind:
                return found[1]
        return None

    async def receive(self, want: int, idle: float, most: float) -> list[Publish]:
        """The PUBLISHes received (each QoS 1 one PUBACKed) until ``want`` came, none for
        ``idle`` seconds, ``most`` seconds passed or the socket closed."""
        got: list[Publish] = []
        deadline = time.monotonic() + most
        while len(got) < want and (left := deadline - time.monotonic()) > 0:
            try:
                found = await self.next(min(idle, left))
            except TimeoutError:
                break
            if found is None:
                break
            if found[0] >> 4 == PUBLISH:
                got.append(p := parse_publish(*found))
                if p.qos:
                    self.send(PUBACKS[p.packet_id])
        return got

    async def publish_all(
        self, messages: Sequence[tuple[str, bytes]], retain: bool = False
    ) -> None:
        """Publish ``messages`` at QoS 1 and wait for every PUBACK."""
        for i, (topic, payload) in enumerate(messages):
            self.send(publish(topic, payload, i % 65535 + 1, retain))
        for _ in messages:
            if await self.expect(PUBACK, timeout=30.0) is None:
                raise RuntimeError("closed before every PUBACK came")

    def close(self) -> None:
        self.writer.transport.abort()


async def login(
    at: Endpoint, client_id: str, clean: bool = True, who: Login | None = None, **kw: object
) -> tuple[Stream, tuple[int, bool] | None]:
    """A connection and its CONNACK (return code, session present), None if closed first."""
    client = await Stream.open(at)
    client.send(connect(client_id, clean, who, **kw))  # type: ignore[arg-type]
    body = await client.expect(CONNACK)
    return client, (body[1], bool(body[0] & 1)) if body is not None else None


async def connected(
    at: Endpoint, client_id: str, clean: bool = True, who: Login | None = None, **kw: object
) -> Stream:
    """A connection that got CONNACK 0; RuntimeError otherwise."""
    client, connack = await login(at, client_id, clean, who, **kw)
    if connack is None or connack[0] != 0:
        client.close()
        raise RuntimeError(f"{client_id}: CONNACK {connack}")
    return client
