"""Hostile connections (issue 20, items 3 and 8): nothing is buffered for a stranger, one budget
bounds what clients make a node hold, and only the load balancer speaks PROXY.

What a client sees, over real sockets, against a node with a real Kafka: a first packet that is
no CONNECT, or a CONNECT over its bound, closes the connection before its body is sent; the node's
memory (``VmRSS`` of a node process) does not grow for 200 such strangers; past
``--max-buffered-bytes`` the node stops reading until it holds less; a PROXY header from a peer
outside ``--proxy-allow`` closes the connection; a client id cannot forge a log line; a WebSocket
``Origin`` outside ``--ws-origins`` gets 403.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from pathlib import Path

import pytest

from frontend.config import Listener
from frontend.proxy_protocol import AllowList
from headwater.services.ports import free_port
from mqttcore.codec import _remaining_length, encode
from mqttcore.packets import Connack, Connect, Pingreq, Pingresp, Will
from tests.e2e.conftest import NodeFactory, eventually, http_get, launch_node_process
from tests.e2e.rawmqtt import RawClient

HOST = "127.0.0.1"
MB = 1024 * 1024


def rss_kb(pid: int) -> int:
    """A process's resident memory, from ``/proc/<pid>/status``."""
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
    assert match is not None
    return int(match.group(1))


async def closed_by_server(reader: asyncio.StreamReader, timeout: float) -> bytes:
    """Read until the server closes (a reset counts); what it sent before.  TimeoutError if it
    keeps the connection open."""
    got = b""
    with contextlib.suppress(ConnectionError):
        async with asyncio.timeout(timeout):
            while data := await reader.read(65536):
                got += data
    return got


async def stranger(port: int, announced: int, sent: int) -> bytes:
    """A socket that announces a PUBLISH of ``announced`` bytes, sends ``sent`` of them, never a
    CONNECT, and waits for the server to close it: what the server answered."""
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        writer.write(b"\x30" + _remaining_length(announced) + bytes(sent))
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        return await closed_by_server(reader, timeout=5.0)
    finally:
        writer.close()


# -- nothing is buffered for a stranger ---------------------------------------------------------


async def test_strangers_announcing_large_publishes_are_closed_at_once_and_cost_no_memory(
    kafka_bootstrap: str, log_topic: str
) -> None:
    port = free_port()
    node = await launch_node_process("strangers", port, kafka_bootstrap, log_topic)
    try:
        client = await RawClient.connected(port, "warm-up")  # the paths a client takes, loaded
        await client.close()
        before = rss_kb(node.pid)
        loop = asyncio.get_running_loop()
        started = loop.time()
        announced = 15 * MB  # within --max-packet-size: only the CONNECT rule refuses it
        answers = await asyncio.gather(*(stranger(port, announced, MB) for _ in range(200)))
        assert answers == [b""] * 200  # closed, nothing said [MQTT-3.1.0-1]
        assert loop.time() - started < 5.0
        grown = rss_kb(node.pid) - before
        assert grown < 10 * 1024, f"the node grew by {grown} kB for 200 strangers"
        again = await RawClient.connected(port, "after")  # and it serves on
        await again.close()
    finally:
        node.terminate()
        await node.wait()


async def test_a_connect_announcing_more_than_its_bound_is_closed_before_its_body(
    start_node: NodeFactory,
) -> None:
    node = await start_node(max_connect_size=1024, max_will_size=1024)
    reader, writer = await asyncio.open_connection(HOST, node.config.port)
    writer.write(b"\x10" + _remaining_length(2049))  # the header only: no body follows
    assert await closed_by_server(reader, timeout=5.0) == b""
    writer.close()
    assert node.stats()["protocol_errors"] == 1
    reader, writer = await asyncio.open_connection(HOST, node.config.port)
    writer.write(b"\x10" + _remaining_length(2000))  # within the bound: the node waits for it
    with pytest.raises(TimeoutError):
        await closed_by_server(reader, timeout=0.3)
    writer.close()


async def test_a_will_message_over_its_bound_is_closed_without_connack(
    start_node: NodeFactory,
) -> None:
    node = await start_node(max_will_size=1024)
    reader, writer = await asyncio.open_connection(HOST, node.config.port)
    writer.write(encode(Connect("big-will", will=Will("w/gone", b"x" * 1025))))
    assert await closed_by_server(reader, timeout=5.0) == b""
    writer.close()
    client = await RawClient.connected(
        node.config.port, "ok-will", will=Will("w/gone", b"x" * 1024)
    )
    await client.close()


# -- one budget for what clients make the node hold ---------------------------------------------


