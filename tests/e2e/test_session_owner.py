"""A session belongs to its user, and what it sends is judged when it is sent: a real node with
Redis, a password file made by ``mosquitto_passwd`` and an ACL giving alice ``alice/#`` and bob
``bob/#``, seen from raw MQTT clients.

Mosquitto 2.0.11 lets bob take alice's persistent session with her client id (session present
1), sends him nothing of it (its ACL, at send) and alice comes back to nothing.  Here bob gets
CONNACK 5 whether he asks for the session or a clean one; alice, connected or not, keeps her
connection, her subscriptions and every queued message.  A message waiting for alice (in flight
or queued) when a reload takes her right to read it away is never sent.  Queues are bounded in
bytes as they are in messages: beyond, QoS 1 waits in the log, nothing is lost.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from frontend.node import Node
from mqttcore.channel import Limits
from mqttcore.packets import (
    Connack,
    ConnackCode,
    Connect,
    Disconnect,
    Pingreq,
    Pingresp,
    Puback,
    Publish,
    Suback,
)
from tests.e2e.conftest import NodeFactory, eventually, http_get
from tests.e2e.rawmqtt import RawClient
from tests.e2e.test_access import password_file
from tests.e2e.test_sessions import Stored

ACL = """\
user alice
topic readwrite alice/#

user bob
topic readwrite bob/#

