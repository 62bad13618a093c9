"""Headwater's tooling without real services: generated configs, settings, ports, processes, CLI."""

from __future__ import annotations

import io
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest

from headwater import cli
from headwater.devcluster.state import (
    ClusterState,
    ProcessRecord,
    read_state,
    remove_state,
    write_state,
)
from headwater.devcluster.up import DevCluster, UpOptions
from headwater.errors import MissingProgramError, ServiceError, SettingError
from headwater.services.haproxy import Server, render_config
from headwater.services.java import java_major_version, require_java
from headwater.services.kafka import (
    KafkaPorts,
    LocalKafkaCluster,
    Quorum,
    new_cluster_id,
    render_server_properties,
)
from headwater.services.ports import ensure_port_free, free_port, port_accepts
from headwater.services.process import ChildProcess, ProcessIdentity, find_program
from headwater.services.readiness import wait_until
from headwater.services.redis_server import redact
from headwater.settings import (
    external_kafka_bootstrap,
    external_redis_url,
    kafka_brokers,
    mqtt_port,
    replication,
)
from router.topics import MESSAGES_TOPIC, Replication, project_topics


def _properties(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line)


def test_kafka_config_is_a_loopback_kraft_single_node(tmp_path: Path) -> None:
    props = _properties(render_server_properties(tmp_path, Quorum({1: KafkaPorts(9001, 9002)})))
    assert props["process.roles"] == "broker,controller"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:9002"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:9001,CONTROLLER://127.0.0.1:9002"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:9001"
    assert props["auto.create.topics.enable"] == "false"
    assert props["group.initial.rebalance.delay.ms"] == "0"
    assert props["offsets.topic.replication.factor"] == "1"
    assert props["transaction.state.log.replication.factor"] == "1"
    assert props["transaction.state.log.min.isr"] == "1"
    assert props["log.dirs"] == str(tmp_path)
    assert "broker.session.timeout.ms" not in props


def test_kafka_config_of_a_three_node_quorum_replicates_internal_topics(tmp_path: Path) -> None:
    quorum = Quorum({i: KafkaPorts(9000 + i, 9100 + i) for i in (1, 2, 3)})
    assert quorum.bootstrap == "127.0.0.1:9001,127.0.0.1:9002,127.0.0.1:9003"
    props = _properties(render_server_properties(tmp_path, quorum, node_id=2))
    assert props["node.id"] == "2"
    assert props["controller.quorum.voters"] == (
        "1@127.0.0.1:9101,2@127.0.0.1:9102,3@127.0.0.1:9103"
    )
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:9002,CONTROLLER://127.0.0.1:9102"
    for topic in ("offsets.topic", "transaction.state.log", "share.coordinator.state.topic"):
        assert props[f"{topic}.replication.factor"] == "3"
    assert props["transaction.state.log.min.isr"] == "2"
    assert props["share.coordinator.state.topic.min.isr"] == "2"
    assert int(props["broker.session.timeout.ms"]) < 9000  # a dead broker is fenced sooner


def test_a_cluster_lays_out_one_directory_per_broker(tmp_path: Path) -> None:
    assert [n.state_dir for n in LocalKafkaCluster(tmp_path, 1).nodes] == [tmp_path]
    three = LocalKafkaCluster(tmp_path, 3)
    assert [n.state_dir for n in three.nodes] == [tmp_path / f"broker{i}" for i in (1, 2, 3)]
    assert [n.node_id for n in three.nodes] == [1, 2, 3]
    assert [n.heap for n in three.nodes] == ["512m"] * 3


def _formatted(directory: Path) -> None:
    (directory / "data").mkdir(parents=True)
    (directory / "data" / "meta.properties").write_text("cluster.id=x\n")


