"""docker/docker-compose.yml started for real, with testcontainers' compose support.

The stack is a project of its own (``headwater-test-<pid>``): its own env file (random passwords,
the base image ``headwater.compose`` picks), free ports on 127.0.0.1, its own edge subnet and
volumes, so a user's ``make compose-up`` stack is never touched. Images are built (cached after
the first run) and shared with that stack. Every container, network and volume is removed at the
end (``down --volumes``).

Through HAProxy's published ports: MQTT on the plain, TLS (verified with the stack's dev CA) and
WebSocket ports; Prometheus sees every front-end up; a rolling restart of the three front-ends
(``docker compose restart``, one after another, each back to healthy before the next) under QoS 1
load loses no acknowledged message.

Skipped where no Docker engine can be had or ``docker compose`` (v2) is missing: ``make
compose-up`` installs both.
"""

from __future__ import annotations

import ipaddress
import json
import os
import random
import shutil
import ssl
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.request import urlopen

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from headwater import compose
from tests.conftest import free_port

pytestmark = [pytest.mark.fault, pytest.mark.timeout(1800)]

TIMEOUT = 60.0


def compose_v2() -> bool:
    if shutil.which("docker") is None:
        return False
    result = subprocess.run(["docker", "compose", "version"], capture_output=True, check=False)
    return result.returncode == 0


def eventually(check: Callable[[], bool], what: str, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout:.0f} s: {what}"
        time.sleep(0.2)


def free_edge_octet() -> int:
    """An X for the stack's fixed edge network 172.31.X.0/24 that no Docker network on the
    engine holds (a suite beside another one, or a stack left up, would make creating it fail:
    "Pool overlaps with other one on this address space")."""
    ids = compose.docker("network", "ls", "-q").stdout.split()
    held = compose.docker("network", "inspect", *ids).stdout if ids else "[]"
    subnets = [
        ipaddress.ip_network(config["Subnet"])
        for network in json.loads(held)
        for config in (network.get("IPAM") or {}).get("Config") or []
        if "." in config.get("Subnet", "")
    ]
    for octet in random.sample(range(200, 250), 50):
        edge = ipaddress.ip_network(f"172.31.{octet}.0/24")
        if not any(edge.overlaps(subnet) for subnet in subnets):
            return octet
    raise RuntimeError("no free 172.31.X.0/24 among 200-249 for the edge network")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[compose.Stack]:
    if not compose_v2():
        pytest.skip("docker compose (v2) is not installed: make compose-up installs it")
    try:
        compose.ensure_engine()
    except Exception as exc:
        pytest.skip(f"no Docker engine: {exc}")
    from testcontainers.compose import DockerCompose

    directory = tmp_path_factory.mktemp("compose")
    project = f"headwater-test-{os.getpid()}"
    octet = free_edge_octet()
    extra = {
        "COMPOSE_PROJECT_NAME": project,
        **{name: free_port() for name in compose.DEFAULT_PORTS},
        "HEADWATER_EDGE_SUBNET": f"172.31.{octet}.0/24",
        "HEADWATER_EDGE_HAPROXY": f"172.31.{octet}.10",
    }
    stack = compose.Stack(project=project, env_file=directory / ".env")
    compose.prepare(stack, extra)
    os.environ["COMPOSE_PROJECT_NAME"] = project  # testcontainers' commands name no project
    environment = DockerCompose(
        compose.DOCKER_DIR, compose_file_name=compose.COMPOSE_FILE.name,
        env_file=str(stack.env_file), build=True, wait=False,
    )  # fmt: skip
    try:
        environment.start()
        stack.wait_ready(timeout=600)
        yield stack
    finally:
        environment.stop()  # down --volumes
        os.environ.pop("COMPOSE_PROJECT_NAME", None)
        left = subprocess.run(
            ["docker", "ps", "-aq", "--filter", f"label=com.docker.compose.project={project}"],
            capture_output=True, text=True, check=False,
        ).stdout.split()  # fmt: skip
        assert not left, f"containers left behind: {left}"


