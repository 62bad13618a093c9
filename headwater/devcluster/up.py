"""`headwater dev up`: start a whole cluster, hold it until told to stop, then stop it all.

Order of start: checks first (ports free, programs installed, files present, settings valid:
nothing is started if one fails), then the dev CA, Kafka, Redis, topics, front-end nodes, HAProxy.
Kafka is `--kafka-brokers` local KRaft nodes or an external one; the topics' replication is
checked against the broker count before anything starts, or for an external Kafka as soon as it
answers. Each stop is pushed on an
ExitStack as its service starts, so any failure, Ctrl-C or SIGTERM unwinds exactly what was
started, newest first. Signals only set an Event; every wait polls it, so no signal interrupts a
half-done step.

HAProxy has up to three public ports (plain MQTT, MQTT over TLS, MQTT over WebSocket) and passes
each through to the nodes' listeners of that kind with a PROXY v2 header, so every node runs with
`--proxy-protocol`. TLS ends at the node, with a server certificate of the dev CA that the first
start makes in `<state-dir>/certs` and later starts reuse; the CA's path is printed, for clients.
With `--workers N` each node is N processes sharing its ports (`frontend.workers`): HAProxy still
has one server per node, checked on worker 1's HTTP port; each worker's `/stats` is an endpoint
(`headwater stats` shows them all), and the supervisor sees the node's parent process only.

While up, the children are supervised (`headwater.devcluster.supervisor`): one that exits is
started again on the same ports and state directory, with backoff, and the rest run on. A child
that fails during start-up still stops everything, with the exit reported.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TextIO

from frontend.auth import anonymous_allowed, anonymous_rule
from frontend.config import SETTINGS, anonymous_setting
from frontend.values import ConfigError
from headwater.certs import DevCerts, ensure_dev_certs
from headwater.devcluster.nodes import NodeSecurity, NodeSpec, launch_node, node_specs, wait_node
from headwater.devcluster.state import (
    ClusterState,
    ProcessRecord,
    read_state,
    remove_state,
    state_path,
    write_state,
)
from headwater.devcluster.supervisor import Launch, Supervised, Supervisor
from headwater.errors import Cancelled, SettingError
from headwater.services import kafka_admin, redis_server
from headwater.services.haproxy import LocalHAProxy, Server, require_haproxy
from headwater.services.kafka import LocalKafkaCluster
from headwater.services.ports import LOOPBACK, ensure_port_free
from headwater.services.process import ChildProcess, start_ticks, terminate_group
from headwater.services.redis_server import LocalRedis, redact, require_redis_server
from headwater.settings import (
    KAFKA_BOOTSTRAP_ENV,
    KAFKA_BROKERS_SETTING,
    external_kafka_bootstrap,
    external_redis_url,
    kafka_brokers,
    parse_port,
    replication,
)
from router.topics import Replication, project_topics

PORT_SETTING = "--port / HEADWATER_PORT"
ALLOW_ANONYMOUS_ENV = SETTINGS["allow-anonymous"].variable
"""Passed on to every node (``--allow-anonymous``); `dev up` has no flag of its own for it."""
DEFAULT_TLS_PORT = 8883
DEFAULT_WS_PORT = 8080
WS_PATH = "/mqtt"
READY_LINE = "headwater: ready (Ctrl-C to stop)"
WATCH_INTERVAL = 0.2
"""Seconds between two looks at the children."""
NODE_STOP_TIMEOUT = 35.0
"""Seconds a node has to drain before SIGKILL: longer than its longest drain (``--drain-timeout``,
30 s by default, after which a node ends itself, ``frontend.node.watch_drain``); usually < 1 s."""


@dataclass(frozen=True, slots=True)
class UpOptions:
    """What `dev up` was asked for."""

    nodes: int
    port: int
    state_dir: Path
    partitions: int
    kafka_brokers: int | None = None
    replication_factor: int | None = None
    min_insync_replicas: int | None = None
    tls_port: int = 0
    """HAProxy's MQTT over TLS port; 0: none (the command line's default is 8883)."""
    ws_port: int = 0
    """HAProxy's MQTT over WebSocket port; 0: none (the command line's default is 8080)."""
    password_file: Path | None = None
    acl_file: Path | None = None
    workers: int = 1
    """Processes per front-end node (`--workers`); HAProxy still has one server per node."""
    exports: tuple[str, ...] = ()
    """Every node's `--export FILTER=KAFKA_TOPIC[:json|raw]` (`router.relays`)."""

    def public_ports(self) -> list[tuple[int, str]]:
        """HAProxy's ports that are on, each with the setting that names it."""
        ports = [
            (self.port, PORT_SETTING),
            (self.tls_port, "--tls-port"),
            (self.ws_port, "--ws-port"),
        ]
        return [(port, setting) for port, setting in ports if port]


