"""The pure parts of the front doors (``frontend.listeners``): PROXY headers read exactly or
greedily and parsed strictly, and the WebSocket adapter driven by wsproto's client side over a
fake socket."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import ssl
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from wsproto import WSConnection
from wsproto.connection import ConnectionType
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Message,
    Ping,
    Pong,
    RejectConnection,
    Request,
)

from frontend.config import TlsFiles
from frontend.deadlines import Deadlines
from frontend.listeners import (
    LOGGED_PEERS,
    Doors,
    WebSocket,
    arrival,
    certificate_identity,
    tls_context,
)
from frontend.proxy_protocol import (
    ANSWERS_KEPT,
    LOOPBACK,
    PROXY_V2_SIGNATURE,
    AllowList,
    ProxyHeader,
    ProxyHeaderError,
    ProxyHeaderReader,
    parse_v1,
    parse_v2,
)
from headwater.certs import ensure_dev_certs

# -- PROXY headers --------------------------------------------------------------------------------


def v2(command: int, family: int, block: bytes) -> bytes:
    """A v2 header: version 2, ``command``, ``family`` byte, then the address block (and TLVs)."""
    return (
        PROXY_V2_SIGNATURE + bytes([0x20 | command, family]) + struct.pack("!H", len(block)) + block
    )


def v2_inet(source: str, port: int, tlvs: bytes = b"") -> bytes:
    ip = ipaddress.ip_address(source)
    family = 0x11 if ip.version == 4 else 0x21
    destination = ipaddress.ip_address("10.0.0.1" if ip.version == 4 else "fd00::1")
    block = ip.packed + destination.packed + struct.pack("!HH", port, 1883) + tlvs
    return v2(1, family, block)


def read_header(
    stream: bytes, chunk: int = 1 << 20, exact: bool = True
) -> tuple[ProxyHeader | None, int, bytes]:
    """Feed ``stream`` as a socket would, each read at most ``chunk`` bytes and at most the
    window: the header, how many bytes of ``stream`` were read, and those past its end."""
    reader, used = ProxyHeaderReader(exact), 0
    while used < len(stream):
        window = reader.window()
        assert len(window) > 0
        n = min(len(window), chunk, len(stream) - used)
        window[:n] = stream[used : used + n]
        used += n
        header = reader.received(n)
        if header is not None:
            return header, used, reader.rest
    return None, used, b""


def read_exactly(stream: bytes, chunk: int = 1 << 20) -> tuple[ProxyHeader | None, int]:
    header, used, rest = read_header(stream, chunk)
    assert rest == b""
    return header, used


def read_greedily(stream: bytes, chunk: int = 1 << 20) -> tuple[ProxyHeader | None, bytes]:
    """The header, and what follows it: the bytes read past its end, then those left unread."""
    header, used, rest = read_header(stream, chunk, exact=False)
    return header, rest + stream[used:]


AFTER = b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x3c\x00\x00"
"""What follows a header here: a CONNECT, which the reader must leave alone."""

VALID = [
    (b"PROXY TCP4 203.0.113.7 10.0.0.1 4242 1883\r\n", ("203.0.113.7", 4242)),
    (b"PROXY TCP6 2001:db8::7 fd00::1 65535 1883\r\n", ("2001:db8::7", 65535)),
    (b"PROXY TCP4 1.2.3.4 5.6.7.8 0 1\r\n", ("1.2.3.4", 0)),
    (b"PROXY UNKNOWN\r\n", None),
    (b"PROXY UNKNOWN ffff:f...f:ffff 1.2.3.4 65535 65535\r\n", None),
    (v2_inet("203.0.113.7", 4242), ("203.0.113.7", 4242)),
    (v2_inet("2001:db8::7", 4242), ("2001:db8::7", 4242)),
    (v2_inet("203.0.113.7", 4242, tlvs=b"\x04\x00\x03abc" * 100), ("203.0.113.7", 4242)),
    (v2(0, 0x00, b""), None),  # LOCAL: the proxy's own health check
    (v2(0, 0x11, bytes(12)), None),  # LOCAL ignores an address block
    (v2(1, 0x00, b""), None),  # UNSPEC
    (v2(1, 0x31, bytes(216)), None),  # a Unix socket
]


@pytest.mark.parametrize(("header", "source"), VALID)
@pytest.mark.parametrize("chunk", [1, 2, 7, 1 << 20])
def test_a_header_is_read_exactly_and_not_one_byte_more(
    header: bytes, source: tuple[str, int] | None, chunk: int
) -> None:
    assert read_exactly(header + AFTER, chunk) == (ProxyHeader(source), len(header))


@pytest.mark.parametrize(("header", "source"), VALID)
@pytest.mark.parametrize("chunk", [1, 2, 7, 1 << 20])
def test_a_greedy_read_keeps_what_follows_the_header_for_the_stream(
    header: bytes, source: tuple[str, int] | None, chunk: int
) -> None:
    assert read_greedily(header + AFTER, chunk) == (ProxyHeader(source), AFTER)


def test_a_greedy_read_takes_haproxys_header_and_a_connect_in_one_read() -> None:
    reader = ProxyHeaderReader(exact=False)
    data = v2_inet("203.0.113.7", 4242) + AFTER
    reader.window()[: len(data)] = data
    assert reader.received(len(data)) == ProxyHeader(("203.0.113.7", 4242))
    assert reader.rest == AFTER


ipv4 = st.ip_addresses(v=4).map(str)
ipv6 = st.ip_addresses(v=6).map(str)
ports = st.integers(0, 65535)


@st.composite
def headers(draw: st.DrawFn) -> tuple[bytes, tuple[str, int] | None]:
    version = draw(st.sampled_from(["v1-4", "v1-6", "v1-unknown", "v2"]))
    if version == "v1-unknown":
        rest = draw(st.text("0123456789abcdef.: ", max_size=80))
        return b"PROXY UNKNOWN" + (b" " + rest.encode() if rest else b"") + b"\r\n", None
    if version == "v2":
        source = draw(ipv4 | ipv6)
        port = draw(ports)
        return v2_inet(source, port, draw(st.binary(max_size=300))), (source, port)
    address = ipv4 if version == "v1-4" else ipv6
    source, destination = draw(address), draw(address)
    port, dport = draw(ports), draw(ports)
    family = b"TCP4" if version == "v1-4" else b"TCP6"
    line = b"PROXY %s %s %s %d %d\r\n" % (
        family,
        source.encode(),
        destination.encode(),
        port,
        dport,
    )
    return line, (str(ipaddress.ip_address(source)), port)


@given(headers(), st.binary(max_size=40), st.integers(1, 200))
@settings(max_examples=400, deadline=None)
def test_any_valid_header_is_read_exactly(
    case: tuple[bytes, tuple[str, int] | None], after: bytes, chunk: int
) -> None:
    header, source = case
    assert read_exactly(header + after, chunk) == (ProxyHeader(source), len(header))


@given(headers(), st.binary(max_size=40), st.integers(1, 200))
@settings(max_examples=400, deadline=None)
def test_any_valid_header_is_read_greedily_losing_nothing_after_it(
    case: tuple[bytes, tuple[str, int] | None], after: bytes, chunk: int
) -> None:
    header, source = case
    assert read_greedily(header + after, chunk) == (ProxyHeader(source), after)


@given(st.binary(max_size=300), st.integers(1, 50), st.booleans())
@settings(max_examples=400, deadline=None)
def test_random_bytes_raise_only_the_header_error(data: bytes, chunk: int, exact: bool) -> None:
    with contextlib.suppress(ProxyHeaderError):
        read_header(data, chunk, exact)


BAD = [
    AFTER,  # plain MQTT, no header
    b"GET /mqtt HTTP/1.1\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",  # a TLS ClientHello
    b"PROXY TCP5 1.2.3.4 5.6.7.8 1 2\r\n",
    b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2 3\r\n",
    b"PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n",
    b"PROXY TCP4 1.2.3.256 5.6.7.8 1 2\r\n",
    b"PROXY TCP4 2001:db8::1 5.6.7.8 1 2\r\n",
    b"PROXY TCP6 1.2.3.4 5.6.7.8 1 2\r\n",
    b"PROXY TCP4 1.2.3.4 5.6.7.8 01 2\r\n",
    b"PROXY TCP4 1.2.3.4 5.6.7.8 65536 2\r\n",
    b"PROXY TCP4 1.2.3.4 5.6.7.8 -1 2\r\n",
    b"PROXY TCP4  1.2.3.4 5.6.7.8 1 2\r\n",
    b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n",
    b"PROXY TCP4 1.2.3.4\r5.6.7.8 1 2\r\n",
    b"PROXY UNKNOWN" + b"x" * 100 + b"\r\n",  # longer than 107 bytes
    b"proxy TCP4 1.2.3.4 5.6.7.8 1 2\r\n",
    v2(1, 0x11, bytes(11)),  # an address block too short for IPv4
    v2(1, 0x21, bytes(35)),  # and for IPv6
    v2(1, 0x12, bytes(12)),  # UDP
    v2(1, 0x41, bytes(12)),  # an unknown family
    v2(2, 0x11, bytes(12)),  # an unknown command
    b"\r\n\r\n\x00\r\nQUIT\n\x11\x11\x00\x0c" + bytes(12),  # version 1
    b"\r\n\r\n\x00\r\nQUIX\n\x21\x11\x00\x0c" + bytes(12),
]


@pytest.mark.parametrize("exact", [True, False])
@pytest.mark.parametrize("data", BAD)
def test_a_bad_header_is_refused(data: bytes, exact: bool) -> None:
    with pytest.raises(ProxyHeaderError):
        read_header(data + b"\r\n" * 60, exact=exact)


@pytest.mark.parametrize(
    "data", [AFTER[:15], b"GET / HTTP/1.1\r", b"\x16\x03\x01", b"PROXX", b"\r\n\r\n\x01"]
)
@pytest.mark.parametrize("exact", [True, False])
def test_what_is_no_header_is_refused_at_its_first_bytes(data: bytes, exact: bool) -> None:
    """A client that sends plain MQTT to a proxy listener is closed at once, not timed out."""
    reader = ProxyHeaderReader(exact)
    window = reader.window()
    window[: len(data)] = data
    with pytest.raises(ProxyHeaderError):
        reader.received(len(data))


@pytest.mark.parametrize("exact", [True, False])
@pytest.mark.parametrize(("header", "_source"), VALID)
def test_a_truncated_header_is_never_complete(header: bytes, _source: object, exact: bool) -> None:
    for cut in range(1, len(header)):
        assert read_header(header[:cut], exact=exact) == (None, cut, b"")


def test_parsers_refuse_headers_given_whole() -> None:
    assert parse_v1(b"PROXY TCP4 203.0.113.7 10.0.0.1 4242 1883\r\n").source == (
        "203.0.113.7",
        4242,
    )
    with pytest.raises(ProxyHeaderError):
        parse_v1(b"PROXY\r\n")
    with pytest.raises(ProxyHeaderError):
        parse_v2(PROXY_V2_SIGNATURE)


# -- TLS --------------------------------------------------------------------------------------


def test_tls_context_verifies_client_certificates_as_configured(tmp_path: Path) -> None:
    certs = ensure_dev_certs(tmp_path)
    server = TlsFiles(str(certs.server.cert), str(certs.server.key))
    plain = tls_context(server)
    assert plain.minimum_version is ssl.TLSVersion.TLSv1_2
    assert plain.verify_mode is ssl.CERT_NONE
    server.cafile = str(certs.cafile)
    assert tls_context(server).verify_mode is ssl.CERT_OPTIONAL
    server.require_certificate = True
    assert tls_context(server).verify_mode is ssl.CERT_REQUIRED
    with pytest.raises(ValueError, match="TLS certificate"):
        tls_context(TlsFiles(str(tmp_path / "none.crt"), str(certs.server.key)))


class Extra:
    def __init__(self, **extra: Any) -> None:
        self.extra = extra

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.extra.get(name, default)


def test_the_certificate_identity_is_the_subject_cn() -> None:
    cert = {"subject": ((("countryName", "NL"),), (("commonName", "device-7"),))}
    assert certificate_identity(Extra(peercert=cert)) == "device-7"  # type: ignore[arg-type]
    no_cn = {"subject": ((("organizationName", "x"),),)}
    assert certificate_identity(Extra(peercert=no_cn)) is None  # type: ignore[arg-type]
    assert certificate_identity(Extra(peercert={})) is None  # type: ignore[arg-type]
    assert certificate_identity(Extra()) is None  # type: ignore[arg-type]


# -- the bound --------------------------------------------------------------------------------


async def test_refusals_are_counted_every_time_and_logged_once_a_second(
    caplog: pytest.LogCaptureFixture,
) -> None:
    doors = Doors(FakeStream, lambda: 3, Deadlines(), 5.0, max_connections=3)
    caplog.set_level(logging.WARNING, "headwater.listeners")
    for _ in range(100):
        assert not doors.admit(FakeTransport())  # type: ignore[arg-type]
    assert doors.refused["refused_max_connections"] == 100
    assert len(caplog.records) == 1
    doors.in_use = lambda: 2
    assert doors.admit(FakeTransport())  # type: ignore[arg-type]


# -- WebSocket --------------------------------------------------------------------------------


class FakeTransport:
    """The socket (or TLS) transport under a WebSocket: what it was sent, and whether closed."""

    def __init__(self) -> None:
        self.sent = bytearray()
        self.closed = False
        self.reading = True
        self.limits: tuple[int | None, int | None] | None = None

    def write(self, data: bytes) -> None:
        assert not self.closed
        self.sent += data

    def take(self) -> bytes:
        data, self.sent = bytes(self.sent), bytearray()
        return data

    def close(self) -> None:
        self.closed = True

    abort = close

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("192.0.2.1", 5555), "peercert": {"subject": ()}}.get(name, default)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.limits = (high, low)

    def get_write_buffer_size(self) -> int:
        return len(self.sent)


class FakeStream:
    """An MqttConnection's stand-in: what it was given."""

    def __init__(self) -> None:
        self.peer: tuple[str, int] | None = None
        self.transport: Any = None
        self.received = bytearray()
        self.lost: list[Exception | None] = []
        self.paused = False

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        transport.set_write_buffer_limits(high=1 << 20)

    def data_received(self, data: bytes) -> None:
        self.received += data

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.append(exc)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False


