"""The brokers under test, started as child processes on fresh loopback ports, always stopped.

Each broker is one or more :class:`headwater.services.process.ChildProcess` children: leaders of
their own process groups (a terminal's Ctrl-C reaches only the benchmark, which then stops them),
output appended to a log file under the run's work directory.  Every child is registered on the
caller's ``ExitStack`` *before* it is waited on, so an exception, Ctrl-C or SIGTERM at any point
stops whatever was started: nothing outlives the run.

* Headwater: ``python -m frontend`` per node (optionally under :mod:`bench.profile_node`), on a
  Kafka that is either started here (:class:`headwater.services.kafka.LocalKafka` in the work
  directory) or given with ``--kafka-bootstrap``; the benchmark's log topics are created per run
  and deleted again on an external Kafka.
* mosquitto: Debian's ``mosquitto`` with a generated config (anonymous, no persistence, 32
  messages in flight per client as Headwater's default).
* amqtt 0.12: its ``amqtt`` broker script with a generated YAML config: one TCP listener and the
  anonymous-auth plugin only (the default config's packet/event loggers and $SYS plugin are off).

Every broker runs with its out-of-the-box limits otherwise (a queue of 1000 per client for mosquitto
and Headwater alike; amqtt bounds neither in-flight messages nor the queue).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from frontend.config import build_parser as node_parser
from headwater.services.kafka import LocalKafka
from headwater.services.kafka_admin import admin_client, ensure_topic
from headwater.services.kafka_classpath import KAFKA_VERSION
from headwater.services.ports import LOOPBACK, free_port, port_accepts
from headwater.services.process import ChildProcess, find_program
from headwater.services.readiness import wait_until
from mqttcore.codec import Decoder, encode
from mqttcore.packets import Connack, Connect, Disconnect

Endpoint = tuple[str, int]

START_TIMEOUT = 60.0
STOP_TIMEOUT = 15.0
KAFKA_WARMUP = 20.0
"""Seconds of untimed traffic through a Kafka the benchmark started, before any scenario."""


@dataclass(slots=True)
class RunningBroker:
    """A broker that accepts MQTT connections on ``endpoints`` (one per node)."""

    name: str
    label: str
    endpoints: list[Endpoint]
    processes: list[ChildProcess]
    """The broker's own processes, whose CPU use is measured (Kafka is not among them)."""
    kafka: ChildProcess | None = None
    topic: str | None = None
    partitions: int = 0
    stats_ports: list[int] = field(default_factory=list)
    """Headwater nodes' ``GET /stats`` ports, when the nodes have the endpoint."""
    profiles: list[NodeProfile] = field(default_factory=list)
    """Nodes run under :mod:`bench.profile_node`."""
    extra_pids: list[list[int]] = field(default_factory=list)
    """Per process: its children that serve too (a node's ``--workers``); their CPU is summed
    into that process's."""

    @property
    def pids(self) -> list[int]:
        """Every process of the broker: the children, then their extra processes."""
        return [p.pid for p in self.processes] + [pid for pids in self.extra_pids for pid in pids]

    def cpu_per_node(self, used: list[float]) -> list[float]:
        """``used`` (in the order of :attr:`pids`) summed per node."""
        nodes = list(used[: len(self.processes)])
        rest = used[len(self.processes) :]
        for k, pids in enumerate(self.extra_pids):
            nodes[k] += sum(rest[: len(pids)])
            rest = rest[len(pids) :]
        return nodes


@dataclass(frozen=True, slots=True)
class NodeProfile:
    """A node under :mod:`bench.profile_node`: SIGUSR2 makes it write its profile to ``out``."""

    pid: int
    out: Path

    def request(self) -> float:
        """Ask for the profile of the window that ends now; returns the time asked."""
        asked = time.time()
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGUSR2)
        return asked

    def keep(self, asked: float, name: str, timeout: float = 10.0) -> Path | None:
        """Once the profile asked for at ``asked`` is written, copy it (and its text summary)
        to ``name`` beside it."""
        summary = self.out.with_suffix(self.out.suffix + ".txt")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if summary.exists() and summary.stat().st_mtime >= asked:
                target = self.out.with_name(name)
                shutil.copyfile(self.out, target)
                shutil.copyfile(summary, target.with_suffix(target.suffix + ".txt"))
                return target
            time.sleep(0.1)
        return None


