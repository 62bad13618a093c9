"""A group consumer's ``close()`` serves no rebalance event: each is served before it, by
``router.retry.leave_group``, while librdkafka's group handler still answers.

Why it matters: confluent-kafka runs a rebalance callback holding the GIL and then asks the
group handler (``rd_kafka_rebalance_protocol``, ``rd_kafka_assign``) with no timeout; an event
that ``close()`` serves once the handler has terminated is never answered, and no Python thread
of the process runs again.  A draining node froze so (py-spy: the relay's thread in
``Consumer_close`` -> ``Consumer_rebalance_cb`` -> ``rd_kafka_rebalance_protocol``): its relay's
producer kept failing against a stalled Kafka, so the relay never polled, and the rebalance
events of its group waited in the consumer's queue for ``close()``.  Whether librdkafka's group
handler still waits for such an event when ``close()`` serves it is a race (1 freeze in 17
fresh-Kafka attempts here); these tests make its precondition certain (an assignment queued,
unserved, at stop) and check that ``close()`` is left no event to serve.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import (
    Consumer,
    ConsumerGroupState,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

import router.relays
from headwater.services.kafka_admin import ensure_topic
from router.relays import Relay, RelaySettings
from router.topics import messages_topic
from tests.e2e.conftest import eventually

pytestmark = pytest.mark.timeout(120)

PARTITIONS = 2

Callback = Callable[[Consumer, list[TopicPartition]], None]


class Recording(Consumer):
    """A consumer that notes, for each rebalance callback, whether ``close()`` was running."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.closing = False
        self.events: list[tuple[str, bool]] = []

    def subscribe(
        self, topics: list[str], on_assign: Callback | None = None,
        on_revoke: Callback | None = None, on_lost: Callback | None = None,
    ) -> None:  # fmt: skip
        super().subscribe(
            topics, on_assign=self._noted("assign", on_assign),
            on_revoke=self._noted("revoke", on_revoke),
            **({"on_lost": self._noted("lost", on_lost)} if on_lost else {}),
        )  # fmt: skip

    def _noted(self, kind: str, callback: Callback | None) -> Callback:
        def called(consumer: Consumer, partitions: list[TopicPartition]) -> None:
            self.events.append((kind, self.closing))
            if callback is not None:
                callback(consumer, partitions)

        return called

    def close(self) -> None:
        self.closing = True
        try:
            super().close()
        finally:
            self.closing = False


def new_topic(bootstrap: str, name: str) -> str:
    topic = f"rebalance.{name}.{time.monotonic_ns()}"
    ensure_topic(bootstrap, topic, PARTITIONS, messages_topic(PARTITIONS).config)
    return topic


def assigned_by_the_group(bootstrap: str, group: str) -> Callable[[], bool]:
    """Whether the broker's group is stable with the consumer's assignment made (the client
    then has the assignment event queued, unserved until something polls or closes)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})

    def check() -> bool:
        try:
            (description,) = [f.result() for f in admin.describe_consumer_groups([group]).values()]
        except KafkaException:
            return False
        return description.state == ConsumerGroupState.STABLE and any(
            m.assignment.topic_partitions for m in description.members
        )

    return check


class HeldRelay(Relay):
    """A relay whose producer cannot be made until the test lets it fail (a Kafka whose
    transaction coordinator does not answer): its thread does not poll meanwhile."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.fail = threading.Event()

    def _new_producer(self) -> Producer:
        self.fail.wait(30)
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "held by the test"))


async def test_a_relay_that_never_polled_leaves_its_group_before_closing(
    kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(router.relays, "Consumer", Recording)
    source = new_topic(kafka_bootstrap, "relay")
    relay = HeldRelay(
        f"test.{source}", RelaySettings(kafka_bootstrap, "rebalance-node"), source,
        lambda message: None,
    )  # fmt: skip
    relay.start()
    consumer = relay._consumer
    assert isinstance(consumer, Recording)
    await eventually(
        assigned_by_the_group(kafka_bootstrap, f"headwater.{relay.name}"),
        what="the relay's group assigning it the partitions", timeout=30,
    )  # fmt: skip
    assert consumer.events == []  # queued, not served: the thread never polled
    started = time.monotonic()
    relay._stopping.set()  # asked to stop while held: it will not poll again
    relay.fail.set()
    await relay.stop()
    assert not relay.running
    assert time.monotonic() - started < 5
    assert consumer.events, "the assignment was never served"
    assert not [kind for kind, inside in consumer.events if inside], consumer.events
