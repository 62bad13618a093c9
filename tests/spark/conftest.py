"""Spark fixtures: one local SparkSession for the whole run, and an oracle for the log.

The session is built by ``spark_streaming.source.build_session`` (so the tests use the connector
jars the jobs use, from the same Ivy cache), with local[2] and two shuffle partitions.  The
front-end fixtures of tests/e2e (an in-process ``Node`` on an ephemeral port, a fresh log topic)
are re-exported here.  ``log_messages`` decodes a topic with ``router.record.decode``: an
implementation independent of Spark's, against which the jobs' aggregates are checked.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

pytest.importorskip("pyspark")

import contextlib

from confluent_kafka import Consumer, TopicPartition
from pyspark.sql import SparkSession

from mqttcore.message import Message
from router.record import RecordError, decode
from spark_streaming.source import build_session
from tests.e2e.conftest import log_topic, node, start_node

__all__ = ["log_messages", "log_topic", "node", "start_node", "wait_for_log"]


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = build_session("headwater-tests", "local[2]", shuffle_partitions=2)
    yield session
    session.stop()


def _consumer(bootstrap: str) -> Consumer:
    return Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False}
    )


def log_size(bootstrap: str, topic: str) -> int:
    """Records in ``topic`` (it is never compacted or truncated during a test)."""
    consumer = _consumer(bootstrap)
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        return sum(
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in partitions
        )
    finally:
        consumer.close()


def wait_for_log(bootstrap: str, topic: str, count: int, timeout: float = 30.0) -> None:
    """Wait until ``topic`` holds ``count`` records (QoS 0 publishes are not acknowledged)."""
    deadline = time.monotonic() + timeout
    while (size := log_size(bootstrap, topic)) < count:
        assert time.monotonic() < deadline, f"{topic} has {size} records, expected {count}"
        time.sleep(0.1)
    assert size == count, f"{topic} has {size} records, expected {count}"


def log_messages(bootstrap: str, topic: str) -> list[Message]:
    """Every Headwater message in ``topic``, decoded in Python (other records skipped)."""
    consumer = _consumer(bootstrap)
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {}
        for p in partitions:
            ends[p] = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        messages, seen = [], dict.fromkeys(partitions, 0)
        while any(seen[p] < ends[p] for p in partitions):
            record = consumer.poll(5.0)
            assert record is not None, "timed out reading the log back"
            if record.error():
                continue
            seen[record.partition()] = record.offset() + 1
            with contextlib.suppress(RecordError):
                messages.append(decode(record.value()))
        return messages
    finally:
        consumer.close()