class Harness:
    """A WebSocket between a fake socket and a fake stream, and wsproto's client on the other
    end of the socket."""

    def __init__(self, peer: tuple[str, int] | None = None) -> None:
        self.streams: list[FakeStream] = []
        self.doors = Doors(self._make, lambda: len(self.streams), Deadlines(), 5.0)
        self.socket = FakeTransport()
        self.ws = WebSocket(self.doors, peer, asyncio.get_running_loop().time())
        self.ws.connection_made(self.socket)  # type: ignore[arg-type]
        self.client = WSConnection(ConnectionType.CLIENT)

    def _make(self) -> FakeStream:
        self.streams.append(FakeStream())
        return self.streams[-1]

    @property
    def stream(self) -> FakeStream:
        (stream,) = self.streams
        return stream

    def send(self, data: bytes, chunk: int = 1 << 20) -> list[Any]:
        """Client bytes to the WebSocket, ``chunk`` bytes a read; the client's events back."""
        for i in range(0, len(data), chunk):
            self.ws.data_received(data[i : i + chunk])
        self.client.receive_data(self.socket.take())
        return list(self.client.events())

    def upgrade(self, chunk: int = 1 << 20, **request: Any) -> list[Any]:
        fields = {"host": "localhost", "target": "/mqtt", "subprotocols": ["mqtt"], **request}
        return self.send(self.client.send(Request(**fields)), chunk)


