"""Client events in the log (docs/log.md, Client events), as a plain Kafka consumer of the log
reads them, and as MQTT subscribers see them (only on ``$events/...`` [MQTT-4.7.2-1])."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from frontend.config import NodeConfig
from frontend.node import Node
from frontend.sessions.redis import hash_tag
from headwater.services.ports import free_port
from mqttcore.packets import (
    SUBACK_FAILURE,
    Connack,
    Connect,
    Disconnect,
    Pingreq,
    Pingresp,
    Publish,
    Suback,
    Unsuback,
    Unsubscribe,
    Will,
)
from router import record
from tests.e2e.conftest import PARTITIONS, NodeFactory, eventually, launch_node_process
from tests.e2e.rawmqtt import RawClient


class LogEvents:
    """Every ``event`` record of the log topic, decoded, as a plain consumer reads them."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "events-test",
                                  "enable.auto.commit": False})  # fmt: skip
        self.consumer.assign(
            [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)]
        )
        self.seen: list[tuple[dict[str, Any], Any]] = []
        self.topics: list[tuple[str, bytes]] = []
        """(MQTT topic, kind) of every record read."""

    def read(self) -> list[dict[str, Any]]:
        """The events read so far (reading what came since)."""
        for message in self.consumer.consume(500, timeout=0.05):
            value = message.value()
            if message.error() is not None or value is None:
                continue
            kind = dict(message.headers() or [])[record.KIND_HEADER]
            assert isinstance(kind, bytes)
            decoded = record.decode(value)
            self.topics.append((decoded.topic, kind))
            if kind == b"event":
                self.seen.append((json.loads(decoded.payload), message))
        return [body for body, _ in self.seen]

    def has(self, topic: str, kind: bytes) -> bool:
        self.read()
        return (topic, kind) in self.topics

    async def wait_for(self, **fields: Any) -> dict[str, Any]:
        """The first event whose fields include ``fields``, once the log has it."""

        def found() -> dict[str, Any] | None:
            wanted = fields.items()
            return next((e for e in self.read() if wanted <= e.items()), None)

        await eventually(lambda: found() is not None, what=f"an event {fields}", timeout=15)
        event = found()
        assert event is not None
        return event


@pytest.fixture
async def node(start_node: NodeFactory) -> Node:
    return await start_node(client_events=True)


@pytest.fixture
async def log_events(kafka_bootstrap: str, log_topic: str) -> AsyncIterator[LogEvents]:
    events = LogEvents(kafka_bootstrap, log_topic)
    yield events
    events.consumer.close()


async def test_a_session_s_life_in_events(node: Node, log_events: LogEvents) -> None:
    everything = await RawClient.connected(node.config.port, "watch-all")
    await everything.subscribe(("#", 0))
    watcher = await RawClient.connected(node.config.port, "watch-events")
    await watcher.subscribe(("$events/#", 0))

    client = await RawClient.connected(node.config.port, "dev1", username="alice")
    await client.subscribe(("plant/#", 1), ("a/+", 0))
    await client.send(Unsubscribe(2, ("plant/#",)))
    assert isinstance(await client.recv(), Unsuback)
    await client.send(Disconnect())
    await client.expect_closed()

    connected = await log_events.wait_for(event="connected", client_id="dev1")
    assert connected["clean_session"] is True and connected["username"] == "alice"
    assert connected["node"] == node.config.node_id and connected["timestamp"] > 0
    subscribed = await log_events.wait_for(event="subscribed", client_id="dev1")
    assert subscribed["filters"] == [{"filter": "plant/#", "qos": 1}, {"filter": "a/+", "qos": 0}]
    unsubscribed = await log_events.wait_for(event="unsubscribed", client_id="dev1")
    assert unsubscribed["filters"] == ["plant/#"]
    await log_events.wait_for(event="disconnected", client_id="dev1", reason="client_disconnect")
    for body, message in log_events.seen:  # the record's metadata agrees with its payload
        assert dict(message.headers())["mqtt.topic"] == f"$events/{body['event']}".encode()
        assert message.timestamp()[1] == body["timestamp"]

    # a $events/# subscriber gets them; a # subscriber none [MQTT-4.7.2-1]
    wanted = {f"$events/{e}" for e in ("connected", "subscribed", "unsubscribed", "disconnected")}
    got: list[str] = []  # (the four topics are in partitions of their own: any order)
    while set(got) != wanted:
        packet = await watcher.recv(timeout=10)
        assert isinstance(packet, Publish) and packet.topic.startswith("$events/"), packet
        if json.loads(packet.payload)["client_id"] == "dev1":
            got.append(packet.topic)
    assert len(got) == 4
    marker = await RawClient.connected(node.config.port, "marker")
    await marker.send(Publish("marker", b"m"))
    packet = await everything.recv(timeout=10)
    assert isinstance(packet, Publish) and packet.topic == "marker", packet
    for each in (everything, watcher, marker):
        await each.close()