async def test_past_the_buffer_budget_the_node_stops_reading_until_it_holds_less(
    start_node: NodeFactory,
) -> None:
    node = await start_node(max_buffered_bytes=256 * 1024, stats_host=HOST)
    port, budget = node.config.port, node.services.buffers
    bystander = await RawClient.connected(port, "bystander")
    hog = await RawClient.connected(port, "hog", keep_alive=1)
    await hog.send(b"\x30" + _remaining_length(4 * MB) + bytes(MB))  # a PUBLISH, never finished
    await eventually(lambda: budget.spent_since is not None, what="the budget spent")
    await bystander.send(Pingreq())
    assert await bystander.recv() == Pingresp()  # its read after the budget was spent...
    await bystander.send(Pingreq())
    await bystander.expect_silence(0.5)  # ...was its last one
    # The hog's keep-alive (1.5 s) ends it; what it held is given back, and reading resumes.
    assert await bystander.recv(timeout=5.0) == Pingresp()
    await hog.expect_closed()
    stats = node.stats()
    assert stats["buffer_pauses"] == 1 and stats["buffer_paused_seconds"] > 0.5
    assert stats["buffered_bytes"] < 256 * 1024 * 3 // 4
    status, metrics = await http_get(node.config.stats_port, "/metrics")
    assert status == 200 and "headwater_buffer_pauses_total 1.0" in metrics
    await bystander.close()


# -- only the load balancer speaks PROXY --------------------------------------------------------

PROXY_V1 = b"PROXY TCP4 203.0.113.9 192.0.2.1 40000 1883\r\n"


async def test_a_proxy_header_from_a_peer_outside_the_allow_list_closes_the_connection(
    start_node: NodeFactory,
) -> None:
    node = await start_node(proxy_protocol=True, proxy_allow=AllowList.parse("10.0.0.0/8"))
    reader, writer = await asyncio.open_connection(HOST, node.config.port)
    writer.write(PROXY_V1 + encode(Connect("forged-address")))
    assert await closed_by_server(reader, timeout=5.0) == b""
    writer.close()
    assert node.stats()["proxy_not_allowed"] == 1
    assert not node.connections


async def test_a_proxy_header_from_the_load_balancer_is_believed(start_node: NodeFactory) -> None:
    node = await start_node(proxy_protocol=True)  # the default: loopback, where the test is
    reader, writer = await asyncio.open_connection(HOST, node.config.port)
    client = RawClient(reader, writer)
    await client.send(PROXY_V1 + encode(Connect("through-the-balancer")))
    assert await client.recv() == Connack(False, 0)
    (connection,) = node.connections
    assert connection.address() == ("203.0.113.9", 40000)
    assert node.stats()["proxy_not_allowed"] == 0
    await client.close()


async def test_a_client_id_cannot_forge_a_log_line(kafka_bootstrap: str, log_topic: str) -> None:
    port = free_port()
    node = await launch_node_process(
        "logs", port, kafka_bootstrap, log_topic, stderr=asyncio.subprocess.PIPE
    )
    forged = "2030-01-01 00:00:00,000 WARNING headwater.node: node logs draining"
    try:
        client = await RawClient.connected(port, f"evil\n{forged}\r\x1b[2K")
        await client.close()
        assert node.stderr is not None
        lines: list[str] = []
        async with asyncio.timeout(10):
            while not any("evil" in line for line in lines):
                lines.append((await node.stderr.readline()).decode())
        (line,) = [line for line in lines if "evil" in line]
        assert "client evil\\n2030-01-01 00:00:00,000 WARNING headwater.node" in line
        assert "\\r\\x1b[2K" in line
        assert not any(line.startswith("2030-01-01") for line in lines)
    finally:
        node.terminate()
        await node.wait()


# -- the WebSocket Origin allow-list ------------------------------------------------------------


async def upgrade_status(port: int, origin: str | None) -> int:
    """The HTTP status a WebSocket upgrade to /mqtt with ``origin`` is answered with."""
    reader, writer = await asyncio.open_connection(HOST, port)
    headers = (
        f"GET /mqtt HTTP/1.1\r\nHost: {HOST}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
        "Sec-WebSocket-Protocol: mqtt\r\n"
    )
    if origin is not None:
        headers += f"Origin: {origin}\r\n"
    writer.write((headers + "\r\n").encode())
    status = await asyncio.wait_for(reader.readline(), 5)
    writer.close()
    return int(status.split()[1])


async def test_a_websocket_origin_outside_the_list_gets_403(start_node: NodeFactory) -> None:
    node = await start_node(
        listeners=[Listener("ws", HOST, 0)], ws_origins=frozenset({"https://app.example.com"})
    )
    port = node.listening["ws"]
    assert await upgrade_status(port, "https://evil.example.com") == 403
    assert await upgrade_status(port, "https://app.example.com") == 101
    assert await upgrade_status(port, None) == 101  # no Origin: not a browser
    assert node.stats()["websocket_upgrades_refused"] == 1
