"""A node of two workers (``--workers 2``, ``frontend.workers``) on one port, as real processes:
the kernel spreads clients over both (``SO_REUSEPORT``), a message crosses from one worker to the
other through the log, a persistent session taken over from one worker by the other keeps its
QoS 1 message, a worker killed is started again, and SIGTERM to the parent drains both and exits 0.

Which worker a connection landed on is read from the workers' ``/stats`` (``connections_opened``
rises on that one), each worker answering on the stats port + its index - 1.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mqttcore.packets import Connack, Connect, Puback, Publish
from tests.conftest import free_port
from tests.e2e.conftest import PARTITIONS, eventually, http_get, launch_node_process
from tests.e2e.rawmqtt import RawClient

pytestmark = pytest.mark.fault

SPREAD = 40
"""Clients connected at once; all on one of two workers by chance: 1 in 2**39."""


@dataclass
class Workers:
    """The parent process, the shared MQTT port and each worker's HTTP port."""

    parent: asyncio.subprocess.Process
    port: int
    http: list[int]

    async def stats(self) -> list[dict[str, Any]]:
        answers = [await http_get(port, "/stats") for port in self.http]
        assert all(status == 200 for status, _ in answers), answers
        return [json.loads(body) for _, body in answers]

    async def opened(self) -> list[int]:
        return [s["connections_opened"] for s in await self.stats()]

    async def opened_beyond(self, total: int) -> list[int]:
        """Each worker's ``connections_opened`` once their sum exceeds ``total``."""
        now: list[int] = []

        async def counted() -> bool:
            now[:] = await self.opened()
            return sum(now) > total

        await eventually(counted, what="the connection to be counted by a worker")
        return now

    async def open_on(self, worker: int, attempts: int = 100) -> RawClient:
        """A TCP connection the kernel gave to ``worker`` (0-based), opened as often as needed."""
        for _ in range(attempts):
            before = await self.opened()
            client = await RawClient.open(self.port)
            after = await self.opened_beyond(sum(before))
            if after[worker] > before[worker]:
                return client
            await client.close()
        raise AssertionError(f"no connection landed on worker {worker + 1} in {attempts}")


def free_port_pair(avoid: int) -> int:
    """The first of two consecutive free loopback ports, neither ``avoid``."""
    while True:
        first = free_port()
        if avoid in (first, first + 1) or first >= 65535:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", first + 1))
            except OSError:
                continue
        return first


