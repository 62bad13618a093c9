"""A QoS 1 PUBLISH leaves nothing for the cycle collector on its way from the channel through the
log to Kafka and back as a PUBACK: each object it makes is freed by its reference count.  A
closure compiled by mypyc keeps itself in its own environment (a reference cycle), and one per
message had the collector take about a tenth of a node's loop (docs/benchmarks.md).  Against the
session's real Kafka; meaningful on the compiled build (``make install``), which CI runs.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from frontend.metrics import Traffic
from frontend.publishing import Publishing
from frontend.retained import MemoryRetainedStore
from frontend.sessions.manager import SessionManager
from frontend.sessions.saver import Owned
from frontend.sessions.store import Lease, MemorySessionStore
from headwater.services.kafka_admin import ensure_topic
from mqttcore.channel import UNRESTRICTED, Action, Channel, Limits, Produce, Send
from mqttcore.codec import Decoder, wire_bytes
from mqttcore.message import MessageStamps
from mqttcore.packets import Connect, Packet, Puback, Publish
from mqttcore.session import Session
from router.dispatch import Dispatcher
from router.log import KafkaLog, LogSettings
from router.partitioner import Router

MESSAGES = 2000
STAMPS = MessageStamps("node-gc", lambda: 1_700_000_000_000, bytes(8))


def connected_channel(session: Session) -> Channel:
    channel = Channel(STAMPS)
    channel.handle_in(Connect("gc-client"))
    channel.logged_in(UNRESTRICTED)
    channel.session_opened(session, False, UNRESTRICTED)
    return channel


class Client:
    """What the client receives: the packets of the channel's ``Send`` actions, decoded once."""

    def __init__(self) -> None:
        self.decoder = Decoder()
        self.received: list[Packet] = []

    def run(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, Send):
                self.received += self.decoder.feed(wire_bytes(action.data))


@pytest.fixture
def collector_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


async def test_qos1_publishes_acknowledged_through_kafka_leave_no_cycles(
    kafka_bootstrap: str, topic_name: str, collector_off: None
) -> None:
    ensure_topic(kafka_bootstrap, topic_name, 2, {})
    router = Router(2)
    log = KafkaLog(LogSettings(kafka_bootstrap, topic_name, "node-gc"), router)
    await log.start()
    try:
        session = Session("gc-client", True)
        channel = connected_channel(session)
        client = Client()
        retained, store = MemoryRetainedStore(), MemorySessionStore()
        sessions = SessionManager(STAMPS, Limits(), store, retained, Dispatcher(log, router), log)
        wiring: Any = SimpleNamespace(log=log, sessions=sessions, traffic=Traffic())
        holder: Any = None  # nothing here closes the session
        owned = Owned(Lease("gc-client", "node-gc", 1), session, holder)
        publishing = Publishing(channel, owned, client.run, lambda held: None, wiring)
        gc.collect()  # what start-up left
        for packet_id in range(1, MESSAGES + 1):
            publish = Publish(f"gc/{packet_id % 7}", b"x" * 64, qos=1, packet_id=packet_id)
            (action,) = channel.handle_in(publish)
            assert isinstance(action, Produce)
            publishing.produce(action)
            if packet_id % 100 == 0:
                await asyncio.sleep(0)  # the loop iteration ends: the outbox goes to librdkafka
        async with asyncio.timeout(30):
            while len(client.received) < MESSAGES:
                await asyncio.sleep(0.01)
        assert all(isinstance(packet, Puback) for packet in client.received)
        assert log.produced == MESSAGES
        found = gc.collect()
    finally:
        await log.stop()
    # a cycle per message would be thousands of objects; start-up's stragglers are a handful
    assert found < MESSAGES // 10, f"{found} objects in reference cycles after {MESSAGES} PUBLISHes"
