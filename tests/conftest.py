"""Session-wide real Kafka and Redis, and per-test names to isolate tests that share them.

Where each service comes from, decided separately for Kafka and for Redis:
1. HEADWATER_KAFKA_BOOTSTRAP / HEADWATER_REDIS_URL set: that external service, checked once;
2. else, if a Docker engine answers a ping: a testcontainers container (apache/kafka:4.1.1, redis:7)
   published on a free 127.0.0.1 port;
3. else a local process through LocalKafka / LocalRedis, the classes `headwater dev up` uses, with
   its state in a temporary directory.
Services are started on first use (a unit-test run starts none) and stopped at session end.

`kafka_cluster` is another Kafka, of three brokers in one KRaft quorum (`LocalKafkaCluster`, as
`headwater dev up --kafka-brokers 3` runs it), for the tests of replication: always local
processes, because those tests kill brokers; a test that kills one starts it again before it ends.
Its topics take `KAFKA_CLUSTER_REPLICATION` (factor 3, min ISR 2).

`redis_cluster_url` names a node of a Redis Cluster of three masters (`LocalRedisCluster`: local
cluster-mode redis-servers joined by `redis-cli --cluster create`), for the tests that run against
Redis Cluster too.

Tests share the services, so they isolate themselves by name: `topic_name` is a fresh Kafka topic
name (not created: call ensure_topic with the partitions you need) and `redis_prefix` a fresh key
prefix. `free_port()` (re-exported here) gives a free loopback port below the ephemeral
range; never use 1883.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from headwater.services import kafka_admin, redis_server
from headwater.services.kafka import LocalKafka, LocalKafkaCluster, new_cluster_id
from headwater.services.ports import LOOPBACK, free_port
from headwater.services.readiness import wait_until
from headwater.services.redis_server import LocalRedis, LocalRedisCluster
from headwater.settings import external_kafka_bootstrap, external_redis_url
from router.topics import Replication

__all__ = ["free_port"]

KAFKA_IMAGE = "apache/kafka:4.1.1"
KAFKA_CLUSTER_REPLICATION = Replication(factor=3, min_insync=2)
REDIS_IMAGE = "redis:7"


@functools.cache
def docker_available(image: str) -> bool:
    """True if a Docker engine answers a ping within a few seconds and already holds `image`
    (quietly False otherwise): an engine that cannot pull it (no registry) runs no container."""
    try:
        import docker

        client = docker.from_env(timeout=3)  # type: ignore[attr-defined]
        try:
            client.images.get(image)
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False


def _kafka_container_env(host_port: int) -> dict[str, str]:
    """KRaft single node; clients on the host reach it as 127.0.0.1:<host_port>."""
    return {
        "CLUSTER_ID": new_cluster_id(),
        "KAFKA_NODE_ID": "1",
        "KAFKA_PROCESS_ROLES": "broker,controller",
        "KAFKA_CONTROLLER_QUORUM_VOTERS": "1@localhost:29093",
        "KAFKA_LISTENERS": "CONTROLLER://:29093,PLAINTEXT_HOST://:9092,PLAINTEXT://:19092",
        "KAFKA_ADVERTISED_LISTENERS": (
            f"PLAINTEXT_HOST://{LOOPBACK}:{host_port},PLAINTEXT://localhost:19092"
        ),
        "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": (
            "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,PLAINTEXT_HOST:PLAINTEXT"
        ),
        "KAFKA_INTER_BROKER_LISTENER_NAME": "PLAINTEXT",
        "KAFKA_CONTROLLER_LISTENER_NAMES": "CONTROLLER",
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1",
        "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR": "1",
        "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR": "1",
        "KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
        "KAFKA_AUTO_CREATE_TOPICS_ENABLE": "false",
    }


def _container(image: str, container_port: int, host_port: int, env: dict[str, str]) -> Any:
    from testcontainers.core.container import DockerContainer

    container = DockerContainer(image)
    for key, value in env.items():
        container.with_env(key, value)
    # docker-py accepts (host_ip, host_port): publish on loopback only.
    container.ports[f"{container_port}/tcp"] = (LOOPBACK, host_port)  # type: ignore[assignment]
    return container


def _kafka_from_docker() -> Iterator[str]:
    port = free_port()
    with _container(KAFKA_IMAGE, 9092, port, _kafka_container_env(port)):
        bootstrap = f"{LOOPBACK}:{port}"
        kafka_admin.wait_until_ready(bootstrap, timeout=120)
        yield bootstrap


def _redis_from_docker() -> Iterator[str]:
    port = free_port()
    with _container(REDIS_IMAGE, 6379, port, {}):
        url = f"redis://{LOOPBACK}:{port}/0"
        wait_until(lambda: redis_server.pings(url), what=f"Redis at {url}", timeout=60)
        yield url


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Bootstrap address of the session's Kafka (external, container or local process)."""
    external = external_kafka_bootstrap()
    if external is not None:
        kafka_admin.check_reachable(external)
        yield external
    elif docker_available(KAFKA_IMAGE):
        yield from _kafka_from_docker()
    else:
        with LocalKafka(tmp_path_factory.mktemp("kafka")) as kafka:
            yield kafka.bootstrap


@pytest.fixture(scope="session")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafkaCluster]:
    """A running three-broker Kafka of local processes; its `bootstrap` lists every broker."""
    with LocalKafkaCluster(tmp_path_factory.mktemp("kafka-cluster"), 3) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of the session's Redis (external, container or local process)."""
    external = external_redis_url()
    if external is not None:
        redis_server.check_reachable(external)
        yield external
    elif docker_available(REDIS_IMAGE):
        yield from _redis_from_docker()
    else:
        with LocalRedis(tmp_path_factory.mktemp("redis"), appendonly=False) as redis:
            yield redis.url


@pytest.fixture(scope="session")
def redis_cluster_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of one master of the session's local Redis Cluster (three masters, no replicas)."""
    with LocalRedisCluster(tmp_path_factory.mktemp("redis-cluster")) as cluster:
        yield cluster.url


@pytest.fixture
def topic_name() -> str:
    """A Kafka topic name no other test uses (the topic itself is not created)."""
    return f"test.{uuid.uuid4().hex[:8]}"


@pytest.fixture
def redis_prefix() -> str:
    """A Redis key prefix no other test uses, ending in ':'."""
    return f"test:{uuid.uuid4().hex[:8]}:"
