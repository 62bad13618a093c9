"""How many record bytes a stretch of the log holds, per partition, read back from Kafka.

A Headwater node counts ``len(value)`` of every record it fetches.  Until nodes expose that counter,
the interest-routing scenario reproduces it from Kafka: the high watermarks of every partition
before and after the publishing, then a read of exactly those offset ranges summing the value
sizes.  A node's fetched bytes are the sum over the partitions it was assigned.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from confluent_kafka import Consumer, TopicPartition

from headwater.services.kafka_admin import CLIENT_LOGGER


@dataclass(frozen=True, slots=True)
class PartitionBytes:
    records: int
    value_bytes: int


def _consumer(bootstrap: str) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"headwater-bench-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
        },
        logger=CLIENT_LOGGER,
    )


def high_watermarks(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    """The offset the next record of each partition will get."""
    consumer = _consumer(bootstrap)
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(partitions)
        }
    finally:
        consumer.close()


def value_bytes(
    bootstrap: str,
    topic: str,
    start: dict[int, int],
    end: dict[int, int],
    timeout: float = 60.0,
) -> dict[int, PartitionBytes]:
    """Records and summed value sizes in ``[start[p], end[p])`` of every partition ``p``."""
    wanted = {p: end[p] for p in start if end[p] > start[p]}
    counts = {p: [0, 0] for p in start}
    consumer = _consumer(bootstrap)
    try:
        consumer.assign([TopicPartition(topic, p, start[p]) for p in wanted])
        deadline = time.monotonic() + timeout
        while wanted and time.monotonic() < deadline:
            for msg in consumer.consume(1000, 0.5):
                p, offset = msg.partition(), msg.offset()
                if msg.error() is not None or p is None or offset is None or p not in wanted:
                    continue
                if offset >= wanted[p]:
                    continue
                counts[p][0] += 1
                counts[p][1] += len(msg.value() or b"")
                if offset + 1 >= wanted[p]:
                    del wanted[p]
        if wanted:
            raise TimeoutError(f"could not read partitions {sorted(wanted)} of {topic} in time")
    finally:
        consumer.close()
    return {p: PartitionBytes(n, size) for p, (n, size) in counts.items()}
