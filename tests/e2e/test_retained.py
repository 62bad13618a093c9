"""Retained messages end: nodes sharing Redis keep at most ``--max-retained`` of them, and a
retained PUBLISH beyond still reaches the subscribers (counted in ``/metrics``); a SUBSCRIBE of
overlapping wildcard filters gets each retained message once, however many there are."""

from __future__ import annotations

from mqttcore.packets import Puback, Publish
from tests.e2e.conftest import NodeFactory, http_get
from tests.e2e.rawmqtt import RawClient
from tests.e2e.test_operations import samples


async def test_a_retained_publish_beyond_max_retained_is_delivered_not_retained_and_counted(
    start_node: NodeFactory, redis_url: str, redis_prefix: str
) -> None:
    one, two = [
        await start_node(
            redis_url=redis_url, redis_prefix=redis_prefix, max_retained=2, stats_host="127.0.0.1"
        )
        for _ in range(2)
    ]
    live = await RawClient.connected(two.config.port, "live")
    await live.subscribe(("cap/#", 1))
    pub = await RawClient.connected(one.config.port, "pub")
    for i, node_pub in enumerate((pub, pub, await RawClient.connected(two.config.port, "pub2"))):
        await node_pub.send(Publish(f"cap/t{i}", b"v%d" % i, 1, retain=True, packet_id=i + 1))
        assert await node_pub.recv() == Puback(i + 1)  # refused or not, acknowledged
    heard = [await live.recv() for _ in range(3)]  # live, the third too [MQTT-3.3.1-9]
    assert {(p.topic, p.payload, p.retain) for p in heard if isinstance(p, Publish)} == {
        (f"cap/t{i}", b"v%d" % i, False) for i in range(3)
    }
    assert (one.stats()["retained_over_limit"], two.stats()["retained_over_limit"]) == (0, 1)
    _, text = await http_get(two.config.stats_port, "/metrics")
    assert samples(text)["headwater_retained_over_limit_total"] == 1
    late = await RawClient.connected(one.config.port, "late")
    await late.subscribe(("cap/#", 0))
    kept = [await late.recv() for _ in range(2)]
    assert {p.topic for p in kept if isinstance(p, Publish) and p.retain} == {"cap/t0", "cap/t1"}
    await late.expect_silence(0.3)


async def test_overlapping_filters_of_one_subscribe_get_each_retained_message_once(
    start_node: NodeFactory, redis_url: str, redis_prefix: str
) -> None:
    node = await start_node(redis_url=redis_url, redis_prefix=redis_prefix)
    pub = await RawClient.connected(node.config.port, "pub")
    count = 250  # more than a batch of the store's scan
    for i in range(count):
        await pub.send(Publish(f"many/d{i}/state", b"%d" % i, 1, retain=True, packet_id=i + 1))
    for i in range(count):
        assert await pub.recv() == Puback(i + 1)
    sub = await RawClient.connected(node.config.port, "sub")
    await sub.subscribe(("many/#", 0), ("many/+/state", 1), ("+/d7/state", 1))
    got: list[Publish] = []
    for _ in range(count):
        publish = await sub.recv()
        assert isinstance(publish, Publish) and publish.retain and publish.packet_id
        got.append(publish)
        await sub.send(Puback(publish.packet_id))
    assert sorted(p.topic for p in got) == sorted(f"many/d{i}/state" for i in range(count))
    assert {p.qos for p in got} == {1}  # the highest of the filters that match
    await sub.expect_silence(0.3)
