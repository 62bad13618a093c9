"""`headwater dev up` / `dev down` as a user runs them: real subprocesses, signals, ports.

The cluster tests point `dev up` at the session's Kafka and Redis through the environment, so they
start only HAProxy (with `--nodes 0`) and run in a second or two. The failure tests check that each
mistake ends with a non-zero exit and one line naming the setting to change, not a traceback.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from headwater.devcluster.nodes import NodeSpec
from headwater.devcluster.supervisor import Supervised
from headwater.devcluster.up import READY_LINE, DevCluster, UpOptions, run_up
from headwater.errors import ServiceError
from headwater.services.ports import port_accepts
from headwater.services.process import ChildProcess, ProcessIdentity
from headwater.services.readiness import wait_until
from headwater.stats import fetch, stats_urls
from tests.conftest import free_port

HEADWATER = [sys.executable, "-m", "headwater"]


@pytest.fixture
def cluster_env(kafka_bootstrap: str, redis_url: str) -> dict[str, str]:
    """The environment of a `dev up` that uses the session's Kafka and Redis."""
    env = {k: v for k, v in os.environ.items() if k != "HEADWATER_PORT"}
    env["HEADWATER_KAFKA_BOOTSTRAP"] = kafka_bootstrap
    env["HEADWATER_REDIS_URL"] = redis_url
    return env


def free_ports(count: int) -> list[int]:
    """`count` distinct free loopback ports."""
    ports: list[int] = []
    while len(ports) < count:
        if (port := free_port()) not in ports:
            ports.append(port)
    return ports


