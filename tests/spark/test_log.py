"""The jobs on the real log: messages published by MQTT clients through a front-end node, read by
Spark from Kafka, and results checked against what was published and decoded independently.

Streaming runs use the available-now trigger and a thread of their own (the front-end node runs
in the test's event loop).  Spark's rows are compared with ``router.record.decode`` of the same
log, after checking that the log holds exactly what the clients published.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import aiomqtt
import pytest
from confluent_kafka import Producer
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from frontend.node import Node
from headwater.services.kafka_admin import ensure_topic
from mqttcore.message import Message
from router.partitioner import routing_key
from router.record import HEADER, encode
from spark_streaming.mqtt_sink import MqttSink
from spark_streaming.options import ANALYTICS_ORIGIN, JobOptions, Trigger
from spark_streaming.runner import RunSummary, run
from tests.spark.conftest import log_messages, wait_for_log

pytestmark = pytest.mark.spark

Published = tuple[str, str, bytes, int]  # client id, topic, payload, qos
WINDOW_MS = 60_000


def traffic_batch(tag: str) -> list[Published]:
    """A known mix: three clients, three prefixes, every QoS, payloads of several sizes."""
    topics = ("plant/line1/temp", "plant/line2/speed", "fleet/truck9/gps/fix", "plant/line1")
    return [
        (
            f"{tag}-client{i % 3}",
            topics[i // 2 % 4],
            f"{tag}:{i}".encode() * (i % 5 + 1),
            i // 3 % 3,
        )
        for i in range(24)
    ]


async def publish(port: int, batch: list[Published]) -> None:
    """Publish ``batch`` with one aiomqtt client per client id."""
    by_client: dict[str, list[Published]] = defaultdict(list)
    for item in batch:
        by_client[item[0]].append(item)
    for client_id, items in by_client.items():
        async with aiomqtt.Client("127.0.0.1", port, identifier=client_id) as client:
            for _, topic, payload, qos in items:
                await client.publish(topic, payload, qos=qos)


def expected_traffic(
    bootstrap: str, topic: str, published: list[Published]
) -> dict[tuple[int, str], dict[str, int]]:
    """Per (window start ms, prefix) aggregates of the log, which must hold ``published``."""
    messages = log_messages(bootstrap, topic)
    logged = Counter(
        (m.client_id, m.topic, m.payload, m.qos)
        for m in messages
        if m.origin_node != ANALYTICS_ORIGIN
    )
    assert logged == Counter(published)
    totals: dict[tuple[int, str], dict[str, Any]] = {}
    for m in messages:
        if m.origin_node == ANALYTICS_ORIGIN:
            continue
        key = (m.timestamp_ms - m.timestamp_ms % WINDOW_MS, routing_key(m.topic, 2))
        t = totals.setdefault(
            key, {"messages": 0, "bytes": 0, "publishers": set(), "qos0": 0, "qos1": 0, "qos2": 0}
        )
        t["messages"] += 1
        t["bytes"] += len(m.payload)
        t["publishers"].add(m.client_id)
        t[f"qos{m.qos}"] += 1
    return {k: {**v, "publishers": len(v["publishers"])} for k, v in totals.items()}


def latest_rows(spark: SparkSession, table: str) -> dict[tuple[int, str], dict[str, int]]:
    """The memory sink's rows, the last (largest: totals only grow) per window and prefix."""
    df = (
        spark.table(table)
        .groupBy(F.unix_millis("window_start").alias("start"), "prefix")
        .agg(
            *[
                F.max(c).alias(c)
                for c in ("messages", "bytes", "publishers", "qos0", "qos1", "qos2")
            ]
        )
    )
    return {
        (r["start"], r["prefix"]): {
            k: v for k, v in r.asDict().items() if k not in ("start", "prefix")
        }
        for r in df.collect()
    }


def traffic_options(bootstrap: str, topic: str, **overrides: Any) -> JobOptions:
    settings: dict[str, Any] = {
        "sink": "memory",
        "trigger": Trigger(available_now=True),
        "query_name": f"traffic_{topic.replace('.', '_')}",
        "shuffle_partitions": 2,
    }
    return JobOptions(job="traffic", bootstrap=bootstrap, topic=topic, **{**settings, **overrides})


