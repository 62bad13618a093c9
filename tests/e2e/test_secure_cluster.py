"""`headwater dev up` serving MQTT over TLS and over WebSocket, as a user runs it.

One cluster for the module: `dev up` with two real nodes behind the real HAProxy (TLS passed
through, PROXY v2 to every node listener), a password file made by Debian's `mosquitto_passwd` and
an ACL file. It is reached by `mosquitto_pub`/`mosquitto_sub` over TLS with the dev CA that
`dev up` printed, by paho-mqtt over WebSocket, and by raw sockets whose own source port must show
up in the node's log: the node saw the client's address through the PROXY header, not HAProxy's.
Every wait is on a condition, bounded in time; topics and client ids are fresh per test.
"""

from __future__ import annotations

import base64
import os
import queue
import re
import signal
import socket
import ssl
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from headwater.certs import Pair, make_ca
from headwater.services.readiness import wait_until
from mqttcore.codec import Decoder, encode
from mqttcore.packets import Connack, Connect
from tests.conftest import free_port
from tests.integration.test_dev_cluster import DevUp

HOST = "127.0.0.1"
TIMEOUT = 30.0
USER, PASSWORD = "alice", "alice-secret"
READER, READER_PASSWORD = "bob", "bob-secret"  # may read everything, publish nothing (ACL)
ACL = f"user {USER}\ntopic readwrite #\n\nuser {READER}\ntopic read #\n"


@dataclass(frozen=True, slots=True)
class SecureCluster:
    up: DevUp
    lines: list[str]
    """What `dev up` printed up to its ready line."""
    cafile: Path

    def tls_args(self, user: str = USER, password: str = PASSWORD) -> list[str]:
        """mosquitto_pub/_sub arguments: HAProxy's TLS port, the dev CA, a login."""
        args = ["-h", HOST, "-p", str(self.up.tls_port), "--cafile", str(self.cafile)]
        return [*args, "-u", user, "-P", password] if user else args

    def node_logs(self) -> str:
        return "".join(p.read_text() for p in sorted((self.up.state_dir / "nodes").glob("*.log")))


def _cluster_env(kafka_bootstrap: str, redis_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "HEADWATER_PORT"}
    return {**env, "HEADWATER_KAFKA_BOOTSTRAP": kafka_bootstrap, "HEADWATER_REDIS_URL": redis_url}


@pytest.fixture(scope="module")
def secure(
    tmp_path_factory: pytest.TempPathFactory, kafka_bootstrap: str, redis_url: str
) -> Iterator[SecureCluster]:
    files = tmp_path_factory.mktemp("secure")
    passwd, acl = files / "passwd", files / "acl"
    subprocess.run(["mosquitto_passwd", "-c", "-b", str(passwd), USER, PASSWORD], check=True)
    subprocess.run(["mosquitto_passwd", "-b", str(passwd), READER, READER_PASSWORD], check=True)
    acl.write_text(ACL)
    extra = ["--password-file", str(passwd), "--acl-file", str(acl)]
    env = _cluster_env(kafka_bootstrap, redis_url)
    up = DevUp(files / "state", free_port(), env, nodes=2, extra=extra)
    try:
        lines = up.wait_ready(timeout=120)
        yield SecureCluster(up, lines, (files / "state" / "certs" / "ca.crt").resolve())
    finally:
        if up.process.poll() is None:
            up.process.send_signal(signal.SIGTERM)
            up.process.wait(60)


# -- clients ---------------------------------------------------------------------------------------


class Lines:
    """The output of a subprocess, line by line, read by a thread."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        self.seen: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for(self, wanted: Callable[[str], bool], timeout: float = TIMEOUT) -> str:
        deadline = time.monotonic() + timeout
        try:
            while (
                line := self._queue.get(timeout=max(deadline - time.monotonic(), 0))
            ) is not None:
                self.seen.append(line)
                if wanted(line):
                    return line
        except queue.Empty:
            pass
        raise AssertionError(f"not seen (ended, or {timeout:g} s passed); output: {self.seen}")


class MosquittoSub:
    """`mosquitto_sub -d` through HAProxy's TLS port, returned once its SUBACK has arrived."""

    def __init__(self, cluster: SecureCluster, topic: str, *login: str) -> None:
        argv = ["stdbuf", "-oL", "mosquitto_sub", *cluster.tls_args(*login), "-q", "1", "-d"]
        argv += ["-t", topic, "-F", "MSG %t %p"]
        process = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.output = Lines(process)
        try:
            self.output.wait_for(lambda line: "received SUBACK" in line)
        except BaseException:
            self.close()
            raise

    def next_message(self) -> str:
        return self.output.wait_for(lambda line: line.startswith("MSG "))

    def close(self) -> None:
        self.output.process.kill()
        self.output.process.wait()


