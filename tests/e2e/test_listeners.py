"""The front doors of a real node (``frontend.listeners``): MQTT over TLS, WebSocket and secure
WebSocket with real clients (paho-mqtt, MQTT.js), PROXY protocol v1/v2 headers, bad input on
every door, and ``--max-connections``.

Nodes run in the test's event loop (the default asyncio loop) against the session's Kafka, on
ephemeral ports; one test runs a node process, which runs on uvloop as ``python -m frontend``
does, and one drives the doors alone, with an echo stream, on both loops.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import ssl
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvloop
from wsproto import WSConnection
from wsproto.connection import ConnectionType
from wsproto.events import AcceptConnection, BytesMessage, Message, RejectConnection, Request

from frontend.auth import hash_password
from frontend.config import LISTENER_KINDS, Listener, TlsFiles
from frontend.deadlines import Deadlines
from frontend.listeners import Doors, serve
from frontend.proxy_protocol import PROXY_V2_SIGNATURE
from headwater.certs import Pair, ensure_dev_certs, issue
from headwater.services.ports import free_port
from mqttcore.codec import Decoder, encode
from mqttcore.packets import Connack, Connect, Packet, Pingreq, Suback, Subscribe
from tests.e2e.conftest import PARTITIONS, NodeFactory, eventually
from tests.e2e.rawmqtt import RawClient
from tests.e2e.realclients import HOST, Clients, PahoClient, Received, aiomqtt_next

pytestmark = pytest.mark.timeout(90)

JS_DIR = Path(__file__).resolve().parents[1] / "js"

SOURCE = ("203.0.113.7", 4242)
"""The made-up client address the PROXY headers here carry."""
V1 = b"PROXY TCP4 203.0.113.7 10.0.0.1 4242 1883\r\n"
V2 = (
    PROXY_V2_SIGNATURE
    + b"\x21\x11\x00\x0c"
    + bytes([203, 0, 113, 7, 10, 0, 0, 1])
    + struct.pack("!HH", 4242, 1883)
)

# -- fixtures -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Certs:
    ca: Path
    server: Pair
    device: Pair
    """A client certificate whose CN is ``device-7``."""

    def files(self, **flags: bool) -> TlsFiles:
        return TlsFiles(str(self.server.cert), str(self.server.key), str(self.ca), **flags)

    def client(self, certificate: bool = False) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca))
        if certificate:
            context.load_cert_chain(str(self.device.cert), str(self.device.key))
        return context


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    directory = tmp_path_factory.mktemp("certs")
    dev = ensure_dev_certs(directory)
    device = Pair(directory / "device-7.crt", directory / "device-7.key")
    issue(dev.ca, device, "device-7")
    return Certs(dev.cafile, dev.server, device)


def doors(*kinds: str) -> list[Listener]:
    return [Listener(kind, HOST, 0) for kind in kinds]


# -- clients --------------------------------------------------------------------------------------


async def paho(port: int, client_id: str, kind: str, certs: Certs) -> PahoClient:
    """paho-mqtt through the door ``kind``, the server's certificate verified on TLS doors."""
    client = PahoClient(port, client_id)
    if kind in ("ws", "wss"):
        client.client.transport = "websockets"
        client.client.ws_set_options(path="/mqtt")
    if kind in ("mqtts", "wss"):
        client.client.tls_set(ca_certs=str(certs.ca))
    await client.connect()
    return client


async def tls_raw(port: int, context: ssl.SSLContext, header: bytes = b"") -> RawClient:
    """A raw MQTT client over TLS, after ``header`` (a PROXY header) if given."""
    reader, writer = await asyncio.open_connection(HOST, port)
    writer.write(header)
    await writer.drain()
    await writer.start_tls(context, server_hostname=HOST)
    return RawClient(reader, writer)