def test_kafka_data_of_another_cluster_size_is_refused(tmp_path: Path) -> None:
    _formatted(tmp_path)  # a one-broker cluster's node lives in the directory itself
    LocalKafkaCluster(tmp_path, 1).check_layout()
    with pytest.raises(SettingError) as caught:
        LocalKafkaCluster(tmp_path, 3).check_layout("--kafka-brokers")
    assert str(caught.value) == (
        f"the Kafka data in {tmp_path} is for 1 broker(s), not 3 (setting --kafka-brokers): "
        "ask for 1 or remove the directory"
    )
    three = tmp_path / "three"
    for i in (1, 2, 3):
        _formatted(three / f"broker{i}")
    LocalKafkaCluster(three, 3).check_layout()
    with pytest.raises(SettingError, match="is for 3 broker"):
        LocalKafkaCluster(three, 1).check_layout()
    with pytest.raises(SettingError, match="is for 3 broker"):
        LocalKafkaCluster(three, 2).check_layout()


def test_cluster_ids_are_22_url_safe_characters_never_read_as_an_option() -> None:
    ids = {new_cluster_id() for _ in range(2000)}
    assert len(ids) == 2000
    assert all(len(i) == 22 and "=" not in i and "/" not in i and "+" not in i for i in ids)
    # one id in 64 would start with "-" if drawn naively; the storage tool reads that as an option
    assert not any(i.startswith("-") for i in ids)


def test_haproxy_config_balances_leastconn_with_long_timeouts() -> None:
    config = render_config(
        18830, [Server("node0", "127.0.0.1", 4000), Server("node1", "127.0.0.1", 4001)]
    )
    assert "    bind 127.0.0.1:18830" in config
    assert "    mode tcp" in config
    assert "    balance leastconn" in config
    assert "    timeout client 1h" in config and "    timeout server 1h" in config
    assert "    server node0 127.0.0.1:4000" in config
    assert "    server node1 127.0.0.1:4001" in config
    assert "check" in config


def test_haproxy_checks_each_nodes_readiness_on_its_stats_port() -> None:
    config = render_config(18830, [Server("node0", "127.0.0.1", 4000, 5000)])
    assert "    option httpchk GET /ready" in config
    assert "    http-check expect status 200" in config
    assert "    server node0 127.0.0.1:4000 check port 5000" in config


