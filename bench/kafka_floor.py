"""Kafka alone: how much of a delivery's time (:func:`measure`) and of the machine (:func:`ceiling`)
is the log's own.

A producer configured as a node's (``linger.ms`` 0, ``acks=all``, idempotent, Nagle off) writes a
record stamped with ``time.monotonic_ns()`` ``rate`` times a second, on schedule, to a topic of
its own (one partition) on Headwater's Kafka; a consumer in a thread of its own blocks in
``poll`` (``fetch.wait.max.ms`` 100, as a node's consumers) and reads each one as soon as
librdkafka has it.  The latencies (read minus stamped, one process, one clock) are the floor under
the latency rows: a PUBLISH through a node takes this path and then some (the client's sockets,
the node's event loop).

:func:`ceiling` floods Kafka with the fan-in rows' records and reads them back, as a node would
with nothing else to do: a producer as a node's busy gear (``linger.ms`` 5, ``acks=all``,
idempotent), records of a node's size (100-byte values keyed by topic, the five headers every log
record carries, docs/log.md) over 12 partitions, and a consumer as a node's live one, in one
thread that produces while the producer's queue has room and otherwise waits in ``consume``.  The
records a second it reaches, and the CPU per record of this process (the Kafka client's threads
and the loop) and of Kafka, are the ceiling of a fan-in through a node on this machine: a node
does all of it and its MQTT work too.  Nothing of Headwater is imported: only confluent-kafka.
"""

from __future__ import annotations

import resource
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from confluent_kafka import OFFSET_END, Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from bench.measure import Meter, Steal, percentile

TOPIC = "bench.kafka-floor"
CEILING_TOPIC = "bench.kafka-ceiling"
CEILING_PARTITIONS = 12
"""A node's log topic's (``headwater dev up``)."""
CEILING_QUEUE = 20_000
"""Records the ceiling's producer holds at most before it waits for the consumer."""
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


@dataclass(frozen=True)
class Ceiling:
    records: int
    """Read back in the measured window."""
    seconds: float
    client_us: float
    """This process's CPU (the Kafka client's threads and the loop) per record read."""
    kafka_us: float
    """Kafka's CPU per record read."""
    stolen: float = 0.0

    @property
    def rate(self) -> float:
        return self.records / self.seconds if self.seconds else 0.0


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


def ceiling(
    bootstrap: str, seconds: float, kafka_pids: Sequence[int] = (), warmup: float = 2.0
) -> Ceiling:
    """Kafka flooded for ``warmup`` then ``seconds`` (measured); see the module's docstring.
    ``kafka_pids``: Kafka's processes, whose CPU is counted (none: 0)."""
    common: dict[str, str | int | float | bool] = {
        "bootstrap.servers": bootstrap,
        "socket.nagle.disable": True,
    }
    _create_topic(AdminClient(common), CEILING_TOPIC, CEILING_PARTITIONS)
    producer = Producer({**common, "linger.ms": 5, "acks": "all", "enable.idempotence": True})
    consumer = Consumer({
        **common, "group.id": "bench-kafka-ceiling", "enable.auto.commit": False,
        "enable.auto.offset.store": False, "fetch.wait.max.ms": 100, "fetch.queue.backoff.ms": 5,
    })  # fmt: skip
    # from each partition's end as the consumer finds it (a new topic's leaders come later)
    consumer.assign(
        [TopicPartition(CEILING_TOPIC, p, OFFSET_END) for p in range(CEILING_PARTITIONS)]
    )
    value = bytes(100)
    sources = [(f"lg/{i}".encode(), f"p{i}".encode()) for i in range(4)]  # the fan-in's
    headers = [
        [("mqtt.topic", topic), ("mqtt.qos", b"0"), ("mqtt.retain", b"0"),
         ("mqtt.client_id", client), ("headwater.kind", b"client")]
        for topic, client in sources
    ]  # fmt: skip
    sent = 0

    def flood(seconds: float) -> int:
        """Produce while the queue has room, else wait for records in ``consume``: the records
        read back in ``seconds``."""
        nonlocal sent
        read, end = 0, time.monotonic() + seconds
        while time.monotonic() < end:
            for _ in range(min(256, CEILING_QUEUE - len(producer))):
                i = sent % len(sources)
                producer.produce(  # by position, as a node: keywords cost about 0.8 us
                    CEILING_TOPIC,
                    value,
                    sources[i][0],
                    sent % CEILING_PARTITIONS,
                    None,
                    None,
                    0,
                    headers[i],  # type: ignore[arg-type]  # the stub's list is invariant
                )
                sent += 1
            producer.poll(0)
            read += len(consumer.consume(500, 0.001))
        return read

    try:
        flood(warmup)
        cpu, kafka, stolen = _self_cpu(), Meter(kafka_pids), Steal()
        read = flood(seconds)
        used, kafka_used, share = _self_cpu() - cpu, sum(kafka.used()), stolen.share()
    finally:
        consumer.close()
        producer.flush(TIMEOUT)
    per = 1e6 / max(1, read)
    return Ceiling(read, seconds, used * per, kafka_used * per, share)


def _self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _create_topic(admin: AdminClient, topic: str = TOPIC, partitions: int = 1) -> None:
    try:
        admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(TIMEOUT)
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
