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

With `sasl_users`, a node also has a SASL_PLAINTEXT listener (mechanism PLAIN, those users and
passwords): a Kafka that requires authentication, as clients with `security.protocol`
SASL_PLAINTEXT and `sasl.*` settings reach it. The broker's own traffic stays on PLAINTEXT.

`python -m headwater.services.kafka --fetch` resolves Kafka's jars ahead of time (see
kafka_classpath), so that starting Kafka later needs no network. `--serve` runs one node in the
foreground in place of the Python process (a container's main process: docker/Dockerfile), its
broker listener bound to every address and advertised under `--advertised-host`, its data kept in
`--state-dir` across restarts.
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
from typing import NoReturn, Self

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
    """The listeners of a combined broker+controller node: PLAINTEXT for clients, CONTROLLER for
    the quorum, SASL_PLAINTEXT (0: none) for clients that authenticate. The client listeners
    are bound to `host` and advertised as `advertised`; the controller stays on loopback."""

    broker: int
    controller: int
    sasl: int = 0
    host: str = LOOPBACK
    advertised: str = LOOPBACK

    @classmethod
    def pick(cls, sasl: bool = False) -> KafkaPorts:
        return cls(broker=free_port(), controller=free_port(), sasl=free_port() if sasl else 0)

    @property
    def bootstrap(self) -> str:
        return f"{self.advertised}:{self.broker}"

    @property
    def sasl_bootstrap(self) -> str:
        return f"{self.advertised}:{self.sasl}"

    def listeners(self) -> dict[str, str]:
        """server.properties' listener settings for these ports."""
        client = {"PLAINTEXT": self.broker, **({"SASL_PLAINTEXT": self.sasl} if self.sasl else {})}
        bound = [f"{name}://{self.host}:{port}" for name, port in client.items()]
        advertised = [f"{name}://{self.advertised}:{port}" for name, port in client.items()]
        protocols = ["CONTROLLER", *client]
        return {
            "listeners": ",".join([*bound, f"CONTROLLER://{LOOPBACK}:{self.controller}"]),
            "advertised.listeners": ",".join(advertised),
            "listener.security.protocol.map": ",".join(
                f"{name}:{'PLAINTEXT' if name == 'CONTROLLER' else name}" for name in protocols
            ),
        }


def sasl_plain_settings(users: Mapping[str, str]) -> dict[str, str]:
    """The SASL_PLAINTEXT listener's PLAIN mechanism, knowing `users` (name: password)."""
    entries = " ".join(f'user_{name}="{password}"' for name, password in users.items())
    module = "org.apache.kafka.common.security.plain.PlainLoginModule"
    return {
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": f"{module} required {entries};",
    }


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


def render_server_properties(
    data_dir: Path, quorum: Quorum, node_id: int = 1, sasl_users: Mapping[str, str] | None = None
) -> str:
    """server.properties for node `node_id` of a KRaft cluster (`sasl_users`: those of its
    SASL_PLAINTEXT listener, if it has one).

    The broker-wide `min.insync.replicas` (which the offsets topic follows) stays Kafka's 1, so
    that a topic created with a replication factor of 1 on several brokers is still writable.
    """
    ports = quorum.nodes[node_id]
    internal = Replication.for_brokers(len(quorum.nodes))
    settings = {
        "process.roles": "broker,controller",
        "node.id": str(node_id),
        "controller.quorum.voters": quorum.voters,
        **ports.listeners(),
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
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
        # a node killed inside a relay's transaction holds back the read_committed readers of
        # the log until the broker aborts it: scan for timed-out ones every second, not 10 s
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
        "share.coordinator.state.topic.replication.factor": str(internal.factor),
        "share.coordinator.state.topic.min.isr": str(internal.min_insync),
    }
    if len(quorum.nodes) > 1:
        settings.update(FAILOVER_SETTINGS)
    if ports.sasl:
        settings.update(sasl_plain_settings(sasl_users or {}))
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
        sasl_users: Mapping[str, str] | None = None,
        log_file: Path | None = None,
    ) -> None:
        self.state_dir = state_dir.resolve()
        self.node_id = node_id
        self.name = name
        self.heap = heap
        self.cancel = cancel
        self.env = env
        self.sasl_users = sasl_users
        self.log_file = log_file
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
        return self.log_file or self.state_dir / "kafka.log"

    @property
    def ports(self) -> KafkaPorts | None:
        return None if self.quorum is None else self.quorum.nodes[self.node_id]

    @property
    def bootstrap(self) -> str:
        if self.ports is None:
            raise RuntimeError("LocalKafka is not started")
        return self.ports.bootstrap

    @property
    def sasl_bootstrap(self) -> str:
        """The SASL_PLAINTEXT listener's address (a node started with `sasl_users`)."""
        if self.ports is None or not self.ports.sasl:
            raise RuntimeError("LocalKafka is not started with a SASL listener")
        return self.ports.sasl_bootstrap

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
        self.child = ChildProcess.spawn(self.name, self.prepare(cluster_id), self.log_path)
        return self.child

    def prepare(self, cluster_id: str | None = None) -> list[str]:
        """Write the configuration, format storage if new, and return the JVM's command line."""
        java, classpath = self.preflight()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        if self.quorum is None:
            self.quorum = Quorum({self.node_id: KafkaPorts.pick(sasl=self.sasl_users is not None)})
        properties = self._write_configs(self.quorum)
        if not self.formatted:
            self._format(java, classpath, properties, cluster_id or new_cluster_id())
        argv = [java, f"-Xms{self.heap}", f"-Xmx{self.heap}", *JVM_OPTIONS, self._gc_log_option()]
        argv.append(self._log4j_option())
        return [*argv, "-cp", classpath, "kafka.Kafka", str(properties)]

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
        rendered = render_server_properties(self.data_dir, quorum, self.node_id, self.sasl_users)
        properties.write_text(rendered)
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


