"""Kafka users against real Kafka, with plain confluent-kafka clients as a user would have them:
records produced to the inbound topic reach MQTT subscribers once and in order, and messages
matching an ``--export`` filter appear in the user's topic once each, also across a SIGKILLed
node (``router.relays``)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import signal
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
from confluent_kafka import Consumer, IsolationLevel, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

from frontend.node import Node, NodeConfig
from headwater.services.kafka import KafkaPorts, LocalKafka
from headwater.services.kafka_admin import ensure_topic
from headwater.services.ports import free_port
from router.relay_records import parse_export
from tests.e2e.conftest import PARTITIONS, NodeFactory, eventually, launch_node_process
from tests.e2e.realclients import Clients, PahoClient, Received

Pairs = list[tuple[str, bytes | None]]


@dataclass(frozen=True, slots=True)
class Copied:
    """A record read back from a Kafka topic."""

    key: bytes | None
    value: bytes
    headers: dict[str, bytes]
    timestamp: int


def produce(bootstrap: str, topic: str, records: Iterable[tuple[Any, ...]]) -> None:
    """Write (key, value[, headers]) records with a plain producer, and wait for all of them."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for key, value, *headers in records:
        producer.produce(topic, value, key, headers=headers[0] if headers else None)
        producer.poll(0)
    assert producer.flush(10) == 0


def read_topic(bootstrap: str, topic: str, count: int, timeout: float = 30.0) -> list[Copied]:
    """At least ``count`` records of ``topic`` (read_committed, from the start), and whatever
    else comes within a second after them (a duplicate would)."""
    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": f"reader-{uuid.uuid4().hex}",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    })  # fmt: skip
    consumer.subscribe([topic])
    got: list[Copied] = []
    deadline = time.monotonic() + timeout
    extra_until = None
    try:
        while time.monotonic() < (extra_until or deadline):
            message = consumer.poll(0.1)
            if message is None or message.error() is not None:
                continue
            pairs = cast(Pairs, message.headers() or [])
            headers = {k: v if isinstance(v, bytes) else b"" for k, v in pairs}
            got.append(Copied(message.key(), message.value() or b"", headers,
                              message.timestamp()[1]))  # fmt: skip
            if len(got) >= count and extra_until is None:
                extra_until = time.monotonic() + 1.0
    finally:
        consumer.close()
    return got


async def messages(client: PahoClient, count: int, timeout: float) -> list[Received]:
    """``count`` messages, then a second more for any that should not come."""
    got = [await client.next_message(timeout) for _ in range(count)]
    with contextlib.suppress(TimeoutError):
        got.append(await client.next_message(1.0))
    return got


def by_topic(received: Iterable[tuple[str, bytes]]) -> dict[str, list[int]]:
    numbers: dict[str, list[int]] = defaultdict(list)
    for topic, payload in received:
        numbers[topic].append(int(payload))
    return numbers