@pytest.mark.skipif(find_program("haproxy") is None, reason="haproxy is not installed")
@pytest.mark.parametrize("nodes", [0, 3])
def test_haproxy_accepts_the_generated_config(tmp_path: Path, nodes: int) -> None:
    servers = [Server(f"node{i}", "127.0.0.1", 4000 + i, 5000 + i) for i in range(nodes)]
    path = tmp_path / "haproxy.cfg"
    path.write_text(render_config(free_port(), servers))
    haproxy = find_program("haproxy")
    assert haproxy is not None
    result = subprocess.run([haproxy, "-c", "-f", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_messages_topic_is_named_once() -> None:
    (topic,) = project_topics(6)
    assert topic.name == MESSAGES_TOPIC == "headwater.messages"
    assert topic.partitions == 6
    assert topic.replication_factor == 1
    assert topic.config["min.insync.replicas"] == "1"


def test_the_messages_topic_is_replicated_as_asked() -> None:
    (topic,) = project_topics(6, Replication(3, 2))
    assert topic.replication_factor == 3
    assert topic.config["min.insync.replicas"] == "2"


@pytest.mark.parametrize(
    ("brokers", "expected"),
    [
        (1, Replication(1, 1)),
        (2, Replication(2, 1)),
        (3, Replication(3, 2)),
        (5, Replication(3, 2)),
    ],
)
def test_replication_defaults_follow_the_broker_count(brokers: int, expected: Replication) -> None:
    assert replication(None, None, brokers, {}) == expected


def test_replication_comes_from_flags_then_the_environment() -> None:
    env = {"HEADWATER_REPLICATION_FACTOR": "2", "HEADWATER_MIN_INSYNC_REPLICAS": "2"}
    assert replication(None, None, 3, env) == Replication(2, 2)
    assert replication(3, 1, 3, env) == Replication(3, 1)
    # a factor given without a min ISR takes the default one for that factor
    assert replication(None, None, 3, {"HEADWATER_REPLICATION_FACTOR": "3"}) == Replication(3, 2)
    assert replication(2, None, 3, {}) == Replication(2, 1)


def test_replication_settings_are_validated_naming_the_setting() -> None:
    with pytest.raises(SettingError) as caught:
        replication(None, 2, 1, {})
    assert str(caught.value) == (
        "--min-insync-replicas: 2 in-sync replicas is more than the replication factor, 1 "
        "(--replication-factor / HEADWATER_REPLICATION_FACTOR): no write could ever be "
        "acknowledged"
    )
    with pytest.raises(SettingError, match=r"^HEADWATER_MIN_INSYNC_REPLICAS: 3 in-sync .*, 2 "):
        replication(2, None, 3, {"HEADWATER_MIN_INSYNC_REPLICAS": "3"})
    with pytest.raises(SettingError) as caught:
        replication(3, None, 1, {})
    assert str(caught.value) == (
        "--replication-factor: replication factor 3 needs 3 Kafka brokers, the Kafka has 1 "
        "(a local Kafka's count is --kafka-brokers / HEADWATER_KAFKA_BROKERS)"
    )
    with pytest.raises(SettingError, match="HEADWATER_REPLICATION_FACTOR: expected a whole number"):
        replication(None, None, 3, {"HEADWATER_REPLICATION_FACTOR": "three"})
    with pytest.raises(SettingError, match="HEADWATER_MIN_INSYNC_REPLICAS: must be at least 1"):
        replication(None, None, 3, {"HEADWATER_MIN_INSYNC_REPLICAS": "0"})


def test_the_kafka_broker_count_comes_from_the_flag_then_the_environment() -> None:
    assert kafka_brokers(None, {}) is None
    assert kafka_brokers(None, {"HEADWATER_KAFKA_BROKERS": "3"}) == 3
    assert kafka_brokers(1, {"HEADWATER_KAFKA_BROKERS": "3"}) == 1
    with pytest.raises(SettingError, match="HEADWATER_KAFKA_BROKERS: must be at least 1, got 0"):
        kafka_brokers(None, {"HEADWATER_KAFKA_BROKERS": "0"})


@pytest.mark.parametrize("value", ["", "   "])
def test_empty_external_settings_mean_local(value: str) -> None:
    env = {"HEADWATER_KAFKA_BOOTSTRAP": value, "HEADWATER_REDIS_URL": value}
    assert external_kafka_bootstrap(env) is None
    assert external_redis_url(env) is None


def test_external_settings_are_validated() -> None:
    assert external_kafka_bootstrap({"HEADWATER_KAFKA_BOOTSTRAP": "a:1,b:2"}) == "a:1,b:2"
    with pytest.raises(SettingError, match="HEADWATER_KAFKA_BOOTSTRAP: expected host:port"):
        external_kafka_bootstrap({"HEADWATER_KAFKA_BOOTSTRAP": "a:1,b"})
    with pytest.raises(SettingError, match="HEADWATER_REDIS_URL: expected a redis:// URL"):
        external_redis_url({"HEADWATER_REDIS_URL": "localhost:6379"})


def test_mqtt_port_prefers_the_flag_then_the_environment() -> None:
    assert mqtt_port(None, {}) == 1883
    assert mqtt_port(None, {"HEADWATER_PORT": "2883"}) == 2883
    assert mqtt_port(3883, {"HEADWATER_PORT": "2883"}) == 3883
    with pytest.raises(SettingError, match=r"HEADWATER_PORT: port must be in 1\.\.65535"):
        mqtt_port(None, {"HEADWATER_PORT": "70000"})
    with pytest.raises(SettingError, match=r"--port: port must be in 1\.\.65535"):
        mqtt_port(0, {})


def test_a_taken_port_is_refused_with_its_setting() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        assert port_accepts(port)
        with pytest.raises(SettingError) as caught:
            ensure_port_free(port, "--port / HEADWATER_PORT")
    assert str(caught.value) == (
        f"port 127.0.0.1:{port} is already in use (setting --port / HEADWATER_PORT)"
    )
    ensure_port_free(free_port(), "--port")


def test_redact_hides_passwords() -> None:
    assert redact("redis://:s3cret@host:6379/0") == "redis://:***@host:6379/0"
    assert redact("redis://user:s3cret@host/0") == "redis://user:***@host/0"
    assert redact("redis://host:6379/0") == "redis://host:6379/0"


def _fake_java(tmp_path: Path, version_line: str) -> str:
    java = tmp_path / "java"
    java.write_text(f"#!/bin/sh\necho '{version_line}' >&2\n")
    java.chmod(0o755)
    return str(java)


@pytest.mark.parametrize(
    ("line", "major"),
    [
        ('openjdk version "17.0.15" 2025-04-15', 17),
        ('openjdk version "21" 2023-09-19', 21),
        ('java version "1.8.0_392"', 8),
        ("no version here", None),
    ],
)
def test_java_version_is_read(tmp_path: Path, line: str, major: int | None) -> None:
    assert java_major_version(_fake_java(tmp_path, line)) == major


def test_old_java_is_refused(tmp_path: Path) -> None:
    _fake_java(tmp_path, 'java version "1.8.0_392"')
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "java").symlink_to(tmp_path / "java")
    with pytest.raises(MissingProgramError, match=r"Java 17\+ is required.*found Java 8"):
        require_java({"JAVA_HOME": str(tmp_path)})


def test_missing_java_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(MissingProgramError) as caught:
        require_java({})
    assert str(caught.value) == (
        "Java 17+ is required to run the local Kafka: "
        "install openjdk-17-jre-headless or set HEADWATER_KAFKA_BOOTSTRAP"
    )


def test_state_file_round_trips(tmp_path: Path) -> None:
    state = ClusterState(
        parent=ProcessRecord("up", 10, 100),
        children=[ProcessRecord("kafka", 11, 101, "/tmp/kafka.log")],
        endpoints={"mqtt": "127.0.0.1:1"},
    )
    assert read_state(tmp_path) is None
    write_state(tmp_path, state)
    assert read_state(tmp_path) == state
    remove_state(tmp_path)
    assert read_state(tmp_path) is None


def test_a_corrupt_state_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "headwater.json").write_text("{")
    with pytest.raises(ServiceError, match=r"headwater\.json is unreadable"):
        read_state(tmp_path)


