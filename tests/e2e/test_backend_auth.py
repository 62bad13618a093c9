"""A node reaches a Kafka and a Redis that require authentication.

* Kafka: a local Kafka with a SASL_PLAINTEXT listener (PLAIN, one user); the node is given that
  listener and ``--kafka-config``, a file of librdkafka settings (``security.protocol``,
  ``sasl.*``, ``ssl.*``) that every producer, consumer and admin client of the node gets. A message
  goes through the log to a subscriber, so the producer and the reader both authenticated.
* Redis: a local Redis with ``requirepass``; the password travels in the node's ``--redis-url``
  (``redis://:PASSWORD@host:port/db``, as redis-py reads it), and a session survives a reconnect.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis import Redis

from frontend.config import build_parser, config_from_args
from frontend.values import ConfigError
from headwater.services.kafka import LocalKafka
from headwater.services.kafka_admin import ensure_topic
from headwater.services.redis_server import LocalRedis
from router.topics import messages_topic
from tests.conftest import free_port
from tests.e2e.conftest import PARTITIONS, launch_node_process
from tests.e2e.realclients import Clients, PahoClient

USER, PASSWORD = "headwater", "s3cret-" + uuid.uuid4().hex[:8]


@pytest.fixture(scope="module")
def sasl_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    kafka = LocalKafka(
        tmp_path_factory.mktemp("kafka-sasl"), heap="512m", sasl_users={USER: PASSWORD}
    )
    with kafka:
        yield kafka


def kafka_config(path: Path, password: str = PASSWORD) -> Path:
    path.write_text(
        "# librdkafka settings for every Kafka client of the node\n"
        "security.protocol=SASL_PLAINTEXT\n"
        "sasl.mechanism=PLAIN\n"
        f"sasl.username={USER}\n"
        f"sasl.password={password}\n"
    )
    return path


async def test_a_node_publishes_through_a_kafka_that_requires_sasl(
    sasl_kafka: LocalKafka, tmp_path: Path, clients: Clients
) -> None:
    topic = f"test.{uuid.uuid4().hex[:12]}"
    ensure_topic(sasl_kafka.bootstrap, topic, PARTITIONS, messages_topic(PARTITIONS).config)
    port = free_port()
    config = kafka_config(tmp_path / "kafka.properties")
    node = await launch_node_process(
        "sasl1", port, sasl_kafka.sasl_bootstrap, topic, "--kafka-config", str(config)
    )
    try:
        subscriber = await clients.paho(port, "sasl-sub")
        await subscriber.subscribe(("sasl/#", 1))
        publisher = await clients.paho(port, "sasl-pub")
        await publisher.publish("sasl/hello", b"through SASL", qos=1)
        received = await subscriber.next_message()
        assert (received.topic, received.payload) == ("sasl/hello", b"through SASL")
    finally:
        node.terminate()
        await node.wait()


async def test_a_redis_password_in_the_url_is_used(
    kafka_bootstrap: str, log_topic: str, tmp_path: Path
) -> None:
    password = uuid.uuid4().hex
    with LocalRedis(tmp_path / "redis", appendonly=False) as redis:
        admin = Redis.from_url(redis.url)
        admin.config_set("requirepass", password)
        admin.close()
        url = redis.url.replace("redis://", f"redis://:{password}@", 1)
        port = free_port()
        node = await launch_node_process(
            "redis-auth1", port, kafka_bootstrap, log_topic, "--redis-url", url
        )
        try:
            first = PahoClient(port, "kept", clean_session=False)
            assert not await first.connect()
            await first.subscribe(("kept/#", 1))
            await first.close()
            again = PahoClient(port, "kept", clean_session=False)
            assert await again.connect()  # the session, read back from the Redis with a password
            await again.close()
        finally:
            node.terminate()
            await node.wait()


@pytest.mark.parametrize("line", ["acks=0", "security.protocol"])
def test_a_kafka_config_beyond_security_stops_start_up(tmp_path: Path, line: str) -> None:
    path = tmp_path / "kafka.properties"
    path.write_text(f"sasl.mechanism=PLAIN\n{line}\n")
    argv = ["--node-id", "n", "--kafka-bootstrap", "k:9092", "--kafka-config", str(path)]
    with pytest.raises(ConfigError, match=r"--kafka-config.*line 2"):
        config_from_args(build_parser().parse_args(argv))
