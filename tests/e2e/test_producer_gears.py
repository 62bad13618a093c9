"""The log's two producers (``router.log.Pace``): a burst of PUBLISHes goes through the one that
lingers and the quiet that follows through the one that sends at once, and across each change
a subscriber gets every message of one topic in the order it was published."""

from __future__ import annotations

import asyncio

from tests.e2e.conftest import NodeFactory
from tests.e2e.rawmqtt import RawClient
from tests.e2e.test_fleet import publish_acked, take

BURST = 20_000


async def test_changing_producers_keeps_each_topics_order(start_node: NodeFactory) -> None:
    node = await start_node()
    sub = await RawClient.connected(node.config.port, "gear-sub")
    await sub.subscribe(("gear/#", 1))
    pub = await RawClient.connected(node.config.port, "gear-pub")
    await publish_acked(pub, "gear/t", range(10))  # at once: quiet so far
    assert node.log.gear_changes == 0
    received = asyncio.create_task(take(sub, 10 + BURST + 1, timeout=60))
    await publish_acked(pub, "gear/t", range(10, 10 + BURST))  # all sent, then the PUBACKs
    assert node.log.gear_changes >= 1  # the burst went through the lingering producer
    await asyncio.sleep(0.2)  # a quiet spell: more than a pace window without a record
    await publish_acked(pub, "gear/t", range(10 + BURST, 11 + BURST))
    assert node.log.gear_changes >= 2  # back to the producer that sends at once
    assert await received == list(range(11 + BURST))
    await sub.close()
    await pub.close()
