"""A node's drain in the unlucky orders: it always ends within ``--drain-timeout``.

The drain that once never finished: a share group's last commit is librdkafka's synchronous
commit, which has no timeout, and it was made on the event loop; with the broker stalled (a JVM
that stops answering, here SIGSTOP) the loop never turned again, so no bound of the drain could
fire, and the process stayed until SIGKILL.  Now the commit and the close run aside
(``router.retry.close_aside``), every step of the drain ends by ``--drain-timeout``, and a thread
ends the process at that bound whatever the loop is doing (``frontend.node.watch_drain``).
The freeze that even that thread could not end: a group consumer's ``close()`` serving a
rebalance event after librdkafka's group handler had ended, its callback blocked for good with
the GIL held (``router.retry.leave_group``, ``tests/integration/test_rebalance_close.py``).

Each test stalls a Kafka and a Redis of this module's own (the session's must stay up) and lets
them go on afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from frontend.config import NodeConfig
from frontend.node import DRAIN_EXIT, Node
from headwater.errors import ServiceError
from headwater.services.kafka import LocalKafka
from headwater.services.kafka_admin import ensure_topic
from headwater.services.redis_server import LocalRedis
from mqttcore.codec import encode
from mqttcore.packets import Connack, Connect, Disconnect, Puback, Publish
from router.topics import messages_topic
from tests.conftest import free_port
from tests.e2e.conftest import PARTITIONS, eventually, launch_node_process
from tests.e2e.rawmqtt import RawClient

pytestmark = [pytest.mark.fault, pytest.mark.timeout(180)]


@dataclass
class Stallable:
    """A Kafka and a Redis this module may stop (SIGSTOP) and let go on (SIGCONT)."""

    kafka: LocalKafka
    redis: LocalRedis
    bootstrap: str
    redis_url: str

    @contextlib.contextmanager
    def stalled(self, kafka: bool = True, redis: bool = False) -> Iterator[None]:
        pids = [
            *([self.kafka.child.pid] if kafka and self.kafka.child else []),
            *([self.redis.child.pid] if redis and self.redis.child else []),
        ]
        for pid in pids:
            os.killpg(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            for pid in pids:
                os.killpg(pid, signal.SIGCONT)


@pytest.fixture(scope="module")
def own(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stallable]:
    kafka = LocalKafka(tmp_path_factory.mktemp("drain-kafka"))
    redis = LocalRedis(tmp_path_factory.mktemp("drain-redis"), appendonly=False)
    bootstrap = kafka.start()
    try:
        url = redis.start()
        try:
            yield Stallable(kafka, redis, bootstrap, url)
        finally:
            redis.stop()
    finally:
        kafka.stop()


def new_topic(bootstrap: str, name: str) -> str:
    """A new log topic, once the controller takes one (a Kafka let go on after a stall takes
    some seconds to)."""
    topic = f"drain.{name}.{time.monotonic_ns()}"
    deadline = time.monotonic() + 90
    while True:
        try:
            ensure_topic(bootstrap, topic, PARTITIONS, messages_topic(PARTITIONS).config)
            return topic
        except ServiceError:
            if time.monotonic() > deadline:
                raise


async def test_a_drain_ends_while_kafka_stalls_under_a_share_group(
    own: Stallable, tmp_path: Path
) -> None:
    topic = await asyncio.to_thread(new_topic, own.bootstrap, "share")
    port = free_port()
    log_path = tmp_path / "node.log"
    with log_path.open("wb") as log_file:
        node = await launch_node_process(
            "drain-share", port, own.bootstrap, topic, "--drain-timeout", "20",
            stderr=log_file.fileno(),
        )  # fmt: skip
    try:
        member = await RawClient.connected(port, "share-member")
        await member.subscribe(("$share/g/s/#", 1))
        publisher = await RawClient.connected(port, "share-pub")
        sent = 0

        async def one_delivered() -> bool:
            nonlocal sent
            sent += 1
            await publisher.send(Publish("s/t", b"%d" % sent, 1, packet_id=sent))
            with contextlib.suppress(TimeoutError):
                while True:
                    packet = await member.recv(timeout=0.3)
                    if isinstance(packet, Publish):  # acknowledged: its offset is due
                        await member.send(Puback(packet.packet_id or 0))
                        return True
            return False

        await eventually(one_delivered, what="the share group delivering", timeout=30)
        await eventually(one_delivered, what="one more delivery", timeout=5)
        with own.stalled(kafka=True):  # its consumers' close waits on the stalled broker
            started = time.monotonic()
            node.send_signal(signal.SIGTERM)
            try:  # past --drain-timeout: a process that outlives its bound shows its log
                status = await asyncio.wait_for(node.wait(), 40)
            except TimeoutError:
                pytest.fail(f"still running 40 s after SIGTERM:\n{log_path.read_text()}")
            took = time.monotonic() - started
        print(f"drained with Kafka stalled in {took:.1f} s, status {status}")
        assert status == 0, log_path.read_text()
        assert " drained in " in log_path.read_text()
        assert took < 20
    finally:
        if node.returncode is None:
            node.kill()
            await node.wait()


def unread_socket(port: int) -> socket.socket:
    """A connected socket whose receive buffer is small, for a client that will stop reading."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.setblocking(False)
    return sock