async def run_job(spark: SparkSession, options: JobOptions) -> RunSummary:
    return await asyncio.to_thread(run, options, spark, True)


async def test_traffic_on_the_real_log_equals_what_was_published(
    spark: SparkSession, node: Node, kafka_bootstrap: str, log_topic: str
) -> None:
    published = traffic_batch("a")
    await publish(node.config.port, published)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    producer.produce(log_topic, b"\xc3\x01" + b"\x00" * 8 + b"another schema", b"plant/line1")
    producer.produce(log_topic, HEADER + b"\x02", b"plant/line1")  # right header, bad datum
    producer.flush(10)
    wait_for_log(kafka_bootstrap, log_topic, len(published) + 2)

    options = traffic_options(kafka_bootstrap, log_topic)
    summary = await run_job(spark, options)

    assert latest_rows(spark, options.name) == expected_traffic(
        kafka_bootstrap, log_topic, published
    )
    assert (summary.input_rows, summary.records) == (len(published) + 2, len(published) + 2)
    assert (summary.bad_header, summary.undecodable) == (1, 1)


def analytics_results(bootstrap: str, topic: str) -> tuple[int, dict[tuple[int, str], Any]]:
    """The MQTT sink's messages in the log: how many, and the last row per window and prefix."""
    rows: dict[tuple[int, str], Any] = {}
    count = 0
    for m in log_messages(bootstrap, topic):  # one partition carries them all, in order
        if m.origin_node == ANALYTICS_ORIGIN:
            row = json.loads(m.payload)
            rows[(int(_iso_millis(row["window_start"])), row["prefix"])] = {
                k: row[k] for k in ("messages", "bytes", "publishers", "qos0", "qos1", "qos2")
            }
            count += 1
    return count, rows


async def test_restart_from_checkpoint_counts_every_message_once(
    spark: SparkSession, node: Node, kafka_bootstrap: str, log_topic: str, tmp_path: Path
) -> None:
    """Two available-now runs on one checkpoint, results published by the MQTT sink (update
    mode: each run re-emits the running totals of the windows it touched)."""
    options = traffic_options(
        kafka_bootstrap, log_topic, sink="mqtt", checkpoint=str(tmp_path / "checkpoint")
    )
    first, second = traffic_batch("first"), traffic_batch("second")[:10]
    await publish(node.config.port, first)
    wait_for_log(kafka_bootstrap, log_topic, len(first))
    summary1 = await run_job(spark, options)
    results1, _ = analytics_results(kafka_bootstrap, log_topic)

    await publish(node.config.port, second)
    wait_for_log(kafka_bootstrap, log_topic, len(first) + results1 + len(second))
    summary2 = await run_job(spark, options)

    # The second run read only what was new: the second batch and the first run's results
    # (which the job skips: they are the analytics sink's own).
    assert (summary1.input_rows, summary2.input_rows) == (len(first), results1 + len(second))
    _, totals = analytics_results(kafka_bootstrap, log_topic)
    assert totals == expected_traffic(kafka_bootstrap, log_topic, first + second)


async def test_mqtt_sink_results_reach_a_subscribed_client(
    spark: SparkSession, node: Node, kafka_bootstrap: str, log_topic: str, tmp_path: Path
) -> None:
    published = traffic_batch("m")
    async with aiomqtt.Client("127.0.0.1", node.config.port, identifier="dashboard") as dashboard:
        await dashboard.subscribe("analytics/traffic/#", qos=1)
        await publish(node.config.port, published)
        wait_for_log(kafka_bootstrap, log_topic, len(published))
        expected = expected_traffic(kafka_bootstrap, log_topic, published)
        options = traffic_options(
            kafka_bootstrap, log_topic, sink="mqtt", checkpoint=str(tmp_path / "ck")
        )
        await run_job(spark, options)

        received: dict[tuple[int, str], dict[str, Any]] = {}
        async with asyncio.timeout(30):
            async for message in dashboard.messages:
                row = json.loads(bytes(message.payload))  # type: ignore[arg-type]
                assert str(message.topic) == f"analytics/traffic/{row['prefix']}"
                start = int(_iso_millis(row["window_start"]))
                received[(start, row["prefix"])] = row
                if len(received) == len(expected):
                    break
    for key, totals in expected.items():
        assert {k: received[key][k] for k in totals} == totals


