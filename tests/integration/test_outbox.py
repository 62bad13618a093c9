"""The outbox (``router.outbox``): one loop iteration's records go to librdkafka together at its
end, each on its partition in order; the sender of a record the producer refuses is told, with the
reason; the records nobody waits for are reported once a partition a hand-over.  Against the
session's real Kafka."""

from __future__ import annotations

from typing import Any

from confluent_kafka import Producer

from headwater.services.kafka_admin import ensure_topic
from router.outbox import Outbox


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


def test_records_without_a_callback_are_reported_once_a_partition_a_hand_over(
    kafka_bootstrap: str, topic_name: str
) -> None:
    """QoS 0 records: one report a partition a hand-over, saying how many were written."""
    ensure_topic(kafka_bootstrap, topic_name, 3, {})
    reports: list[tuple[int, Any, int]] = []
    outbox = Outbox(lambda records, err, msg: reports.append((records, err, msg.partition())))
    kafka = producer(kafka_bootstrap)
    for _ in range(2):  # two hand-overs, two groups a partition
        for i in range(10):
            outbox.add(i % 3, b"%d" % i, b"k", None, None)
        assert outbox.send(kafka, topic_name) == []
    assert kafka.flush(30) == 0
    assert sorted(reports) == sorted([(4, None, 0), (3, None, 1), (3, None, 2)] * 2)


def test_a_group_counts_only_the_records_the_producer_took(
    kafka_bootstrap: str, topic_name: str
) -> None:
    """Refused records are the refusal's (told as such), not the group's; what the group holds
    is reported lost together when it fails (here: purged)."""
    ensure_topic(kafka_bootstrap, topic_name, 1, {})
    full_at_five = producer(
        kafka_bootstrap, **{"queue.buffering.max.messages": 5, "linger.ms": 5000}
    )
    reports: list[tuple[int, Any]] = []
    outbox = Outbox(lambda records, err, msg: reports.append((records, err)))
    for i in range(8):
        outbox.add(0, b"%d" % i, b"k", None, None)
    refused = outbox.send(full_at_five, topic_name)
    assert [(sender, partition) for sender, partition, _ in refused] == [(None, 0)] * 3
    full_at_five.purge()
    full_at_five.poll(5)
    assert len(reports) == 1
    records, err = reports[0]
    assert records == 5 and err is not None and "Purged" in err.str()