class DevCluster:
    """The services of one `dev up`, started in order and stopped in reverse."""

    def __init__(
        self, options: UpOptions, env: Mapping[str, str], cancel: threading.Event, out: TextIO
    ) -> None:
        self.options = options
        self.env = env
        self.cancel = cancel
        self.out = out
        self.state_dir = options.state_dir.resolve()
        self.stack = contextlib.ExitStack()
        self.kafka_brokers = 0  # local brokers; 0 with an external Kafka
        self.certs: DevCerts | None = None
        pid = os.getpid()
        self.state = ClusterState(parent=ProcessRecord("headwater dev up", pid, start_ticks(pid)))
        self.supervisor = Supervisor(
            self.state, lambda: write_state(self.state_dir, self.state), out
        )

    def __enter__(self) -> DevCluster:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.supervisor.services:
            print("headwater: stopping...", file=self.out, flush=True)
            self.supervisor.stopping()
        self.stack.close()

    def preflight(self) -> None:
        """Fail before starting anything if a setting, port or program is wrong."""
        self.claim_state_dir()
        check_ports(self.options)
        check_files(self.options)
        anonymous_line(self.options, self.env)  # an ACL with no way to log in stops here
        self.kafka_brokers = self.local_brokers()
        if self.kafka_brokers:
            self.topic_replication(self.kafka_brokers)  # refuses one the brokers cannot give
            self.local_kafka(self.kafka_brokers).preflight(KAFKA_BROKERS_SETTING)
        if external_redis_url(self.env) is None:
            require_redis_server()
        require_haproxy()

    def claim_state_dir(self) -> None:
        """Refuse a state directory in use; stop what a dead `dev up` left running in it."""
        previous = read_state(self.state_dir)
        if previous is None:
            return
        if previous.parent.identity.alive():
            raise SettingError(
                f"a dev cluster already runs from {self.state_dir} (pid {previous.parent.pid}): "
                "stop it with `headwater dev down` or choose another --state-dir"
            )
        for child in reversed(previous.children):
            terminate_group(child.identity)
        remove_state(self.state_dir)

    def start(self) -> None:
        """Bring every service up, in dependency order."""
        self.preflight()
        self.stack.callback(remove_state, self.state_dir)
        if self.options.tls_port:
            self.certs = ensure_dev_certs(self.state_dir / "certs")
        bootstrap = self.start_kafka()
        redis_url = self.start_redis()
        brokers = self.kafka_brokers or kafka_admin.broker_count(bootstrap)
        self.create_topics(bootstrap, self.topic_replication(brokers))
        specs = self.start_nodes(bootstrap, redis_url)
        self.start_haproxy(specs)

    def local_brokers(self) -> int:
        """How many Kafka brokers to run here (default 1); 0 with an external Kafka."""
        asked = kafka_brokers(self.options.kafka_brokers, self.env)
        if external_kafka_bootstrap(self.env) is None:
            return asked or 1
        if asked is not None:
            raise SettingError(
                f"{KAFKA_BROKERS_SETTING} asks for local Kafka brokers, but "
                f"{KAFKA_BOOTSTRAP_ENV} names an external Kafka: unset one of them"
            )
        return 0

    def local_kafka(self, brokers: int) -> LocalKafkaCluster:
        return LocalKafkaCluster(
            self.state_dir / "kafka", brokers, cancel=self.cancel, env=self.env
        )

    def topic_replication(self, brokers: int) -> Replication:
        """The topics' replication asked for, checked against `brokers` brokers."""
        options = self.options
        return replication(
            options.replication_factor, options.min_insync_replicas, brokers, self.env
        )

    def start_kafka(self) -> str:
        external = external_kafka_bootstrap(self.env)
        if external is not None:
            kafka_admin.check_reachable(external)
            return self._endpoint("kafka", external)
        brokers = self.kafka_brokers
        self._say(f"starting Kafka ({brokers} broker{'s' if brokers > 1 else ''})...")
        kafka = self.local_kafka(brokers)
        self.stack.callback(kafka.stop)
        started = time.monotonic()
        for node, child in zip(kafka.nodes, kafka.launch(), strict=True):
            assert node.ports is not None
            self._track(child, node.launch, [node.ports.broker, node.ports.controller])
        bootstrap = kafka.wait_ready()
        self._say(f"Kafka ready at {bootstrap} in {time.monotonic() - started:.1f}s")
        return self._endpoint("kafka", bootstrap)

    def start_redis(self) -> str:
        external = external_redis_url(self.env)
        if external is not None:
            redis_server.check_reachable(external)
            return self._endpoint("redis", external)
        redis = LocalRedis(self.state_dir / "redis", appendonly=True, cancel=self.cancel)
        self.stack.callback(redis.stop)
        child = redis.launch()
        assert redis.port is not None
        self._track(child, lambda: relaunch_redis(redis), [redis.port])
        url = redis.wait_ready()
        return self._endpoint("redis", url)

    def create_topics(self, bootstrap: str, replicas: Replication) -> None:
        for topic in project_topics(self.options.partitions, replicas):
            kafka_admin.ensure_topic(
                bootstrap,
                topic.name,
                topic.partitions,
                topic.config,
                replication_factor=topic.replication_factor,
            )
            self.state.endpoints[f"topic {topic.name}"] = (
                f"{topic.partitions} partitions, replication factor {replicas.factor}, "
                f"min ISR {replicas.min_insync}"
            )

    def node_security(self) -> NodeSecurity:
        """What every node is given: the dev certificates, PROXY protocol, password/ACL files."""
        options, certs = self.options, self.certs
        return NodeSecurity(
            certfile=certs.server.cert if certs else None,
            keyfile=certs.server.key if certs else None,
            cafile=certs.cafile if certs else None,
            proxy_protocol=True,
            proxy_allow=f"{LOOPBACK}/32",  # HAProxy's address: no one else may send the header
            password_file=_absolute(options.password_file),
            acl_file=_absolute(options.acl_file),
        )

    def start_nodes(self, bootstrap: str, redis_url: str) -> list[NodeSpec]:
        options = self.options
        specs = node_specs(
            options.nodes,
            bootstrap,
            redis_url,
            options.partitions,
            tls=bool(options.tls_port),
            ws=bool(options.ws_port),
            security=self.node_security(),
            workers=options.workers,
            exports=options.exports,
            avoid=frozenset(port for port, _ in options.public_ports()),
        )
        log_dir = self.state_dir / "nodes"
        for spec in specs:
            child = launch_node(spec, log_dir)
            ports = [p for p in (spec.port, spec.tls_port, spec.ws_port, *spec.stats_ports) if p]
            launcher = _node_launcher(spec, log_dir)
            node = self._track(child, launcher, ports, spec.stats_port, spec.workers)
            self.stack.callback(_stop_current, node)
            wait_node(spec, child, self.cancel)
            self._endpoint(spec.node_id, spec.address)
            for name, url in spec.worker_stats_urls().items():
                self._endpoint(f"{name} stats", url)
        return specs

    def start_haproxy(self, specs: list[NodeSpec]) -> None:
        servers = [
            Server(
                s.node_id, LOOPBACK, s.port, s.stats_port, tls_port=s.tls_port, ws_port=s.ws_port
            )
            for s in specs
        ]
        options = self.options
        haproxy = LocalHAProxy(
            self.state_dir / "haproxy",
            options.port,
            servers,
            tls_port=options.tls_port,
            ws_port=options.ws_port,
            send_proxy=True,
            cancel=self.cancel,
        )
        self.stack.callback(haproxy.stop)
        self._track(haproxy.launch(), haproxy.launch, [port for port, _ in options.public_ports()])
        address = haproxy.wait_ready()
        self._endpoint("mqtt", address)
        if options.tls_port:
            self._endpoint("mqtts", f"{LOOPBACK}:{options.tls_port}")
        if options.ws_port:
            self._endpoint("ws", f"ws://{LOOPBACK}:{options.ws_port}{WS_PATH}")

    def announce(self) -> None:
        """Print the endpoints and the ready line."""
        print(f"headwater: dev cluster up (state: {state_path(self.state_dir)})", file=self.out)
        for name, value in _display_order(self.state.endpoints):
            print(f"  {name:<26} {value}", file=self.out)
        cafile = self.certs.cafile if self.certs is not None else None
        for line in client_examples(self.options, cafile):
            print(line, file=self.out)
        print(f"headwater: {anonymous_line(self.options, self.env)}", file=self.out)
        print(READY_LINE, file=self.out, flush=True)

    def watch(self) -> None:
        """Block until a stop is requested, restarting the children that exit meanwhile.

        It sleeps and looks, never ``cancel.wait()``: the signal handler's ``cancel.set()`` takes
        the event's lock, and a main thread interrupted while it held that lock in ``wait()``
        waited on itself for good (py-spy of a `dev up` that outlived SIGINT and SIGTERM: the
        handler in ``Event.set`` inside ``Event.wait``, twice)."""
        while not self.cancel.is_set():
            self.supervisor.poll()
            time.sleep(WATCH_INTERVAL)

    def _track(
        self,
        child: ChildProcess,
        launch: Launch,
        ports: Sequence[int] = (),
        ready_port: int | None = None,
        workers: int = 1,
    ) -> Supervised:
        """Record `child` in the state file and supervise it; `launch` starts it again."""
        return self.supervisor.add(child, launch, ports, ready_port, workers)

    def _endpoint(self, name: str, value: str) -> str:
        self.state.endpoints[name] = redact(value) if name == "redis" else value
        write_state(self.state_dir, self.state)
        return value

    def _say(self, message: str) -> None:
        print(f"headwater: {message}", file=self.out, flush=True)


