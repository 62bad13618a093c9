"""A supervised dev cluster under faults: a rolling restart under QoS 1 load, a SIGKILLed node.

Real processes throughout: `headwater dev up` (front-end nodes and HAProxy; the session's Kafka and
Redis, through the environment), paho-mqtt clients through HAProxy that reconnect by themselves,
and `headwater dev roll` / `dev status` as a user runs them.  The roll test asserts that every
message a publisher had acknowledged reached a persistent subscriber (duplicates allowed and
counted) and prints how long the clients were away.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from headwater.devcluster.nodes import answers_ready
from headwater.services.ports import port_accepts
from headwater.services.process import ProcessIdentity
from headwater.services.readiness import wait_until
from tests.conftest import free_port
from tests.integration.test_dev_cluster import HEADWATER, DevUp

TOPIC = "roll/load"
PUBLISH_EVERY = 0.002
"""Seconds between two PUBLISHes of the load (a few hundred a second)."""


@pytest.fixture
def fault_env(kafka_bootstrap: str, redis_url: str) -> dict[str, str]:
    """The environment of a `dev up` that uses the session's Kafka and Redis."""
    env = {k: v for k, v in os.environ.items() if k != "HEADWATER_PORT"}
    env["HEADWATER_KAFKA_BOOTSTRAP"] = kafka_bootstrap
    env["HEADWATER_REDIS_URL"] = redis_url
    return env


@pytest.fixture
def cluster(
    request: pytest.FixtureRequest, tmp_path: Path, fault_env: dict[str, str]
) -> Iterator[DevUp]:
    nodes = getattr(request, "param", 3)
    up = DevUp(tmp_path / "state", free_port(), fault_env, nodes=nodes)
    try:
        up.wait_ready(timeout=90)
        yield up
    finally:
        if up.process.poll() is None:
            up.process.send_signal(signal.SIGTERM)
            up.process.wait(90)


def headwater(
    env: dict[str, str], *args: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*HEADWATER, *args], env=env, capture_output=True, text=True, timeout=timeout
    )