def mosquitto_pub(cluster: SecureCluster, topic: str, message: str, *login: str) -> tuple[int, str]:
    argv = ["mosquitto_pub", *cluster.tls_args(*login), "-q", "1", "-t", topic, "-m", message]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT)
    return done.returncode, done.stdout + done.stderr


class WebSocketClient:
    """paho-mqtt over WebSocket (path /mqtt) through HAProxy's WebSocket port."""

    def __init__(self, port: int, user: str = USER, password: str = PASSWORD) -> None:
        self.port = port
        self.client = paho.Client(
            CallbackAPIVersion.VERSION2,
            client_id=f"ws-{uuid.uuid4().hex[:8]}",
            protocol=paho.MQTTv311,
            transport="websockets",
            reconnect_on_failure=False,
        )
        self.client.ws_set_options(path="/mqtt")
        self.client.username_pw_set(user, password)
        self.events: queue.Queue[tuple[str, object]] = queue.Queue()
        self.client.on_connect = lambda _c, _u, _f, reason, _p: self.events.put(("connack", reason))
        self.client.on_subscribe = lambda _c, _u, _m, codes, _p: self.events.put(("suback", codes))
        self.client.on_message = lambda _c, _u, msg: self.events.put(
            ("message", (msg.topic, bytes(msg.payload)))
        )

    def connect(self) -> str:
        """What the CONNACK said, as paho names it ("Success", "Bad user name or password")."""
        self.client.connect(HOST, self.port, keepalive=30)
        self.client.loop_start()
        return str(self.next("connack"))

    def next(self, kind: str) -> object:
        while True:
            got, value = self.events.get(timeout=TIMEOUT)
            if got == kind:
                return value

    def subscribe(self, topic: str) -> None:
        self.client.subscribe(topic, qos=1)
        codes = self.next("suback")
        assert [int(code.value) for code in codes] == [1], codes  # type: ignore[attr-defined]

    def publish(self, topic: str, payload: bytes) -> None:
        self.client.publish(topic, payload, qos=1).wait_for_publish(TIMEOUT)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


# -- what `dev up` prints and writes ---------------------------------------------------------------


def test_dev_up_prints_the_dev_ca_and_how_to_connect(secure: SecureCluster) -> None:
    up = secure.up
    assert secure.cafile.is_file()
    printed = "\n".join(secure.lines)
    assert f"dev CA certificate (give it to TLS clients): {secure.cafile}" in printed
    assert f"mosquitto_sub --cafile {secure.cafile} -h 127.0.0.1 -p {up.tls_port}" in printed
    assert f"ws://127.0.0.1:{up.ws_port}/mqtt" in printed


def test_haproxy_sends_proxy_v2_to_every_listener_and_checks_ready(secure: SecureCluster) -> None:
    config = (secure.up.state_dir / "haproxy" / "haproxy.cfg").read_text()
    backends = config.split("\nbackend ")[1:]
    assert [b.split()[0] for b in backends] == ["frontends", "frontends_tls", "frontends_ws"]
    for backend in backends:
        assert "    option httpchk GET /ready" in backend
        servers = [line for line in backend.splitlines() if line.startswith("    server ")]
        assert len(servers) == 2
        assert all(re.search(r" send-proxy-v2 check port \d+$", line) for line in servers)


# -- TLS, passwords, ACL ---------------------------------------------------------------------------


def test_mosquitto_over_tls_with_the_dev_ca_and_a_password(secure: SecureCluster) -> None:
    topic = f"secure/{uuid.uuid4().hex[:8]}/tls"
    sub = MosquittoSub(secure, topic)
    try:
        code, output = mosquitto_pub(secure, topic, "over tls")
        assert code == 0, output
        assert sub.next_message() == f"MSG {topic} over tls"
    finally:
        sub.close()


def test_a_wrong_or_missing_password_is_refused(secure: SecureCluster) -> None:
    code, output = mosquitto_pub(secure, "secure/x", "no", USER, "wrong-password")
    assert code != 0 and "bad user name or password" in output.lower(), output
    code, output = mosquitto_pub(secure, "secure/x", "no", "")  # no -u/-P
    assert code != 0 and "not authori" in output.lower(), output