def serve(state_dir: Path, port: int, advertised_host: str, heap: str = SINGLE_HEAP) -> NoReturn:
    """Run one node in the foreground: the JVM replaces this process (its signals, its exit
    status), logging to stdout; PLAINTEXT on `port` of every address, advertised as
    `advertised_host`, the controller on loopback `port + 1`."""
    ports = KafkaPorts(port, port + 1, host="0.0.0.0", advertised=advertised_host)
    node = LocalKafka(state_dir, heap=heap, log_file=Path("/dev/stdout"))
    node.quorum = Quorum({node.node_id: ports})
    argv = node.prepare()
    os.execv(argv[0], argv)


def main(argv: list[str] | None = None) -> int:
    """`--fetch`: resolve Kafka's jars into the cache and print where they are; `--serve`:
    run one node in the foreground (see `serve`)."""
    parser = argparse.ArgumentParser(prog="python -m headwater.services.kafka")
    parser.add_argument("--fetch", action="store_true", help="resolve Kafka's jars (uses mvn)")
    parser.add_argument("--serve", action="store_true", help="run one node in the foreground")
    parser.add_argument("--state-dir", type=Path, default=Path("kafka-data"), help="for --serve")
    parser.add_argument("--port", type=int, default=9092, help="for --serve (default 9092)")
    parser.add_argument("--advertised-host", default=LOOPBACK, help="for --serve")
    parser.add_argument("--heap", default=SINGLE_HEAP, help=f"for --serve (default {SINGLE_HEAP})")
    args = parser.parse_args(argv)
    if not (args.fetch or args.serve):
        parser.print_help()
        return 2
    try:
        if args.serve:
            serve(args.state_dir, args.port, args.advertised_host, args.heap)
        print(kafka_classpath.fetch())
    except HeadwaterError as exc:
        print(f"headwater: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
