"""A local, Docker-free Kafka: KRaft nodes that are each both broker and controller.

`LocalKafka(state_dir)` is one node and keeps everything under `state_dir`: the generated
`server.properties` and `log4j2.properties`, the data in `data/`, the JVM's log in `kafka.log`
(log4j2 and the JVM's own output both append there) and its garbage collections in `gc.log`. On
first start the data directory is formatted (kafka.tools.StorageTool); later starts reuse it.
Kafka is ready once an AdminClient gets metadata naming the broker; `stop()` sends SIGTERM (a
controlled shutdown, about 2 s) and SIGKILL after a grace period, `kill()` SIGKILL at once.

`LocalKafkaCluster(state_dir, brokers)` is N such nodes forming one static quorum of N voters,
formatted with one cluster id: the node itself lives in `state_dir` when N is 1, else node i in
`state_dir/broker<i>`. Kafka's internal topics (offsets, transactions, share groups) get
`Replication.for_brokers(N)`: three copies, two in sync, on three brokers.

Every node's listeners (PLAINTEXT for clients, CONTROLLER for the quorum) get fresh loopback ports
on the first start of the object and keep them on a restart, as a restarted broker keeps its
address; a static quorum tolerates new ports as long as every voter is told the same ones.

`python -m headwater.services.kafka --fetch` resolves Kafka's jars ahead of time (see
kafka_classpath), so that starting Kafka later needs no network.
"""

from __future__ import annotations

import argparse
import base64
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from headwater.errors import HeadwaterError, ServiceError, SettingError
from headwater.services import kafka_classpath
from headwater.services.java import require_java
from headwater.services.kafka_admin import answers, wait_until_ready
from headwater.services.ports import LOOPBACK, free_port
from headwater.services.process import ChildProcess, LocalService, signal_group
from headwater.services.readiness import wait_until
from router.topics import Replication

JVM_OPTIONS = (
    # ZGC: pauses under a millisecond. With G1 (MaxGCPauseMillis=20, as Kafka's scripts run it)
    # young pauses of 20 to 180 ms every few seconds were measured on a 2-core machine at only
    # 1,000 produce requests/s, and they were the whole p99 of the log's round trip
    # (docs/design.md, 4.1).
    "-XX:+UseZGC",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
)
SINGLE_HEAP = "1g"
CLUSTER_HEAP = "512m"  # per node: three of them fit beside the rest of a dev cluster
# The storage formatter runs for a second: start it as cheaply as the JVM allows.
TOOL_JVM_OPTIONS = ("-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")


@dataclass(frozen=True, slots=True)
class KafkaPorts:
    """The two loopback listeners of a combined broker+controller node."""

    broker: int
    controller: int

    @classmethod
    def pick(cls) -> KafkaPorts:
        return cls(broker=free_port(), controller=free_port())

    @property
    def bootstrap(self) -> str:
        return f"{LOOPBACK}:{self.broker}"


@dataclass(frozen=True, slots=True)
class Quorum:
    """The listeners of every node of a cluster whose nodes are all voters, by node id."""

    nodes: Mapping[int, KafkaPorts]

    @classmethod
    def pick(cls, node_ids: Iterable[int]) -> Quorum:
        return cls({node_id: KafkaPorts.pick() for node_id in node_ids})

    @property
    def voters(self) -> str:
        """`controller.quorum.voters`: id@host:port of every node."""
        return ",".join(f"{i}@{LOOPBACK}:{ports.controller}" for i, ports in self.nodes.items())

    @property
    def bootstrap(self) -> str:
        return ",".join(ports.bootstrap for ports in self.nodes.values())


# With several nodes a dead one is fenced, and its partitions get new leaders, after 3 s without a
# heartbeat instead of Kafka's 9 s: on loopback a live broker is never that late.
FAILOVER_SETTINGS = {
    "broker.heartbeat.interval.ms": "500",
    "broker.session.timeout.ms": "3000",
}


def render_server_properties(data_dir: Path, quorum: Quorum, node_id: int = 1) -> str:
    """server.properties for node `node_id` of a KRaft cluster on loopback.

    The broker-wide `min.insync.replicas` (which the offsets topic follows) stays Kafka's 1, so
    that a topic created with a replication factor of 1 on several brokers is still writable.
    """
    ports = quorum.nodes[node_id]
    internal = Replication.for_brokers(len(quorum.nodes))
    settings = {
        "process.roles": "broker,controller",
        "node.id": str(node_id),
        "controller.quorum.voters": quorum.voters,
        "listeners": f"PLAINTEXT://{LOOPBACK}:{ports.broker},CONTROLLER://{LOOPBACK}:{ports.controller}",
        "advertised.listeners": f"PLAINTEXT://{LOOPBACK}:{ports.broker}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(data_dir),
        "num.partitions": "1",
        "num.network.threads": "2",
        "num.io.threads": "4",
        "auto.create.topics.enable": "false",
        "group.initial.rebalance.delay.ms": "0",
        "offsets.topic.replication.factor": str(internal.factor),
        "offsets.topic.num.partitions": "8",
        "transaction.state.log.replication.factor": str(internal.factor),
        "transaction.state.log.min.isr": str(internal.min_insync),
        "transaction.state.log.num.partitions": "4",
        "share.coordinator.state.topic.replication.factor": str(internal.factor),
        "share.coordinator.state.topic.min.isr": str(internal.min_insync),
    }
    if len(quorum.nodes) > 1:
        settings.update(FAILOVER_SETTINGS)
    return "".join(f"{key}={value}\n" for key, value in settings.items())