async def test_an_upgrade_to_mqtt_starts_the_stream_with_the_websocket_as_its_transport() -> None:
    h = Harness(peer=("203.0.113.7", 4242))
    assert h.doors.arriving == {h.ws}
    assert h.upgrade(chunk=1) == [AcceptConnection(subprotocol="mqtt")]
    assert h.stream.transport is h.ws
    assert h.stream.peer == ("203.0.113.7", 4242)
    assert h.doors.arriving == set()
    assert h.socket.limits == (1 << 20, None)  # delegated to the socket
    assert h.ws.get_extra_info("peername") == ("192.0.2.1", 5555)
    assert h.ws.get_extra_info("peercert") == {"subject": ()}


@pytest.mark.parametrize(
    ("offered", "chosen"),
    [(["mqtt"], "mqtt"), (["mqttv3.1"], "mqttv3.1"), (["wamp", "mqttv3.1", "mqtt"], "mqttv3.1")],
)
async def test_the_first_mqtt_subprotocol_offered_is_answered(
    offered: list[str], chosen: str
) -> None:
    h = Harness()
    assert h.upgrade(subprotocols=offered) == [AcceptConnection(subprotocol=chosen)]


@pytest.mark.parametrize(
    ("request_fields", "status"),
    [
        ({"target": "/"}, 404),
        ({"target": "/mqttx"}, 404),
        ({"subprotocols": []}, 400),
        ({"subprotocols": ["wamp", "MQTT"]}, 400),
    ],
)
async def test_a_wrong_path_or_subprotocol_is_refused_and_closed(
    request_fields: dict[str, Any], status: int
) -> None:
    h = Harness()
    events = h.upgrade(**request_fields)
    assert isinstance(events[0], RejectConnection) and events[0].status_code == status
    assert h.socket.closed and h.streams == []
    assert h.doors.refused["websocket_upgrades_refused"] == 1
    assert h.doors.arriving == set()