class Client:
    """A paho client that reconnects by itself and records how long it was away each time."""

    def __init__(self, port: int, client_id: str, clean_session: bool) -> None:
        self.client = paho.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            clean_session=clean_session,
            protocol=paho.MQTTv311,
        )
        self.client.reconnect_delay_set(min_delay=0.05, max_delay=0.5)  # type: ignore[arg-type]
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect
        self.connected = threading.Event()
        self.connects = 0
        self.lost_at: float | None = None
        self.gaps: list[float] = []
        """Seconds from each lost connection to the next CONNACK."""
        self.port = port

    def start(self) -> None:
        self.client.connect_async("127.0.0.1", self.port, keepalive=30)
        self.client.loop_start()
        assert self.connected.wait(30), "no CONNACK through HAProxy"

    def stop(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()

    def _on_connect(self, _c: Any, _u: Any, flags: Any, reason: Any, _p: Any) -> None:
        if reason.is_failure:
            return
        self.connects += 1
        if self.lost_at is not None:
            self.gaps.append(time.monotonic() - self.lost_at)
            self.lost_at = None
        self.connected_flags(flags)
        self.connected.set()

    def connected_flags(self, flags: Any) -> None:
        """Overridden by the subscriber."""

    def _on_disconnect(self, *_args: Any) -> None:
        if self.lost_at is None:
            self.lost_at = time.monotonic()


class Subscriber(Client):
    """A persistent session (cleanSession=0) on the load's topic, subscribed once."""

    def __init__(self, port: int) -> None:
        super().__init__(port, "roll-subscriber", clean_session=False)
        self.received: list[int] = []
        self.subscribed = threading.Event()
        self.client.on_message = lambda _c, _u, msg: self.received.append(int(msg.payload))
        self.client.on_subscribe = lambda *_args: self.subscribed.set()

    def connected_flags(self, flags: Any) -> None:
        if not flags.session_present:  # a stored session keeps its subscription [MQTT-3.1.2-4]
            self.client.subscribe(TOPIC, qos=1)


class Publisher(Client):
    """Publishes 0, 1, 2, ... at QoS 1 until stopped; `acknowledged` are those PUBACKed."""

    def __init__(self, port: int) -> None:
        super().__init__(port, "roll-publisher", clean_session=True)
        self.sent: list[tuple[int, paho.MQTTMessageInfo]] = []
        self.acked_mids: list[int] = []
        """Packet ids PUBACKed, in order (matched to ``sent`` at the end: fewer than 65,535)."""
        self.client.on_publish = lambda _c, _u, mid, _r, _p: self.acked_mids.append(mid)
        self.running = threading.Event()
        self.thread = threading.Thread(target=self._publish, daemon=True)

    def begin(self) -> None:
        self.running.set()
        self.thread.start()

    def end(self) -> None:
        self.running.clear()
        self.thread.join(10)

    def _publish(self) -> None:
        seq = 0
        while self.running.is_set():
            self.sent.append((seq, self.client.publish(TOPIC, str(seq), qos=1)))
            seq += 1
            time.sleep(PUBLISH_EVERY)

    def acknowledged(self) -> set[int]:
        assert len(self.sent) < 65535, "packet ids would repeat"
        by_mid = {info.mid: seq for seq, info in self.sent}
        return {by_mid[mid] for mid in self.acked_mids}


def children(state_dir: Path) -> dict[str, dict[str, Any]]:
    """The processes recorded in `dev up`'s state file, by name."""
    state = json.loads((state_dir / "headwater.json").read_text())
    return {child["name"]: child for child in state["children"]}


def node_records(state_dir: Path) -> list[dict[str, Any]]:
    return [c for c in children(state_dir).values() if c.get("ready_port")]


@pytest.mark.fault
@pytest.mark.timeout(150)
def test_a_rolling_restart_under_qos1_load_loses_no_acknowledged_message(
    cluster: DevUp, fault_env: dict[str, str]
) -> None:
    subscriber, publisher = Subscriber(cluster.port), Publisher(cluster.port)
    subscriber.start()
    assert subscriber.subscribed.wait(30), "no SUBACK"
    publisher.start()
    try:
        publisher.begin()
        time.sleep(2)
        started = time.monotonic()
        state = ["--state-dir", str(cluster.state_dir)]
        roll = headwater(fault_env, "dev", "roll", *state, timeout=120)
        rolled = time.monotonic() - started
        assert roll.returncode == 0, roll.stdout + roll.stderr
        time.sleep(2)
    finally:
        publisher.end()
    acknowledged = publisher.acknowledged()
    wait_until(
        lambda: acknowledged <= set(subscriber.received),
        what="every acknowledged message at the subscriber",
        timeout=30,
        interval=0.2,
    )
    publisher.stop()
    subscriber.stop()
    received = subscriber.received
    duplicates = len(received) - len(set(received))
    gaps = publisher.gaps + subscriber.gaps
    print(
        f"\nroll of 3 nodes: {rolled:.1f} s; published {len(publisher.sent)}, acknowledged "
        f"{len(acknowledged)}, received {len(set(received))} distinct + {duplicates} duplicates, "
        f"lost 0; clients reconnected {len(gaps)} times, longest away {max(gaps, default=0):.2f} s "
        f"(publisher {max(publisher.gaps, default=0):.2f} s, subscriber "
        f"{max(subscriber.gaps, default=0):.2f} s)\n{roll.stdout}"
    )
    assert len(acknowledged) > 1000
    assert [n["restarts"] for n in node_records(cluster.state_dir)] == [1, 1, 1]
    for log in sorted((cluster.state_dir / "nodes").glob("node*.log")):
        drains = [line for line in log.read_text().splitlines() if " drained in " in line]
        assert drains, log
        print(drains[0].split(": ", 1)[1])


@pytest.mark.fault
@pytest.mark.timeout(120)
@pytest.mark.parametrize("cluster", [2], indirect=True)
def test_a_killed_node_is_restarted_and_the_rest_keep_running(
    cluster: DevUp, fault_env: dict[str, str]
) -> None:
    recorded = children(cluster.state_dir).values()
    before = {c["name"]: ProcessIdentity(c["pid"], c["start_ticks"]) for c in recorded}
    victim = node_records(cluster.state_dir)[-1]
    os.kill(victim["pid"], signal.SIGKILL)

    def restarted() -> bool:
        record = next(r for r in node_records(cluster.state_dir) if r["name"] == victim["name"])
        return record["pid"] != victim["pid"] and answers_ready(record["ready_port"])

    wait_until(restarted, what=f"{victim['name']} restarted", timeout=60, interval=0.1)
    status = headwater(fault_env, "dev", "status", "--state-dir", str(cluster.state_dir))
    assert status.returncode == 0, status.stderr
    print(f"\n{status.stdout}")
    rows = {line.split()[0]: line.split() for line in status.stdout.splitlines()[2:]}
    name = victim["name"]
    assert rows[name][2:4] == ["running", "1"], status.stdout
    assert "ready: 200 ready" in status.stdout.splitlines()[2 + list(rows).index(name)]
    for other, identity in before.items():
        if other != name:
            assert identity.alive(), f"{other} was restarted too"
            assert rows[other][1:4] == [str(identity.pid), "running", "0"], status.stdout
    lines = []
    while not cluster.lines.empty():
        lines.append(cluster.lines.get())
    assert f"headwater: {name} exited with -9; restarting in 0.5 s" in lines, lines


@pytest.mark.fault
@pytest.mark.timeout(120)
def test_killed_redis_and_haproxy_come_back_on_their_ports(
    tmp_path: Path, fault_env: dict[str, str]
) -> None:
    env = {k: v for k, v in fault_env.items() if k != "HEADWATER_REDIS_URL"}  # a local Redis
    up = DevUp(tmp_path / "state", free_port(), env, nodes=1)
    try:
        up.wait_ready(timeout=90)
        before = children(up.state_dir)
        for name in ("redis", "haproxy"):
            os.kill(before[name]["pid"], signal.SIGKILL)

        def back() -> bool:
            now = children(up.state_dir)
            return (
                all(
                    now[n]["pid"] != before[n]["pid"] and now[n]["state"] == "running"
                    for n in ("redis", "haproxy")
                )
                and answers_ready(now["node0"]["ready_port"])
                and port_accepts(up.port)
            )

        wait_until(back, what="Redis and HAProxy restarted", timeout=60, interval=0.1)
        after = children(up.state_dir)
        for name in ("redis", "haproxy"):
            assert after[name]["ports"] == before[name]["ports"]
            assert after[name]["restarts"] == 1
        assert after["node0"]["pid"] == before["node0"]["pid"]
    finally:
        if up.process.poll() is None:
            up.process.send_signal(signal.SIGTERM)
            assert up.process.wait(90) == 0


def test_dev_status_without_a_cluster_fails(tmp_path: Path) -> None:
    result = headwater(dict(os.environ), "dev", "status", "--state-dir", str(tmp_path))
    assert result.returncode == 1
    assert result.stderr.startswith("headwater: error: no dev cluster is running from")