user root
topic readwrite #
"""

PASSWORDS = {"alice": b"alice-pw", "bob": b"bob-pw", "root": b"root-pw"}


@pytest.fixture
async def stored(redis_url: str, redis_prefix: str) -> AsyncIterator[Stored]:
    client = aioredis.Redis.from_url(redis_url)
    yield Stored(client, redis_prefix)
    await client.aclose()


@pytest.fixture
def guarded(
    start_node: NodeFactory, tmp_path: Path, redis_url: str, redis_prefix: str
) -> NodeFactory:
    """Start a node with the password file and the ACL above (``tmp_path / "acl"``), sessions in
    Redis, its stats served; ``limits`` as given."""

    async def start(limits: Limits | None = None) -> Node:
        acl = tmp_path / "acl"
        acl.write_text(ACL)
        return await start_node(
            password_file=str(password_file(tmp_path)),
            acl_file=str(acl),
            redis_url=redis_url,
            redis_prefix=redis_prefix,
            stats_host="127.0.0.1",
            limits=limits or Limits(),
        )

    return start


def connect(client_id: str, user: str, clean: bool = False) -> Connect:
    return Connect(client_id, clean, username=user, password=PASSWORDS[user])


async def connack(port: int, packet: Connect) -> tuple[Connack, RawClient]:
    client = await RawClient.open(port)
    await client.send(packet)
    answer = await client.recv()
    assert isinstance(answer, Connack), answer
    return answer, client


async def refused(port: int, packet: Connect) -> None:
    """``packet`` gets CONNACK 5 and the connection is closed [MQTT-3.2.2-5]."""
    answer, client = await connack(port, packet)
    assert answer == Connack(False, ConnackCode.NOT_AUTHORIZED)
    await client.expect_closed()


async def publish(port: int, topic: str, *payloads: bytes) -> None:
    """root publishes ``payloads`` to ``topic`` at QoS 1, each acknowledged (in the log)."""
    root = await RawClient.connected(port, "root-pub", username="root", password=b"root-pw")
    for packet_id, payload in enumerate(payloads, 1):
        await root.send(Publish(topic, payload, 1, packet_id=packet_id))
        assert await root.recv() == Puback(packet_id)
    await root.close()


async def received(client: RawClient) -> Publish:
    """The next packet, a PUBLISH, acknowledged."""
    packet = await client.recv()
    assert isinstance(packet, Publish), packet
    assert packet.packet_id is not None
    await client.send(Puback(packet.packet_id))
    return packet


async def subscribed(port: int, client_id: str, user: str, topic_filter: str) -> RawClient:
    answer, client = await connack(port, connect(client_id, user))
    assert answer.return_code == 0
    assert await client.subscribe((topic_filter, 1)) == Suback(1, (1,))
    return client


async def test_another_user_gets_connack_5_and_the_owner_gets_every_queued_message(
    guarded: NodeFactory, stored: Stored
) -> None:
    node = await guarded()
    port = node.config.port
    alice = await subscribed(port, "alice-phone", "alice", "alice/#")
    await alice.send(Disconnect())
    await alice.close()
    await eventually(lambda: stored.released("alice-phone"), what="alice's session stored")
    await publish(port, "alice/x", *(b"%d" % i for i in range(5)))

    await refused(port, connect("alice-phone", "bob"))  # her session, asked for
    await refused(port, connect("alice-phone", "bob", clean=True))  # wiped, had it been taken

    answer, alice = await connack(port, connect("alice-phone", "alice"))
    assert answer == Connack(True, 0)
    got = [(await received(alice)).payload for _ in range(5)]
    assert got == [b"0", b"1", b"2", b"3", b"4"]
    await alice.expect_silence(0.3)
    _, metrics = await http_get(node.config.stats_port, "/metrics")
    assert "headwater_session_takeovers_refused_total 2.0" in metrics
    assert "headwater_session_takeovers_total 0.0" in metrics


async def test_a_live_owner_is_not_kicked_by_another_users_attempt(
    guarded: NodeFactory,
) -> None:
    port = (await guarded()).config.port
    alice = await subscribed(port, "alice-live", "alice", "alice/#")
    await refused(port, connect("alice-live", "bob"))
    await refused(port, connect("alice-live", "bob", clean=True))
    await publish(port, "alice/x", b"still yours")
    assert (await received(alice)).payload == b"still yours"  # same connection, subscribed
    await alice.send(Pingreq())
    assert await alice.recv() == Pingresp()


async def test_a_message_in_flight_is_not_resent_once_a_reload_denies_it(
    guarded: NodeFactory, stored: Stored, tmp_path: Path
) -> None:
    node = await guarded()
    port = node.config.port
    alice = await subscribed(port, "alice-acl", "alice", "alice/#")
    await publish(port, "alice/secret", b"then allowed")
    first = await alice.recv()  # sent, never acknowledged: owed again after a reconnect
    assert isinstance(first, Publish) and first.topic == "alice/secret"
    await alice.close()
    await eventually(lambda: stored.released("alice-acl"), what="alice's session stored")

    (tmp_path / "acl").write_text(ACL + "user alice\ntopic deny alice/secret\n")
    node.reload()  # what SIGHUP does
    denied = node.services.auth.denied_reads

    answer, alice = await connack(port, connect("alice-acl", "alice"))
    assert answer == Connack(True, 0)
    await publish(port, "alice/ok", b"allowed")
    assert (await received(alice)).topic == "alice/ok"  # not the DUP of alice/secret first
    assert node.services.auth.denied_reads == denied + 1


async def test_a_queued_message_is_not_sent_once_a_reload_denies_it(
    guarded: NodeFactory, tmp_path: Path
) -> None:
    node = await guarded(Limits(max_inflight=1))
    port = node.config.port
    alice = await subscribed(port, "alice-q", "alice", "alice/#")
    await publish(port, "alice/1", b"in flight")
    first = await alice.recv()
    assert isinstance(first, Publish) and first.topic == "alice/1"
    await publish(port, "alice/secret", b"queued")
    await publish(port, "alice/2", b"queued")
    session = node.dispatcher.subscriber("alice-q").channel.session  # type: ignore[union-attr]
    await eventually(lambda: len(session.queue) == 2, what="two messages queued for alice")

    (tmp_path / "acl").write_text(ACL + "user alice\ntopic deny alice/secret\n")
    node.reload()
    assert first.packet_id is not None
    await alice.send(Puback(first.packet_id))  # a slot frees: the queue drains
    assert (await received(alice)).topic == "alice/2"
    await alice.expect_silence(0.3)


async def test_a_queue_bounded_in_bytes_reads_on_from_the_log_and_loses_nothing(
    guarded: NodeFactory,
) -> None:
    bound = 4096
    node = await guarded(Limits(max_inflight=1, max_queued=1000, max_queued_bytes=bound))
    port = node.config.port
    alice = await subscribed(port, "alice-big", "alice", "alice/#")
    payloads = [b"%04d" % i + b"." * 996 for i in range(20)]  # 20 KB, 20 messages
    await publish(port, "alice/big", *payloads)
    first = await alice.recv()  # in flight, not acknowledged yet: the rest waits
    assert isinstance(first, Publish) and first.packet_id is not None
    counters = node.dispatcher.counters
    await eventually(lambda: counters.fell_behind >= 1, what="alice to read on from the log")
    session = node.dispatcher.subscriber("alice-big").channel.session  # type: ignore[union-attr]
    assert session is not None
    assert session.queued_bytes <= bound + 1000 + len("alice/big")  # one message may cross it
    assert len(session.queue) < 19
    await alice.send(Puback(first.packet_id))
    got = [first.payload] + [(await received(alice)).payload for _ in range(19)]
    assert got == payloads  # every one, in order, once
    await alice.expect_silence(0.3)