def test_a_client_that_does_not_trust_the_dev_ca_fails_the_handshake(
    tmp_path: Path, secure: SecureCluster
) -> None:
    other = Pair(tmp_path / "other-ca.crt", tmp_path / "other-ca.key")
    make_ca(other, "Some other CA")
    argv = ["mosquitto_pub", "-d", "-h", HOST, "-p", str(secure.up.tls_port)]
    argv += ["--cafile", str(other.cert)]
    argv += ["-u", USER, "-P", PASSWORD, "-t", "secure/x", "-m", "no"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode != 0
    assert "certificate verify failed" in done.stdout + done.stderr


def test_the_acl_file_reaches_the_nodes(secure: SecureCluster) -> None:
    """The reader's PUBLISH is dropped: the writer's, acknowledged after it, arrives first."""
    topic = f"secure/{uuid.uuid4().hex[:8]}/acl"
    sub = MosquittoSub(secure, topic, READER, READER_PASSWORD)
    try:
        mosquitto_pub(secure, topic, "denied", READER, READER_PASSWORD)
        code, output = mosquitto_pub(secure, topic, "allowed")
        assert code == 0, output
        assert sub.next_message() == f"MSG {topic} allowed"
    finally:
        sub.close()


# -- WebSocket <-> TLS -----------------------------------------------------------------------------


def test_tls_to_websocket_and_back(secure: SecureCluster) -> None:
    base = f"secure/{uuid.uuid4().hex[:8]}"
    ws = WebSocketClient(secure.up.ws_port)
    try:
        assert ws.connect() == "Success"
        ws.subscribe(f"{base}/to-ws")
        code, output = mosquitto_pub(secure, f"{base}/to-ws", "from tls")
        assert code == 0, output
        assert ws.next("message") == (f"{base}/to-ws", b"from tls")
        sub = MosquittoSub(secure, f"{base}/to-tls")
        try:
            ws.publish(f"{base}/to-tls", b"from ws")
            assert sub.next_message() == f"MSG {base}/to-tls from ws"
        finally:
            sub.close()
    finally:
        ws.close()


def test_websocket_with_a_wrong_password_is_refused(secure: SecureCluster) -> None:
    ws = WebSocketClient(secure.up.ws_port, USER, "wrong-password")
    try:
        assert ws.connect() == "Bad user name or password"  # CONNACK 4
    finally:
        ws.close()


# -- the client's own address, through PROXY v2 ----------------------------------------------------


def _mqtt_over_websocket(sock: socket.socket) -> Callable[[bytes], bytes]:
    """Upgrade `sock` to a WebSocket (subprotocol mqtt) and return a function that sends one
    binary frame and returns the payload of the next frame received."""
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        (
            f"GET /mqtt HTTP/1.1\r\nHost: {HOST}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            "Sec-WebSocket-Protocol: mqtt\r\n\r\n"
        ).encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1) or b"<closed>\r\n\r\n"
    assert head.startswith(b"HTTP/1.1 101"), head

    def exchange(payload: bytes) -> bytes:
        sock.sendall(_ws_frame(payload))
        first, size = _recv_exactly(sock, 2)
        assert first & 0x0F == 0x2 and size < 126, (first, size)  # binary, short
        return _recv_exactly(sock, size)

    return exchange


def _ws_frame(payload: bytes) -> bytes:
    """One final binary frame from a client, masked with the key 0 (XOR leaves it as it is)."""
    assert len(payload) < 126
    return bytes([0x82, 0x80 | len(payload)]) + b"\0\0\0\0" + payload


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        assert chunk, "closed by the server"
        data += chunk
    return data


def _connect(exchange: Callable[[bytes], bytes], client_id: str) -> None:
    connect = Connect(client_id, username=USER, password=PASSWORD.encode())
    connack = Decoder().feed(exchange(encode(connect)))
    assert connack == [Connack(False, 0)], connack


@pytest.mark.parametrize("kind", ["mqtt", "mqtts", "ws"])
def test_the_node_sees_the_clients_own_address(secure: SecureCluster, kind: str) -> None:
    """HAProxy connects to the node from a port of its own; the node logs the client's."""
    port = {"mqtt": secure.up.port, "mqtts": secure.up.tls_port, "ws": secure.up.ws_port}[kind]
    client_id = f"{kind}-{uuid.uuid4().hex[:8]}"
    raw = socket.create_connection((HOST, port), timeout=TIMEOUT)
    client_port = raw.getsockname()[1]
    sock = raw
    if kind == "mqtts":
        context = ssl.create_default_context(cafile=str(secure.cafile))
        sock = context.wrap_socket(raw, server_hostname=HOST)
    with sock:
        if kind == "ws":
            exchange = _mqtt_over_websocket(sock)
        else:

            def exchange(packet: bytes) -> bytes:
                sock.sendall(packet)
                return _recv_exactly(sock, 4)  # CONNACK

        _connect(exchange, client_id)
    # gone without DISCONNECT: a close line at INFO (a DISCONNECT's is at DEBUG)
    line = f"client {client_id} ({HOST}:{client_port}) closed"
    wait_until(lambda: line in secure.node_logs(), what=f"'{line}' in a node log", timeout=TIMEOUT)
