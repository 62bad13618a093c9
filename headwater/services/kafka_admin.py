"""Talking to a Kafka cluster as an administrator: reachability and topic creation.

`ensure_topic` is idempotent: it creates the topic with an explicit partition count, replication
factor and settings, accepts an existing topic with the same count, and refuses one with a
different count (partitions cannot be merged, and Headwater's MQTT-topic -> partition mapping
depends on the count). An existing topic whose replication factor or settings differ from those
asked for is used as it is, with a warning naming each difference on the `headwater.kafka` logger:
re-replicating or reconfiguring a live topic is an operator's decision. It returns only once every
partition has a leader, so a producer can write at once.

librdkafka's own log lines go to the `headwater.kafka.client` logger, which has a NullHandler and
does not propagate: an unreachable cluster is reported once, by the exception raised here, not by a
stream of log lines.
"""

from __future__ import annotations

import logging
import threading
import time

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
    ResourceType,
    TopicMetadata,
)
from confluent_kafka.cimpl import NewTopic

from headwater.errors import ServiceError
from headwater.services.process import ChildProcess
from headwater.services.readiness import wait_until
from headwater.settings import KAFKA_BOOTSTRAP_ENV

log = logging.getLogger("headwater.kafka")
CLIENT_LOGGER = logging.getLogger("headwater.kafka.client")
CLIENT_LOGGER.addHandler(logging.NullHandler())
CLIENT_LOGGER.propagate = False


class TopicMismatchError(ServiceError):
    """A topic exists with a partition count other than the one asked for."""


def admin_client(bootstrap: str) -> AdminClient:
    """An AdminClient whose librdkafka logging stays out of the terminal."""
    return AdminClient({"bootstrap.servers": bootstrap}, logger=CLIENT_LOGGER)


def answers(bootstrap: str, timeout: float = 1.0, brokers: int = 1) -> bool:
    """True if a broker at `bootstrap` returns metadata naming at least `brokers` brokers."""
    try:
        return len(admin_client(bootstrap).list_topics(timeout=timeout).brokers) >= brokers
    except KafkaException:
        return False


def broker_count(bootstrap: str, timeout: float = 10.0) -> int:
    """How many live brokers the Kafka at `bootstrap` has."""
    return len(admin_client(bootstrap).list_topics(timeout=timeout).brokers)


def check_reachable(
    bootstrap: str, timeout: float = 10.0, setting: str = KAFKA_BOOTSTRAP_ENV
) -> None:
    """Raise a ServiceError naming `setting` unless Kafka at `bootstrap` answers in time."""
    try:
        admin_client(bootstrap).list_topics(timeout=timeout)
    except KafkaException as exc:
        raise ServiceError(
            f"Kafka at {bootstrap} (setting {setting}) is unreachable: {_reason(exc)}"
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
    existing = _metadata(admin, name, timeout)
    if existing is None:
        existing = _create(admin, NewTopic(name, partitions, replication_factor, config=config))
    if existing is not None:
        _check_existing(admin, name, existing, partitions, replication_factor, config)
    _wait_for_leaders(admin, name, partitions, timeout)


def _metadata(admin: AdminClient, name: str, timeout: float) -> TopicMetadata | None:
    """The metadata of topic `name`, or None if it does not exist.

    All topics are listed rather than just `name`, so that a cluster with auto-creation enabled does
    not create the topic with its default partition count in answer to the question.
    """
    try:
        topic = admin.list_topics(timeout=timeout).topics.get(name)
    except KafkaException as exc:
        raise ServiceError(f"cannot list Kafka's topics: {_reason(exc)}") from None
    if topic is None or topic.error is not None:
        return None
    return topic


def _create(admin: AdminClient, topic: NewTopic) -> TopicMetadata | None:
    """Create `topic`; if someone else just did, return the existing one's metadata instead."""
    future = admin.create_topics([topic], operation_timeout=30)[topic.topic]
    try:
        future.result()
    except KafkaException as exc:
        if _code(exc) != KafkaError.TOPIC_ALREADY_EXISTS:
            raise ServiceError(f"cannot create Kafka topic {topic.topic}: {_reason(exc)}") from None
        return _metadata(admin, topic.topic, 10.0)
    return None


def _check_existing(
    admin: AdminClient,
    name: str,
    topic: TopicMetadata,
    partitions: int,
    replication_factor: int,
    config: dict[str, str],
) -> None:
    """Refuse another partition count; warn of another replication factor or setting."""
    if len(topic.partitions) != partitions:
        raise TopicMismatchError(
            f"Kafka topic {name} exists with {len(topic.partitions)} partitions, not {partitions}: "
            "delete it (or the state directory) or ask for the same count"
        )
    replicas = min(len(p.replicas) for p in topic.partitions.values())
    if replicas != replication_factor:
        log.warning(
            "Kafka topic %s exists with replication factor %d, not %d: it is used as it is "
            "(kafka-reassign-partitions can change it)",
            name, replicas, replication_factor,
        )  # fmt: skip
    if not config:
        return
    actual = topic_config(admin, name)
    for key, wanted in config.items():
        if key in actual and actual[key] != wanted:
            log.warning(
                "Kafka topic %s exists with %s=%s, not %s: it is used as it is "
                "(kafka-configs --alter can change it)",
                name, key, actual[key], wanted,
            )  # fmt: skip


def topic_config(admin: AdminClient, name: str, timeout: float = 10.0) -> dict[str, str]:
    """Every setting of topic `name`, as Kafka reports it.

    A broker that has not yet heard of a topic just created elsewhere says it does not exist, so
    that answer is retried until `timeout`.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            return _describe_config(admin, name, timeout)
        except KafkaException as exc:
            if _code(exc) != KafkaError.UNKNOWN_TOPIC_OR_PART or time.monotonic() >= deadline:
                raise ServiceError(
                    f"cannot read the settings of Kafka topic {name}: {_reason(exc)}"
                ) from None
        time.sleep(0.1)


def _describe_config(admin: AdminClient, name: str, timeout: float) -> dict[str, str]:
    resource = ConfigResource(ResourceType.TOPIC, name)
    entries = admin.describe_configs([resource])[resource].result(timeout=timeout)
    return {key: entry.value for key, entry in entries.items()}


def _error(exc: KafkaException) -> KafkaError | None:
    """The KafkaError `exc` carries, if it carries one."""
    error = exc.args[0] if exc.args else None
    return error if isinstance(error, KafkaError) else None


def _code(exc: KafkaException) -> int | None:
    """The Kafka error code `exc` carries, if it carries one."""
    error = _error(exc)
    return None if error is None else error.code()


def _reason(exc: KafkaException) -> str:
    """What went wrong, in librdkafka's words."""
    error = _error(exc)
    return str(exc) if error is None else error.str()


def _wait_for_leaders(admin: AdminClient, name: str, partitions: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not _all_led(admin, name, partitions):
        if time.monotonic() >= deadline:
            raise ServiceError(f"Kafka topic {name}: partitions have no leader after {timeout}s")
        time.sleep(0.1)


def _all_led(admin: AdminClient, name: str, partitions: int) -> bool:
    try:
        topic = admin.list_topics(topic=name, timeout=5.0).topics.get(name)
    except KafkaException:  # the deadline of `_wait_for_leaders` bounds the asking
        return False
    if topic is None or topic.error is not None or len(topic.partitions) != partitions:
        return False
    return all(p.leader >= 0 and p.error is None for p in topic.partitions.values())