@pytest.mark.parametrize(
    "data",
    [
        b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x3c\x00\x00",  # MQTT without the upgrade
        b"GET /mqtt HTTP/1.1\r\nHost: x\r\n\r\n",  # no Upgrade, no key
        b"POST /mqtt HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
        b"GET /mqtt HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 8\r\n\r\n",
    ],
)
async def test_what_is_no_websocket_upgrade_gets_an_http_error_and_is_closed(data: bytes) -> None:
    h = Harness()
    h.ws.data_received(data)
    assert h.socket.take().split(b" ")[1] in (b"400", b"426")
    assert h.socket.closed and h.streams == []


async def test_packets_split_across_frames_and_packed_in_one_arrive_as_one_stream() -> None:
    h = Harness()
    h.upgrade()
    stream = bytes(range(256)) * 3
    frames = h.client.send(Message(data=stream[:5], message_finished=False))  # a fragment
    frames += h.client.send(Message(data=stream[5:300]))
    frames += h.client.send(Message(data=stream[300:]))
    assert h.send(frames, chunk=1) == []
    assert bytes(h.stream.received) == stream


async def test_what_the_stream_writes_goes_out_in_binary_frames() -> None:
    h = Harness()
    h.upgrade()
    h.stream.transport.write(b"\x20\x02\x00\x00")
    h.stream.transport.write(b"\xd0\x00")
    h.client.receive_data(h.socket.take())
    assert [(type(e), getattr(e, "data", None)) for e in h.client.events()] == [
        (BytesMessage, b"\x20\x02\x00\x00"),
        (BytesMessage, b"\xd0\x00"),
    ]