def render_log4j2(log_file: Path) -> str:
    """A quiet log4j2 configuration: warnings, plus Kafka's own start/stop lines, to one file."""
    return f"""\
status = warn
shutdownHook = disable
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = {log_file}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.file.ref = FILE
logger.raft.name = kafka.server.KafkaRaftServer
logger.raft.level = INFO
logger.broker.name = kafka.server.BrokerServer
logger.broker.level = INFO
"""


def new_cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes, URL-safe base64 without padding (as Uuid.toString).

    Like Kafka's Uuid.randomUuid, an id starting with "-" is drawn again: the storage tool
    (and any command line) would read it as an option.
    """
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


class LocalKafka(LocalService):
    """One Kafka JVM under `state_dir`, started by `start()` and gone after `stop()`."""

    STOP_TIMEOUT = 30.0  # a controlled shutdown takes a while

    def __init__(
        self,
        state_dir: Path,
        *,
        node_id: int = 1,
        name: str = "kafka",
        heap: str = SINGLE_HEAP,
        cancel: threading.Event | None = None,
        env: Mapping[str, str] = os.environ,
    ) -> None:
        self.state_dir = state_dir.resolve()
        self.node_id = node_id
        self.name = name
        self.heap = heap
        self.cancel = cancel
        self.env = env
        self.quorum: Quorum | None = None
        self.child: ChildProcess | None = None

    @property
    def data_dir(self) -> Path:
        return self.state_dir / "data"

    @property
    def formatted(self) -> bool:
        return (self.data_dir / "meta.properties").is_file()

    @property
    def log_path(self) -> Path:
        return self.state_dir / "kafka.log"

    @property
    def ports(self) -> KafkaPorts | None:
        return None if self.quorum is None else self.quorum.nodes[self.node_id]

    @property
    def bootstrap(self) -> str:
        if self.ports is None:
            raise RuntimeError("LocalKafka is not started")
        return self.ports.bootstrap

    def preflight(self) -> tuple[str, str]:
        """Java and the classpath, checked before anything is started."""
        return require_java(self.env), kafka_classpath.classpath(self.env)

    def start(self, timeout: float = 90.0) -> str:
        """Start Kafka and return its bootstrap address once it answers."""
        self.launch()
        return self.wait_ready(timeout)

    def launch(self, cluster_id: str | None = None) -> ChildProcess:
        """Format storage if new (with `cluster_id`, else a new id), then spawn the JVM without
        waiting for it. A node alone is a quorum of one."""
        java, classpath = self.preflight()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        if self.quorum is None:
            self.quorum = Quorum.pick([self.node_id])
        properties = self._write_configs(self.quorum)
        if not self.formatted:
            self._format(java, classpath, properties, cluster_id or new_cluster_id())
        argv = [java, f"-Xms{self.heap}", f"-Xmx{self.heap}", *JVM_OPTIONS, self._gc_log_option()]
        argv.append(self._log4j_option())
        argv += ["-cp", classpath, "kafka.Kafka", str(properties)]
        self.child = ChildProcess.spawn(self.name, argv, self.log_path)
        return self.child

    def wait_ready(self, timeout: float = 90.0) -> str:
        """Wait until the launched Kafka answers; stop it if it does not."""
        return self._ready_or_stop(
            lambda: wait_until_ready(self.bootstrap, timeout, child=self.child, cancel=self.cancel),
            self.bootstrap,
        )

    def kill(self) -> None:
        """SIGKILL the JVM, as a crash would; `launch()` brings it back on the same ports."""
        if self.child is not None:
            signal_group(self.child.pid, signal.SIGKILL)
            self.stop()

    def cluster_id(self) -> str | None:
        """The cluster id the data directory was formatted with, or None if it is not."""
        if not self.formatted:
            return None
        for line in (self.data_dir / "meta.properties").read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "cluster.id":
                return value.strip()
        return None

    def _gc_log_option(self) -> str:
        """GC events to `gc.log` beside `kafka.log`, as Kafka's own scripts keep them."""
        gc_log = self.state_dir / "gc.log"
        return f"-Xlog:gc:file={gc_log}:time,uptime,level,tags:filecount=2,filesize=10M"

    def _log4j_option(self) -> str:
        return f"-Dlog4j2.configurationFile={self.state_dir / 'log4j2.properties'}"

    def _write_configs(self, quorum: Quorum) -> Path:
        (self.state_dir / "log4j2.properties").write_text(render_log4j2(self.log_path))
        properties = self.state_dir / "server.properties"
        properties.write_text(render_server_properties(self.data_dir, quorum, self.node_id))
        return properties

    def _format(self, java: str, classpath: str, properties: Path, cluster_id: str) -> None:
        argv = [java, *TOOL_JVM_OPTIONS, self._log4j_option()]
        argv += ["-cp", classpath, "kafka.tools.StorageTool"]
        argv += ["format", f"--cluster-id={cluster_id}", "--config", str(properties)]
        result = subprocess.run(argv, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            output = (result.stdout + result.stderr).strip()
            raise ServiceError(f"formatting Kafka storage in {self.data_dir} failed:\n{output}")


class LocalKafkaCluster:
    """`brokers` LocalKafka nodes in one quorum under `state_dir`, started and stopped together.

    Usable as a context manager that starts and stops it.
    """

    def __init__(
        self,
        state_dir: Path,
        brokers: int,
        *,
        heap: str | None = None,
        cancel: threading.Event | None = None,
        env: Mapping[str, str] = os.environ,
    ) -> None:
        self.state_dir = state_dir.resolve()
        self.cancel = cancel
        self.quorum: Quorum | None = None
        heap = heap or (SINGLE_HEAP if brokers == 1 else CLUSTER_HEAP)
        self.nodes = [
            LocalKafka(directory, node_id=i, name=name, heap=heap, cancel=cancel, env=env)
            for i, (directory, name) in enumerate(self._layout(brokers), start=1)
        ]

    def _layout(self, brokers: int) -> list[tuple[Path, str]]:
        """Each node's directory and process name."""
        if brokers == 1:
            return [(self.state_dir, "kafka")]
        return [(self.state_dir / f"broker{i}", f"kafka{i}") for i in range(1, brokers + 1)]

    @property
    def bootstrap(self) -> str:
        """Every broker's address, comma-separated."""
        if self.quorum is None:
            raise RuntimeError("LocalKafkaCluster is not started")
        return self.quorum.bootstrap

    def node(self, node_id: int) -> LocalKafka:
        return self.nodes[node_id - 1]

    def preflight(self, setting: str = "the broker count") -> None:
        """Java and the classpath, and `check_layout`."""
        self.nodes[0].preflight()
        self.check_layout(setting)

    def check_layout(self, setting: str = "the broker count") -> None:
        """Refuse Kafka data in `state_dir` left by a cluster of another size, naming `setting`."""
        ours = {node.state_dir for node in self.nodes}
        on_disk = [self.state_dir, *sorted(self.state_dir.glob("broker*"))]
        formatted = [d for d in on_disk if (d / "data" / "meta.properties").is_file()]
        if any(directory not in ours for directory in formatted):
            found = 1 if self.state_dir in formatted else len(formatted)
            raise SettingError(
                f"the Kafka data in {self.state_dir} is for {found} broker(s), not "
                f"{len(self.nodes)} (setting {setting}): ask for {found} or remove the directory"
            )

    def start(self, timeout: float = 120.0) -> str:
        """Start every node and return the bootstrap list once all of them are brokers."""
        self.launch()
        return self.wait_ready(timeout)

    def launch(self) -> list[ChildProcess]:
        """Format the nodes that are new, with the cluster's id, then spawn every JVM without
        waiting for any (the quorum needs a majority of them to elect a leader)."""
        if self.quorum is None:
            self.quorum = Quorum.pick(node.node_id for node in self.nodes)
        formatted_with = (node.cluster_id() for node in self.nodes)
        cluster_id = next(filter(None, formatted_with), None) or new_cluster_id()
        for node in self.nodes:
            node.quorum = self.quorum
        return [node.launch(cluster_id) for node in self.nodes]

    def wait_ready(self, timeout: float = 120.0) -> str:
        """Wait until every node is a live broker; stop them all if one exits or time runs out."""
        try:
            wait_until(
                self._all_up,
                what=f"Kafka cluster at {self.bootstrap} (logs under {self.state_dir})",
                timeout=timeout,
                cancel=self.cancel,
                interval=0.2,
            )
        except BaseException:
            self.stop()
            raise
        return self.bootstrap

    def _all_up(self) -> bool:
        for node in self.nodes:
            if node.child is None:
                raise ServiceError(f"Kafka node {node.node_id} is not running")
            if node.child.poll() is not None:
                raise ServiceError(node.child.describe_exit())
        return answers(self.bootstrap, brokers=len(self.nodes))

    def stop(self) -> None:
        """Stop every node at once: stopped one after another, the last ones would wait for a
        quorum that is already gone."""
        threads = [threading.Thread(target=node.stop) for node in self.nodes]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    """`--fetch`: resolve Kafka's jars into the cache and print where they are."""
    parser = argparse.ArgumentParser(prog="python -m headwater.services.kafka")
    parser.add_argument("--fetch", action="store_true", help="resolve Kafka's jars (uses mvn)")
    args = parser.parse_args(argv)
    if not args.fetch:
        parser.print_help()
        return 2
    try:
        print(kafka_classpath.fetch())
    except HeadwaterError as exc:
        print(f"headwater: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