class DevUp:
    """A running `headwater dev up` subprocess whose stdout is read line by line; HAProxy's TLS
    and WebSocket ports are free ones too, never the defaults."""

    def __init__(
        self,
        state_dir: Path,
        port: int,
        env: dict[str, str],
        nodes: int = 0,
        extra: Sequence[str] = (),
    ) -> None:
        self.state_dir = state_dir
        self.port = port
        self.tls_port, self.ws_port = [p for p in free_ports(3) if p != port][:2]
        argv = [*HEADWATER, "dev", "up", "--nodes", str(nodes), "--port", str(port)]
        argv += ["--tls-port", str(self.tls_port), "--ws-port", str(self.ws_port)]
        argv += ["--state-dir", str(state_dir), "--partitions", "3", *extra]
        self.process = subprocess.Popen(
            argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.errors: deque[str] = deque(maxlen=200)
        """The last lines of its stderr, read as they come: a pipe nobody reads fills, and a
        process writing to it (librdkafka's threads log there) blocks for good."""
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_errors, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))

    def _read_errors(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.errors.append(line.rstrip("\n"))

    def stopped(self, sig: int = signal.SIGINT, timeout: float = 60.0) -> int:
        """Its exit status after ``sig``; fails with its last stderr lines if it outlives
        ``timeout``."""
        self.process.send_signal(sig)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"dev up still running {timeout:g} s after {signal.Signals(sig).name}; "
                        "its stderr ends:\n" + "\n".join(self.errors))  # fmt: skip

    def end(self) -> None:
        """Stop it if it still runs: SIGTERM, SIGKILL a minute later (its children die with
        it)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(30)

    def wait_ready(self, timeout: float = 60.0) -> list[str]:
        seen: list[str] = []
        deadline = time.monotonic() + timeout
        while READY_LINE not in seen:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or (self.process.poll() is not None and self.lines.empty()):
                self.process.terminate()
                self.process.wait(30)
                pytest.fail(f"dev up not ready: {seen}\nstderr: " + "\n".join(self.errors))
            try:
                seen.append(self.lines.get(timeout=min(remaining, 0.5)))
            except queue.Empty:
                continue
        return seen

    def child_identities(self) -> list[ProcessIdentity]:
        state = json.loads((self.state_dir / "headwater.json").read_text())
        return [ProcessIdentity(c["pid"], c["start_ticks"]) for c in state["children"]]


@pytest.fixture
def dev_up(tmp_path: Path, cluster_env: dict[str, str]) -> Iterator[DevUp]:
    cluster = DevUp(tmp_path / "state", free_port(), cluster_env)
    try:
        yield cluster
    finally:
        cluster.end()


def _assert_all_gone(cluster: DevUp, children: list[ProcessIdentity]) -> None:
    assert children, "dev up recorded no child process"
    assert [c.pid for c in children if c.alive()] == []
    assert not any(port_accepts(p) for p in (cluster.port, cluster.tls_port, cluster.ws_port))
    assert not (cluster.state_dir / "headwater.json").exists()


def test_dev_up_serves_then_sigint_leaves_nothing(dev_up: DevUp) -> None:
    lines = dev_up.wait_ready()
    assert any(f"127.0.0.1:{dev_up.port}" in line and "MQTT" in line for line in lines)
    assert "headwater: anonymous clients allowed: no password file" in lines
    assert all(port_accepts(p) for p in (dev_up.port, dev_up.tls_port, dev_up.ws_port))
    children = dev_up.child_identities()
    assert all(child.alive() for child in children)
    assert dev_up.stopped(signal.SIGINT) == 0
    _assert_all_gone(dev_up, children)


def test_dev_up_makes_a_dev_ca_once_and_prints_it(
    tmp_path: Path, cluster_env: dict[str, str]
) -> None:
    """The first start makes the CA and prints how to use it; a later one reuses it."""
    printed_ca: list[bytes] = []
    for _ in range(2):
        cluster = DevUp(tmp_path / "state", free_port(), cluster_env)
        try:
            lines = cluster.wait_ready()
            cafile = (tmp_path / "state" / "certs" / "ca.crt").resolve()
            example = f"mosquitto_sub --cafile {cafile} -h 127.0.0.1 -p {cluster.tls_port} -t"
            assert any(example in line for line in lines), lines
            assert any(f"ws://127.0.0.1:{cluster.ws_port}/mqtt" in line for line in lines)
            printed_ca.append(cafile.read_bytes())
            assert cluster.stopped(signal.SIGINT) == 0
        finally:
            cluster.end()
    assert printed_ca[0] == printed_ca[1]


def test_dev_down_stops_a_running_cluster(dev_up: DevUp, cluster_env: dict[str, str]) -> None:
    dev_up.wait_ready()
    children = dev_up.child_identities()
    argv = [*HEADWATER, "dev", "down", "--state-dir", str(dev_up.state_dir)]
    down = subprocess.run(argv, env=cluster_env, capture_output=True, text=True, timeout=120)
    assert down.returncode == 0, down.stderr
    assert dev_up.process.wait(60) == 0
    _assert_all_gone(dev_up, children)


def test_dev_up_with_nodes_serves_mosquitto_clients_through_haproxy(
    tmp_path: Path, cluster_env: dict[str, str]
) -> None:
    cluster = DevUp(tmp_path / "state", free_port(), cluster_env, nodes=3)
    try:
        cluster.wait_ready(timeout=120)
        port = str(cluster.port)
        sub = subprocess.Popen(
            ["mosquitto_sub", "-h", "127.0.0.1", "-p", port, "-t", "demo/#", "-q", "1",
             "-C", "3", "-v", "-W", "30"],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip

        def subscribed() -> bool:
            """mosquitto_sub has no "subscribed" signal: its node reads the log for it once the
            subscription is registered (before the SUBACK)."""
            assert sub.poll() is None, "mosquitto_sub exited"
            urls = stats_urls(cluster.state_dir)
            return any(fetch(url)["assigned_partitions"] for url in urls)

        wait_until(subscribed, what="mosquitto_sub's subscription", timeout=30, interval=0.02)
        for i in range(3):
            pub = ["mosquitto_pub", "-h", "127.0.0.1", "-p", port, "-q", "1"]
            subprocess.run([*pub, "-t", f"demo/x/{i}", "-m", f"hello {i}"], check=True, timeout=30)
        out, _ = sub.communicate(timeout=40)
        assert sorted(out.splitlines()) == [f"demo/x/{i} hello {i}" for i in range(3)]
        argv = [*HEADWATER, "stats", "--state-dir", str(cluster.state_dir)]
        stats = subprocess.run(argv, env=cluster_env, capture_output=True, text=True, timeout=60)
        assert stats.returncode == 0, stats.stderr
        rows = stats.stdout.splitlines()
        assert rows[0].split()[:2] == ["node", "clients"] and len(rows) == 4
        fetched = [int(row.split()[3]) for row in rows[1:]]
        # only the subscriber's node read the log: the three records, and the nodes' $SYS reports
        # (every 10 s) if one came after the subscription: `$SYS/brokers` routes to demo/x's
        # partition of three (a loaded fresh-clone run read two)
        assert sorted(fetched)[:2] == [0, 0] and max(fetched) >= 3
        children = cluster.child_identities()
        assert cluster.stopped(signal.SIGINT) == 0
        _assert_all_gone(cluster, children)
    finally:
        cluster.end()


def _dev_up_fails(
    env: dict[str, str], tmp_path: Path, port: int | None = None, extra: Sequence[str] = ()
) -> str:
    """Run a `dev up` that must fail; return its stderr after checking the exit and the form."""
    argv = [*HEADWATER, "dev", "up", "--nodes", "0", "--state-dir", str(tmp_path / "state")]
    argv += ["--port", str(port if port is not None else free_port())]
    tls_port, ws_port = free_ports(2)
    argv += ["--tls-port", str(tls_port), "--ws-port", str(ws_port), *extra]
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("headwater: error: ")
    return result.stderr


def test_taken_port_is_named(tmp_path: Path, cluster_env: dict[str, str]) -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        stderr = _dev_up_fails(cluster_env, tmp_path, port)
    assert f"port 127.0.0.1:{port} is already in use" in stderr
    assert "--port / HEADWATER_PORT" in stderr


def test_a_taken_tls_port_is_named(tmp_path: Path, cluster_env: dict[str, str]) -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        stderr = _dev_up_fails(cluster_env, tmp_path, extra=["--tls-port", str(port)])
    assert f"port 127.0.0.1:{port} is already in use (setting --tls-port)" in stderr


def test_one_port_for_two_frontends_is_refused(tmp_path: Path, cluster_env: dict[str, str]) -> None:
    port = free_port()
    stderr = _dev_up_fails(cluster_env, tmp_path, port, extra=["--ws-port", str(port)])
    assert f"--ws-port and --port / HEADWATER_PORT are both {port}" in stderr


@pytest.mark.parametrize("flag", ["--password-file", "--acl-file"])
def test_a_missing_password_or_acl_file_is_named(
    tmp_path: Path, cluster_env: dict[str, str], flag: str
) -> None:
    missing = tmp_path / "nowhere" / "file"
    stderr = _dev_up_fails(cluster_env, tmp_path, extra=[flag, str(missing)])
    assert f"{flag}: no file {missing}" in stderr
    assert not (tmp_path / "state" / "headwater.json").exists()


def test_an_acl_no_login_can_select_is_refused_before_anything_starts(
    tmp_path: Path, cluster_env: dict[str, str]
) -> None:
    acl = tmp_path / "acl"
    acl.write_text("user alice\ntopic readwrite alice/#\n")
    stderr = _dev_up_fails(cluster_env, tmp_path, extra=["--acl-file", str(acl)])
    assert "--acl-file" in stderr and "--allow-anonymous yes" in stderr
    assert not (tmp_path / "state" / "headwater.json").exists()


def test_unreachable_kafka_is_named(tmp_path: Path, cluster_env: dict[str, str]) -> None:
    bootstrap = f"127.0.0.1:{free_port()}"
    env = {**cluster_env, "HEADWATER_KAFKA_BOOTSTRAP": bootstrap}
    stderr = _dev_up_fails(env, tmp_path)
    assert f"Kafka at {bootstrap} (setting HEADWATER_KAFKA_BOOTSTRAP) is unreachable" in stderr


def test_unreachable_redis_is_named(tmp_path: Path, cluster_env: dict[str, str]) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    stderr = _dev_up_fails({**cluster_env, "HEADWATER_REDIS_URL": url}, tmp_path)
    assert f"Redis at {url} (setting HEADWATER_REDIS_URL) is unreachable" in stderr


def test_malformed_kafka_setting_is_named(tmp_path: Path, cluster_env: dict[str, str]) -> None:
    env = {**cluster_env, "HEADWATER_KAFKA_BOOTSTRAP": "no-port-here"}
    stderr = _dev_up_fails(env, tmp_path)
    assert "HEADWATER_KAFKA_BOOTSTRAP: expected host:port" in stderr


def test_missing_java_says_what_to_install(tmp_path: Path, redis_url: str) -> None:
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("JAVA_HOME", "HEADWATER_KAFKA_BOOTSTRAP", "HEADWATER_PORT")
    }
    env.update(PATH=str(empty_bin), HEADWATER_REDIS_URL=redis_url)
    stderr = _dev_up_fails(env, tmp_path)
    assert "Java 17+ is required to run the local Kafka" in stderr
    assert "install openjdk-17-jre-headless or set HEADWATER_KAFKA_BOOTSTRAP" in stderr


def test_a_second_dev_up_on_the_same_state_dir_is_refused(
    dev_up: DevUp, cluster_env: dict[str, str]
) -> None:
    dev_up.wait_ready()
    argv = [*HEADWATER, "dev", "up", "--nodes", "0", "--port", str(free_port())]
    argv += ["--state-dir", str(dev_up.state_dir)]
    second = subprocess.run(argv, env=cluster_env, capture_output=True, text=True, timeout=60)
    assert second.returncode == 1
    assert "a dev cluster already runs from" in second.stderr
    assert (dev_up.state_dir / "headwater.json").exists()
    assert all(child.alive() for child in dev_up.child_identities())


def test_a_node_that_exits_early_is_reported_and_everything_stops(
    tmp_path: Path, cluster_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    crash = "import sys; print('frontend: bad flag --bogus', file=sys.stderr); sys.exit(2)"
    monkeypatch.setattr(NodeSpec, "argv", lambda self: [sys.executable, "-c", crash])
    spawned: list[ProcessIdentity] = []
    original_track = DevCluster._track

    def track(cluster: DevCluster, child: ChildProcess, *args: Any) -> Supervised:
        spawned.append(child.identity)
        return original_track(cluster, child, *args)

    monkeypatch.setattr(DevCluster, "_track", track)
    options = UpOptions(nodes=2, port=free_port(), state_dir=tmp_path / "state", partitions=3)
    with pytest.raises(ServiceError, match=r"(?s)node0 exited with code 2.*bad flag --bogus"):
        run_up(options, env=cluster_env)
    assert spawned and not any(identity.alive() for identity in spawned)
    assert not (tmp_path / "state" / "headwater.json").exists()