class Client:
    """paho-mqtt with its own thread; reconnects by itself, as a device would."""

    def __init__(self, port: int, client_id: str, **kwargs: Any) -> None:
        self.client = paho.Client(
            CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=False,
            protocol=paho.MQTTv311, **kwargs,
        )  # fmt: skip
        self.client.reconnect_delay_set(0.2, 1)
        self.port = port
        self.received: list[bytes] = []
        self.acked: set[int] = set()
        self.subscribed = threading.Event()
        self.connected = threading.Event()
        self.client.on_connect = lambda *_: self.connected.set()
        self.client.on_message = lambda _c, _u, msg: self.received.append(bytes(msg.payload))
        self.client.on_publish = lambda _c, _u, mid, *_: self.acked.add(mid)
        self.client.on_subscribe = lambda *_: self.subscribed.set()

    def start(self) -> Client:
        self.client.connect("127.0.0.1", self.port, keepalive=10)
        self.client.loop_start()
        assert self.connected.wait(TIMEOUT), "no CONNACK"
        return self

    def subscribe(self, topic: str) -> None:
        self.client.subscribe(topic, qos=1)
        assert self.subscribed.wait(TIMEOUT), "no SUBACK"

    def stop(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def round_trip(port: int, **kwargs: Any) -> None:
    topic = f"compose/{uuid.uuid4().hex}"
    subscriber = Client(port, f"sub-{uuid.uuid4().hex[:8]}", **kwargs).start()
    publisher = Client(port, f"pub-{uuid.uuid4().hex[:8]}", **kwargs).start()
    try:
        subscriber.subscribe(topic)
        publisher.client.publish(topic, b"hello", qos=1)
        eventually(lambda: subscriber.received == [b"hello"], f"the message on {topic}")
    finally:
        publisher.stop()
        subscriber.stop()


def test_mqtt_through_haproxy_plain_tls_and_websocket(stack: compose.Stack, tmp_path: Path) -> None:
    round_trip(stack.port("HEADWATER_MQTT_PORT"))
    ca = stack.copy_ca(tmp_path / "ca.crt")
    tls = Client(stack.port("HEADWATER_MQTTS_PORT"), "tls-probe")
    tls.client.tls_set(ca_certs=str(ca), cert_reqs=ssl.CERT_REQUIRED)
    tls.start().stop()
    round_trip(stack.port("HEADWATER_WS_PORT"), transport="websockets")


def test_prometheus_scrapes_every_front_end(stack: compose.Stack) -> None:
    url = f"http://127.0.0.1:{stack.port('HEADWATER_PROMETHEUS_PORT')}/api/v1/targets"

    def all_up() -> bool:
        with urlopen(url, timeout=5) as response:
            targets = json.load(response)["data"]["activeTargets"]
        up = {target["labels"]["instance"] for target in targets if target["health"] == "up"}
        return up == {f"{name}:9100" for name in compose.FRONTENDS}

    eventually(all_up, "every front-end up in Prometheus", timeout=90)


def test_rolling_restart_under_qos1_load_loses_nothing_acknowledged(stack: compose.Stack) -> None:
    port = stack.port("HEADWATER_MQTT_PORT")
    topic = f"roll/{uuid.uuid4().hex}"
    subscriber = Client(port, f"roll-sub-{uuid.uuid4().hex[:8]}").start()
    subscriber.subscribe(topic)
    publisher = Client(port, f"roll-pub-{uuid.uuid4().hex[:8]}").start()
    payloads: dict[int, bytes] = {}
    stop = threading.Event()

    def load() -> None:
        sequence = 0
        while not stop.is_set():
            payload = f"{sequence}".encode()
            info = publisher.client.publish(topic, payload, qos=1)
            payloads[info.mid] = payload
            sequence += 1
            time.sleep(0.01)

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    try:
        for service in compose.FRONTENDS:
            stack.compose("restart", service, timeout=120)
            eventually(lambda s=service: stack.healthy([s]), f"{service} healthy again", 120)
    finally:
        stop.set()
        thread.join()
    acked = {payloads[mid] for mid in set(publisher.acked)}
    assert len(acked) > 100
    eventually(lambda: acked <= set(subscriber.received), "every acknowledged message", 90)
    publisher.stop()
    subscriber.stop()