def test_stop_kills_the_whole_process_group(tmp_path: Path) -> None:
    child = ChildProcess.spawn(
        "sleeper",
        ["sh", "-c", "sleep 300 & echo $! > grandchild; wait"],
        tmp_path / "log",
        cwd=tmp_path,
    )
    wait_until(lambda: (tmp_path / "grandchild").exists(), what="grandchild", timeout=10)
    time.sleep(0.1)
    grandchild = ProcessIdentity.of(int((tmp_path / "grandchild").read_text()))
    assert child.identity.alive() and grandchild.alive()
    child.stop(timeout=5)
    assert child.poll() is not None
    assert not child.identity.alive()
    assert not grandchild.alive()


def test_stop_escalates_to_sigkill(tmp_path: Path) -> None:
    child = ChildProcess.spawn(
        "stubborn",
        ["sh", "-c", "trap '' TERM; echo up; while :; do sleep 0.1; done"],
        tmp_path / "log",
    )
    wait_until(lambda: "up" in child.log_tail(), what="stubborn", timeout=10)
    started = time.monotonic()
    child.stop(timeout=0.5)
    assert child.poll() == -signal.SIGKILL
    assert time.monotonic() - started < 5


def test_waiting_on_a_dead_child_reports_its_log(tmp_path: Path) -> None:
    child = ChildProcess.spawn("doomed", ["sh", "-c", "echo boom; exit 3"], tmp_path / "log")
    with pytest.raises(ServiceError, match=r"(?s)doomed exited with code 3.*boom"):
        wait_until(lambda: False, what="doomed", timeout=10, child=child)


def test_a_recorded_pid_with_another_start_time_is_not_ours() -> None:
    me = ProcessIdentity.of(os.getpid())
    assert me.alive()
    assert me.start_ticks is not None
    assert not ProcessIdentity(os.getpid(), me.start_ticks + 1).alive()