async def test_a_ping_is_answered_with_a_pong() -> None:
    h = Harness()
    h.upgrade()
    assert h.send(h.client.send(Ping(b"hello"))) == [Pong(b"hello")]


async def test_the_clients_close_is_answered_and_the_socket_closed() -> None:
    h = Harness()
    h.upgrade()
    (answer,) = h.send(h.client.send(CloseConnection(code=1000)))
    assert isinstance(answer, CloseConnection) and answer.code == 1000
    assert h.socket.closed
    h.ws.connection_lost(None)
    assert h.stream.lost == [None]


async def test_a_text_frame_closes_the_connection() -> None:
    h = Harness()
    h.upgrade()
    events = h.send(h.client.send(Message(data="\x10\x0c")))
    assert [type(e) for e in events] == [CloseConnection] and events[0].code == 1003
    assert h.socket.closed and h.doors.refused["websocket_errors"] == 1
    assert h.stream.received == b""


async def test_an_unmasked_frame_is_a_protocol_error() -> None:
    h = Harness()
    h.upgrade()
    h.ws.data_received(b"\x82\x02\x10\x00")  # a binary frame, not masked as a client's must be
    assert h.socket.closed and h.doors.refused["websocket_errors"] == 1
    assert h.stream.received == b""


async def test_the_streams_close_waits_for_the_clients_close_frame() -> None:
    h = Harness()
    h.upgrade()
    h.stream.transport.close()
    assert h.ws.is_closing() and not h.socket.closed
    h.client.receive_data(h.socket.take())
    (close,) = h.client.events()
    assert isinstance(close, CloseConnection) and close.code == 1000
    h.stream.transport.write(b"late")  # dropped: the stream has closed
    assert h.socket.sent == b""
    late = b"\x82\x87" + bytes(4) + b"ignored"  # sent before the client saw our close
    h.ws.data_received(late + h.client.send(close.response()))
    assert h.socket.closed and h.stream.received == b""


