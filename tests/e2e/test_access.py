"""Who may connect, publish and read, as a client sees it: a node given a password file made by
Debian's ``mosquitto_passwd`` and a Mosquitto ``acl_file``, with real Kafka and real clients.

The ACL's own table of rules is tested in ``tests/unit/test_acl.py``; here, what each decision
looks like on the wire (SUBACK 0x80, a PUBACK for a publish that is never written, CONNACK 4/5),
that a wildcard subscription never leaks a denied topic, and that SIGHUP rereads both files
under traffic without dropping a connection."""

from __future__ import annotations

import asyncio
import signal
import subprocess
from pathlib import Path

import pytest

from headwater.services.ports import free_port
from mqttcore.packets import (
    SUBACK_FAILURE,
    Connack,
    ConnackCode,
    Connect,
    Puback,
    Publish,
    Suback,
    Will,
)
from tests.e2e.conftest import NodeFactory, eventually, http_get, launch_node_process
from tests.e2e.rawmqtt import RawClient
from tests.e2e.realclients import mosquitto_pub

ACL = """\
# anonymous clients: read the public feed only
topic read public/#

user alice
topic readwrite alice/#
topic read sensors/+/temp
topic deny sensors/secret/temp

user bob
topic write sensors/#
topic write public/#

user root
topic readwrite #

# every client: its own devices/<client id>/ tree, and its user's inbox
pattern readwrite devices/%c/#
pattern read inbox/%u
"""

USERS = {"alice": "alice-pw", "bob": "bob-pw", "root": "root-pw"}


def password_file(directory: Path) -> Path:
    path = directory / "passwords"
    for user, password in USERS.items():
        create = ["-c"] if not path.exists() else []
        subprocess.run(["mosquitto_passwd", *create, "-b", str(path), user, password], check=True)
    return path


@pytest.fixture
async def guarded(start_node: NodeFactory, tmp_path: Path) -> tuple[int, int]:
    """A node with the password file and ACL above: its MQTT and stats ports."""
    acl = tmp_path / "acl"
    acl.write_text(ACL)
    node = await start_node(
        password_file=str(password_file(tmp_path)), acl_file=str(acl), stats_host="127.0.0.1"
    )
    return node.config.port, node.config.stats_port


async def login(port: int, client_id: str, user: str | None = None, **connect: object) -> RawClient:
    password = USERS[user].encode() if user else None
    return await RawClient.connected(port, client_id, username=user, password=password, **connect)


async def connack(port: int, connect: Connect) -> int:
    client = await RawClient.open(port)
    await client.send(connect)
    answer = await client.recv()
    assert isinstance(answer, Connack)
    if answer.return_code:
        await client.expect_closed()  # [MQTT-3.2.2-5]
    else:
        await client.close()
    return answer.return_code


async def test_passwords_made_by_mosquitto_passwd_decide_connack(guarded: tuple[int, int]) -> None:
    port, _ = guarded
    assert await connack(port, Connect("a", username="alice", password=b"alice-pw")) == 0
    assert await connack(port, Connect("a", username="alice", password=b"wrong")) == 4
    assert await connack(port, Connect("a", username="mallory", password=b"x")) == 4
    assert await connack(port, Connect("a")) == ConnackCode.NOT_AUTHORIZED  # 5: no credentials
    # A real client: mosquitto_pub's exit status and message.
    ok, _ = await mosquitto_pub(port, "-u", "bob", "-P", "bob-pw", "-t", "public/x", "-m", "1")
    assert ok == 0
    refused, said = await mosquitto_pub(
        port, "-u", "bob", "-P", "nope", "-t", "public/x", "-m", "1"
    )
    assert refused != 0 and "bad user name or password" in said.lower(), said


async def test_subscribe_publish_and_read_follow_the_acl(guarded: tuple[int, int]) -> None:
    port, stats = guarded
    alice = await login(port, "alice-1", "alice")
    # One SUBSCRIBE: what alice may read is granted, the rest gets 0x80 [MQTT-3.9.3-1].
    assert await alice.subscribe(("sensors/+/temp", 1), ("#", 1), ("alice/#", 1)) == Suback(
        1, (1, SUBACK_FAILURE, 1)
    )
    root = await login(port, "root-1", "root")
    await root.subscribe(("#", 1))
    bob = await login(port, "bob-1", "bob")
    published = [
        ("sensors/kitchen/temp", True),  # bob writes, alice reads
        ("sensors/secret/temp", True),  # bob writes; alice's wildcard matches, her deny rule wins
        ("alice/notes", False),  # bob may not write there: PUBACK, never written
        ("$SYS/broker/uptime", False),  # nobody publishes into $SYS
        ("devices/bob-1/state", True),  # the %c pattern
        ("devices/alice-1/state", False),  # someone else's device
    ]
    for packet_id, (topic, _) in enumerate(published, 1):
        await bob.send(Publish(topic, topic.encode(), 1, packet_id=packet_id))
        assert await bob.recv() == Puback(packet_id)  # denied or not, the client sees a PUBACK
    written = [topic for topic, allowed in published if allowed]
    got = {(await root.recv()).topic for _ in written}  # type: ignore[attr-defined]
    assert got == set(written)
    first = await alice.recv()
    assert isinstance(first, Publish) and first.topic == "sensors/kitchen/temp"
    await alice.expect_silence(0.5)
    await root.expect_silence(0.2)
    _, text = await http_get(stats, "/stats")
    assert '"messages_produced": 3' in text


