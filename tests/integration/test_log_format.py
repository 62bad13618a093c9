"""The log as a Kafka user reads it, and ``docs/log.md`` that describes it.

* With a plain confluent-kafka consumer, every kind of record a node writes carries the headers
  ``mqtt.topic``, ``mqtt.qos``, ``mqtt.retain``, ``mqtt.client_id`` and ``headwater.kind``, and
  its Kafka timestamp is a CreateTime equal to the Avro ``timestamp`` field.  A node still reads
  records without headers (written before them).
* The page's tables (headers, kinds, partitions, fingerprint) are the code's, and its Python
  recipe runs as shown (``python -c``, from the repository's root), with ``localhost:9092`` and
  ``headwater.messages`` replaced by the test's Kafka and log topic (:func:`as_run_here`), as
  tests/integration/test_doc_commands.py runs the README's commands.  The Spark recipe runs in
  tests/spark/test_log_recipes.py; the Java one is shown only.

One node on a fresh log topic of the session's real Kafka, with ``$SYS`` reports every
``SYS_INTERVAL`` seconds; a raw MQTT client publishes, clears a retained message and dies.
"""

from __future__ import annotations

import asyncio
import re
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, Consumer, Producer, TopicPartition

from frontend.config import NodeConfig
from frontend.node import Node
from headwater.services.kafka_admin import ensure_topic
from mqttcore.message import Message
from mqttcore.packets import Puback, Publish, Will
from router import record
from router.partitioner import Router
from router.topics import messages_topic
from tests.e2e.conftest import PARTITIONS, eventually
from tests.e2e.rawmqtt import RawClient

SYS_INTERVAL = 0.2
ROOT = Path(__file__).resolve().parents[2]
LOG_MD = ROOT / "docs" / "log.md"


def recipe(heading: str) -> str:
    """The first code block after the heading of docs/log.md that starts with ``heading``."""
    section = LOG_MD.read_text().split(f"\n### {heading}", 1)[1]
    found = re.search(r"```\w+\n(.*?)```", section, re.S)
    assert found, f"no code block under {heading}"
    return found.group(1)


def as_run_here(code: str, bootstrap: str, topic: str) -> str:
    """A recipe pointed at the test's Kafka and log topic: the only edits made to it."""
    return code.replace("localhost:9092", bootstrap).replace('"headwater.messages"', f'"{topic}"')


