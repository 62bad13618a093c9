"""History subscriptions: ``$history/<since>/<filter>`` delivers what the log holds from a time
on, then goes on live (``router.history``), to unchanged MQTT 3.1.1 clients."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from frontend.node import Node
from mqttcore.packets import Puback, Publish, Unsuback, Unsubscribe
from mqttcore.session import Session
from tests.e2e.conftest import NodeFactory, eventually
from tests.e2e.rawmqtt import RawClient
from tests.e2e.realclients import Clients, Received

SUBACK_FAILURE = 0x80
JS_DIR = Path(__file__).resolve().parents[1] / "js"


def prefix() -> str:
    return f"h{uuid.uuid4().hex[:8]}"


async def publish_each(node: Node, clients: Clients, topics: list[str], payloads: range) -> None:
    """QoS 1 PUBLISHes through paho, acknowledged (so in the log), alternating ``topics``."""
    pub = await clients.paho(node.config.port, f"pub-{uuid.uuid4().hex[:6]}")
    acks = [pub.publish_nowait(topics[i % len(topics)], b"%d" % i, qos=1) for i in payloads]
    await asyncio.wait_for(asyncio.gather(*acks), 30)
    await pub.close()


def by_topic(got: list[Received]) -> dict[str, list[int]]:
    topics: dict[str, list[int]] = {}
    for message in got:
        topics.setdefault(message.topic, []).append(int(message.payload))
    return topics


async def test_history_then_live_in_order_per_topic_for_mosquitto_sub(
    node: Node, clients: Clients
) -> None:
    p = prefix()
    a, b = f"{p}/a", f"{p}/b"
    await publish_each(node, clients, [a, b], range(250))
    sub = await clients.mosquitto_sub(node.config.port, f"$history/10m/{p}/#", qos=1)
    history = await sub.messages(250, timeout=30)
    assert by_topic(history) == {
        f"$history/10m/{a}": list(range(0, 250, 2)),
        f"$history/10m/{b}": list(range(1, 250, 2)),
    }
    assert {m.qos for m in history} == {1}
    await publish_each(node, clients, [a, b], range(250, 260))
    live = await sub.messages(10, timeout=10)
    assert by_topic(live) == {
        f"$history/10m/{a}": list(range(250, 260, 2)),
        f"$history/10m/{b}": list(range(251, 260, 2)),
    }
    try:
        extra = await sub.next_message(timeout=0.5)
    except TimeoutError:
        extra = None
    assert extra is None, f"a duplicate after the switch to live: {extra}"


async def test_mqttjs_reads_history(node: Node, clients: Clients) -> None:
    p = prefix()
    await publish_each(node, clients, [f"{p}/x", f"{p}/y"], range(40))
    process = await asyncio.create_subprocess_exec(
        "node",
        str(JS_DIR / "history.js"),
        f"mqtt://127.0.0.1:{node.config.port}",
        f"$history/2h/{p}/+",
        "40",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0, err.decode()
    got = [json.loads(line) for line in out.decode().splitlines()]
    topics: dict[str, list[int]] = {}
    for message in got:
        topics.setdefault(message["topic"], []).append(int(message["payload"]))
    assert topics == {
        f"$history/2h/{p}/x": list(range(0, 40, 2)),
        f"$history/2h/{p}/y": list(range(1, 40, 2)),
    }
    assert {message["qos"] for message in got} == {1}


async def test_a_utc_start_gives_what_came_after_it_and_earliest_everything(
    node: Node, clients: Clients
) -> None:
    p = prefix()
    await publish_each(node, clients, [f"{p}/t"], range(20))
    start = int(time.time()) + 1  # the next whole second: after every message so far
    await eventually(lambda: time.time() >= start + 0.01, what="the start time to pass")
    await publish_each(node, clients, [f"{p}/t"], range(20, 30))
    since = datetime.fromtimestamp(start, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    after = await clients.paho(node.config.port, "h-after")
    assert await after.subscribe((f"$history/{since}/{p}/#", 1)) == [1]
    got = [await after.next_message() for _ in range(10)]
    assert by_topic(got) == {f"$history/{since}/{p}/t": list(range(20, 30))}
    everything = await clients.paho(node.config.port, "h-all")
    assert await everything.subscribe((f"$history/earliest/{p}/t", 1)) == [1]
    got = [await everything.next_message() for _ in range(30)]
    assert by_topic(got) == {f"$history/earliest/{p}/t": list(range(30))}


async def test_qos0_history_is_delivered_at_the_lower_qos(node: Node, clients: Clients) -> None:
    p = prefix()
    pub = await clients.paho(node.config.port, "h-pub0")
    for i in range(5):
        await pub.publish(f"{p}/zero", b"%d" % i, qos=0)
    await publish_each(node, clients, [f"{p}/one"], range(5, 10))
    sub = await clients.paho(node.config.port, "h-sub0")
    assert await sub.subscribe((f"$history/1h/{p}/#", 1)) == [1]
    got = [await sub.next_message() for _ in range(10)]
    qos_of = {int(m.payload): m.qos for m in got}
    assert qos_of == {**dict.fromkeys(range(5), 0), **dict.fromkeys(range(5, 10), 1)}


async def test_plain_subscribers_never_see_history_topics(node: Node, clients: Clients) -> None:
    p = prefix()
    everything = await clients.paho(node.config.port, "h-hash")
    assert await everything.subscribe(("#", 1)) == [1]
    reader = await clients.paho(node.config.port, "h-reader")
    assert await reader.subscribe((f"$history/earliest/{p}/#", 1)) == [1]
    await publish_each(node, clients, [f"{p}/x"], range(3))
    got = [await reader.next_message() for _ in range(3)]
    assert [m.topic for m in got] == [f"$history/earliest/{p}/x"] * 3
    seen: list[str] = []
    while len([t for t in seen if t == f"{p}/x"]) < 3:
        seen.append((await everything.next_message()).topic)
    assert not [t for t in seen if t.startswith("$")], seen


async def test_malformed_history_filters_get_0x80_and_publishing_there_is_refused(
    node: Node, clients: Clients
) -> None:
    raw = await RawClient.connected(node.config.port, "h-bad")
    suback = await raw.subscribe(
        ("$history/10x/a", 1),
        ("$history/yesterday/a", 1),
        ("$history/2026-13-40T00:00:00Z/a", 1),
        ("$history/10m/", 1),
        ("$history/10m/$share/g/a", 1),
        ("$history/10m/a/#/b", 1),
        ("$history/10m/a/+", 1),
    )
    assert list(suback.return_codes) == [SUBACK_FAILURE] * 6 + [1]
    reader = await clients.paho(node.config.port, "h-watch")
    assert await reader.subscribe(("$history/10m/a/#", 1), ("$history/+/a/#", 0)) == [1, 0x80]
    await raw.send(Publish("$history/10m/a/b", b"forged", qos=1, packet_id=7))
    assert await raw.recv() == Puback(7)  # acknowledged, never published (as $SYS)
    try:
        forged = await reader.next_message(timeout=0.5)
    except TimeoutError:
        forged = None
    assert forged is None
    await raw.close()


async def test_a_persistent_history_subscription_resumes_where_it_was(
    start_node: NodeFactory, redis_url: str, redis_prefix: str, clients: Clients
) -> None:
    first, second = [
        await start_node(redis_url=redis_url, redis_prefix=redis_prefix) for _ in range(2)
    ]
    p = prefix()
    total = 400
    await publish_each(first, clients, [f"{p}/a", f"{p}/b"], range(total))
    history = f"$history/earliest/{p}/#"
    raw = await RawClient.connected(first.config.port, "h-resume", clean_session=False)
    assert list((await raw.subscribe((history, 1))).return_codes) == [1]
    taken: list[int] = []
    for _ in range(50):  # fifty of them, acknowledged; the rest waits for the window
        packet = await raw.recv()
        assert isinstance(packet, Publish), packet
        taken.append(int(packet.payload))
        await raw.send(Puback(packet.packet_id))
    await raw.close()
    await eventually(
        lambda: not first.dispatcher.subscriber("h-resume"), what="the first node to let go"
    )
    back = await clients.paho(second.config.port, "h-resume", clean_session=False)
    got = {int(m.payload) for m in [await back.next_message() for _ in range(total - 50)]}
    assert got | set(taken) == set(range(total))
    assert len(got & set(taken)) <= Session("x", False).max_inflight  # resent, at most


async def test_history_bounds_refuse_with_0x80_and_are_counted(start_node: NodeFactory) -> None:
    node = await start_node(max_history=3, max_history_per_client=2)
    a = await RawClient.connected(node.config.port, "h-bound-a")
    wanted = [(f"$history/{n}m/a/#", 1) for n in (1, 2, 3)]
    assert list((await a.subscribe(*wanted)).return_codes) == [1, 1, 0x80]
    assert list((await a.subscribe(wanted[0], packet_id=2)).return_codes) == [1]  # held: no more
    b = await RawClient.connected(node.config.port, "h-bound-b")
    assert list((await b.subscribe(wanted[0], wanted[1])).return_codes) == [1, 0x80]  # node: 3
    assert (node.dispatcher.history_streams, node.dispatcher.history_refused) == (3, 2)
    await a.send(Unsubscribe(3, ("$history/1m/a/#",)))
    assert isinstance(await a.recv(), Unsuback)
    assert list((await b.subscribe(wanted[1], packet_id=2)).return_codes) == [1]
    await a.close()
    await b.close()
    await eventually(lambda: node.dispatcher.history_streams == 0, what="the streams to end")