async def test_history_is_judged_by_its_filter_and_each_message_by_its_topic(
    guarded: tuple[int, int],
) -> None:
    port, _ = guarded
    bob = await login(port, "bob-h", "bob")
    for packet_id, topic in enumerate(("sensors/attic/temp", "sensors/secret/temp"), 1):
        await bob.send(Publish(topic, topic.encode(), 1, packet_id=packet_id))
        assert await bob.recv() == Puback(packet_id)
    alice = await login(port, "alice-h", "alice")
    assert await alice.subscribe(
        ("$history/earliest/sensors/+/temp", 1), ("$history/earliest/#", 1)
    ) == Suback(1, (1, SUBACK_FAILURE))
    got = await alice.recv()
    assert isinstance(got, Publish) and got.topic == "$history/earliest/sensors/attic/temp"
    await alice.send(Puback(got.packet_id))
    await alice.expect_silence()  # her deny rule holds for sensors/secret/temp's history too


async def test_without_a_password_file_the_anonymous_section_and_patterns_apply(
    start_node: NodeFactory, tmp_path: Path
) -> None:
    acl = tmp_path / "acl"
    acl.write_text(ACL)
    port = (await start_node(acl_file=str(acl))).config.port
    anonymous = await RawClient.connected(port, "anon-1")
    assert await anonymous.subscribe(("public/#", 0), ("alice/#", 0)) == Suback(
        1, (0, SUBACK_FAILURE)
    )
    await anonymous.send(Publish("public/news", b"x", 1, packet_id=5))  # read-only for them
    assert await anonymous.recv() == Puback(5)
    # Without a password file a user name proves nothing (Mosquitto takes it as given): its
    # client gets the anonymous section and the %c patterns, never a user section or %u.
    carol = await RawClient.connected(port, "carol-1", username="carol")
    assert await carol.subscribe(("inbox/carol", 1), ("public/#", 1)) == Suback(
        1, (SUBACK_FAILURE, 1)
    )
    bob = await RawClient.connected(port, "bob-3", username="bob")
    assert await bob.subscribe(("devices/bob-3/#", 1)) == Suback(1, (1,))
    await bob.send(Publish("public/news", b"from bob", 1, packet_id=1))
    assert await bob.recv() == Puback(1)  # acknowledged, never written: bob's rules are not his
    await bob.send(Publish("devices/bob-3/state", b"own", 1, packet_id=2))
    got = [await bob.recv(), await bob.recv()]
    assert Puback(2) in got and any(isinstance(p, Publish) and p.payload == b"own" for p in got)
    await anonymous.expect_silence(0.3)  # neither anon's own publish nor "bob"'s was written
    await carol.expect_silence(0.1)


async def test_a_will_the_client_may_not_publish_refuses_the_connect(
    guarded: tuple[int, int],
) -> None:
    port, _ = guarded
    bad = Connect("alice-w", username="alice", password=b"alice-pw", will=Will("bob/x", b"", 0))
    assert await connack(port, bad) == ConnackCode.NOT_AUTHORIZED
    good = Connect(
        "alice-w", username="alice", password=b"alice-pw", will=Will("alice/gone", b"", 0)
    )
    client = await RawClient.open(port)
    await client.send(good)
    assert await client.recv() == Connack(False, 0)
    await client.close()


async def test_sighup_rereads_the_acl_under_traffic_and_keeps_the_old_rules_if_it_is_broken(
    kafka_bootstrap: str, log_topic: str, tmp_path: Path
) -> None:
    acl = tmp_path / "acl"
    acl.write_text("user bob\ntopic write feed/#\nuser alice\ntopic read other/#\n")
    port = free_port()
    node = await launch_node_process(
        "hup", port, kafka_bootstrap, log_topic,
        "--password-file", str(password_file(tmp_path)), "--acl-file", str(acl),
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        bob = await login(port, "bob-feed", "bob")
        acked = 0

        async def publish_until(stop: asyncio.Event) -> None:
            nonlocal acked
            while not stop.is_set():
                packet_id = acked % 65535 + 1
                await bob.send(Publish("feed/x", b"%d" % acked, 1, packet_id=packet_id))
                assert await bob.recv() == Puback(packet_id)
                acked += 1

        stop = asyncio.Event()
        traffic = asyncio.create_task(publish_until(stop))
        alice = await login(port, "alice-feed", "alice")
        assert await alice.subscribe(("feed/#", 1)) == Suback(1, (SUBACK_FAILURE,))

        acl.write_text("user bob\ntopic write feed/#\nuser alice\ntopic read feed/#\n")
        node.send_signal(signal.SIGHUP)

        async def granted() -> bool:
            return (await alice.subscribe(("feed/#", 1), packet_id=2)) == Suback(2, (1,))

        await eventually(granted, what="alice's subscription granted after SIGHUP", timeout=10)
        assert isinstance(await alice.recv(), Publish)  # the feed reaches her, live

        acl.write_text("user alice\ntopic sideways feed/#\n")  # not a Mosquitto ACL line
        node.send_signal(signal.SIGHUP)
        assert node.stderr is not None
        at_fault = f"{acl}:2".encode()  # the log names the line at fault
        while at_fault not in (line := await asyncio.wait_for(node.stderr.readline(), 10)):
            assert line, "the node's log ended"
        before = acked
        await eventually(lambda: acked > before + 50, what="publishes after the broken reload")
        assert isinstance(await alice.recv(), Publish)  # the old rules still hold
        stop.set()
        await traffic  # every PUBLISH acknowledged, on the one connection throughout
    finally:
        node.terminate()
        await node.wait()
