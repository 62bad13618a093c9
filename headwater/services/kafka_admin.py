"""Talking to a Kafka cluster as an administrator: reachability and topic creation.

`ensure_topic` is idempotent: it creates the topic with an explicit partition count and settings,
accepts an existing topic with the same count, and refuses one with a different count (partitions
cannot be merged, and Headwater's MQTT-topic -> partition mapping depends on the count). It returns
only once every partition has a leader, so a producer can write at once.

librdkafka's own log lines go to the `headwater.kafka.client` logger, which has a NullHandler: an
unreachable cluster is reported once, by the exception raised here, not by a stream of log lines.
"""

from __future__ import annotations

import logging
import threading
import time

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from headwater.errors import ServiceError
from headwater.services.process import ChildProcess
from headwater.services.readiness import wait_until
from headwater.settings import KAFKA_BOOTSTRAP_ENV

CLIENT_LOGGER = logging.getLogger("headwater.kafka.client")
CLIENT_LOGGER.addHandler(logging.NullHandler())


class TopicMismatchError(ServiceError):
    """A topic exists with a partition count other than the one asked for."""


def admin_client(bootstrap: str) -> AdminClient:
    """An AdminClient whose librdkafka logging stays out of the terminal."""
    return AdminClient({"bootstrap.servers": bootstrap}, logger=CLIENT_LOGGER)


def answers(bootstrap: str, timeout: float = 1.0) -> bool:
    """True if a broker at `bootstrap` returns metadata naming at least one broker."""
    try:
        return bool(admin_client(bootstrap).list_topics(timeout=timeout).brokers)
    except KafkaException:
        return False


def check_reachable(
    bootstrap: str, timeout: float = 10.0, setting: str = KAFKA_BOOTSTRAP_ENV
) -> None:
    """Raise a ServiceError naming `setting` unless Kafka at `bootstrap` answers in time."""
    try:
        admin_client(bootstrap).list_topics(timeout=timeout)
    except KafkaException as exc:
        reason = exc.args[0].str() if exc.args and isinstance(exc.args[0], KafkaError) else exc
        raise ServiceError(
            f"Kafka at {bootstrap} (setting {setting}) is unreachable: {reason}"
        ) from None


def wait_until_ready(
    bootstrap: str,
    timeout: float,
    child: ChildProcess | None = None,
    cancel: threading.Event | None = None,
) -> None:
    """Wait until Kafka at `bootstrap` answers metadata requests."""
    wait_until(
        lambda: answers(bootstrap),
        what=f"Kafka at {bootstrap}",
        timeout=timeout,
        child=child,
        cancel=cancel,
        interval=0.1,
    )


def ensure_topic(
    bootstrap: str,
    name: str,
    partitions: int,
    config: dict[str, str],
    *,
    replication_factor: int = 1,
    timeout: float = 30.0,
) -> None:
    """Create topic `name` unless it exists with the same partition count; then wait for leaders."""
    admin = admin_client(bootstrap)
    existing = _partition_count(admin, name, timeout)
    if existing is None:
        existing = _create(admin, NewTopic(name, partitions, replication_factor, config=config))
    if existing is not None and existing != partitions:
        raise TopicMismatchError(
            f"Kafka topic {name} exists with {existing} partitions, not {partitions}: "
            "delete it (or the state directory) or ask for the same count"
        )
    _wait_for_leaders(admin, name, partitions, timeout)


def _partition_count(admin: AdminClient, name: str, timeout: float) -> int | None:
    """How many partitions topic `name` has, or None if it does not exist.

    All topics are listed rather than just `name`, so that a cluster with auto-creation enabled does
    not create the topic with its default partition count in answer to the question.
    """
    topic = admin.list_topics(timeout=timeout).topics.get(name)
    if topic is None or topic.error is not None:
        return None
    return len(topic.partitions)


def _create(admin: AdminClient, topic: NewTopic) -> int | None:
    """Create `topic`; if someone else just did, return its partition count instead."""
    future = admin.create_topics([topic], operation_timeout=30)[topic.topic]
    try:
        future.result()
    except KafkaException as exc:
        error = exc.args[0]
        if not isinstance(error, KafkaError) or error.code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise ServiceError(f"cannot create Kafka topic {topic.topic}: {error}") from None
        return _partition_count(admin, topic.topic, 10.0)
    return None


def _wait_for_leaders(admin: AdminClient, name: str, partitions: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not _all_led(admin, name, partitions):
        if time.monotonic() >= deadline:
            raise ServiceError(f"Kafka topic {name}: partitions have no leader after {timeout}s")
        time.sleep(0.1)


def _all_led(admin: AdminClient, name: str, partitions: int) -> bool:
    topic = admin.list_topics(topic=name, timeout=5.0).topics.get(name)
    if topic is None or topic.error is not None or len(topic.partitions) != partitions:
        return False
    return all(p.leader >= 0 and p.error is None for p in topic.partitions.values())
