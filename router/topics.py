"""The Kafka topics Headwater uses, named in one place.

Every MQTT PUBLISH becomes one record of `MESSAGES_TOPIC`. The partition count is chosen when the
topic is created (`headwater dev up --partitions`) and never changes afterwards, because the
router's MQTT-topic -> partition mapping depends on it; tooling that finds the topic with another
count refuses to go on rather than repartition it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MESSAGES_TOPIC = "headwater.messages"
DEFAULT_PARTITIONS = 12
# Largest record the messages topic accepts (Kafka's default is 1 MiB). Producers must raise their
# own `message.max.bytes` to match; an MQTT PUBLISH larger than this cannot be made durable.
MAX_RECORD_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """What `ensure_topic` needs to create one topic."""

    name: str
    partitions: int
    config: dict[str, str] = field(default_factory=dict)


def messages_topic(partitions: int) -> TopicSpec:
    """The log of every accepted PUBLISH, kept for a week, timestamped by the front-end."""
    return TopicSpec(
        name=MESSAGES_TOPIC,
        partitions=partitions,
        config={
            "cleanup.policy": "delete",
            "retention.ms": str(7 * 24 * 3600 * 1000),
            "message.timestamp.type": "CreateTime",
            "min.insync.replicas": "1",
            "max.message.bytes": str(MAX_RECORD_BYTES),
        },
    )


def project_topics(partitions: int) -> list[TopicSpec]:
    """Every topic a Headwater cluster needs, for `partitions` message partitions."""
    return [messages_topic(partitions)]