async def test_inbound_records_reach_every_nodes_subscribers_once_in_order(
    start_node: NodeFactory, kafka_bootstrap: str, log_topic: str, clients: Clients
) -> None:
    inbound = f"{log_topic}.inbound"
    first = await start_node(inbound_topic=inbound)
    second = await start_node(inbound_topic=inbound)
    relays = [n.relays.inbound for n in (first, second) if n.relays.inbound is not None]
    await eventually(
        lambda: sorted(p for r in relays for p in r.assigned) == list(range(PARTITIONS)),
        what="the inbound topic's partitions shared by the two nodes",
        timeout=20,
    )
    subscriber = await clients.paho(second.config.port)
    await subscriber.subscribe(("cmd/#", 1))
    bad = [
        (None, b"no key"),
        (b"cmd/+", b"wildcard"),
        (b"$SYS/broker/x", b"a broker's"),
        (b"\xff\xfe", b"not UTF-8"),
        (b"", b"empty"),
        (b"cmd/ok", b"qos 7", [("mqtt.qos", b"7")]),
        (b"cmd/ok", b"retain x", [("mqtt.retain", b"x")]),
    ]
    good = [(f"cmd/dev{i % 5}".encode(), str(i).encode(), [("mqtt.qos", b"1")]) for i in range(100)]
    sent = time.monotonic()
    await asyncio.to_thread(produce, kafka_bootstrap, inbound, [*bad, *good])
    got = await messages(subscriber, 100, timeout=5)
    elapsed = time.monotonic() - sent

    assert len(got) == 100, got[100:]
    assert elapsed < 5
    assert {m.qos for m in got} == {1}
    assert by_topic((m.topic, m.payload) for m in got) == {
        f"cmd/dev{d}": list(range(d, 100, 5)) for d in range(5)
    }
    counts = [n.stats() for n in (first, second)]
    assert sum(c["inbound_relayed"] for c in counts) == 100
    assert sum(c["inbound_skipped_no_topic"] for c in counts) == 1
    assert sum(c["inbound_skipped_bad_topic"] for c in counts) == 4
    assert sum(c["inbound_skipped_bad_header"] for c in counts) == 2


async def test_a_retained_inbound_record_is_retained(
    start_node: NodeFactory, kafka_bootstrap: str, log_topic: str, clients: Clients
) -> None:
    inbound = f"{log_topic}.inbound"
    node = await start_node(inbound_topic=inbound)
    watcher = await clients.paho(node.config.port)
    await watcher.subscribe(("state/#", 0))
    await asyncio.to_thread(
        produce, kafka_bootstrap, inbound, [(b"state/valve", b"open", [("mqtt.retain", b"1")])]
    )
    assert (await watcher.next_message(20)).payload == b"open"

    late = await clients.paho(node.config.port)
    await late.subscribe(("state/#", 0))
    assert await late.next_message() == Received("state/valve", b"open", 0, True)


async def test_exports_mirror_matching_messages_as_json_and_raw(
    start_node: NodeFactory, kafka_bootstrap: str, log_topic: str, clients: Clients
) -> None:
    as_json, as_raw = f"{log_topic}.plant.json", f"{log_topic}.plant.raw"
    node = await start_node(
        export=[
            parse_export(f"plant/#={as_json}:json"),
            parse_export(f"plant/+/temp={as_raw}:raw"),
        ]
    )
    publisher = await clients.paho(node.config.port, "press-1")
    await publisher.publish("plant/a/temp", b"21.5", qos=1)
    await publisher.publish("plant/b/blob", b"\xff\x00\x01", qos=1)
    await publisher.publish("office/a/temp", b"19", qos=1)
    await publisher.publish("plant/a/temp", b"22", qos=1, retain=True)
    await publisher.publish("plant/a/temp", b"", qos=1, retain=True)  # a clear: no data

    mirrored = await asyncio.to_thread(read_topic, kafka_bootstrap, as_json, 3)
    objects = {(o["topic"], o["retain"]): (o, r) for r in mirrored if (o := json.loads(r.value))}
    assert len(mirrored) == 3  # in order per MQTT topic; topics apart may come in any order
    first, record = objects[("plant/a/temp", False)]
    assert first == {
        "topic": "plant/a/temp", "payload": "21.5", "qos": 1, "retain": False,
        "client_id": "press-1", "timestamp": record.timestamp,
    }  # fmt: skip
    assert abs(record.timestamp - time.time() * 1000) < 60_000
    blob, _ = objects[("plant/b/blob", False)]
    assert blob["payload_encoding"] == "base64"
    assert base64.b64decode(blob["payload"]) == b"\xff\x00\x01"
    assert objects[("plant/a/temp", True)][0]["payload"] == "22"

    raw = await asyncio.to_thread(read_topic, kafka_bootstrap, as_raw, 2)
    assert [(r.key, r.value) for r in raw] == [(b"plant/a/temp", b"21.5"), (b"plant/a/temp", b"22")]
    assert raw[1].headers["mqtt.topic"] == b"plant/a/temp"
    assert raw[1].headers["mqtt.qos"] == b"1"
    assert raw[1].headers["mqtt.retain"] == b"1"
    assert raw[1].headers["mqtt.client_id"] == b"press-1"
    assert node.stats()["exported"] == 5