def check_ports(options: UpOptions) -> None:
    """HAProxy's ports: valid, not two alike, and free."""
    seen: dict[int, str] = {}
    for port, setting in options.public_ports():
        parse_port(port, setting)
        if port in seen:
            raise SettingError(f"{setting} and {seen[port]} are both {port}: choose two ports")
        seen[port] = setting
        ensure_port_free(port, setting)


def check_files(options: UpOptions) -> None:
    """The password and ACL files, when given, exist (each node rereads them on SIGHUP)."""
    for path, flag in (
        (options.password_file, "--password-file"),
        (options.acl_file, "--acl-file"),
    ):
        if path is not None and not path.is_file():
            raise SettingError(f"{flag}: no file {path}")


def anonymous_line(options: UpOptions, env: Mapping[str, str]) -> str:
    """What the nodes let in without credentials (``anonymous clients allowed: no password
    file``), as each node decides it from the same settings (HEADWATER_ALLOW_ANONYMOUS reaches
    them through the environment); SettingError for an ACL that no login could select."""
    password_file = str(options.password_file) if options.password_file else None
    acl_file = str(options.acl_file) if options.acl_file else None
    try:
        setting = anonymous_setting(env.get(ALLOW_ANONYMOUS_ENV), password_file, acl_file, False)
    except ConfigError as exc:
        raise SettingError(str(exc)) from None
    allowed = anonymous_allowed(setting, password_file is not None)
    return anonymous_rule(allowed, password_file, certificates=False)