async def test_a_client_that_never_answers_the_close_is_closed_by_the_wheel() -> None:
    h = Harness()
    h.upgrade()
    h.stream.transport.close()
    assert h.ws.due() == pytest.approx(asyncio.get_running_loop().time() + 2.0, abs=0.5)
    h.ws.expire()
    assert h.socket.closed and h.doors.refused["handshake_timeouts"] == 0


async def test_frames_sent_with_the_upgrade_request_are_not_lost() -> None:
    h = Harness()
    request = h.client.send(Request(host="localhost", target="/mqtt", subprotocols=["mqtt"]))
    frame = b"\x82\x82" + bytes(4) + b"\x10\x0c"  # masked with zeros, as a client may
    h.ws.data_received(request + frame)
    assert h.stream.received == b"\x10\x0c"


async def test_flow_control_is_passed_on() -> None:
    h = Harness()
    h.upgrade()
    h.ws.pause_writing()
    assert h.stream.paused
    h.ws.resume_writing()
    assert not h.stream.paused
    h.stream.transport.pause_reading()
    assert not h.socket.reading
    h.stream.transport.resume_reading()
    assert h.socket.reading


async def test_no_upgrade_within_the_timeout_is_refused_by_the_wheel() -> None:
    h = Harness()
    assert h.ws.due() == pytest.approx(h.ws.opened + 5.0)
    h.ws.expire()
    assert h.socket.closed and h.doors.refused["handshake_timeouts"] == 1
    h.ws.data_received(h.client.send(Request(host="x", target="/mqtt", subprotocols=["mqtt"])))
    assert h.streams == [] and h.socket.sent == b""


# -- only the load balancer speaks PROXY; the WebSocket Origin allow-list ---------------------


def test_the_proxy_allow_list_takes_networks_and_addresses() -> None:
    allow = AllowList.parse("10.0.0.0/8, 192.0.2.7,2001:db8::/32")
    assert allow.allows("10.1.2.3") and allow.allows("192.0.2.7")
    assert allow.allows("2001:db8::1") and allow.allows("::ffff:10.9.9.9")  # dual-stack socket
    assert not allow.allows("192.0.2.8") and not allow.allows("127.0.0.1")
    assert not allow.allows("") and not allow.allows("not an address")
    assert AllowList.parse(LOOPBACK).allows("127.0.0.1") and AllowList.parse(LOOPBACK).allows("::1")
    for bad in ("", "10.0.0.0/33", "example.com", "10.0.0.0/8,,x"):
        with pytest.raises(ValueError):
            AllowList.parse(bad)


def test_the_proxy_allow_list_keeps_a_bounded_number_of_answers() -> None:
    allow = AllowList.parse("10.0.0.0/8")
    for i in range(ANSWERS_KEPT + 100):  # a peer for every address: the answers stay bounded
        assert allow.allows(str(ipaddress.IPv4Address(0x0A000000 + i)))
    assert len(allow._answers) == ANSWERS_KEPT
    assert not allow.allows("192.0.2.1") and allow.allows("10.0.0.1")
    assert allow == AllowList.parse("10.0.0.0/8")  # what it has seen is not part of its value


class Peer(FakeTransport):
    def __init__(self, host: str) -> None:
        super().__init__()
        self.host = host

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return (self.host, 40000) if name == "peername" else default


async def test_a_peer_outside_the_allow_list_is_closed_at_accept_counted_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    doors = Doors(
        FakeStream, lambda: 0, Deadlines(), 5.0, proxy_protocol=True,
        proxy_allow=AllowList.parse("10.0.0.0/8"),
    )  # fmt: skip
    caplog.set_level(logging.WARNING, "headwater.listeners")
    for host in ("192.0.2.1", "192.0.2.1", "192.0.2.2", "192.0.2.1"):
        peer = Peer(host)
        arrival(doors, "mqtt").connection_made(peer)  # type: ignore[arg-type]
        assert peer.closed
    assert doors.refused["proxy_not_allowed"] == 4
    assert [r.getMessage().split()[2] for r in caplog.records] == [
        "192.0.2.1:40000",
        "192.0.2.2:40000",
    ]
    assert "believed only from 10.0.0.0/8 (--proxy-allow)" in caplog.records[0].getMessage()
    allowed = Peer("10.0.0.9")
    arrival(doors, "mqtt").connection_made(allowed)  # type: ignore[arg-type]
    assert not allowed.closed and len(doors.arriving) == 1
    doors.close()


