"""Shared subscriptions against hostile or unlucky clients (issue 20 item 5), on a real Kafka:
share names that differ only in where a dot falls are two groups; share groups are bounded per
node and per client (SUBACK 0x80, counted, threads flat); the ACL judges the filter inside
``$share/<name>/``; a member that may not read a message never takes it from its group.

Threads are read from ``/proc/self/status``: the nodes run in the test's process."""

from __future__ import annotations

import itertools
import signal
import uuid
from collections import Counter
from pathlib import Path

from frontend.node import Node
from mqttcore.packets import SUBACK_FAILURE, Puback, Publish, Suback, Subscribe
from router.partitioner import Router
from router.shared import DEFAULT_MAX_SHARE_GROUPS
from tests.conftest import free_port
from tests.e2e.conftest import (
    PARTITIONS,
    NodeFactory,
    eventually,
    http_get,
    launch_node_process,
)
from tests.e2e.rawmqtt import RawClient
from tests.e2e.test_access import login, password_file

ACL = """\
user alice
topic readwrite alice/#
topic readwrite work/#

user bob
topic readwrite work/#
topic deny work/secret
"""


def threads() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads: line")


async def publish_qos1(client: RawClient, topics: list[str], first_id: int = 1) -> None:
    for i, topic in enumerate(topics):
        await client.send(Publish(topic, str(i).encode(), qos=1, packet_id=first_id + i))
    for i in range(len(topics)):
        assert await client.recv() == Puback(first_id + i)


async def drain(client: RawClient, quiet: float = 1.5, ack: bool = True) -> list[Publish]:
    """Everything ``client`` is sent until it has been sent nothing for ``quiet`` seconds,
    each QoS 1 message acknowledged (unless ``ack`` is false)."""
    got: list[Publish] = []
    while True:
        try:
            packet = await client.recv(timeout=quiet)
        except TimeoutError:
            return got
        assert isinstance(packet, Publish), packet
        if packet.qos and ack:
            await client.send(Puback(packet.packet_id or 0))
        got.append(packet)


async def reading(node: Node, *shares: tuple[str, str]) -> None:
    """Until every one of ``shares`` (group, filter) holds partitions on ``node``."""

    def holding() -> bool:
        groups = [node.dispatcher.share_group(*share) for share in shares]
        return all(g is not None and g.positions for g in groups)

    await eventually(holding, what=f"share groups {shares} holding partitions", timeout=30)


async def test_share_names_differing_by_a_dot_are_two_groups(node: Node) -> None:
    """``$share/q/p.X/x`` and ``$share/q.p/X/x`` once joined into one Kafka group id; X is
    chosen so that both filters' topics live on one partition, so that one Kafka group could
    never give each its 100 (the two consumers would split the partitions between them)."""
    router = Router(PARTITIONS, 2)
    level = next(
        b
        for b in (f"t{n}" for n in itertools.count())
        if router.partition_for_topic(f"p.{b}/x") == router.partition_for_topic(f"{b}/x")
    )
    q = f"q{uuid.uuid4().hex[:8]}"
    first, second = (q, f"p.{level}/x"), (f"{q}.p", f"{level}/x")
    members = []
    for group, topic_filter in (first, second):
        member = await RawClient.connected(node.config.port, f"m-{group}")
        assert (await member.subscribe((f"$share/{group}/{topic_filter}", 1))).return_codes == (1,)
        members.append(member)
    await reading(node, first, second)
    pub = await RawClient.connected(node.config.port, "dots-pub")
    await publish_qos1(pub, [first[1]] * 100 + [second[1]] * 100)
    got = [await drain(m) for m in members]
    assert [Counter(p.topic for p in g) for g in got] == [
        Counter({first[1]: 100}),
        Counter({second[1]: 100}),
    ]
    for client in (*members, pub):
        await client.close()


async def test_share_groups_per_node_are_bounded_threads_stay_flat(
    start_node: NodeFactory,
) -> None:
    """One client asks for 300 distinct share groups; the node takes ``--max-share-groups`` of
    them (the default), refuses the rest with 0x80 (counted in /metrics), and runs not one
    thread more for them: every group is read by the node's one share consumer."""
    bound = DEFAULT_MAX_SHARE_GROUPS
    node = await start_node(stats_host="127.0.0.1", max_share_groups_per_client=1000)
    first = await RawClient.connected(node.config.port, "first")  # the executor's threads
    assert (await first.subscribe(("$share/g0/greedy/0", 1))).return_codes == (1,)
    await reading(node, ("g0", "greedy/0"))
    client = await RawClient.connected(node.config.port, "greedy")
    before = threads()
    filters = tuple((f"$share/g{i}/greedy/{i}", 1) for i in range(300))
    await client.send(Subscribe(1, filters))
    suback = await client.recv(timeout=60)
    assert isinstance(suback, Suback)
    assert suback.return_codes == (1,) * bound + (SUBACK_FAILURE,) * (300 - bound)
    await reading(node, *((f"g{i}", f"greedy/{i}") for i in range(bound)))
    assert threads() == before
    _, metrics = await http_get(node.config.stats_port, "/metrics")
    assert f"headwater_share_groups_refused_total {300 - bound}.0" in metrics
    assert f"headwater_share_groups {bound}.0" in metrics
    other = await RawClient.connected(node.config.port, "joiner")  # a group the node has: room
    suback = await other.subscribe(("$share/g0/greedy/0", 0), ("$share/new/greedy/x", 0))
    assert suback.return_codes == (0, SUBACK_FAILURE)
    for c in (first, client, other):
        await c.close()