@pytest.mark.fault
async def test_a_killed_node_loses_and_duplicates_nothing_either_way(
    kafka_bootstrap: str, log_topic: str, clients: Clients
) -> None:
    inbound, export = f"{log_topic}.inbound", f"{log_topic}.plant"
    options = ("--inbound-topic", inbound, "--export", f"plant/#={export}:json")
    ports = {"a": free_port(), "b": free_port()}

    async def launch(name: str) -> asyncio.subprocess.Process:
        return await launch_node_process(
            name, ports[name], kafka_bootstrap, log_topic, *options, "--sys-interval", "0"
        )

    victim, survivor = await launch("a"), await launch("b")
    try:
        subscriber = await clients.paho(ports["b"], "watcher")
        await subscriber.subscribe(("cmd/#", 1))
        publisher = await clients.paho(ports["b"], "press")
        # the relays have joined once a first record has gone each way
        await asyncio.to_thread(produce, kafka_bootstrap, inbound, [(b"cmd/probe", b"0")])
        assert (await subscriber.next_message(30)).topic == "cmd/probe"

        inbound_done = threading.Event()
        count = 400

        def feed() -> None:  # the inbound side, 8 topics, while the node is killed
            for i in range(0, count, 20):
                batch = [(f"cmd/k{j % 8}".encode(), str(j).encode()) for j in range(i, i + 20)]
                produce(kafka_bootstrap, inbound, batch)
                time.sleep(0.01)
            inbound_done.set()

        feeding = asyncio.create_task(asyncio.to_thread(feed))
        for i in range(count):  # the export side
            await publisher.publish(f"plant/p{i % 8}", str(i).encode(), qos=1)
            if i == count // 4:
                victim.send_signal(signal.SIGKILL)
                await victim.wait()
                victim = await launch("a")  # as a supervisor would: fences the dead one
        await feeding

        got = await messages(subscriber, count, timeout=60)
        assert by_topic((m.topic, m.payload) for m in got) == {
            f"cmd/k{k}": list(range(k, count, 8)) for k in range(8)
        }
        mirrored = await asyncio.to_thread(read_topic, kafka_bootstrap, export, count, 60)
        objects = [json.loads(r.value) for r in mirrored]
        assert by_topic((o["topic"], o["payload"].encode()) for o in objects) == {
            f"plant/p{k}": list(range(k, count, 8)) for k in range(8)
        }
    finally:
        for process in (victim, survivor):
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
                await asyncio.wait_for(process.wait(), 30)


HELD_BACK_AT_MOST = 9.0
"""Seconds: ``TRANSACTION_TIMEOUT_MS`` (5 s), the broker's abort scan (1 s) and slack (5-6 s
measured); with the former 10 s and Kafka's default 10 s scan, 14-17 s was measured."""


