"""What a subscription or a topic may cost a node, over real sockets, one node, real Kafka.

Topics and filters of more than 200 levels are refused (Mosquitto's limit): SUBACK 0x80 for a
filter, the connection closed for a PUBLISH or will topic; a client holds at most
``--max-subscriptions`` filters (1,000 by default).  The node runs in this process, so its
memory is this process's ``VmRSS``.
"""

from __future__ import annotations

from pathlib import Path

from frontend.node import Node
from mqttcore.packets import SUBACK_FAILURE, Connect, Puback, Publish, Subscribe, Will
from tests.e2e.rawmqtt import RawClient


def _levels(n: int, level: str = "l") -> str:
    return "/".join([level] * n)


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


async def test_a_filter_of_201_levels_gets_0x80_and_one_of_200_is_granted(node: Node) -> None:
    client = await RawClient.connected(node.config.port, "deep-sub")
    suback = await client.subscribe(
        (_levels(200), 1),
        (_levels(201), 1),
        (_levels(200, "+"), 0),
        (_levels(200) + "/#", 0),
        (f"$share/g/{_levels(200)}", 1),
        (f"$share/g/{_levels(201)}", 1),
    )
    assert suback.return_codes == (1, SUBACK_FAILURE, 0, SUBACK_FAILURE, 1, SUBACK_FAILURE)
    await client.close()


async def test_a_publish_to_a_topic_of_201_levels_closes_the_connection(node: Node) -> None:
    client = await RawClient.connected(node.config.port, "deep-pub")
    await client.send(Publish(_levels(200), b"ok", qos=1, packet_id=1))
    assert await client.recv() == Puback(1)
    await client.send(Publish(_levels(201), b"too deep", qos=1, packet_id=2))
    await client.expect_closed()
    assert client.received == []


async def test_a_will_topic_of_201_levels_closes_the_connection(node: Node) -> None:
    client = await RawClient.open(node.config.port)
    await client.send(Connect("deep-will", will=Will(_levels(201), b"gone")))
    await client.expect_closed()
    assert client.received == []  # no CONNACK: a protocol error, not a refusal


async def test_eight_filters_of_30000_levels_are_refused_at_no_cost(node: Node) -> None:
    client = await RawClient.connected(node.config.port, "deepest")
    filters = tuple((f"{i}/" + _levels(29_999), 1) for i in range(8))  # 60 KB each
    await client.subscribe(("warm/up", 0))  # the node's first SUBSCRIBE paths are loaded
    before = _rss_bytes()
    suback = await client.subscribe(*filters, packet_id=2)
    grown = _rss_bytes() - before
    assert suback.return_codes == (SUBACK_FAILURE,) * 8
    assert grown < 5 * 1024 * 1024, f"RSS grew by {grown / 1e6:.1f} MB"  # today: +61 MB
    assert node.dispatcher.subscription_count == 1  # only warm/up
    await client.close()


async def test_the_default_max_subscriptions_refuses_the_1001st_filter(node: Node) -> None:
    client = await RawClient.connected(node.config.port, "many-filters")
    await client.send(Subscribe(1, tuple((f"many/{i}", 0) for i in range(1001))))
    suback = await client.recv(timeout=15)
    assert suback.return_codes == (0,) * 1000 + (SUBACK_FAILURE,)  # type: ignore[attr-defined]
    again = await client.subscribe(("many/0", 1), ("many/new", 0), packet_id=2)
    assert again.return_codes == (1, SUBACK_FAILURE)  # a held filter takes no room
    await client.close()