def client_examples(options: UpOptions, cafile: Path | None) -> list[str]:
    """How to connect: the dev CA's path and a command ready to paste, the WebSocket URL."""
    login = " -u USER -P PASSWORD" if options.password_file else ""
    lines = []
    if cafile is not None:
        lines += [
            f"headwater: dev CA certificate (give it to TLS clients): {cafile}",
            f"  mosquitto_sub --cafile {shlex.quote(str(cafile))} -h {LOOPBACK} "
            f"-p {options.tls_port}{login} -t '#' -v",
        ]
    if options.ws_port:
        lines.append(
            f"headwater: MQTT over WebSocket at ws://{LOOPBACK}:{options.ws_port}{WS_PATH} "
            "(subprotocol mqtt)"
        )
    return lines


def relaunch_redis(redis: LocalRedis) -> ChildProcess:
    """Start the cluster's Redis again on its port and directory (its append-only file keeps the
    sessions): `LocalRedis.launch` would pick a new port, which the nodes do not know."""
    assert redis.port is not None, "a Redis is relaunched only after its first launch"
    argv = redis.argv(require_redis_server(), redis.port)
    redis.child = ChildProcess.spawn("redis", argv, redis.state_dir / "redis.log")
    return redis.child


def _stop_current(service: Supervised) -> None:
    """Stop the process a service runs now (the supervisor may have replaced the first one)."""
    service.child.stop(NODE_STOP_TIMEOUT)


def _node_launcher(spec: NodeSpec, log_dir: Path) -> Launch:
    return lambda: launch_node(spec, log_dir)


def _absolute(path: Path | None) -> Path | None:
    return path.resolve() if path is not None else None


def _display_order(endpoints: dict[str, str]) -> Iterator[tuple[str, str]]:
    labels = {
        "mqtt": "MQTT (HAProxy)",
        "mqtts": "MQTT over TLS (HAProxy)",
        "ws": "MQTT over WebSocket",
        "kafka": "Kafka bootstrap",
        "redis": "Redis",
    }
    for key in labels:
        if key in endpoints:
            yield labels[key], endpoints[key]
    for key, value in endpoints.items():
        if key not in labels:
            yield (f"front-end {key}" if key.startswith("node") else key), value


@contextlib.contextmanager
def stop_on_signals(cancel: threading.Event) -> Iterator[None]:
    """Turn SIGINT and SIGTERM into `cancel.set()` for the duration of the block.  The main
    thread must never hold `cancel`'s lock (no `cancel.wait()` there): see `DevCluster.watch`."""

    def handler(signum: int, frame: FrameType | None) -> None:
        cancel.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def run_up(
    options: UpOptions, env: Mapping[str, str] = os.environ, out: TextIO = sys.stdout
) -> int:
    """Start the cluster, wait for Ctrl-C or SIGTERM, stop everything; 0 on a clean stop."""
    cancel = threading.Event()
    with stop_on_signals(cancel):
        try:
            with DevCluster(options, env, cancel, out) as cluster:
                cluster.start()
                cluster.announce()
                cluster.watch()
        except Cancelled:
            pass
    print("headwater: stopped", file=out, flush=True)
    return 0
