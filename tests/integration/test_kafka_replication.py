"""Replicated topics on the session's three-broker `kafka_cluster`, and `dev up --kafka-brokers 3`.

`ensure_topic` creates a topic with the replication asked for; it uses an existing topic whose
replication differs as it is, with a warning naming the topic and the difference. `dev up` with
three brokers runs them as three processes, creates the log with factor 3 and min ISR 2, gives
every front-end the whole bootstrap list, and leaves no JVM behind when it stops.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
from pathlib import Path

import pytest

from headwater.services.kafka import LocalKafkaCluster
from headwater.services.kafka_admin import admin_client, ensure_topic, topic_config
from headwater.services.process import ProcessIdentity
from router.topics import Replication, messages_topic
from tests.conftest import KAFKA_CLUSTER_REPLICATION, free_port
from tests.integration.test_dev_cluster import HEADWATER, DevUp


def replication_of(bootstrap: str, topic: str) -> Replication:
    """The topic's replication as Kafka has it: replicas per partition, min.insync.replicas."""
    admin = admin_client(bootstrap)
    partitions = admin.list_topics(topic=topic, timeout=10).topics[topic].partitions
    (factor,) = {len(p.replicas) for p in partitions.values()}
    return Replication(factor, int(topic_config(admin, topic)["min.insync.replicas"]))


def create(bootstrap: str, topic: str, replication: Replication) -> None:
    spec = messages_topic(2, replication)
    ensure_topic(bootstrap, topic, 2, spec.config, replication_factor=spec.replication_factor)


def test_ensure_topic_replicates_as_asked(
    kafka_cluster: LocalKafkaCluster, topic_name: str
) -> None:
    create(kafka_cluster.bootstrap, topic_name, KAFKA_CLUSTER_REPLICATION)
    assert replication_of(kafka_cluster.bootstrap, topic_name) == Replication(3, 2)


def test_an_existing_topic_replicated_otherwise_is_used_with_a_warning(
    kafka_cluster: LocalKafkaCluster, topic_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    create(kafka_cluster.bootstrap, topic_name, KAFKA_CLUSTER_REPLICATION)
    with caplog.at_level(logging.WARNING, logger="headwater.kafka"):
        create(kafka_cluster.bootstrap, topic_name, Replication(1, 1))
    warnings = [r.getMessage() for r in caplog.records if r.name == "headwater.kafka"]
    assert warnings == [
        f"Kafka topic {topic_name} exists with replication factor 3, not 1: it is used as it is "
        "(kafka-reassign-partitions can change it)",
        f"Kafka topic {topic_name} exists with min.insync.replicas=2, not 1: it is used as it is "
        "(kafka-configs --alter can change it)",
    ]
    assert replication_of(kafka_cluster.bootstrap, topic_name) == Replication(3, 2)


@pytest.mark.fault
def test_dev_up_with_three_kafka_brokers(tmp_path: Path, redis_url: str) -> None:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("HEADWATER_PORT", "HEADWATER_KAFKA_BOOTSTRAP")
    }
    env.update(HEADWATER_REDIS_URL=redis_url, HEADWATER_KAFKA_BROKERS="3")
    cluster = DevUp(tmp_path / "state", free_port(), env, nodes=1)
    try:
        lines = cluster.wait_ready(timeout=180)
        assert "headwater: starting Kafka (3 brokers)..." in lines
        assert any("replication factor 3, min ISR 2" in line for line in lines)
        state = json.loads((cluster.state_dir / "headwater.json").read_text())
        bootstrap = state["endpoints"]["kafka"]
        assert len(bootstrap.split(",")) == 3
        kafkas = [c for c in state["children"] if c["name"].startswith("kafka")]
        assert [c["name"] for c in kafkas] == ["kafka1", "kafka2", "kafka3"]
        (node,) = [c for c in state["children"] if c["name"] == "node0"]
        assert bootstrap in Path(f"/proc/{node['pid']}/cmdline").read_text().split("\0")
        assert replication_of(bootstrap, "headwater.messages") == Replication(3, 2)
        children = cluster.child_identities()
        argv = [*HEADWATER, "dev", "down", "--state-dir", str(cluster.state_dir)]
        down = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180)
        assert down.returncode == 0, down.stderr
        assert cluster.process.wait(60) == 0
        assert [c.pid for c in children if c.alive()] == []
        assert not any(ProcessIdentity(k["pid"], k["start_ticks"]).alive() for k in kafkas)
    finally:
        if cluster.process.poll() is None:
            cluster.process.send_signal(signal.SIGTERM)
            cluster.process.wait(120)