@pytest.mark.fault
async def test_a_node_killed_inside_a_transaction_holds_back_delivery_seconds_only(
    kafka_bootstrap: str, log_topic: str, clients: Clients
) -> None:
    """A node SIGKILLed while its inbound relay writes (inside a transaction, not restarted)
    holds every read_committed reader of the log partitions it wrote to at its first record
    until the broker aborts the transaction: ``TRANSACTION_TIMEOUT_MS`` plus the broker's
    abort scan (``render_server_properties``: 1 s).  Measured as a subscriber on another node
    sees it: per topic, how long after the kill the first message published after it comes.
    The victim is stopped (SIGSTOP) until Kafka shows one of its transactions open with records
    (a partition's read_committed end below its high watermark), then killed."""
    inbound = f"{log_topic}.inbound"
    port = free_port()
    survivor = await launch_node_process(
        "b", port, kafka_bootstrap, log_topic, "--inbound-topic", "", "--sys-interval", "0"
    )
    victim: asyncio.subprocess.Process | None = None
    feeding = threading.Event()
    feeder: asyncio.Future[None] | None = None

    def feed() -> None:  # inbound records all along: the victim is mostly in a transaction
        producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 5})
        j = 0
        while not feeding.is_set():
            for _ in range(20):
                producer.produce(inbound, str(j).encode(), f"cmd/k{j % 32}".encode())
                j += 1
            producer.poll(0.02)
        producer.flush(10)

    try:
        subscriber = await clients.paho(port, "watcher")
        await subscriber.subscribe(("live/#", 1), ("cmd/k0", 0))
        publisher = await clients.paho(port, "press")
        feeder = asyncio.ensure_future(asyncio.to_thread(feed))
        victim = await launch_node_process(
            "a", free_port(), kafka_bootstrap, log_topic, "--inbound-topic", inbound,
            "--sys-interval", "0",
        )  # fmt: skip
        while (await subscriber.next_message(30)).topic != "cmd/k0":
            pass  # the victim relays
        for _ in range(100):
            victim.send_signal(signal.SIGSTOP)
            await asyncio.sleep(0.1)  # what it had sent lands
            if await asyncio.to_thread(_open_transaction, kafka_bootstrap, log_topic):
                break
            victim.send_signal(signal.SIGCONT)
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("never caught the victim inside a transaction")
        stall = await _stall_after_a_kill(victim, subscriber, publisher)
        print(f"delivery held back {stall:.1f} s after the kill")  # the measure (pytest -s)
        assert stall < HELD_BACK_AT_MOST
    finally:
        feeding.set()
        if feeder is not None:
            await feeder
        for process in (victim, survivor):
            if process is not None and process.returncode is None:
                process.send_signal(signal.SIGCONT)
                process.send_signal(signal.SIGTERM)
                await asyncio.wait_for(process.wait(), 30)


def _open_transaction(bootstrap: str, topic: str) -> bool:
    """Whether a partition of ``topic`` has records of a transaction still open."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    partitions = admin.list_topics(topic, timeout=10).topics[topic].partitions

    def ends(level: IsolationLevel) -> dict[int, int]:
        latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
        asked = {TopicPartition(topic, p): latest for p in partitions}
        found = admin.list_offsets(asked, isolation_level=level, request_timeout=10)
        return {tp.partition: future.result().offset for tp, future in found.items()}

    committed = ends(IsolationLevel.READ_COMMITTED)
    written = ends(IsolationLevel.READ_UNCOMMITTED)
    return any(committed[p] < written[p] for p in partitions)


async def _stall_after_a_kill(
    victim: asyncio.subprocess.Process, subscriber: PahoClient, publisher: PahoClient
) -> float:
    """SIGKILL ``victim``; the longest wait, over 8 topics, for the first message published
    after the kill."""
    victim.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    await victim.wait()
    live = [f"live/t{k}" for k in range(8)]
    first_after: dict[str, float] = {}

    async def publish() -> None:
        for i in range(1000):
            await publisher.publish(live[i % 8], str(time.monotonic()).encode(), qos=1)
            await asyncio.sleep(0.02)

    publishing = asyncio.ensure_future(publish())
    try:
        while len(first_after) < len(live):
            message = await subscriber.next_message(30)
            if message.topic.startswith("live/") and float(message.payload) > killed:
                first_after.setdefault(message.topic, time.monotonic())
    finally:
        publishing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await publishing
    return max(first_after.values()) - killed


async def test_a_returning_session_gets_inbound_records_and_goes_on_live(
    start_node: NodeFactory, kafka_bootstrap: str, log_topic: str, clients: Clients
) -> None:
    """A transaction's commit marker ends the partitions it wrote to: catching up over it
    must finish, and live messages follow at once."""
    inbound = f"{log_topic}.inbound"
    node = await start_node(inbound_topic=inbound)
    first = await clients.paho(node.config.port, "device", clean_session=False)
    await first.subscribe(("cmd/#", 1))
    await asyncio.to_thread(produce, kafka_bootstrap, inbound, [(b"cmd/a", b"0")])
    assert (await first.next_message(20)).payload == b"0"
    await first.close()

    records = [(b"cmd/a", str(i).encode(), [("mqtt.qos", b"1")]) for i in range(1, 6)]
    await asyncio.to_thread(produce, kafka_bootstrap, inbound, records)
    await eventually(lambda: node.stats()["inbound_relayed"] == 6, what="the records relayed")
    back = await clients.paho(node.config.port, "device", clean_session=False)
    assert [(await back.next_message()).payload for _ in range(5)] == [b"1", b"2", b"3", b"4", b"5"]
    publisher = await clients.paho(node.config.port)
    await publisher.publish("cmd/a", b"live", qos=1)
    assert (await back.next_message(2)).payload == b"live"


AFTER_RESTART = 60.0
"""Seconds a record may take to go through a relay once Kafka is back: a watchdog that made a
relay anew meanwhile (``STUCK_SECONDS``) is seen by the relays' identity, not by this wait."""