async def test_share_groups_per_client_are_bounded(start_node: NodeFactory) -> None:
    node = await start_node(max_share_groups_per_client=3)
    client = await RawClient.connected(node.config.port, "capped")
    filters = [(f"$share/c{i}/capped/x", 0) for i in range(4)]
    suback = await client.subscribe(*filters[:2], ("plain/x", 0))
    assert suback.return_codes == (0, 0, 0)
    suback = await client.subscribe(filters[0], *filters[2:], packet_id=2)
    assert suback.return_codes == (0, 0, SUBACK_FAILURE)  # the one held again takes no room
    assert node.dispatcher.shares.refused == 1
    await client.close()


async def guarded(start_node: NodeFactory, tmp_path: Path) -> Node:
    acl = tmp_path / "acl"
    acl.write_text(ACL)
    return await start_node(password_file=str(password_file(tmp_path)), acl_file=str(acl))


async def test_acl_judges_the_filter_inside_share(start_node: NodeFactory, tmp_path: Path) -> None:
    node = await guarded(start_node, tmp_path)
    port = node.config.port
    alice = await login(port, "alice-share", "alice")
    suback = await alice.subscribe(("$share/g/alice/#", 1), ("$share/g/bob/#", 1))
    assert suback.return_codes == (1, SUBACK_FAILURE)  # judged as alice/# and bob/#
    await reading(node, ("g", "alice/#"))
    pub = await login(port, "alice-pub", "alice")
    await publish_qos1(pub, ["alice/inbox"])
    assert [p.topic for p in await drain(alice)] == ["alice/inbox"]
    await alice.close()
    await pub.close()


async def test_a_member_that_may_not_read_leaves_the_message_to_another(
    start_node: NodeFactory, tmp_path: Path
) -> None:
    """bob may subscribe to work/# but not read work/secret: every secret goes to alice, none
    is taken by bob's turn and lost; the open topic is split between them."""
    node = await guarded(start_node, tmp_path)
    port = node.config.port
    members = {user: await login(port, f"{user}-worker", user) for user in ("alice", "bob")}
    for member in members.values():
        assert (await member.subscribe(("$share/w/work/#", 1))).return_codes == (1,)
    await reading(node, ("w", "work/#"))
    pub = await login(port, "alice-pub", "alice")
    await publish_qos1(pub, ["work/secret", "work/open"] * 20)
    got = {user: Counter(p.topic for p in await drain(m)) for user, m in members.items()}
    assert got["bob"]["work/secret"] == 0
    assert got["alice"]["work/secret"] == 20
    assert got["alice"]["work/open"] + got["bob"]["work/open"] == 20
    assert got["bob"]["work/open"] > 0  # bob is a member still: he gets his turns
    await members["alice"].close()
    group = node.dispatcher.share_group("w", "work/#")
    assert group is not None
    await eventually(lambda: "alice-worker" not in group.members, what="alice gone")
    # no member here may read it: finished unread (denied), never left pinning the partition
    await publish_qos1(pub, ["work/secret", "work/open"], first_id=100)
    assert [p.topic for p in await drain(members["bob"])] == ["work/open"]
    await eventually(lambda: node.dispatcher.shares.denied == 1, what="the secret denied")
    for client in (members["bob"], pub):
        await client.close()


async def test_a_killed_nodes_partitions_go_to_another_with_what_it_left_unacknowledged(
    kafka_bootstrap: str, log_topic: str, redis_url: str, redis_prefix: str
) -> None:
    """Two node processes share a group; the one whose member acknowledges nothing is
    SIGKILLed; the other takes its partitions once their leases expire and delivers what the
    dead node handed out unacknowledged: the surviving member ends with every message."""
    store = ("--redis-url", redis_url, "--redis-prefix", redis_prefix)
    ports = [free_port(), free_port()]
    doomed, survivor = [
        await launch_node_process(f"share-{i}", port, kafka_bootstrap, log_topic, *store)
        for i, port in enumerate(ports)
    ]
    try:
        silent = await RawClient.connected(ports[0], "silent")  # takes, never acknowledges
        assert (await silent.subscribe(("$share/k/w/+/x", 1))).return_codes == (1,)
        member = await RawClient.connected(ports[1], "member")
        assert (await member.subscribe(("$share/k/w/+/x", 1))).return_codes == (1,)
        pub = await RawClient.connected(ports[1], "k-pub")
        got: set[bytes] = set()
        silent_got: set[bytes] = set()

        async def both_hold(n: list[int] = [0]) -> bool:  # noqa: B006  # a probe each look
            n[0] += 1
            await publish_qos1(pub, [f"w/probe{n[0] % 16}/x"], first_id=n[0])
            silent_got.update(p.payload for p in await drain(silent, quiet=0.1, ack=False))
            got.update(p.payload for p in await drain(member, quiet=0.1))
            return bool(silent_got) and bool(got)

        await eventually(both_hold, what="each node holding some of the group's partitions")
        total = 40
        for i in range(total):
            await pub.send(Publish(f"w/{i}/x", b"m%d" % i, qos=1, packet_id=1000 + i))
        for i in range(total):
            assert await pub.recv() == Puback(1000 + i)
        silent_got = {p.payload for p in await drain(silent, quiet=1.0, ack=False)}
        assert silent_got, "the doomed node's member was given none of the 40"
        doomed.send_signal(signal.SIGKILL)
        await doomed.wait()

        async def all_delivered() -> bool:
            got.update(p.payload for p in await drain(member, quiet=0.2))
            return {b"m%d" % i for i in range(total)} <= got

        await eventually(all_delivered, what="every message at the survivor", timeout=40)
        await pub.close()
        await member.close()
    finally:
        for proc in (doomed, survivor):
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