class WsClient:
    """A raw MQTT client over WebSocket (wsproto's client side) on any stream."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.ws = WSConnection(ConnectionType.CLIENT)
        self.decoder = Decoder()
        self.packets: list[Packet] = []

    async def upgrade(
        self, target: str = "/mqtt", subprotocols: tuple[str, ...] = ("mqtt",), prefix: bytes = b""
    ) -> Any:
        """Send the upgrade request (after ``prefix``, in the same write): the answer event."""
        request = Request(host=HOST, target=target, subprotocols=list(subprotocols))
        self.writer.write(prefix + self.ws.send(request))
        while True:
            for event in await self._events():
                if isinstance(event, AcceptConnection | RejectConnection):
                    return event

    async def send(self, packet: Packet) -> None:
        self.writer.write(self.ws.send(Message(data=encode(packet))))
        await self.writer.drain()

    async def recv(self) -> Packet:
        while not self.packets:
            for event in await self._events():
                if isinstance(event, BytesMessage):
                    self.packets += self.decoder.feed(bytes(event.data))
        return self.packets.pop(0)

    async def _events(self) -> list[Any]:
        data = await asyncio.wait_for(self.reader.read(65536), 5)
        if not data:
            raise ConnectionError("closed by the server")
        self.ws.receive_data(data)
        return list(self.ws.events())

    def close(self) -> None:
        self.writer.close()


async def closed_without_answer(reader: asyncio.StreamReader, timeout: float = 5.0) -> bytes:
    """Read until the server closes; what it sent before (a reset counts as closed)."""
    got = b""
    with contextlib.suppress(ConnectionError):
        async with asyncio.timeout(timeout):
            while data := await reader.read(65536):
                got += data
    return got


async def ping_pong(client: Any, topic: str, rounds: int = 3) -> None:
    for i in range(rounds):
        await client.publish(topic, b"%d" % i, qos=1)
        assert await aiomqtt_next(client) == Received(topic, b"%d" % i, 1)


# -- real clients through every door -------------------------------------------------------------


async def test_paho_over_tls_websocket_and_secure_websocket(
    start_node: NodeFactory, certs: Certs, clients: Clients, loop_errors: list[dict[str, Any]]
) -> None:
    node = await start_node(listeners=doors("mqtts", "ws", "wss"), tls=certs.files())
    assert set(node.listening) == set(LISTENER_KINDS) and all(node.listening.values())
    assert node.stats()["listeners"] == node.listening
    assert node.listening["mqtt"] == node.config.port
    plain = await clients.aiomqtt(node.config.port, "plain")
    await plain.subscribe("doors/+/up", qos=1)
    for kind in ("mqtts", "ws", "wss"):
        client = await paho(node.listening[kind], f"paho-{kind}", kind, certs)
        try:
            assert await client.subscribe((f"doors/{kind}/down", 1)) == [1]
            await client.publish(f"doors/{kind}/up", kind.encode(), qos=1)
            assert await aiomqtt_next(plain) == Received(f"doors/{kind}/up", kind.encode(), 1)
            await plain.publish(f"doors/{kind}/down", b"x" * 100_000, qos=1)  # many frames
            assert await client.next_message() == Received(f"doors/{kind}/down", b"x" * 100_000, 1)
        finally:
            await client.close()
    assert loop_errors == []


async def test_a_client_certificate_is_the_user_name(
    start_node: NodeFactory, certs: Certs, tmp_path: Path
) -> None:
    passwords = tmp_path / "passwords"
    passwords.write_text(f"alice:{hash_password('secret')}\n")
    acl = tmp_path / "acl"
    acl.write_text("user device-7\ntopic devices/device-7/#\nuser alice\ntopic devices/alice/#\n")
    node = await start_node(
        listeners=doors("mqtts"),
        tls=certs.files(use_identity_as_username=True),
        password_file=str(passwords),
        acl_file=str(acl),
    )
    port = node.listening["mqtts"]
    device = await tls_raw(port, certs.client(certificate=True))
    # The user name and password given are not checked: the certificate says who this is.
    await device.send(Connect("device", username="alice", password=b"wrong"))
    assert await device.recv() == Connack(False, 0)
    await device.send(Subscribe(1, (("devices/device-7/t", 1), ("devices/alice/t", 1))))
    assert await device.recv() == Suback(1, (1, 0x80))
    await device.close()
    # Without a certificate identity (a plain listener's client), CONNACK 5.
    plain = await RawClient.open(node.config.port)
    await plain.send(Connect("alice", username="alice", password=b"secret"))
    assert await plain.recv() == Connack(False, 5)
    await plain.close()
    # A TLS client without a certificate does not get past the handshake.
    with contextlib.suppress(ConnectionError, ssl.SSLError):
        anonymous = await tls_raw(port, certs.client())
        await anonymous.send(Connect("anonymous"))
        await closed_without_answer(anonymous.reader)
    await eventually(
        lambda: node.stats()["tls_handshake_failures"] == 1, what="the handshake failure counted"
    )


async def test_mqttjs_over_websocket(start_node: NodeFactory, clients: Clients) -> None:
    node = await start_node(listeners=doors("ws"))
    watcher = await clients.aiomqtt(node.config.port, "js-watcher")
    await watcher.subscribe("js/t", qos=1)
    process = await asyncio.create_subprocess_exec(
        "node",
        str(JS_DIR / "pubsub.js"),
        f"ws://{HOST}:{node.listening['ws']}/mqtt",
        "js/t",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0, err.decode()
    steps = [json.loads(line) for line in out.decode().splitlines()]
    assert [step["step"] for step in steps] == ["connected", "subscribed", "published", "received"]
    assert steps[1]["granted"] == [1] and steps[-1]["qos"] == 1
    got = await aiomqtt_next(watcher)
    assert got.topic == "js/t" and got.payload.startswith(b"hello from MQTT.js")


# -- the PROXY protocol ---------------------------------------------------------------------------


async def test_proxy_headers_give_the_clients_address(
    start_node: NodeFactory,
    certs: Certs,
    caplog: pytest.LogCaptureFixture,
    loop_errors: list[dict[str, Any]],
) -> None:
    caplog.set_level(logging.INFO, "headwater.connection")
    node = await start_node(
        listeners=doors("mqtts", "ws", "wss"), tls=certs.files(), proxy_protocol=True
    )
    listening = node.listening

    async def connected(client: RawClient | WsClient, client_id: str) -> None:
        await client.send(Connect(client_id))
        assert await client.recv() == Connack(False, 0)

    def addresses() -> set[tuple[str, int] | None]:
        return {connection.address() for connection in node.connections}

    # v1 and plain MQTT in one write: one read takes both, the CONNECT handed on whole.
    reader, writer = await asyncio.open_connection(HOST, listening["mqtt"])
    writer.write(V1 + encode(Connect("v1-plain")))
    assert await RawClient(reader, writer).recv() == Connack(False, 0)
    assert addresses() == {SOURCE}
    writer.close()
    await eventually(lambda: "(203.0.113.7:4242) closed" in caplog.text, what="the close logged")
    # v2, then a TLS handshake
    secure = await tls_raw(listening["mqtts"], certs.client(), header=V2)
    await connected(secure, "v2-tls")
    assert addresses() == {SOURCE}
    # v1 and the upgrade request in one write; v2, TLS and an upgrade
    reader, writer = await asyncio.open_connection(HOST, listening["ws"])
    ws = WsClient(reader, writer)
    assert await ws.upgrade(prefix=V1) == AcceptConnection(subprotocol="mqtt")
    await connected(ws, "v1-ws")
    tls = await tls_raw(listening["wss"], certs.client(), header=V2)
    wss = WsClient(tls.reader, tls.writer)
    assert await wss.upgrade() == AcceptConnection(subprotocol="mqtt")
    await connected(wss, "v2-wss")
    assert [c.address() for c in node.connections] == [SOURCE] * 3
    # LOCAL (v2) and UNKNOWN (v1): the socket's own peer
    local = PROXY_V2_SIGNATURE + b"\x20\x00\x00\x00"
    for header in (local, b"PROXY UNKNOWN\r\n"):
        reader, writer = await asyncio.open_connection(HOST, listening["mqtt"])
        writer.write(header + encode(Connect("local")))
        assert await RawClient(reader, writer).recv() == Connack(False, 0)
        assert writer.get_extra_info("sockname") in addresses()
        writer.close()
    for client in (secure, tls):
        await client.close()
    ws.close()
    assert node.stats()["proxy_header_errors"] == 0
    assert loop_errors == []


# -- bad input: each closes its own connection only -----------------------------------------------


async def test_bad_input_on_every_door_closes_that_connection_only(
    start_node: NodeFactory, certs: Certs, clients: Clients, loop_errors: list[dict[str, Any]]
) -> None:
    node = await start_node(listeners=doors("mqtts", "ws", "wss"), tls=certs.files())
    healthy = await clients.aiomqtt(node.config.port, "healthy")
    await healthy.subscribe("health/t", qos=1)
    listening = node.listening
    # Plain MQTT on the TLS port: no ClientHello, no handshake.
    reader, writer = await asyncio.open_connection(HOST, listening["mqtts"])
    writer.write(encode(Connect("not-tls")))
    assert await closed_without_answer(reader) == b""
    await eventually(lambda: node.doors.refused["tls_handshake_failures"] == 1, what="counted")
    # TLS on the plain port: the ClientHello is not MQTT.
    with pytest.raises((ssl.SSLError, ConnectionError)):
        await asyncio.wait_for(
            asyncio.open_connection(HOST, node.config.port, ssl=certs.client()), 5
        )
    await ping_pong(healthy, "health/t")
    # WebSocket upgrades with a wrong subprotocol, none, a wrong path; HTTP that is no upgrade.
    for kind in ("ws", "wss"):
        for request, status in (
            ({"subprotocols": ("wamp",)}, 400),
            ({"subprotocols": ()}, 400),
            ({"target": "/"}, 404),
        ):
            context = certs.client() if kind == "wss" else None
            reader, writer = await asyncio.open_connection(
                HOST, listening[kind], ssl=context, server_hostname=HOST if context else None
            )
            answer = await WsClient(reader, writer).upgrade(**request)
            assert isinstance(answer, RejectConnection) and answer.status_code == status
            await closed_without_answer(reader)
            writer.close()
    reader, writer = await asyncio.open_connection(HOST, listening["ws"])
    writer.write(encode(Connect("mqtt-on-ws")))
    assert (await closed_without_answer(reader)).startswith(b"HTTP/1.1 400")
    assert node.doors.refused["websocket_upgrades_refused"] == 7
    await ping_pong(healthy, "health/t")
    assert len(node.connections) == 1
    assert loop_errors == []


async def test_bad_or_missing_proxy_headers_close_that_connection_only(
    start_node: NodeFactory, clients: Clients, loop_errors: list[dict[str, Any]]
) -> None:
    node = await start_node(proxy_protocol=True, connect_timeout=1.0)
    port = node.config.port
    healthy = await RawClient.open(port)
    await healthy.send(V1 + encode(Connect("healthy")))
    assert await healthy.recv() == Connack(False, 0)
    loop = asyncio.get_running_loop()
    # Plain MQTT without a header: closed at its first bytes, not at the timeout.
    started = loop.time()
    reader, writer = await asyncio.open_connection(HOST, port)
    writer.write(encode(Connect("no-header")))
    assert await closed_without_answer(reader) == b""
    assert loop.time() - started < 0.9
    writer.close()
    # A malformed header.
    reader, writer = await asyncio.open_connection(HOST, port)
    writer.write(b"PROXY TCP4 203.0.113.7 10.0.0.1 99999 1883\r\n" + encode(Connect("bad")))
    assert await closed_without_answer(reader) == b""
    writer.close()
    # Truncated, then the client hangs up; truncated, then nothing more (the timeout).
    for header in (V1[:20], V2[:20]):
        _, writer = await asyncio.open_connection(HOST, port)
        writer.write(header)
        await writer.drain()
        writer.close()
    reader, writer = await asyncio.open_connection(HOST, port)
    writer.write(V2[:20])
    assert await closed_without_answer(reader, timeout=5.0) == b""
    writer.close()
    await eventually(
        lambda: (
            node.doors.refused["proxy_header_errors"] == 4
            and node.doors.refused["handshake_timeouts"] == 1
        ),
        what="every bad header counted",
    )
    await healthy.send(Subscribe(1, (("still/here", 0),)))
    assert await healthy.recv() == Suback(1, (0,))
    assert len(node.connections) == 1 and not node.doors.arriving
    await healthy.close()
    assert loop_errors == []


# -- the bound and the CONNECT timeout ------------------------------------------------------------


async def test_max_connections_closes_the_one_over_the_bound_at_accept(
    start_node: NodeFactory,
) -> None:
    node = await start_node(max_connections=3)
    port = node.config.port
    held = [await RawClient.connected(port, f"held-{i}") for i in range(3)]
    over = await RawClient.open(port)
    with contextlib.suppress(ConnectionError):
        await over.send(Connect("over"))
    assert await closed_without_answer(over.reader) == b""  # no CONNACK: closed before MQTT
    assert node.stats()["refused_max_connections"] == 1
    await held.pop().close()
    await eventually(lambda: len(node.connections) == 2, what="the connection gone")
    again = await RawClient.connected(port, "again")
    assert node.stats()["refused_max_connections"] == 1
    for client in [*held, again]:
        await client.close()


async def test_no_connect_in_time_is_closed_and_counted(start_node: NodeFactory) -> None:
    node = await start_node(connect_timeout=1.0)
    silent = await RawClient.open(node.config.port)
    assert await closed_without_answer(silent.reader, timeout=4.0) == b""
    assert node.stats()["connect_timeouts"] == 1
    await silent.close()


# -- the doors on both event loops, and a node process on uvloop ---------------------------------


class Echo(asyncio.Protocol):
    """A stream that sends back what it gets."""

    def __init__(self, opened: list[Echo]) -> None:
        self.peer: tuple[str, int] | None = None
        self.opened = opened
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.opened.append(self)

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.opened.remove(self)


async def through_every_door(certs: Certs) -> None:
    opened: list[Echo] = []
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(str(certs.server.cert), str(certs.server.key))
    front = Doors(lambda: Echo(opened), lambda: len(opened), Deadlines(), 5.0, tls, True)
    servers = [await serve(Listener(kind, HOST, 0), front, 100) for kind in LISTENER_KINDS]
    writers: list[asyncio.StreamWriter] = []
    try:
        for kind, header in (("mqtt", V1), ("mqtts", V2), ("ws", V2), ("wss", V1)):
            reader, writer = await asyncio.open_connection(HOST, front.listening[kind])
            writers.append(writer)
            if kind in ("mqtts", "wss"):
                writer.write(header)
                await writer.drain()
                await writer.start_tls(certs.client(), server_hostname=HOST)
                header = b""
            if kind in ("ws", "wss"):
                ws = WsClient(reader, writer)
                assert await ws.upgrade(prefix=header) == AcceptConnection(subprotocol="mqtt")
                writer.write(ws.ws.send(Message(data=b"\xc0\x00")))
                assert await ws.recv() == Pingreq()  # echoed in a frame
            else:
                writer.write(header + b"hello " + kind.encode())
                assert await reader.readexactly(6 + len(kind)) == b"hello " + kind.encode()
            assert opened[-1].peer == SOURCE, kind
        assert len(opened) == 4 and not front.arriving
    finally:
        for writer in writers:
            writer.close()
        for server in servers:
            server.close()
            await server.wait_closed()


@pytest.mark.parametrize("loop_factory", [asyncio.new_event_loop, uvloop.new_event_loop])
def test_the_doors_hand_streams_over_on_asyncio_and_uvloop(
    loop_factory: Callable[[], asyncio.AbstractEventLoop], certs: Certs
) -> None:
    """PROXY header read (greedily, or exactly before TLS), ``set_protocol`` from the reader to
    the stream, ``start_tls`` after a header, on each loop (node.main runs on uvloop; tests
    mostly on asyncio)."""
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(asyncio.wait_for(through_every_door(certs), 20))


async def test_a_node_process_serves_every_door_behind_proxy_headers(
    kafka_bootstrap: str, log_topic: str, certs: Certs, tmp_path: Path
) -> None:
    ports = {kind: free_port() for kind in LISTENER_KINDS}
    flags = {
        "mqtt": "--listen",
        "mqtts": "--tls-listen",
        "ws": "--ws-listen",
        "wss": "--wss-listen",
    }
    argv = [
        sys.executable, "-m", "frontend",
        "--node-id", "uvloop-doors",
        "--kafka-bootstrap", kafka_bootstrap,
        "--topic", log_topic,
        "--partitions", str(PARTITIONS),
        "--certfile", str(certs.server.cert),
        "--keyfile", str(certs.server.key),
        "--proxy-protocol",
        *(arg for kind, port in ports.items() for arg in (flags[kind], f"{HOST}:{port}")),
    ]  # fmt: skip
    with (tmp_path / "node.log").open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdout=asyncio.subprocess.PIPE,
            stderr=log,
            env={**os.environ, "PYTHONPATH": os.getcwd()},
        )
    try:
        assert process.stdout is not None
        line = (await asyncio.wait_for(process.stdout.readline(), 30)).decode()
        assert "ready on" in line, (tmp_path / "node.log").read_text()
        for kind, port in ports.items():
            assert f"{HOST}:{port}" in line and (kind == "mqtt" or f"{kind} on" in line)
        plain = await RawClient.open(ports["mqtt"])
        await plain.send(V1 + encode(Connect("uv-plain")))
        assert await plain.recv() == Connack(False, 0)
        secure = await tls_raw(ports["mqtts"], certs.client(), header=V2)
        await secure.send(Connect("uv-tls"))
        assert await secure.recv() == Connack(False, 0)
        tls = await tls_raw(ports["wss"], certs.client(), header=V1)
        wss = WsClient(tls.reader, tls.writer)
        assert await wss.upgrade() == AcceptConnection(subprotocol="mqtt")
        await wss.send(Connect("uv-wss"))
        assert await wss.recv() == Connack(False, 0)
        reader, writer = await asyncio.open_connection(HOST, ports["ws"])
        ws = WsClient(reader, writer)
        assert await ws.upgrade(prefix=V2) == AcceptConnection(subprotocol="mqtt")
        await ws.send(Connect("uv-ws"))
        assert await ws.recv() == Connack(False, 0)
        for client in (plain, secure, tls):
            await client.close()
        ws.close()
    finally:
        process.terminate()
        await asyncio.wait_for(process.wait(), 30)