async def test_a_drain_closes_a_client_that_stopped_reading_and_stores_its_session(
    own: Stallable, caplog: pytest.LogCaptureFixture
) -> None:
    topic = await asyncio.to_thread(new_topic, own.bootstrap, "unread")
    config = NodeConfig(
        node_id="drain-unread", host="127.0.0.1", port=0, kafka_bootstrap=own.bootstrap,
        redis_url=None, topic=topic, partitions=PARTITIONS, drain_timeout=10,
    )  # fmt: skip
    node = Node(config)
    await node.start()
    reader, writer = await asyncio.open_connection(sock=unread_socket(config.port), limit=1024)
    sleeper = RawClient(reader, writer)
    await sleeper.send(Connect("sleeper", clean_session=False))
    assert isinstance(await sleeper.recv(), Connack)
    await sleeper.subscribe(("big/#", 1))
    publisher = await RawClient.connected(config.port, "big-pub")
    for n in range(40):  # 20 MB: far more than the sockets hold
        await publisher.send(Publish("big/t", bytes(512 * 1024), 1, packet_id=n + 1))
        assert await publisher.recv(timeout=15) == Puback(n + 1)
    await eventually(
        lambda: any(c.transport and c.transport.get_write_buffer_size() for c in node.connections),
        what="the sleeper's transport holding what it does not read",
    )
    caplog.set_level(logging.INFO, logger="headwater.node")
    started = time.monotonic()
    await asyncio.wait_for(node.stop(), config.drain_timeout)
    print(f"drained in {time.monotonic() - started:.1f} s")
    (line,) = [r.getMessage() for r in caplog.records if " drained in " in r.getMessage()]
    assert "2 clients closed, 1 of 1 sessions stored" in line, line
    # The client sees its connection end (it reads now: what was buffered, then the end).
    await sleeper.expect_closed(timeout=5)
    assert not node.connections


MISSED = 2000
"""Messages a persistent subscriber missed, caught up while the node drains."""