Login = tuple[str, str]
"""A user name and password, for a broker that refuses anonymous clients."""


def connack_probe(port: int, timeout: float = 3.0, login: Login | None = None) -> bool:
    """True if an MQTT CONNECT on ``port`` (as ``login``'s user, if given) is answered with
    CONNACK 0 (a listening port alone does not show that the broker serves MQTT)."""
    decoder = Decoder()
    user, password = login if login is not None else (None, None)
    connect = Connect(
        f"bench-probe-{uuid.uuid4().hex[:8]}",
        username=user,
        password=password.encode() if password is not None else None,
    )
    try:
        with socket.create_connection((LOOPBACK, port), timeout=timeout) as sock:
            sock.sendall(encode(connect))
            while True:
                chunk = sock.recv(4096)
                if not chunk:
                    return False
                packets = decoder.feed(chunk)
                if packets:
                    ok = isinstance(packets[0], Connack) and packets[0].return_code == 0
                    if ok:
                        sock.sendall(encode(Disconnect()))
                    return ok
    except OSError:
        return False


def wait_serving(
    child: ChildProcess, port: int, timeout: float, login: Login | None = None
) -> None:
    wait_until(
        lambda: port_accepts(port),
        what=f"{child.name} on {LOOPBACK}:{port}",
        timeout=timeout,
        child=child,
        interval=0.1,
    )
    if not connack_probe(port, login=login):
        raise NotServing(
            f"{child.name} on {LOOPBACK}:{port} accepts TCP but answers no CONNACK "
            f"(log: {child.log_path}); last lines:\n{child.log_tail()}"
        )


class NotServing(RuntimeError):
    """A broker listens but does not complete an MQTT handshake."""


def _spawn(
    stack: ExitStack, name: str, argv: list[str], log: Path, port: int, timeout: float
) -> ChildProcess:
    child = ChildProcess.spawn(name, argv, log)
    stack.callback(child.stop, STOP_TIMEOUT)
    wait_serving(child, port, timeout)
    return child


# -- mosquitto --------------------------------------------------------------------------------


def mosquitto_version() -> str:
    program = find_program("mosquitto")
    if program is None:
        return "not installed"
    result = subprocess.run([program, "-h"], capture_output=True, text=True, check=False)
    first = (result.stdout or result.stderr).splitlines()[:1]
    return first[0].replace("mosquitto version ", "") if first else "?"


def render_mosquitto_conf(port: int) -> str:
    return "\n".join(
        [
            f"listener {port} {LOOPBACK}",
            "allow_anonymous true",
            "persistence false",
            # Headwater's default in-flight window (EMQX's); mosquitto's own is 20
            "max_inflight_messages 32",
            "log_dest stderr",
            "log_type error",
            "log_type warning",
            "",
        ]
    )


def start_mosquitto(work: Path, stack: ExitStack, extra: Sequence[str] = ()) -> RunningBroker:
    """mosquitto with the generated config, plus the config lines ``extra``."""
    program = find_program("mosquitto")
    if program is None:
        raise RuntimeError("mosquitto is not installed (apt-get install mosquitto)")
    port = free_port()
    conf = work / "mosquitto.conf"
    conf.write_text(render_mosquitto_conf(port) + "".join(f"{line}\n" for line in extra))
    child = _spawn(stack, "mosquitto", [program, "-c", str(conf)], work / "mosquitto.log", port, 15)
    return RunningBroker(
        "mosquitto", f"mosquitto {mosquitto_version()}", [(LOOPBACK, port)], [child]
    )


# -- amqtt ------------------------------------------------------------------------------------


def amqtt_version() -> str:
    try:
        import amqtt
    except ImportError:
        return "not installed"
    return str(amqtt.__version__)


def render_amqtt_conf(port: int) -> str:
    return "\n".join(
        [
            "listeners:",
            "  default:",
            "    type: tcp",
            f"    bind: {LOOPBACK}:{port}",
            "plugins:",
            "  amqtt.plugins.authentication.AnonymousAuthPlugin:",
            "    allow_anonymous: true",
            "",
        ]
    )


