"""The outbox (``router.log``): one loop iteration's records go to librdkafka together at its end,
each on its partition in order, and the sender of a record the producer refuses is told, with the
reason.  Against the session's real Kafka."""

from __future__ import annotations

from typing import Any

from confluent_kafka import Producer

from headwater.services.kafka_admin import ensure_topic
from router.log import Outbox


def producer(bootstrap: str, **config: Any) -> Producer:
    return Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, **config})


def test_each_record_lands_on_its_partition_in_order(kafka_bootstrap: str, topic_name: str) -> None:
    ensure_topic(kafka_bootstrap, topic_name, 3, {})
    outbox = Outbox()
    landed: list[tuple[int, bytes]] = []

    def report(err: Any, msg: Any) -> None:
        assert err is None
        landed.append((msg.partition(), msg.value()))

    for i in range(12):
        outbox.add(i % 3, b"%d" % i, b"k", report, None)
    assert len(outbox) == 12
    kafka = producer(kafka_bootstrap)
    assert outbox.send(kafka, topic_name) == []
    assert len(outbox) == 0
    assert kafka.flush(30) == 0
    for partition in range(3):
        wanted = [b"%d" % i for i in range(partition, 12, 3)]
        assert [value for p, value in landed if p == partition] == wanted


def test_a_record_the_producer_refuses_tells_its_sender(
    kafka_bootstrap: str, topic_name: str
) -> None:
    ensure_topic(kafka_bootstrap, topic_name, 1, {})
    full_at_five = producer(
        kafka_bootstrap, **{"queue.buffering.max.messages": 5, "linger.ms": 5000}
    )
    outbox = Outbox()
    senders = [lambda p, o, e, i=i: None for i in range(8)]
    for i, sender in enumerate(senders):
        outbox.add(0, b"%d" % i, b"k", None, sender)
    refused = outbox.send(full_at_five, topic_name)
    assert [sender for sender, _, _ in refused] == senders[5:]
    assert all(partition == 0 and "Queue full" in error for _, partition, error in refused)
    full_at_five.purge()