class Accepted(Peer):
    """A socket from a load balancer whose protocol the arrival hands over."""

    def __init__(self) -> None:
        super().__init__("127.0.0.1")
        self.protocol: Any = None

    def set_protocol(self, protocol: Any) -> None:
        self.protocol = protocol


@pytest.mark.parametrize("chunk", [1, 5, 1 << 16])
async def test_the_stream_gets_what_follows_the_proxy_header_once_and_in_order(chunk: int) -> None:
    """Behind a plain listener the header is read greedily: a CONNECT that came with it (in
    the same read, or in reads of any size) reaches the stream whole, after its
    ``connection_made``, and later bytes after it."""
    doors = Doors(FakeStream, lambda: 0, Deadlines(), 5.0, proxy_protocol=True)
    socket, protocol = Accepted(), arrival(doors, "mqtt")
    protocol.connection_made(socket)  # type: ignore[arg-type]
    data, reads = v2_inet("203.0.113.7", 4242) + AFTER, 0
    while socket.protocol is None:
        window = protocol.get_buffer(65536)  # type: ignore[union-attr]
        n = min(len(window), chunk, len(data))
        window[:n], data, reads = data[:n], data[n:], reads + 1
        protocol.buffer_updated(n)  # type: ignore[union-attr]
    stream = socket.protocol
    assert stream.transport is socket and stream.peer == ("203.0.113.7", 4242)
    stream.data_received(data + b"\xe0\x00")  # what the socket has next goes to the stream
    assert bytes(stream.received) == AFTER + b"\xe0\x00"
    if chunk == 1 << 16:
        assert reads == 1
    assert not doors.arriving


async def test_behind_a_tls_listener_the_header_is_read_exactly() -> None:
    """The ClientHello after the header is the TLS handshake's, left in the socket."""
    doors = Doors(FakeStream, lambda: 0, Deadlines(), 5.0, proxy_protocol=True)
    protocol = arrival(doors, "mqtts")
    protocol.connection_made(Accepted())  # type: ignore[arg-type]
    header = v2_inet("203.0.113.7", 4242)
    used = 0
    while protocol.header is not None:
        window = protocol.get_buffer(65536)  # type: ignore[union-attr]
        assert used + len(window) <= len(header)
        n = len(window)
        window[:n] = header[used : used + n]
        used += n
        protocol.buffer_updated(n)  # type: ignore[union-attr]
    assert used == len(header) and protocol.early is None
    doors.close()


async def test_the_addresses_logged_are_bounded(caplog: pytest.LogCaptureFixture) -> None:
    doors = Doors(FakeStream, lambda: 0, Deadlines(), 5.0, proxy_protocol=True)
    caplog.set_level(logging.WARNING, "headwater.listeners")
    for i in range(LOGGED_PEERS + 10):
        doors.believes(Peer(str(ipaddress.IPv4Address(0x0A000000 + i))))  # type: ignore[arg-type]
    assert len(doors.peers_logged) == LOGGED_PEERS
    assert len(caplog.records) == LOGGED_PEERS + 10  # each a new address


@pytest.mark.parametrize(
    ("origin", "accepted"),
    [
        (None, True),  # no Origin: not a browser
        (b"https://app.example.com", True),
        (b"HTTPS://App.Example.com/", True),
        (b"https://evil.example.com", False),
        (b"null", False),
    ],
)
async def test_a_websocket_origin_not_listed_gets_403(origin: bytes | None, accepted: bool) -> None:
    h = Harness()
    h.doors.ws_origins = frozenset({"https://app.example.com"})
    extra = [(b"origin", origin)] if origin is not None else []
    events = h.upgrade(extra_headers=extra)
    if accepted:
        assert events == [AcceptConnection(subprotocol="mqtt")]
        return
    assert isinstance(events[0], RejectConnection) and events[0].status_code == 403
    assert h.socket.closed and h.streams == []
    assert h.doors.refused["websocket_upgrades_refused"] == 1


async def test_without_an_origin_list_any_origin_is_served() -> None:
    h = Harness()
    events = h.upgrade(extra_headers=[(b"origin", b"https://anywhere.example")])
    assert events == [AcceptConnection(subprotocol="mqtt")]