async def test_a_drain_ends_within_its_bound_with_kafka_and_redis_stalled_mid_catch_up(
    own: Stallable, caplog: pytest.LogCaptureFixture
) -> None:
    topic = await asyncio.to_thread(new_topic, own.bootstrap, "stalled")

    def config(node_id: str) -> NodeConfig:
        return NodeConfig(
            node_id=node_id, host="127.0.0.1", port=0, kafka_bootstrap=own.bootstrap,
            redis_url=own.redis_url, topic=topic, partitions=PARTITIONS,
            redis_prefix=f"drain{time.monotonic_ns()}:", drain_timeout=8,
        )  # fmt: skip

    first = config("drain-stalled")
    node = Node(first)
    await node.start()
    away = await RawClient.connected(first.port, "stalled-sub", clean_session=False)
    await away.subscribe(("c/#", 1))
    await away.send(Disconnect())
    await away.expect_closed()
    publisher = await RawClient.connected(first.port, "stalled-pub")
    burst = [Publish("c/t", b"%d" % n, 1, packet_id=n + 1) for n in range(MISSED)]
    await publisher.send(b"".join(encode(p) for p in burst))
    for _ in range(MISSED):
        assert isinstance(await publisher.recv(timeout=30), Puback)
    back = await RawClient.connected(first.port, "stalled-sub", clean_session=False)
    assert isinstance(await back.recv(), Publish)  # catching up; never acknowledged
    caplog.set_level(logging.INFO, logger="headwater.node")
    with own.stalled(kafka=True, redis=True):
        await publisher.send(Publish("c/t", b"in flight", 1, packet_id=MISSED + 1))
        late = await RawClient.open(first.port)
        await late.send(Connect("late", clean_session=False))  # acquiring from a stalled Redis
        await asyncio.sleep(0.2)
        started = time.monotonic()
        await asyncio.wait_for(node.stop(), first.drain_timeout)
        took = time.monotonic() - started
    print(f"drained with Kafka and Redis stalled in {took:.1f} s")
    assert took <= first.drain_timeout - DRAIN_EXIT + 0.5
    assert any(" drained in " in r.getMessage() for r in caplog.records)
    for client in (back, publisher):
        with contextlib.suppress(ConnectionError):
            while True:  # what was sent before the close, then the close
                await client.recv(timeout=5)
    with contextlib.suppress(ConnectionError):
        assert (await late.recv(timeout=5)) != Connack(False, 0)

    # Nothing acknowledged is lost: the subscriber reads on at another node.
    second = config("drain-after")
    second.redis_prefix = first.redis_prefix
    after = Node(second)
    await after.start()
    try:
        again = await RawClient.connected(second.port, "stalled-sub", clean_session=False)
        received: set[bytes] = set()
        while len(received) < MISSED:
            packet = await again.recv(timeout=30)
            assert isinstance(packet, Publish), packet
            await again.send(Puback(packet.packet_id or 0))
            received.add(packet.payload)
        assert received >= {b"%d" % n for n in range(MISSED)}
        await again.close()
    finally:
        await after.stop()


BLOCKED = """
import logging, sys, time
from frontend.node import watch_drain
logging.basicConfig(level=logging.INFO)
watch_drain(1.0, "blocked")
print("armed", flush=True)
time.sleep(60)  # a loop blocked for good: nothing else would end this process
"""


HELD = """
import ctypes
from frontend.node import watch_drain
watch_drain(1.0, "held")
print("armed", flush=True)
ctypes.PyDLL(None).sleep(60)  # a C call that keeps the GIL: no Python thread runs meanwhile
"""


async def run_snippet(code: str, timeout: float) -> tuple[int, str, str, float]:
    """``python -c code`` with the project importable: its status, stdout, stderr and the
    seconds it took."""
    started = time.monotonic()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env={**os.environ, "PYTHONPATH": os.getcwd()},
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), timeout)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode(), time.monotonic() - started


async def test_a_process_whose_every_thread_is_held_still_ends_after_its_bound() -> None:
    status, out, _, took = await run_snippet(HELD, 30)
    assert out.strip() == "armed"
    assert status == -signal.SIGALRM  # the kernel's backstop, not the watch thread
    assert took < 15


async def test_a_process_whose_drain_is_blocked_exits_at_the_drain_timeout() -> None:
    status, _, text, took = await run_snippet(BLOCKED, 15)
    assert status == 1
    assert took < 10
    assert "the drain did not end within 1 s (--drain-timeout)" in text, text
    assert 'thread MainThread: File "<string>", line 7' in text, text  # where it was blocked
