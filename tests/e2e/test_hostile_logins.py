"""Logins as a hostile client tries them, on a real node with real Kafka: a user name the node
cannot check selects no ACL rules, an ACL with no way to log in stops start-up, dear password
hashes do not stall the event loop, an address that keeps failing is refused (by the address
the load balancer's PROXY header gives), and SIGHUP disconnects a client whose password entry
is gone or changed (as Mosquitto 2 does)."""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from frontend.auth import hash_password
from frontend.auth.passwords import parse_hash
from headwater.services.ports import free_port
from mqttcore.codec import encode
from mqttcore.packets import SUBACK_FAILURE, Connack, Connect, Pingreq, Pingresp, Suback
from tests.e2e.conftest import NodeFactory, http_get, launch_node_process
from tests.e2e.rawmqtt import RawClient

pytestmark = pytest.mark.timeout(120)

ACL = "topic read public/#\nuser alice\ntopic readwrite alice/#\n"


async def ping(client: RawClient) -> float:
    """Seconds from sending a PINGREQ to its PINGRESP."""
    started = time.perf_counter()
    await client.send(Pingreq())
    assert await client.recv(timeout=60) == Pingresp()
    return time.perf_counter() - started


async def test_a_claimed_user_name_selects_no_acl_rules_without_a_way_to_authenticate(
    start_node: NodeFactory, tmp_path: Path
) -> None:
    acl = tmp_path / "acl"
    acl.write_text(ACL)
    # Built in code, the node applies the default (anonymous clients allowed: it has no password
    # file); from the command line it would need --allow-anonymous yes (the test below).
    port = (await start_node(acl_file=str(acl))).config.port
    claimer = await RawClient.connected(port, "not-alice", username="alice")
    assert await claimer.subscribe(("alice/#", 1), ("public/#", 1)) == Suback(
        1, (SUBACK_FAILURE, 1)
    )  # the anonymous rules: claiming a name proves nothing
    await claimer.close()


def test_a_node_given_an_acl_and_no_way_to_authenticate_refuses_to_start(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    acl = tmp_path / "acl"
    acl.write_text(ACL)
    argv = [
        sys.executable, "-m", "frontend", "--node-id", "anon",
        "--listen", f"127.0.0.1:{free_port()}",
        "--kafka-bootstrap", kafka_bootstrap, "--acl-file", str(acl),
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEADWATER_")}
    env["PYTHONPATH"] = os.getcwd()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=20, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail("the node started with an ACL and no way to authenticate")
    assert done.returncode == 2, done.stderr
    for setting in ("--acl-file", "--password-file", "--use-identity-as-username"):
        assert setting in done.stderr
    assert "--allow-anonymous yes" in done.stderr


async def test_dear_logins_are_hashed_while_the_event_loop_serves(
    start_node: NodeFactory, tmp_path: Path
) -> None:
    """Twenty CONNECTs whose hashes cost about a second of CPU in all do not hold up another
    client's PINGREQ for half of that (on the loop, they held it up for all of it)."""
    entry = hash_password("pw", iterations=50_000)
    (tmp_path / "passwords").write_text(f"alice:{entry}\n")
    port = (await start_node(password_file=str(tmp_path / "passwords"))).config.port
    one_hash = statistics.median(_timed(parse_hash(entry).verify, b"pw") for _ in range(3))
    pinger = await RawClient.connected(port, "pinger", username="alice", password=b"pw")
    logins = [await RawClient.open(port) for _ in range(20)]
    for i, client in enumerate(logins):
        client.writer.write(encode(Connect(f"dear-{i}", username="alice", password=b"pw")))
    round_trip = await ping(pinger)
    assert round_trip < 20 * one_hash / 2, (round_trip, one_hash)
    answers = [await client.recv(timeout=60) for client in logins]
    assert answers == [Connack(False, 0)] * 20
    for client in [pinger, *logins]:
        await client.close()


async def test_failed_logins_are_throttled_per_proxy_address(
    start_node: NodeFactory, tmp_path: Path
) -> None:
    (tmp_path / "passwords").write_text(f"alice:{hash_password('pw')}\n")
    node = await start_node(
        password_file=str(tmp_path / "passwords"), proxy_protocol=True, stats_host="127.0.0.1"
    )
    port, stats = node.config.port, node.config.stats_port
    guesser = b"PROXY TCP4 203.0.113.7 10.0.0.1 4242 1883\r\n"
    other = b"PROXY TCP4 198.51.100.9 10.0.0.1 4242 1883\r\n"
    for i in range(10):
        wrong = Connect(f"g{i}", username="alice", password=b"guess %d" % i)
        assert await _connack(port, wrong, guesser) == 4
    right = Connect("g-right", username="alice", password=b"pw")
    assert await _connack(port, right, guesser) == 5  # refused without a check, right or not
    assert await _connack(port, right, other) == 0  # another address is not concerned
    _, text = await http_get(stats, "/stats")
    assert '"logins_throttled": 1' in text
    _, metrics = await http_get(stats, "/metrics")
    assert "headwater_logins_throttled_total 1.0" in metrics


async def test_sighup_disconnects_clients_whose_password_entry_is_gone_or_changed(
    kafka_bootstrap: str, log_topic: str, tmp_path: Path
) -> None:
    path = tmp_path / "passwords"
    for user in ("alice", "bob", "carol"):
        create = ["-c"] if user == "alice" else []
        subprocess.run(
            ["mosquitto_passwd", *create, "-b", str(path), user, f"{user}-pw"], check=True
        )
    port = free_port()
    node = await launch_node_process(
        "hup-auth", port, kafka_bootstrap, log_topic, "--password-file", str(path)
    )
    try:
        alice, bob, carol = [
            await RawClient.connected(port, user, username=user, password=f"{user}-pw".encode())
            for user in ("alice", "bob", "carol")
        ]
        subprocess.run(["mosquitto_passwd", "-D", str(path), "bob"], check=True)
        subprocess.run(["mosquitto_passwd", "-b", str(path), "carol", "new-pw"], check=True)
        node.send_signal(signal.SIGHUP)
        await bob.expect_closed(timeout=10)
        await carol.expect_closed(timeout=10)
        await ping(alice)  # alice's entry did not change: she stays
        await alice.close()
    finally:
        node.terminate()
        await node.wait()


def _timed(check: Callable[[bytes], bool], password: bytes) -> float:
    started = time.perf_counter()
    check(password)
    return time.perf_counter() - started


async def _connack(port: int, connect: Connect, proxy_header: bytes) -> int:
    client = await RawClient.open(port)
    await client.send(proxy_header + encode(connect))
    answer = await client.recv()
    assert isinstance(answer, Connack), answer
    await client.close()
    return answer.return_code
