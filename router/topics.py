"""The Kafka topics Headwater uses, named in one place.

Every MQTT PUBLISH becomes one record of `MESSAGES_TOPIC`. The partition count is chosen when the
topic is created (`headwater dev up --partitions`) and never changes afterwards, because the
router's MQTT-topic -> partition mapping depends on it; tooling that finds the topic with another
count refuses to go on rather than repartition it.

A front-end acknowledges a QoS 1/2 PUBLISH once Kafka has written it with acks=all, that is to at
least `min.insync.replicas` brokers: the topic's `Replication` decides how many broker losses an
acknowledged message survives (min_insync - 1) and how many the topic stays writable through
(factor - min_insync).
"""

from __future__ import annotations

from dataclasses import dataclass, field

MESSAGES_TOPIC = "headwater.messages"
DEFAULT_PARTITIONS = 12
# Largest record the messages topic accepts (Kafka's default is 1 MiB). Producers must raise their
# own `message.max.bytes` to match; an MQTT PUBLISH larger than this cannot be made durable.
MAX_RECORD_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Replication:
    """How many brokers keep each partition (`factor`), and how many must have a record before a
    write is acknowledged (`min_insync`, Kafka's `min.insync.replicas`)."""

    factor: int = 1
    min_insync: int = 1

    @classmethod
    def for_factor(cls, factor: int) -> Replication:
        """`factor` copies, of which all but one must have a write (at least one)."""
        return cls(factor, max(1, factor - 1))

    @classmethod
    def for_brokers(cls, brokers: int) -> Replication:
        """The default on `brokers` brokers: up to three copies, writable with one of them down."""
        return cls.for_factor(min(3, brokers))


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """What `ensure_topic` needs to create one topic."""

    name: str
    partitions: int
    replication_factor: int = 1
    config: dict[str, str] = field(default_factory=dict)


def messages_topic(partitions: int, replication: Replication = Replication()) -> TopicSpec:
    """The log of every accepted PUBLISH, kept for a week, timestamped by the front-end."""
    return TopicSpec(
        name=MESSAGES_TOPIC,
        partitions=partitions,
        replication_factor=replication.factor,
        config={
            "cleanup.policy": "delete",
            "retention.ms": str(7 * 24 * 3600 * 1000),
            "message.timestamp.type": "CreateTime",
            "min.insync.replicas": str(replication.min_insync),
            "max.message.bytes": str(MAX_RECORD_BYTES),
        },
    )


def project_topics(partitions: int, replication: Replication = Replication()) -> list[TopicSpec]:
    """Every topic a Headwater cluster needs, for `partitions` message partitions."""
    return [messages_topic(partitions, replication)]
