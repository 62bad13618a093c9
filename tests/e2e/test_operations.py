"""What an operator reads from a node, with real Kafka and real MQTT clients: ``/metrics`` in
Prometheus's text format (parsed with ``prometheus_client``'s own parser), ``/live`` and
``/ready``."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from frontend.mqtt.packets import Puback, Publish
from tests.e2e.conftest import NodeFactory, http_get
from tests.e2e.rawmqtt import RawClient


def samples(text: str) -> dict[str, float]:
    return {
        sample.name + "".join(f"[{v}]" for v in sample.labels.values()): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def test_metrics_count_what_clients_did_and_health_says_ready(
    start_node: NodeFactory,
) -> None:
    node = await start_node(stats_host="127.0.0.1")
    stats = node.config.stats_port
    sub = await RawClient.connected(node.config.port, "watcher")
    await sub.subscribe(("ops/#", 1))
    pub = await RawClient.connected(node.config.port, "ops-pub")
    for i in range(3):
        await pub.send(Publish("ops/x", b"%d" % i, 1, packet_id=i + 1))
        assert await pub.recv() == Puback(i + 1)
    for _ in range(3):
        assert isinstance(await sub.recv(), Publish)
    status, text = await http_get(stats, "/metrics")
    assert status == 200
    found = samples(text)
    assert found["headwater_clients"] == 2
    assert found["headwater_messages_produced_total"] == 3
    assert found["headwater_messages_delivered_total"] == 3
    assert found["headwater_messages_dropped_total"] == 0
    assert found["headwater_kafka_available"] == 1
    assert found["headwater_assigned_partitions"] >= 1
    assert await http_get(stats, "/live") == (200, "live\n")
    assert await http_get(stats, "/ready") == (200, "ready\n")
    await sub.close()
    await pub.close()
