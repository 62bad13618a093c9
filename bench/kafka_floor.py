"""Kafka alone at the latency rows' pace: how much of a delivery's time is the log's own.

A producer configured as a node's (``linger.ms`` 0, ``acks=all``, idempotent, Nagle off) writes a
record stamped with ``time.monotonic_ns()`` ``rate`` times a second, on schedule, to a topic of
its own (one partition) on Headwater's Kafka; a consumer in a thread of its own blocks in
``poll`` (``fetch.wait.max.ms`` 100, as a node's consumers) and reads each one as soon as
librdkafka has it.  The latencies (read minus stamped, one process, one clock) are the floor under
the latency rows: a PUBLISH through a node takes this path and then some (the client's sockets,
the node's event loop).  Nothing of Headwater is imported: only confluent-kafka.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from bench.measure import Steal, percentile

TOPIC = "bench.kafka-floor"
TIMEOUT = 10.0
"""Seconds Kafka has to create the topic, answer the watermark query, or deliver the tail."""


@dataclass(frozen=True)
class Floor:
    sent: int
    received: int
    p50_ms: float
    p99_ms: float
    stolen: float = 0.0
    """The share of the machine's CPU time its hypervisor took meanwhile (``bench.measure``)."""


def measure(bootstrap: str, rate: float, seconds: float) -> Floor:
    """``rate * seconds`` records through Kafka at ``bootstrap``; see the module's docstring."""
    common: dict[str, str | int | float | bool] = {
        "bootstrap.servers": bootstrap,
        "socket.nagle.disable": True,
    }
    _create_topic(AdminClient(common))
    producer = Producer({**common, "linger.ms": 0, "acks": "all", "enable.idempotence": True})
    consumer = Consumer({
        **common, "group.id": "bench-kafka-floor", "enable.auto.commit": False,
        "fetch.wait.max.ms": 100,
    })  # fmt: skip
    _, high = consumer.get_watermark_offsets(TopicPartition(TOPIC, 0), timeout=TIMEOUT)
    consumer.assign([TopicPartition(TOPIC, 0, high)])
    count = int(rate * seconds)
    latencies: list[float] = []
    reader = threading.Thread(target=_read, args=(consumer, count, latencies), daemon=True)
    reader.start()
    stolen = Steal()
    try:
        start = time.monotonic()
        for i in range(count):
            wait = start + i / rate - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            producer.produce(TOPIC, str(time.monotonic_ns()).encode(), partition=0)
            producer.poll(0)
        producer.flush(TIMEOUT)
        reader.join(2 * TIMEOUT)  # it gives up after TIMEOUT without a record
    finally:
        consumer.close()
    return Floor(
        count, len(latencies), percentile(latencies, 50), percentile(latencies, 99), stolen.share()
    )


def _create_topic(admin: AdminClient) -> None:
    try:
        admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(TIMEOUT)
    except KafkaException as exc:
        if "TOPIC_ALREADY_EXISTS" not in str(exc):
            raise


def _read(consumer: Consumer, count: int, latencies: list[float]) -> None:
    deadline = None
    while len(latencies) < count:
        msg = consumer.poll(0.1)
        if msg is None or msg.error() is not None:
            deadline = deadline or time.monotonic() + TIMEOUT
            if time.monotonic() > deadline:
                return
            continue
        deadline = None
        latencies.append((time.monotonic_ns() - int(msg.value() or 0)) / 1e6)
