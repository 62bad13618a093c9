"""A node's drain (``Node.stop``, what SIGTERM and SIGINT run): ``/ready`` says "draining" at
once, PUBLISHes in flight are acknowledged before the client is closed, the persistent session is
stored, the will is published (a close by the server [MQTT-3.1.2-8]), and one line counts it all.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from frontend.config import NodeConfig
from frontend.node import Node
from mqttcore.codec import encode
from mqttcore.packets import Puback, Publish, Will
from tests.e2e.conftest import PARTITIONS, NodeFactory
from tests.e2e.rawmqtt import RawClient

PUBLISHES = 200


@pytest.mark.fault
async def test_a_drain_acknowledges_in_flight_publishes_and_publishes_the_will(
    kafka_bootstrap: str, log_topic: str, start_node: NodeFactory, caplog: pytest.LogCaptureFixture
) -> None:
    other = await start_node("drain-other")
    watcher = await RawClient.connected(other.config.port, "drain-watcher")
    await watcher.subscribe(("drain/#", 1))
    config = NodeConfig(
        node_id="drain-node", host="127.0.0.1", port=0, kafka_bootstrap=kafka_bootstrap,
        redis_url=None, topic=log_topic, partitions=PARTITIONS,
        stats_host="127.0.0.1", stats_port=0,
    )  # fmt: skip
    node = Node(config)
    await node.start()
    will = Will("drain/will", b"gone", qos=1)
    client = await RawClient.connected(config.port, "drainer", clean_session=False, will=will)
    burst = [Publish("drain/m", str(i).encode(), qos=1, packet_id=i + 1) for i in range(PUBLISHES)]
    await client.send(b"".join(encode(p) for p in burst))
    await asyncio.sleep(0.02)  # most of the burst read, some of it still awaiting Kafka
    caplog.set_level(logging.INFO, logger="headwater.node")
    stopping = asyncio.get_running_loop().create_task(node.stop())
    await asyncio.sleep(0)
    assert node.not_ready()[0] == "draining"
    acked = []
    while True:
        try:
            packet = await client.recv(timeout=15)
        except (asyncio.IncompleteReadError, ConnectionError):
            break
        assert isinstance(packet, Puback)
        acked.append(packet.packet_id)
    await asyncio.wait_for(stopping, 30)
    (line,) = [r.getMessage() for r in caplog.records if " drained in " in r.getMessage()]
    assert "1 clients closed, 1 of 1 sessions stored" in line and "0 unacknowledged" in line
    assert acked, "the node read none of the burst before it drained"
    expected = {f"drain/m {int(i) - 1}".encode() for i in acked} | {b"drain/will gone"}
    seen: set[bytes] = set()
    while not expected <= seen:
        message = await watcher.recv(timeout=15)
        assert isinstance(message, Publish)
        seen.add(message.topic.encode() + b" " + message.payload)
        if message.packet_id is not None:
            await watcher.send(Puback(message.packet_id))
    await watcher.close()
