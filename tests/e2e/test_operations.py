"""What an operator reads from a node, with real Kafka and real MQTT clients (raw bytes and
paho-mqtt): ``/metrics`` in Prometheus's text format (parsed with ``prometheus_client``'s own
parser), ``/live`` and ``/ready``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

from frontend.metrics import DENIED, DROPPED, REFUSED
from mqttcore.packets import Puback, Publish
from tests.e2e.conftest import NodeFactory, http_get
from tests.e2e.rawmqtt import RawClient
from tests.e2e.realclients import Clients


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


async def _metrics_when(
    stats_port: int, done: Callable[[dict[str, float]], bool], timeout: float = 10.0
) -> dict[str, float]:
    """``/metrics`` once ``done`` says so (a delivery report may follow the delivery)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        status, text = await http_get(stats_port, "/metrics")
        assert status == 200
        found = samples(text)
        if done(found) or asyncio.get_running_loop().time() > deadline:
            return found
        await asyncio.sleep(0.1)


async def test_metrics_by_qos_latency_sessions_and_reasons(
    start_node: NodeFactory, clients: Clients
) -> None:
    """paho clients publish at each QoS to a persistent subscriber, which is then taken over by
    a second connection of the same client id: every family of ``frontend.metrics`` says so."""
    node = await start_node(stats_host="127.0.0.1")
    port, stats = node.config.port, node.config.stats_port
    sub = await clients.paho(port, "ops-sub", clean_session=False)
    assert await sub.subscribe(("ops/#", 2)) == [2]
    pub = await clients.paho(port, "ops-pub")
    for qos in (0, 1, 2):
        await pub.publish(f"ops/q{qos}", b"x" * 10, qos)
    got = sorted([(await sub.next_message()).qos for _ in range(3)])
    assert got == [0, 1, 2]
    again = await clients.paho(port, "ops-sub", clean_session=False)
    assert again.client.is_connected()
    found = await _metrics_when(stats, lambda m: m["headwater_produce_latency_seconds_count"] >= 3)
    for qos in "012":
        assert found[f"headwater_messages_received_total[{qos}]"] == 1
        assert found[f"headwater_messages_sent_total[{qos}]"] == 1
    assert found["headwater_produce_latency_seconds_count"] == 3
    assert found["headwater_produce_latency_seconds_bucket[+Inf]"] == 3
    assert 0 < found["headwater_produce_latency_seconds_sum"] < 30
    assert found["headwater_produce_latency_seconds_bucket[0.001]"] <= 3
    assert found["headwater_connections_opened_total"] == 3
    assert found["headwater_bytes_received_total"] > 3 * 10
    assert found["headwater_bytes_sent_total"] > 3 * 10
    assert found["headwater_sessions_resumed_total"] == 1
    assert found["headwater_session_takeovers_total"] == 1
    assert found["headwater_session_takeovers_forced_total"] == 0
    assert found["headwater_sessions_live[clean]"] == 1
    assert found["headwater_sessions_live[persistent]"] == 1
    for reason in REFUSED.values():
        assert found[f"headwater_connections_refused_total[{reason}]"] == 0
    for reason in DROPPED.values():
        assert found[f"headwater_drops_total[{reason}]"] == 0
    for action in DENIED.values():
        assert found[f"headwater_denials_total[{action}]"] == 0
    _, body = await http_get(stats, "/stats")
    assert json.loads(body)["messages_sent_by_qos"] == {"0": 1, "1": 1, "2": 1}
