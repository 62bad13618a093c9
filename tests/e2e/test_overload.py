"""A saturated node with a subscriber behind takes in no faster than it delivers
(``frontend.intake``): its publishers wait, and nothing is lost or acknowledged early."""

from __future__ import annotations

import asyncio
import time

from frontend.intake import LATE, SLACK, TICK
from mqttcore.packets import Puback, Publish
from tests.e2e.conftest import NodeFactory
from tests.e2e.test_fleet import behind, publish_acked, take
from tests.e2e.test_resume_at_scale import http_json


async def test_publishers_wait_while_a_saturated_node_delivers_and_nothing_is_lost(
    start_node: NodeFactory,
) -> None:
    node, slow, publisher = await behind(start_node, 100)
    intake = node.services.intake
    sent = 100
    while not intake.coupled:  # PUBLISHes keep the intake watching the loop, which runs late
        assert sent < 300, "the node never took in no faster than it delivers"
        await publish_acked(publisher, "fan/in", range(sent, sent + 1))
        sent += 1
        time.sleep(LATE + TICK)  # the node's loop (this test's) runs late: no CPU to spare
        await asyncio.sleep(TICK)
    more = range(sent, sent + 4 * SLACK)
    for n in more:
        await publisher.send(Publish("fan/in", b"%d" % n, 1, packet_id=n + 1))
    acked: set[int] = set()
    while len(acked) < len(more):  # held back, yet never lost: every one is acknowledged
        packet = await publisher.recv(10)
        assert isinstance(packet, Puback), packet
        acked.add(packet.packet_id)
    assert acked == {n + 1 for n in more}
    stats = await http_json(node.config.stats_port, "/stats")
    assert isinstance(holds := stats["intake_holds"], int) and holds >= 1, stats
    assert await take(slow, sent + len(more)) == list(range(sent + len(more)))  # all, in order
    await slow.close()
    await publisher.close()
