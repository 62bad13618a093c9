"""A local, Docker-free Kafka: one KRaft node that is both broker and controller.

`LocalKafka(state_dir)` keeps everything under `state_dir`: the generated `server.properties` and
`log4j2.properties`, the data in `data/`, the JVM's log in `kafka.log` (log4j2 and the
JVM's own output both append there) and its garbage collections in `gc.log`. On first start the data
directory is formatted with a new cluster id (kafka.tools.StorageTool); later starts reuse it. Both
listeners (PLAINTEXT for clients, CONTROLLER for the Raft quorum) get fresh loopback ports on every
start, which a static single-voter quorum tolerates. Kafka is ready once an AdminClient gets
metadata naming the broker; `stop()` sends SIGTERM (a controlled shutdown, about 2 s) and SIGKILL
after a grace period.

`python -m headwater.services.kafka --fetch` resolves Kafka's jars ahead of time (see
kafka_classpath), so that starting Kafka later needs no network.
"""

from __future__ import annotations

import argparse
import base64
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from headwater.errors import HeadwaterError, ServiceError
from headwater.services import kafka_classpath
from headwater.services.java import require_java
from headwater.services.kafka_admin import wait_until_ready
from headwater.services.ports import LOOPBACK, free_port
from headwater.services.process import ChildProcess, LocalService

JVM_OPTIONS = (
    # ZGC: pauses under a millisecond. With G1 (MaxGCPauseMillis=20, as Kafka's scripts run it)
    # young pauses of 20 to 180 ms every few seconds were measured on a 2-core machine at only
    # 1,000 produce requests/s, and they were the whole p99 of the log's round trip
    # (docs/design.md, 4.1).
    "-XX:+UseZGC",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
)
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


def render_server_properties(data_dir: Path, ports: KafkaPorts, node_id: int = 1) -> str:
    """server.properties for a single-node KRaft cluster on loopback."""
    settings = {
        "process.roles": "broker,controller",
        "node.id": str(node_id),
        "controller.quorum.voters": f"{node_id}@{LOOPBACK}:{ports.controller}",
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
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "8",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "4",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
    }
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
        heap: str = "1g",
        cancel: threading.Event | None = None,
        env: Mapping[str, str] = os.environ,
    ) -> None:
        self.state_dir = state_dir.resolve()
        self.heap = heap
        self.cancel = cancel
        self.env = env
        self.ports: KafkaPorts | None = None
        self.child: ChildProcess | None = None

    @property
    def data_dir(self) -> Path:
        return self.state_dir / "data"

    @property
    def log_path(self) -> Path:
        return self.state_dir / "kafka.log"

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

    def launch(self) -> ChildProcess:
        """Format storage if new, then spawn the JVM without waiting for it."""
        java, classpath = self.preflight()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.ports = KafkaPorts.pick()
        properties = self._write_configs(self.ports)
        if not (self.data_dir / "meta.properties").is_file():
            self._format(java, classpath, properties)
        argv = [java, f"-Xms{self.heap}", f"-Xmx{self.heap}", *JVM_OPTIONS, self._gc_log_option()]
        argv.append(self._log4j_option())
        argv += ["-cp", classpath, "kafka.Kafka", str(properties)]
        self.child = ChildProcess.spawn("kafka", argv, self.log_path)
        return self.child

    def wait_ready(self, timeout: float = 90.0) -> str:
        """Wait until the launched Kafka answers; stop it if it does not."""
        return self._ready_or_stop(
            lambda: wait_until_ready(self.bootstrap, timeout, child=self.child, cancel=self.cancel),
            self.bootstrap,
        )

    def _gc_log_option(self) -> str:
        """GC events to `gc.log` beside `kafka.log`, as Kafka's own scripts keep them."""
        gc_log = self.state_dir / "gc.log"
        return f"-Xlog:gc:file={gc_log}:time,uptime,level,tags:filecount=2,filesize=10M"

    def _log4j_option(self) -> str:
        return f"-Dlog4j2.configurationFile={self.state_dir / 'log4j2.properties'}"

    def _write_configs(self, ports: KafkaPorts) -> Path:
        (self.state_dir / "log4j2.properties").write_text(render_log4j2(self.log_path))
        properties = self.state_dir / "server.properties"
        properties.write_text(render_server_properties(self.data_dir, ports))
        return properties

    def _format(self, java: str, classpath: str, properties: Path) -> None:
        argv = [java, *TOOL_JVM_OPTIONS, self._log4j_option()]
        argv += ["-cp", classpath, "kafka.tools.StorageTool"]
        argv += ["format", f"--cluster-id={new_cluster_id()}", "--config", str(properties)]
        result = subprocess.run(argv, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            output = (result.stdout + result.stderr).strip()
            raise ServiceError(f"formatting Kafka storage in {self.data_dir} failed:\n{output}")


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