async def test_disconnect_reasons(node: Node, log_events: LogEvents) -> None:
    port = node.config.port
    silent = await RawClient.connected(port, "silent", keep_alive=1, clean_session=False)
    taken = await RawClient.connected(port, "taken")
    broken = await RawClient.connected(port, "broken")
    await broken.send(b"\xf0\x00")  # packet type 15 is reserved [MQTT-2.2.2-2]
    await broken.expect_closed()
    again = await RawClient.connected(port, "taken")
    await taken.expect_closed()
    await silent.expect_closed(timeout=5)

    await log_events.wait_for(event="disconnected", client_id="broken", reason="protocol_error")
    await log_events.wait_for(event="disconnected", client_id="taken", reason="taken_over")
    await log_events.wait_for(event="connected", client_id="silent", clean_session=False)
    await log_events.wait_for(event="disconnected", client_id="silent", reason="keep_alive_timeout")
    # the takeover: the old connection's end, then the new one's start
    taken_events = [(e["event"], e.get("reason")) for e in log_events.read()
                    if e["client_id"] == "taken"]  # fmt: skip
    assert taken_events.count(("connected", None)) == 2
    await again.close()
    await log_events.wait_for(event="disconnected", client_id="taken", reason="connection_lost")


async def test_a_close_is_a_line_at_info_unless_the_client_sent_disconnect(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    """The usual end (DISCONNECT) is a DEBUG line, as EMQX logs it; any other an INFO line."""
    caplog.set_level(logging.DEBUG, logger="headwater.connection")
    polite = await RawClient.connected(node.config.port, "polite")
    await polite.send(Disconnect())
    await polite.expect_closed()
    broken = await RawClient.connected(node.config.port, "rude")
    await broken.send(b"\xf0\x00")  # packet type 15 is reserved [MQTT-2.2.2-2]
    await broken.expect_closed()

    def closes() -> dict[str, int]:
        lines = [r for r in caplog.records if " closed: " in r.getMessage()]
        return {r.getMessage().split()[1]: r.levelno for r in lines}

    await eventually(lambda: {"polite", "rude"} <= closes().keys(), what="both close lines")
    assert closes() == {"polite": logging.DEBUG, "rude": logging.INFO}


async def test_clients_may_not_write_events(node: Node, log_events: LogEvents) -> None:
    """A PUBLISH to ``$events/...`` is acknowledged as usual and never written."""
    client = await RawClient.connected(node.config.port, "forger")
    await client.send(Publish("$events/connected", b'{"event":"connected"}', qos=1, packet_id=1))
    await client.recv()  # PUBACK
    await client.send(Disconnect())
    await log_events.wait_for(event="disconnected", client_id="forger")
    log_events.read()
    assert sorted(log_events.topics) == [(f"$events/{e}", b"event")
                                         for e in ("connected", "disconnected")]  # fmt: skip
    refused = await RawClient.open(node.config.port)
    await refused.send(Connect("willer", will=_will("$events/disconnected")))
    connack = await refused.recv()
    assert isinstance(connack, Connack) and connack.return_code == 5
    await client.close()
    await refused.close()


async def test_off_writes_no_event(start_node: NodeFactory, log_events: LogEvents) -> None:
    node = await start_node(client_events=False)
    client = await RawClient.connected(node.config.port, "quiet")
    await client.subscribe(("a", 0))
    await client.send(Publish("a", b"after"))
    await client.recv()  # its own message, back through the log
    await client.send(Disconnect())
    await client.expect_closed()
    await eventually(lambda: log_events.has("a", b"client"), what="the message in the log")
    assert log_events.read() == [] and node.sessions.events.written == 0
    assert all(not topic.startswith("$") for topic, _ in log_events.topics)
    await client.close()


async def test_sighup_switches_events_as_the_config_file_says(
    kafka_bootstrap: str, log_topic: str, log_events: LogEvents, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """An operator turns events on and off in the node's file and sends SIGHUP: no client is
    disconnected; a file that does not load keeps them as they were, its error logged; a changed
    setting only a restart applies is named."""
    monkeypatch.delenv("HEADWATER_CLIENT_EVENTS", raising=False)  # it would override the file
    config = tmp_path / "headwater.toml"
    config.write_text("client-events = false\n")
    port = free_port()
    node = await launch_node_process(
        "hup-events", port, kafka_bootstrap, log_topic, "--config", str(config),
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip

    async def logged(text: str) -> None:
        assert node.stderr is not None
        while text.encode() not in (line := await asyncio.wait_for(node.stderr.readline(), 10)):
            assert line, f"the node's log ended before {text!r}"

    async def visit(client_id: str) -> None:
        client = await RawClient.connected(port, client_id)
        await client.send(Disconnect())
        await client.expect_closed()

    async def switch(text: str, then: str) -> None:
        config.write_text(text)
        node.send_signal(signal.SIGHUP)
        await logged(then)

    try:
        stays = await RawClient.connected(port, "stays")
        await visit("while-off")
        await switch("client-events = true\n", "client events on")
        await visit("while-on")
        await log_events.wait_for(event="disconnected", client_id="while-on")
        await switch('client-events = "no"\n', f"client-events in {config}")  # a string: kept
        await switch("client-events = false\nmax-inflight = 7\n", "max-inflight changed")
        await logged("client events off")
        await visit("off-again")
        await switch("client-events = true\n", "client events on")
        await visit("on-again")
        await log_events.wait_for(event="connected", client_id="on-again")
        await log_events.wait_for(event="disconnected", client_id="on-again")
        # events of one kind share a partition, in order: "off-again"'s would be before these
        seen = {(e["event"], e["client_id"]) for e in log_events.read()}
        assert {client_id for _, client_id in seen} == {"while-on", "on-again"}
        await stays.send(Pingreq())
        assert await stays.recv() == Pingresp()  # connected throughout
        await stays.close()
    finally:
        node.terminate()
        await node.wait()


async def _gone(redis: aioredis.Redis, key: str) -> bool:
    """Whether ``key`` is gone; reading it makes Redis expire it now if its TTL is over."""
    return not await redis.exists(key)


def _will(topic: str) -> Will:
    return Will(topic, b"gone", 0, False)


async def test_a_drain_and_an_expiry(
    kafka_bootstrap: str, log_topic: str, redis_url: str, redis_prefix: str,
    log_events: LogEvents,
) -> None:  # fmt: skip
    """A node that stops closes its clients for ``node_drain``; a persistent session nobody
    resumes expires, and the node that reaps it tells ``session_expired``."""
    config = NodeConfig(
        node_id="events-drain", host="127.0.0.1", port=0, kafka_bootstrap=kafka_bootstrap,
        redis_url=redis_url, topic=log_topic, partitions=PARTITIONS, client_events=True,
        redis_prefix=redis_prefix, session_expiry=1.0,
    )  # fmt: skip
    node = Node(config)
    await node.start()
    try:
        gone = await RawClient.connected(config.port, "parked", clean_session=False)
        await gone.send(Disconnect())
        await gone.expect_closed()
        drained = await RawClient.connected(config.port, "drained")
        # Redis tells of an expiry when it notices it: at once when the key is read after its
        # TTL, else whenever its sampling comes to it among the other tests' keys.
        marker = f"{redis_prefix}{hash_tag('parked')}:expiry"
        redis = aioredis.Redis.from_url(redis_url)
        try:
            await eventually(lambda: _gone(redis, marker), what="the marker expired", interval=0.2)
        finally:
            await redis.aclose()
        await log_events.wait_for(event="session_expired", client_id="parked", username=None)
    finally:
        await node.stop()
    await drained.expect_closed()
    await log_events.wait_for(event="disconnected", client_id="drained", reason="node_drain")


async def test_the_acl_read_rules_apply(
    start_node: NodeFactory, tmp_path: Path, log_events: LogEvents
) -> None:
    acl = tmp_path / "acl"
    acl.write_text("topic read $events/#\ntopic deny $events/disconnected\n")
    node = await start_node(client_events=True, acl_file=str(acl), allow_anonymous=True)
    ops = await RawClient.connected(node.config.port, "ops")
    assert await ops.subscribe(("$events/#", 0), ("$events/disconnected", 0)) == Suback(
        1, (0, SUBACK_FAILURE)
    )
    device = await RawClient.connected(node.config.port, "device")
    await device.send(Disconnect())
    seen: list[tuple[str, str]] = []  # (topic, client id); ops' own events come too
    while ("$events/connected", "device") not in seen:
        packet = await ops.recv(timeout=20)
        assert isinstance(packet, Publish), packet
        seen.append((packet.topic, json.loads(packet.payload)["client_id"]))
    assert ("$events/disconnected", "device") not in seen
    await log_events.wait_for(event="disconnected", client_id="device")
    auth = node.services.auth
    await eventually(
        lambda: auth.denied_reads > 0, what="the disconnected event refused", timeout=20
    )
    while True:  # whatever else came: never the denied topic
        try:
            packet = await ops.recv(timeout=0.3)
        except TimeoutError:
            break
        assert isinstance(packet, Publish) and packet.topic != "$events/disconnected", packet
    await ops.close()