def table(heading: str) -> list[list[str]]:
    """The rows of the first table under the ``## heading`` of docs/log.md, each cell stripped
    of its backquotes (the header row and the rule left out)."""
    lines = LOG_MD.read_text().split(f"\n## {heading}\n", 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return [
        [cell.strip().strip("`") for cell in line.strip().strip("|").split(" | ")]
        for line in lines[start + 2 : end]
    ]


async def started_node(
    bootstrap: str, topic: str, sys_interval: float, client_events: bool = False
) -> Node:
    config = NodeConfig(
        node_id="logformat",
        host="127.0.0.1",
        port=0,
        kafka_bootstrap=bootstrap,
        redis_url=None,
        topic=topic,
        partitions=PARTITIONS,
        sys_interval=sys_interval,
        client_events=client_events,
    )
    node = Node(config)
    await node.start()
    return node


@pytest.fixture
async def node(kafka_bootstrap: str, log_topic: str) -> AsyncIterator[Node]:
    """A node that reports to ``$SYS`` every ``SYS_INTERVAL`` seconds and writes client events."""
    started = await started_node(kafka_bootstrap, log_topic, SYS_INTERVAL, client_events=True)
    yield started
    await started.stop()


@pytest.fixture
async def quiet_node(kafka_bootstrap: str, log_topic: str) -> AsyncIterator[Node]:
    """A node that writes nothing of its own (no ``$SYS`` reports)."""
    started = await started_node(kafka_bootstrap, log_topic, 0)
    yield started
    await started.stop()


@pytest.fixture
def log_topic(kafka_bootstrap: str) -> str:
    name = f"test.{uuid.uuid4().hex[:12]}"
    ensure_topic(kafka_bootstrap, name, PARTITIONS, messages_topic(PARTITIONS).config)
    return name


class LogConsumer:
    """A plain Kafka consumer of every partition of the log, from its beginning, as a user's."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.consumer = Consumer({
            "bootstrap.servers": bootstrap,
            "group.id": f"user-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
        })  # fmt: skip
        self.consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        self.records: list[Any] = []

    def take(self) -> list[Any]:
        for msg in self.consumer.consume(500, timeout=0.05):
            if msg.error() is None:
                self.records.append(msg)
        return self.records

    def find(self, kind: bytes, topic_prefix: str) -> Any | None:
        for msg in self.take():
            heads = dict(msg.headers() or [])
            if heads.get("headwater.kind") == kind and (
                heads["mqtt.topic"].decode().startswith(topic_prefix)
            ):
                return msg
        return None

    def close(self) -> None:
        self.consumer.close()


async def puback(client: RawClient, packet_id: int) -> None:
    packet = await client.recv()
    assert packet == Puback(packet_id), packet


def check(msg: Any, topic: str, qos: int, retain: bool, client_id: str, kind: str) -> Message:
    """The record's headers and timestamp say what its Avro value says."""
    message = record.decode(msg.value())
    assert (message.topic, message.qos, message.retain, message.client_id) == (
        topic, qos, retain, client_id,
    )  # fmt: skip
    assert msg.headers() == [
        ("mqtt.topic", topic.encode()),
        ("mqtt.qos", str(qos).encode()),
        ("mqtt.retain", b"1" if retain else b"0"),
        ("mqtt.client_id", client_id.encode()),
        ("headwater.kind", kind.encode()),
    ]
    assert msg.timestamp() == (TIMESTAMP_CREATE_TIME, message.timestamp_ms)
    return message


async def test_every_kind_of_record_carries_the_headers_and_the_message_time(
    node: Node, kafka_bootstrap: str, log_topic: str
) -> None:
    client = await RawClient.connected(
        node.config.port, "sensor-7", will=Will("plant/a/status", b"gone", 1, False)
    )
    await client.send(Publish("plant/a/temp", b"21.5", 1, packet_id=1))
    await puback(client, 1)
    await client.send(Publish("plant/a/state", b"", 1, retain=True, packet_id=2))
    await puback(client, 2)
    client.writer.transport.abort()  # no DISCONNECT: the node publishes the will

    user = LogConsumer(kafka_bootstrap, log_topic)
    try:
        wanted = {
            "client": (b"client", "plant/a/temp"),
            "retained-clear": (b"retained-clear", "plant/a/state"),
            "will": (b"will", "plant/a/status"),
            "sys": (b"sys", "$SYS/brokers/logformat/"),
            "event": (b"event", "$events/connected"),  # the quiet producer's
        }
        await eventually(
            lambda: all(user.find(*w) for w in wanted.values()),
            what="a record of every kind",
            timeout=20,
        )
        found: dict[str, Any] = {name: user.find(*w) for name, w in wanted.items()}
        check(found["client"], "plant/a/temp", 1, False, "sensor-7", record.CLIENT)
        check(found["retained-clear"], "plant/a/state", 1, True, "sensor-7", record.RETAINED_CLEAR)
        check(found["will"], "plant/a/status", 1, False, "sensor-7", record.WILL)
        sys_topic = dict(found["sys"].headers())["mqtt.topic"].decode()
        report = check(found["sys"], sys_topic, 0, True, "", record.SYS)
        assert report.origin_node == "logformat"
        event = check(found["event"], "$events/connected", 0, False, "sensor-7", record.EVENT)
        assert b'"client_id":"sensor-7"' in event.payload
    finally:
        user.close()


async def test_records_with_and_without_headers_both_reach_subscribers(
    quiet_node: Node, kafka_bootstrap: str, log_topic: str
) -> None:
    subscriber = await RawClient.connected(quiet_node.config.port, "watcher")
    await subscriber.subscribe(("plant/#", 0))
    router = Router(PARTITIONS, quiet_node.config.routing_depth)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for n, with_headers in enumerate((False, True)):
        message = Message(
            "plant/b/temp", b"%d" % n, 0, False, "elsewhere", "old-node",
            1_700_000_000_000 + n, uuid.uuid4().bytes,
        )  # fmt: skip
        partition, key = router.route(message.topic)
        extra: dict[str, Any] = (
            {"headers": record.headers(message), "timestamp": message.timestamp_ms}
            if with_headers
            else {}
        )
        producer.produce(log_topic, record.encode(message), key, partition, **extra)
    assert producer.flush(30) == 0
    got = [await subscriber.recv(timeout=10) for _ in range(2)]
    assert [(p.topic, p.payload) for p in got if isinstance(p, Publish)] == [
        ("plant/b/temp", b"0"),
        ("plant/b/temp", b"1"),
    ]
    await subscriber.close()


def test_the_pages_tables_are_the_codes() -> None:
    message = Message("plant/line1/temp", b"x" * 64, 1, False, "sensor-17", "n1", 0, bytes(16))
    assert [row[0] for row in table("Headers")] == [k for k, _ in record.headers(message)]
    assert [row[0] for row in table("Kinds of records, and who writes them")] == list(record.KINDS)
    router = Router(12, 2)
    for topic, key, partition in table("Key and partition"):
        assert router.route(topic) == (int(partition), key.encode()), topic
    text = LOG_MD.read_text()
    assert f"(`{record.FINGERPRINT.hex(' ')}`)" in text
    assert f"makes a {len(record.encode(message))}-byte value" in text
    header = 'bytes.fromhex("c301" "' + record.FINGERPRINT.hex() + '")'
    assert header in recipe("Python") and header in recipe("Spark")
    topic_table = dict((row[0], row[1]) for row in table("Topic"))
    assert topic_table["name"] == messages_topic(12).name


async def test_the_python_recipe_decodes_what_a_node_wrote(
    quiet_node: Node, kafka_bootstrap: str, log_topic: str
) -> None:
    client = await RawClient.connected(quiet_node.config.port, "sensor-9")
    await client.send(Publish("plant/c/temp", b"19.5", 1, packet_id=1))
    await puback(client, 1)
    await client.send(Publish("plant/c/state", b"", 1, retain=True, packet_id=2))
    await puback(client, 2)
    await client.close()
    code = as_run_here(recipe("Python"), kafka_bootstrap, log_topic)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, cwd=ROOT, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0
    lines = [line.split(" ") for line in out.decode().splitlines()]
    assert [line[:3] for line in lines] == [
        ["plant/c/temp", "b'19.5'", "client"],
        ["plant/c/state", "b''", "retained-clear"],
    ]
    assert all(avro_ms == kafka_ms for *_, avro_ms, kafka_ms in lines)