@pytest.mark.fault
async def test_relays_ride_out_a_kafka_outage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clients: Clients
) -> None:
    """Kafka stopped and started again on the same ports: the node keeps running, and both
    relays go on from where they were, at once: not after their watchdog (``STUCK_SECONDS``)
    has made them anew, a producer that saw the outage being made anew before its next
    transaction (librdkafka's could block in ``send_offsets_to_transaction`` for good)."""
    kafka = LocalKafka(tmp_path / "kafka")
    bootstrap = await asyncio.to_thread(kafka.start)
    node: Node | None = None
    try:
        await asyncio.to_thread(ensure_topic, bootstrap, "log", 2, {})
        config = NodeConfig("n1", "127.0.0.1", 0, bootstrap, None, "log", 2)
        config.inbound_topic, config.export = "in", [parse_export("plant/#=out:raw")]
        node = Node(config)
        await node.start()
        subscriber = await clients.paho(node.config.port)
        await subscriber.subscribe(("cmd/#", 1))
        await asyncio.to_thread(produce, bootstrap, "in", [(b"cmd/a", b"before")])
        assert (await subscriber.next_message(30)).payload == b"before"
        relays = list(node.relays.relays)

        await asyncio.to_thread(kafka.stop)
        await eventually(lambda: not node.log.available, what="Kafka seen down", timeout=30)
        ports = kafka.ports
        assert ports is not None
        monkeypatch.setattr(KafkaPorts, "pick", classmethod(lambda cls: ports))
        await asyncio.to_thread(kafka.start)

        await asyncio.to_thread(produce, bootstrap, "in", [(b"cmd/a", b"after")])
        # a Kafka just restarted may time out the first transactions' records (5 s each, seen
        # four times in a row on a loaded machine): each is aborted and its batch copied again
        assert (await subscriber.next_message(AFTER_RESTART)).payload == b"after"
        # the node's own producer sees Kafka back by its probe; until then a CONNECT gets 3
        await eventually(lambda: node.log.available, what="Kafka seen back", timeout=30)
        publisher = await clients.paho(node.config.port)
        await publisher.publish("plant/x", b"1", qos=1)
        mirrored = await asyncio.to_thread(read_topic, bootstrap, "out", 1, AFTER_RESTART)
        assert [(r.key, r.value) for r in mirrored] == [(b"plant/x", b"1")]
        # the same relays, running: none was made anew by the watchdog (a transaction that
        # met the restarted group coordinator may abort, UNKNOWN_MEMBER_ID: its batch is
        # copied again, once, as after any abort)
        assert node.relays.relays == relays and all(relay.running for relay in relays)
    finally:
        if node is not None:
            await node.stop()
        await asyncio.to_thread(kafka.stop)
