"""End-to-end fixtures: front-end nodes running in the test's event loop on ephemeral ports,
each test on a log topic of its own in the real Kafka."""

from __future__ import annotations

import asyncio
import inspect
import os
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from frontend.node import Node, NodeConfig
from headwater.services.kafka_admin import ensure_topic
from mqttcore.channel import Limits
from router.topics import messages_topic
from tests.e2e.realclients import Clients

PARTITIONS = 4

NodeFactory = Callable[..., Awaitable[Node]]


async def eventually(
    condition: Callable[[], bool | Awaitable[bool]],
    *,
    what: str,
    timeout: float = 10.0,
    interval: float = 0.01,
) -> None:
    """Return as soon as ``condition()`` (sync or async) is true; checked every ``interval``
    seconds.  Fails the test, naming ``what`` it waited for, if it is still false after
    ``timeout`` seconds.  For waiting on something to happen; never for a sleep."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = condition()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if loop.time() >= deadline:
            raise AssertionError(f"still waiting for {what} after {timeout:g} s")
        await asyncio.sleep(interval)


async def http_get(port: int, path: str) -> tuple[int, str]:
    """``GET path`` from a node's stats port: the status code and the body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.0\r\n\r\n".encode())
    head, _, body = (await reader.read()).partition(b"\r\n\r\n")
    writer.close()
    return int(head.split()[1]), body.decode()


@pytest.fixture
def log_topic(kafka_bootstrap: str) -> str:
    name = f"test.{uuid.uuid4().hex[:12]}"
    ensure_topic(kafka_bootstrap, name, PARTITIONS, messages_topic(PARTITIONS).config)
    return name


@pytest.fixture
async def start_node(kafka_bootstrap: str, log_topic: str) -> AsyncIterator[NodeFactory]:
    nodes: list[Node] = []

    async def start(node_id: str | None = None, **overrides: object) -> Node:
        config = NodeConfig(
            node_id=node_id or f"node{len(nodes) + 1}",
            host="127.0.0.1",
            port=0,
            kafka_bootstrap=kafka_bootstrap,
            redis_url=None,
            topic=log_topic,
            partitions=PARTITIONS,
        )
        for key, value in overrides.items():
            setattr(config, key, value)
        node = Node(config)
        await node.start()
        nodes.append(node)
        return node

    yield start
    for node in nodes:
        await node.stop()


@pytest.fixture
async def node(start_node: NodeFactory) -> Node:
    return await start_node()


@pytest.fixture
async def clients() -> AsyncIterator[Clients]:
    """Real clients of every library, closed after the test."""
    opened = Clients()
    yield opened
    await opened.aclose()


@pytest.fixture
async def loop_errors() -> AsyncIterator[list[dict[str, Any]]]:
    """What reaches the event loop's exception handler during the test (must stay empty)."""
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()
    caught: list[dict[str, Any]] = []

    def record(_loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        caught.append(context)
        loop.default_exception_handler(context)

    loop.set_exception_handler(record)
    yield caught
    loop.set_exception_handler(previous)


async def launch_node_process(
    node_id: str,
    port: int,
    kafka_bootstrap: str,
    log_topic: str,
    *options: str,
    stderr: int = asyncio.subprocess.DEVNULL,
) -> asyncio.subprocess.Process:
    """``python -m frontend`` as its own process (one a test can kill), once it says "ready";
    ``stderr=asyncio.subprocess.PIPE`` to read its log."""
    argv = [
        sys.executable, "-m", "frontend",
        "--node-id", node_id,
        "--listen", f"127.0.0.1:{port}",
        "--kafka-bootstrap", kafka_bootstrap,
        "--topic", log_topic,
        "--partitions", str(PARTITIONS),
        *options,
    ]  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=stderr,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 30)
    assert b"ready" in line, line
    return proc


__all__ = ["Limits"]
