"""The session's real Kafka and Redis: records and keys survive a round trip, topics are ensured."""

from __future__ import annotations

import time

import pytest
import redis.asyncio as aioredis
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from headwater.errors import ServiceError
from headwater.services import kafka_admin, redis_server
from headwater.services.kafka_admin import TopicMismatchError, ensure_topic
from tests.conftest import free_port

RECORDS = 300


def _produce(bootstrap: str, topic: str, count: int) -> dict[bytes, tuple[bytes, int]]:
    """Send `count` keyed records; return key -> (value, partition) from the delivery reports."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    delivered: dict[bytes, tuple[bytes, int]] = {}
    failures: list[KafkaError] = []

    def on_delivery(error: KafkaError | None, message: Message) -> None:
        if error is not None:
            failures.append(error)
            return
        key, value, partition = message.key(), message.value(), message.partition()
        assert isinstance(key, bytes) and isinstance(value, bytes) and partition is not None
        delivered[key] = (value, partition)

    for i in range(count):
        producer.produce(topic, key=b"key-%d" % i, value=b"value-%d" % i, on_delivery=on_delivery)
    assert producer.flush(30) == 0
    assert failures == []
    return delivered


def _consume_all(consumer: Consumer, count: int, timeout: float = 30.0) -> list[Message]:
    messages: list[Message] = []
    deadline = time.monotonic() + timeout
    while len(messages) < count and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is None:
            continue
        assert message.error() is None, message.error()
        messages.append(message)
    return messages


def _partition_counts(bootstrap: str, topic: str) -> int:
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10)
    return len(metadata.topics[topic].partitions)


def test_records_round_trip_with_keys_values_and_partitions(
    kafka_bootstrap: str, topic_name: str
) -> None:
    ensure_topic(kafka_bootstrap, topic_name, 3, {"retention.ms": "3600000"})
    delivered = _produce(kafka_bootstrap, topic_name, RECORDS)
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": topic_name})
    consumer.assign([TopicPartition(topic_name, p, 0) for p in range(3)])
    try:
        messages = _consume_all(consumer, RECORDS)
    finally:
        consumer.close()
    received = {m.key(): (m.value(), m.partition()) for m in messages}
    assert len(messages) == RECORDS
    assert received == delivered
    assert {partition for _, partition in received.values()} == {0, 1, 2}


def test_records_keep_their_order_within_a_partition(kafka_bootstrap: str, topic_name: str) -> None:
    ensure_topic(kafka_bootstrap, topic_name, 3, {})
    _produce(kafka_bootstrap, topic_name, 60)
    consumer = Consumer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "group.id": topic_name,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic_name])
    try:
        messages = _consume_all(consumer, 60)
    finally:
        consumer.close()
    assert len(messages) == 60
    for partition in range(3):
        offsets = [m.offset() or 0 for m in messages if m.partition() == partition]
        assert offsets == sorted(offsets)


def test_ensure_topic_is_idempotent(kafka_bootstrap: str, topic_name: str) -> None:
    ensure_topic(kafka_bootstrap, topic_name, 3, {"cleanup.policy": "delete"})
    ensure_topic(kafka_bootstrap, topic_name, 3, {"cleanup.policy": "delete"})
    assert _partition_counts(kafka_bootstrap, topic_name) == 3


def test_ensure_topic_refuses_another_partition_count(
    kafka_bootstrap: str, topic_name: str
) -> None:
    ensure_topic(kafka_bootstrap, topic_name, 3, {})
    with pytest.raises(TopicMismatchError, match=rf"{topic_name} exists with 3 partitions, not 5"):
        ensure_topic(kafka_bootstrap, topic_name, 5, {})
    assert _partition_counts(kafka_bootstrap, topic_name) == 3


def test_ensure_topic_applies_settings(kafka_bootstrap: str, topic_name: str) -> None:
    from confluent_kafka.admin import ConfigResource  # type: ignore[attr-defined]

    ensure_topic(kafka_bootstrap, topic_name, 1, {"retention.ms": "123456"})
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    resource = ConfigResource("topic", topic_name)
    configs = admin.describe_configs([resource])[resource].result(timeout=10)
    assert configs["retention.ms"].value == "123456"


def test_unreachable_kafka_is_a_clear_error() -> None:
    bootstrap = f"127.0.0.1:{free_port()}"
    with pytest.raises(ServiceError, match=rf"Kafka at {bootstrap} .*HEADWATER_KAFKA_BOOTSTRAP"):
        kafka_admin.check_reachable(bootstrap, timeout=2.0)


def test_a_topic_on_an_unreachable_kafka_is_a_clear_error() -> None:
    with pytest.raises(ServiceError, match=r"cannot list Kafka's topics: .*[Tt]ransport"):
        ensure_topic(f"127.0.0.1:{free_port()}", "nowhere", 1, {}, timeout=2.0)


async def test_redis_round_trips_keys(redis_url: str, redis_prefix: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    try:
        await client.set(f"{redis_prefix}plain", b"\x00binary\xff")
        await client.hset(f"{redis_prefix}session", mapping={"clean": "0", "node": "node1"})
        await client.set(f"{redis_prefix}expiring", "x", ex=60)
        assert await client.get(f"{redis_prefix}plain") == b"\x00binary\xff"
        assert await client.hgetall(f"{redis_prefix}session") == {
            b"clean": b"0",
            b"node": b"node1",
        }
        assert 0 < await client.ttl(f"{redis_prefix}expiring") <= 60
        keys = sorted([key async for key in client.scan_iter(match=f"{redis_prefix}*")])
        assert keys == [f"{redis_prefix}{k}".encode() for k in ("expiring", "plain", "session")]
    finally:
        await client.aclose()


def test_unreachable_redis_is_a_clear_error() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    with pytest.raises(ServiceError, match=r"Redis at .* \(setting HEADWATER_REDIS_URL\)"):
        redis_server.check_reachable(url, timeout=2.0)