def _iso_millis(text: str) -> float:
    import datetime as dt

    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000


def test_mqtt_sink_writes_a_batch_once_and_a_replay_with_the_same_ids(
    spark: SparkSession, kafka_bootstrap: str, topic_name: str, tmp_path: Path
) -> None:
    ensure_topic(kafka_bootstrap, topic_name, 3, {})
    options = JobOptions(
        job="traffic",
        bootstrap=kafka_bootstrap,
        topic=topic_name,
        sink="mqtt",
        checkpoint=str(tmp_path),
    )
    sink = MqttSink(options, lambda row: str(row["prefix"]))
    batch = spark.createDataFrame([("a/b", 3), ("c/d", 4)], "prefix string, messages long")
    sink.write_batch(batch, 0)
    sink.write_batch(batch, 0)  # Spark re-running a batch that completed: nothing is written
    wait_for_log(kafka_bootstrap, topic_name, 2)
    (tmp_path / "mqtt_sink" / "0").unlink()  # as if the driver died before recording batch 0
    sink.write_batch(batch, 0)
    sink.close()
    wait_for_log(kafka_bootstrap, topic_name, 4)
    logged = log_messages(kafka_bootstrap, topic_name)
    ids = Counter(m.message_id for m in logged)
    assert sorted(ids.values()) == [2, 2]  # the replay repeated both ids: readers can deduplicate
    assert {(m.topic, json.loads(m.payload)["messages"], m.origin_node) for m in logged} == {
        ("analytics/traffic/a/b", 3, ANALYTICS_ORIGIN),
        ("analytics/traffic/c/d", 4, ANALYTICS_ORIGIN),
    }


def test_parquet_sink_is_partitioned_by_date_and_exactly_once_across_restarts(
    spark: SparkSession, kafka_bootstrap: str, topic_name: str, tmp_path: Path
) -> None:
    ensure_topic(kafka_bootstrap, topic_name, 2, {})
    midnight = 1_772_323_200_000  # 2026-03-01T00:00:00Z
    producer = Producer({"bootstrap.servers": kafka_bootstrap})

    def produce(*offsets_s: float) -> None:
        for i, offset in enumerate(offsets_s):
            at = midnight + int(offset * 1000)
            m = Message(
                "site/a/x", b"p" * (i + 1), 1, False, f"c{i}", "node1", at, at.to_bytes(16, "big")
            )
            producer.produce(topic_name, encode(m), b"site/a")
        producer.flush(10)

    output, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    options = JobOptions(
        job="traffic",
        bootstrap=kafka_bootstrap,
        topic=topic_name,
        sink="parquet",
        output=str(output),
        checkpoint=str(checkpoint),
        trigger=Trigger(available_now=True),
        watermark="0 seconds",
        shuffle_partitions=2,
    )
    produce(-50, -40, -30, 5, 6, 120)  # 23:59 (Feb 28), 00:00 twice, 00:02 (moves the watermark)
    run(options, spark, quiet=True)
    produce(150, 600)  # 00:02 again, then 00:10 closes it
    run(options, spark, quiet=True)

    written = spark.read.parquet(str(output))
    got = sorted(
        (str(r["date"]), r["start"], r["messages"])
        for r in written.select(
            "date", F.unix_millis("window_start").alias("start"), "messages"
        ).collect()
    )
    assert got == [
        ("2026-02-28", midnight - 60_000, 3),
        ("2026-03-01", midnight, 2),
        ("2026-03-01", midnight + 120_000, 2),  # one message from each run: state was restored
    ]
    assert sorted(p.name for p in output.iterdir() if p.name.startswith("date=")) == [
        "date=2026-02-28",
        "date=2026-03-01",
    ]