def children(pid: int) -> set[int]:
    """The processes whose parent is ``pid``."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == pid:
                found.add(int(entry.name))
    return found


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def connect(client: RawClient, client_id: str, **options: object) -> Connack:
    await client.send(Connect(client_id, **options))  # type: ignore[arg-type]
    connack = await client.recv()
    assert isinstance(connack, Connack) and connack.return_code == 0, connack
    return connack


async def publish(client: RawClient, topic: str, payload: bytes, packet_id: int) -> None:
    await client.send(Publish(topic, payload, qos=1, packet_id=packet_id))
    assert await client.recv() == Puback(packet_id)


async def received(client: RawClient) -> Publish:
    packet = await client.recv(timeout=10)
    assert isinstance(packet, Publish), packet
    return packet


@pytest.fixture
async def workers(
    kafka_bootstrap: str, log_topic: str, redis_url: str, redis_prefix: str
) -> AsyncIterator[Workers]:
    port = free_port()
    http = free_port_pair(port)
    parent = await launch_node_process(
        "wk", port, kafka_bootstrap, log_topic,
        "--workers", "2",
        "--stats-listen", f"127.0.0.1:{http}",
        "--redis-url", redis_url,
        "--redis-prefix", redis_prefix,
        "--sys-interval", "0",
    )  # fmt: skip
    running = Workers(parent, port, [http, http + 1])
    try:
        yield running
    finally:
        if parent.returncode is None:
            for pid in children(parent.pid):
                os.kill(pid, signal.SIGKILL)
            parent.kill()
            await parent.wait()


async def test_two_workers_share_a_port_and_behave_as_two_nodes(workers: Workers) -> None:
    assert workers.parent.stdout is not None
    worker_lines = [await workers.parent.stdout.readline() for _ in range(2)]
    assert sorted(line.split()[2] for line in worker_lines) == [b"wk-1", b"wk-2"]
    assert [s["node_id"] for s in await workers.stats()] == ["wk-1", "wk-2"]

    # many clients: the kernel gives both workers some
    spread = [await RawClient.connected(workers.port, f"spread-{i}") for i in range(SPREAD)]

    async def both_serve() -> bool:
        counts = [s["connections"] for s in await workers.stats()]
        return sum(counts) == SPREAD and all(counts)

    await eventually(both_serve, what="both workers to hold some of the clients")

    # a message published on worker 1 reaches a subscriber on worker 2
    sub = await workers.open_on(1)
    await connect(sub, "cross-sub")
    await sub.subscribe(("cross/t", 1))
    pub = await workers.open_on(0)
    await connect(pub, "cross-pub")
    await publish(pub, "cross/t", b"over", 1)
    got = await received(sub)
    assert got.payload == b"over"
    await sub.send(Puback(got.packet_id or 0))

    # a persistent session on worker 1, its QoS 1 message unacknowledged, taken over on worker 2
    old = await workers.open_on(0)
    await connect(old, "mover", clean_session=False)
    await old.subscribe(("mover/t", 1))
    await publish(pub, "mover/t", b"owed", 2)
    first = await received(old)
    assert first.payload == b"owed" and not first.dup
    new = await workers.open_on(1)
    assert (await connect(new, "mover", clean_session=False)).session_present
    await old.expect_closed()
    again = await received(new)
    assert again == Publish("mover/t", b"owed", qos=1, packet_id=first.packet_id, dup=True)
    await new.send(Puback(again.packet_id or 0))
    await publish(pub, "mover/t", b"after", 3)
    assert (await received(new)).payload == b"after"
    persistent = [s["sessions_live_persistent"] for s in await workers.stats()]
    assert persistent == [0, 1]

    # a worker killed is started again under its id, on its HTTP port
    pids = children(workers.parent.pid)
    assert len(pids) == 2
    victim = next(iter(pids))
    os.kill(victim, signal.SIGKILL)

    async def back() -> bool:
        now = children(workers.parent.pid)
        if len(now) != 2 or victim in now:
            return False
        try:
            return len(await workers.stats()) == 2
        except (OSError, AssertionError):
            return False

    await eventually(back, what="the killed worker to serve again", timeout=60, interval=0.1)

    # SIGTERM to the parent: both workers drain (their clients are closed) and all exit 0
    pids = children(workers.parent.pid)
    workers.parent.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(workers.parent.wait(), 60) == 0
    assert all(gone(pid) for pid in pids)
    await new.expect_closed()
    for client in spread[:5]:
        await client.expect_closed()
    for client in (pub, sub, *spread):
        await client.close()


async def test_a_second_node_on_a_port_in_use_stops_without_reuse_port(
    kafka_bootstrap: str, log_topic: str
) -> None:
    """Only workers share a port: a node started twice on one port by mistake refuses to start,
    saying why, and the first keeps serving."""
    port = free_port()
    first = await launch_node_process(
        "first", port, kafka_bootstrap, log_topic, "--sys-interval", "0"
    )
    try:
        second = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "frontend",
            "--node-id", "second",
            "--listen", f"127.0.0.1:{port}",
            "--kafka-bootstrap", kafka_bootstrap,
            "--topic", log_topic,
            "--partitions", str(PARTITIONS),
            "--sys-interval", "0",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": os.getcwd()},
        )  # fmt: skip
        _, err = await asyncio.wait_for(second.communicate(), 60)
        assert second.returncode == 1
        assert b"headwater frontend:" in err and b"address already in use" in err.lower(), err
        client = await RawClient.open(port)
        await connect(client, "still-served")
        await client.close()
    finally:
        first.send_signal(signal.SIGTERM)
        await asyncio.wait_for(first.wait(), 60)