def test_cli_hands_frontend_arguments_over_untouched(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []

    def fake_main(argv: list[str]) -> int:
        seen.append(argv)
        return 7

    monkeypatch.setitem(sys.modules, "frontend.node", types.SimpleNamespace(main=fake_main))
    assert cli.main(["frontend", "--node-id", "n1", "--listen", "127.0.0.1:1"]) == 7
    assert seen == [["--node-id", "n1", "--listen", "127.0.0.1:1"]]


NO_OTHER_LISTENERS = ("--tls-port", "0", "--ws-port", "0")
"""No TLS nor WebSocket listener: their default ports (8883, 8080) may be taken on the machine
(a compose stack beside the suite held 8883, and `dev up` refused that first)."""


def test_cli_errors_are_one_line_without_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HEADWATER_KAFKA_BOOTSTRAP", "bad")
    code = cli.main(["dev", "up", "--nodes", "0", "--port", str(free_port()), *NO_OTHER_LISTENERS,
                     "--state-dir", str(tmp_path)])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1
    assert err == "headwater: error: HEADWATER_KAFKA_BOOTSTRAP: expected host:port, got 'bad'\n"


def test_dev_up_refuses_a_replication_its_brokers_cannot_give(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HEADWATER_KAFKA_BOOTSTRAP", raising=False)
    code = cli.main(["dev", "up", "--nodes", "0", "--port", str(free_port()), *NO_OTHER_LISTENERS,
                     "--state-dir", str(tmp_path), "--kafka-brokers", "3",
                     "--min-insync-replicas", "4"])  # fmt: skip
    assert code == 1
    assert capsys.readouterr().err.startswith(
        "headwater: error: --min-insync-replicas: 4 in-sync replicas is more than the "
        "replication factor, 3"
    )
    assert not (tmp_path / "kafka").exists()  # refused before anything started


def test_dev_up_refuses_local_brokers_beside_an_external_kafka(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HEADWATER_KAFKA_BOOTSTRAP", "127.0.0.1:1")
    code = cli.main(["dev", "up", "--nodes", "0", "--port", str(free_port()), *NO_OTHER_LISTENERS,
                     "--state-dir", str(tmp_path), "--kafka-brokers", "3"])  # fmt: skip
    assert code == 1
    assert capsys.readouterr().err == (
        "headwater: error: --kafka-brokers / HEADWATER_KAFKA_BROKERS asks for local Kafka "
        "brokers, but HEADWATER_KAFKA_BOOTSTRAP names an external Kafka: unset one of them\n"
    )


def test_cli_prints_the_tooling_warnings(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HEADWATER_KAFKA_BOOTSTRAP", raising=False)
    assert cli.main(["topics", "create"]) == 1
    capsys.readouterr()
    logging.getLogger("headwater.kafka").warning("Kafka topic %s differs", "t")
    logging.getLogger("headwater.kafka.client").warning("librdkafka chatter")
    assert capsys.readouterr().err == "headwater: warning: Kafka topic t differs\n"


def test_dev_down_without_a_cluster_is_harmless(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["dev", "down", "--state-dir", str(tmp_path)]) == 0
    assert "no dev cluster recorded" in capsys.readouterr().out


def test_children_die_with_a_killed_parent(tmp_path: Path) -> None:
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from headwater.services.process import ChildProcess\n"
        "child = ChildProcess.spawn('sleeper', ['sleep', '300'], Path(sys.argv[1]))\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(300)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path / "log")], stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None
    orphan = ProcessIdentity.of(int(parent.stdout.readline()))
    assert orphan.alive()
    parent.kill()
    parent.wait()
    wait_until(lambda: not orphan.alive(), what="orphan to die", timeout=10)


class NeverWaitedOn(threading.Event):
    """The stop event, as `dev up`'s signal handler sets it: a `wait()` on it in the main thread
    could hold its lock when the handler's `set()` comes, and the process waits on itself."""

    def __init__(self, looks: int) -> None:
        super().__init__()
        self.looks = looks

    def is_set(self) -> bool:
        self.looks -= 1
        return self.looks < 0

    def wait(self, timeout: float | None = None) -> bool:
        raise AssertionError("the main thread waited on the event the signal handler sets")


def test_dev_up_watches_without_waiting_on_the_event_its_signal_handler_sets(
    tmp_path: Path,
) -> None:
    options = UpOptions(nodes=0, port=0, state_dir=tmp_path, partitions=1)
    cluster = DevCluster(options, {}, NeverWaitedOn(looks=3), io.StringIO())
    polled: list[int] = []
    cluster.supervisor.poll = lambda: polled.append(1)  # type: ignore[method-assign]
    cluster.watch()
    assert len(polled) == 3