def start_amqtt(work: Path, stack: ExitStack) -> RunningBroker:
    script = Path(sys.executable).with_name("amqtt")
    if not script.exists():
        raise RuntimeError(f"amqtt is not installed next to {sys.executable}")
    port = free_port()
    conf = work / "amqtt.yaml"
    conf.write_text(render_amqtt_conf(port))
    child = _spawn(stack, "amqtt", [str(script), "-c", str(conf)], work / "amqtt.log", port, 30)
    return RunningBroker("amqtt", f"amqtt {amqtt_version()}", [(LOOPBACK, port)], [child])


# -- Kafka and Headwater ----------------------------------------------------------------------


class BenchKafka:
    """The Kafka the Headwater nodes log to: a local one started here, or an external one."""

    def __init__(self, work: Path, stack: ExitStack, bootstrap: str | None) -> None:
        self.external = bootstrap is not None
        self._stack = stack
        self._topics: list[str] = []
        self.local: LocalKafka | None = None
        if bootstrap is None:
            self.local = LocalKafka(work / "kafka")
            stack.callback(self.local.stop)
            bootstrap = self.local.start()
        else:
            stack.callback(self._delete_topics)
        self.bootstrap = bootstrap

    @property
    def version(self) -> str:
        if self.local is not None:
            return f"{KAFKA_VERSION} (started by the benchmark, KRaft, 1 node)"
        return f"external at {self.bootstrap}"

    @property
    def child(self) -> ChildProcess | None:
        return self.local.child if self.local is not None else None

    def create_topic(self, name: str, partitions: int) -> str:
        ensure_topic(self.bootstrap, name, partitions, {})
        self._topics.append(name)
        return name

    def warm_up(self, seconds: float = KAFKA_WARMUP) -> int:
        """Carry small records through Kafka for ``seconds``, produced one request at a time as
        the nodes do and read back, and return how many were read.

        A fresh JVM runs Kafka's produce and fetch paths interpreted until the JIT has compiled
        them: without this, whichever scenario runs first measures the JIT."""
        topic = self.create_topic(f"bench.warmup.{uuid.uuid4().hex[:6]}", 1)
        common = {"bootstrap.servers": self.bootstrap, "socket.nagle.disable": True}
        producer = Producer({**common, "acks": "all", "enable.idempotence": True, "linger.ms": 0})
        consumer = Consumer({**common, "group.id": "bench-warmup", "enable.auto.commit": False})
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        read, value, end = 0, bytes(64), time.monotonic() + seconds
        try:
            while time.monotonic() < end:
                with contextlib.suppress(BufferError):
                    for _ in range(50):
                        producer.produce(topic, value)
                producer.poll(0)
                read += sum(m.error() is None for m in consumer.consume(1000, 0.001))
            producer.flush(10)
        finally:
            consumer.close()
        return read

    def _delete_topics(self) -> None:
        if not self._topics:
            return
        admin = admin_client(self.bootstrap)  # kept alive until the deletions are done
        futures = admin.delete_topics(self._topics, operation_timeout=30)
        for name, future in futures.items():
            try:
                future.result()
            except Exception as exc:  # a leftover topic is worth a line, not a failed run
                print(f"bench: could not delete Kafka topic {name}: {exc}", file=sys.stderr)


def node_has_stats(source: Path | None) -> bool:
    """Whether ``python -m frontend`` (of ``source``) takes ``--stats-listen`` (``GET /stats``)."""
    if source is None:
        return any("--stats-listen" in a.option_strings for a in node_parser()._actions)
    where = ("config.py", "server.py")  # the flags moved from server.py to config.py
    found = [source / "frontend" / name for name in where if (source / "frontend" / name).exists()]
    return any("--stats-listen" in path.read_text() for path in found)


