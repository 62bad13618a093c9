"""docs/log.md's Spark recipe, run as shown on a node's log (``tests.integration.test_log_format``
extracts it and points it at the test's Kafka and topic): Spark's ``from_avro`` decodes what a
client published, and the Kafka ``timestamp`` column equals the Avro ``timestamp`` field."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest
from pyspark.sql import SparkSession

from frontend.node import Node
from mqttcore.packets import Puback, Publish
from tests.e2e.rawmqtt import RawClient
from tests.integration.test_log_format import ROOT, as_run_here, recipe

pytestmark = pytest.mark.spark


async def test_the_spark_recipe_decodes_what_a_node_wrote(
    spark: SparkSession, node: Node, kafka_bootstrap: str, log_topic: str
) -> None:
    client = await RawClient.connected(node.config.port, "sensor-3")
    for packet_id, payload in enumerate((b"20.5", b"20.75"), start=1):
        await client.send(Publish("plant/d/temp", payload, 1, packet_id=packet_id))
        assert await client.recv() == Puback(packet_id)
    await client.close()
    code = as_run_here(recipe("Spark"), kafka_bootstrap, log_topic)
    names: dict[str, Any] = {}

    def run() -> None:
        cwd = os.getcwd()
        os.chdir(ROOT)
        try:
            exec(code, names)
        finally:
            os.chdir(cwd)

    await asyncio.to_thread(run)
    rows = names["messages"].orderBy("timestamp").collect()
    assert [(r.topic, bytes(r.payload), r.client_id) for r in rows] == [
        ("plant/d/temp", b"20.5", "sensor-3"),
        ("plant/d/temp", b"20.75", "sensor-3"),
    ]
    assert all(r.timestamp == r.kafka_timestamp for r in rows)
    assert all(dict(r.headers)["headwater.kind"] == b"client" for r in rows)