def node_stats(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{LOOPBACK}:{port}/stats", timeout=10) as answer:
        stats: dict[str, Any] = json.loads(answer.read())
        return stats


REPO = Path(__file__).resolve().parent.parent


def git(*args: str, cwd: Path = REPO) -> str:
    result = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout.strip()


def describe_checkout() -> str:
    """The commit of this checkout, and whether the node's code differs from it."""
    try:
        commit = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--", "frontend", "router", "headwater", "schemas")
    except (RuntimeError, OSError):
        return "this checkout (not a git repository)"
    return f"this checkout at {commit}" + (" with uncommitted changes" if dirty else "")


def snapshot_source(rev: str, work: Path) -> tuple[Path, str]:
    """Extract commit ``rev`` into the work directory (``git archive``; the repository is not
    touched), so the nodes run one fixed version while the checkout changes."""
    commit = git("rev-parse", "--verify", f"{rev}^{{commit}}")
    target = work / f"headwater-{commit[:10]}"
    if not target.exists():
        target.mkdir(parents=True)
        archive = subprocess.Popen(["git", "archive", commit], cwd=REPO, stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", str(target)], stdin=archive.stdout, check=True)
        if archive.wait() != 0:
            raise RuntimeError(f"git archive {commit} failed")
    return target, f"commit {commit[:10]} (`--headwater-rev {rev}`)"


@dataclass(frozen=True, slots=True)
class NodeLaunch:
    """How nodes are launched: from this checkout or a snapshot, plainly or under a profiler,
    with or without a stats port."""

    profile: Path | None = None
    stats: bool = False
    source: Path | None = None
    """A source tree to run ``frontend`` from instead of this checkout."""
    profiler: str = "auto"

    def env(self) -> dict[str, str] | None:
        if self.source is None:
            return None
        # The snapshot first; this checkout after it, for bench.profile_node.
        return {**os.environ, "PYTHONPATH": f"{self.source}{os.pathsep}{REPO}"}

    def argv(
        self, node_id: str, port: int, stats_port: int, bootstrap: str, topic: str, partitions: int
    ) -> list[str]:
        args = [
            "--node-id", node_id,
            "--listen", f"{LOOPBACK}:{port}",
            "--kafka-bootstrap", bootstrap,
            "--topic", topic,
            "--partitions", str(partitions),
            "--log-level", "WARNING",
        ]  # fmt: skip
        if self.stats:
            args += ["--stats-listen", f"{LOOPBACK}:{stats_port}"]
        if self.profile is None:
            return [sys.executable, "-m", "frontend", *args]
        out = self.profile_path(topic, node_id)
        profiler = ["--profiler", self.profiler]
        return [
            sys.executable,
            "-m",
            "bench.profile_node",
            "--out",
            str(out),
            *profiler,
            "--",
            *args,
        ]

    def profile_path(self, topic: str, node_id: str) -> Path:
        assert self.profile is not None
        return self.profile / f"{topic}.{node_id}.prof"


def start_headwater(
    kafka: BenchKafka,
    topic: str,
    partitions: int,
    nodes: int,
    work: Path,
    stack: ExitStack,
    launch: NodeLaunch,
    extra: Sequence[str] = (),
    login: Login | None = None,
) -> RunningBroker:
    """``nodes`` front-end nodes on one log topic, each given the flags ``extra`` and waited on
    with a CONNECT as ``login`` (if given); all are started before any is waited on."""
    children: list[ChildProcess] = []
    ports: list[int] = []
    stats_ports: list[int] = []
    for i in range(1, nodes + 1):
        port, stats_port = free_port(), free_port()
        argv = launch.argv(f"n{i}", port, stats_port, kafka.bootstrap, topic, partitions)
        argv += extra
        child = ChildProcess.spawn(
            f"headwater-n{i}", argv, work / f"{topic}.n{i}.log", env=launch.env(), cwd=launch.source
        )
        stack.callback(child.stop, STOP_TIMEOUT)
        children.append(child)
        ports.append(port)
        stats_ports.append(stats_port)
    for child, port in zip(children, ports, strict=True):
        wait_serving(child, port, START_TIMEOUT, login)
    label = f"Headwater ({nodes} node{'s' if nodes > 1 else ''})"
    return RunningBroker(
        "headwater",
        label,
        [(LOOPBACK, p) for p in ports],
        children,
        kafka=kafka.child,
        topic=topic,
        partitions=partitions,
        stats_ports=stats_ports if launch.stats else [],
        profiles=[
            NodeProfile(c.pid, launch.profile_path(topic, f"n{i}"))
            for i, c in enumerate(children, 1)
        ]
        if launch.profile is not None
        else [],
    )
