"""Front-end nodes of a dev cluster: how one is launched and when it counts as up.

A node is `python -m frontend` with the flags below (the contract with frontend/config.py): a
plain MQTT listener, optionally MQTT over TLS and over WebSocket, each on its own loopback port,
and what every node of the cluster shares (`NodeSecurity`: certificate files, PROXY protocol,
password and ACL files). With `workers` above 1 the node is a parent of that many worker
processes (`frontend.workers`) sharing its MQTT ports, worker i named `<node>-i` with the HTTP
port `stats_port + i-1`, so a node's stats ports are consecutive. A node is up once `GET /ready`
answers 200 on every worker's HTTP port: its listeners are serving and Kafka and Redis answer.
Its MQTT ports are not probed, because with `--proxy-protocol` a connection that sends no PROXY
header is a broken one. If the node exits first, its log tail says why.
"""

from __future__ import annotations

import http.client
import socket
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from headwater.errors import ServiceError
from headwater.services.ports import LOOPBACK, free_port
from headwater.services.process import ChildProcess
from headwater.services.readiness import wait_until
from router.topics import MESSAGES_TOPIC


@dataclass(frozen=True, slots=True)
class NodeSecurity:
    """What every node of a cluster is given alike."""

    certfile: Path | None = None
    keyfile: Path | None = None
    cafile: Path | None = None
    """The CA that client certificates, when a client presents one, are verified against."""
    proxy_protocol: bool = False
    """Every listener expects a PROXY protocol header first (HAProxy sends v2)."""
    proxy_allow: str = f"{LOOPBACK}/32"
    """Where those headers are believed from: the dev cluster's HAProxy, on loopback."""
    password_file: Path | None = None
    acl_file: Path | None = None

    def argv(self) -> list[str]:
        files = [
            ("--certfile", self.certfile),
            ("--keyfile", self.keyfile),
            ("--cafile", self.cafile),
            ("--password-file", self.password_file),
            ("--acl-file", self.acl_file),
        ]
        args = [arg for flag, path in files if path is not None for arg in (flag, str(path))]
        if not self.proxy_protocol:
            return args
        return [*args, "--proxy-protocol", "--proxy-allow", self.proxy_allow]


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """Everything one front-end node is told on its command line."""

    node_id: str
    port: int
    kafka_bootstrap: str
    redis_url: str
    partitions: int
    stats_port: int
    tls_port: int = 0
    """MQTT over TLS; 0: no such listener."""
    ws_port: int = 0
    """MQTT over WebSocket (path /mqtt); 0: no such listener."""
    security: NodeSecurity = field(default_factory=NodeSecurity)
    workers: int = 1
    """Processes of the node (``--workers``); worker i answers HTTP on ``stats_port + i-1``."""
    exports: tuple[str, ...] = ()
    """``--export`` settings (``FILTER=KAFKA_TOPIC[:json|raw]``), given to every node alike."""

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    @property
    def stats_url(self) -> str:
        return f"http://{LOOPBACK}:{self.stats_port}/stats"

    @property
    def stats_ports(self) -> list[int]:
        """Each worker's HTTP port (the first is the node's, which HAProxy checks)."""
        return [self.stats_port + i for i in range(self.workers)]

    def worker_stats_urls(self) -> dict[str, str]:
        """Each worker's node id -> its ``/stats`` URL (the node's own with one worker)."""
        if self.workers == 1:
            return {self.node_id: self.stats_url}
        return {
            f"{self.node_id}-{i + 1}": f"http://{LOOPBACK}:{port}/stats"
            for i, port in enumerate(self.stats_ports)
        }

    def argv(self) -> list[str]:
        return [
            sys.executable, "-m", "frontend",
            "--node-id", self.node_id,
            "--listen", self.address,
            *self._listener_args(),
            "--kafka-bootstrap", self.kafka_bootstrap,
            "--redis-url", self.redis_url,
            "--topic", MESSAGES_TOPIC,
            "--partitions", str(self.partitions),
            "--stats-listen", f"{LOOPBACK}:{self.stats_port}",
            "--workers", str(self.workers),
            *self.security.argv(),
            *(arg for export in self.exports for arg in ("--export", export)),
        ]  # fmt: skip

    def _listener_args(self) -> list[str]:
        listeners = [("--tls-listen", self.tls_port), ("--ws-listen", self.ws_port)]
        return [arg for flag, port in listeners if port for arg in (flag, f"{LOOPBACK}:{port}")]


def node_specs(
    count: int,
    kafka_bootstrap: str,
    redis_url: str,
    partitions: int,
    *,
    tls: bool = False,
    ws: bool = False,
    security: NodeSecurity | None = None,
    workers: int = 1,
    exports: tuple[str, ...] = (),
    avoid: frozenset[int] = frozenset(),
) -> list[NodeSpec]:
    """`count` nodes named node0.., each on fresh loopback ports: plain MQTT and stats (one
    per worker, consecutive), plus TLS and WebSocket where asked; none of them in `avoid` (the
    cluster's own ports, which HAProxy binds after the nodes started)."""
    shared = security or NodeSecurity()
    ports = _distinct_free_ports(count * 3, avoid)
    taken = set(ports) | avoid
    specs = []
    for i in range(count):
        plain, tls_port, ws_port = ports[3 * i : 3 * i + 3]
        stats = _free_port_run(workers, taken)
        specs.append(
            NodeSpec(
                f"node{i}", plain, kafka_bootstrap, redis_url, partitions, stats,
                tls_port=tls_port if tls else 0,
                ws_port=ws_port if ws else 0,
                security=shared,
                workers=workers,
                exports=exports,
            )
        )  # fmt: skip
    return specs


def _distinct_free_ports(count: int, avoid: frozenset[int] = frozenset()) -> list[int]:
    """`count` free loopback ports, no two alike (the system may hand one out twice in a row),
    none in `avoid`."""
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports and port not in avoid:
            ports.append(port)
    return ports


def _free_port_run(length: int, taken: set[int], attempts: int = 200) -> int:
    """The first of `length` consecutive free loopback ports, none in `taken` (which they join)."""
    for _ in range(attempts):
        first = free_port()
        run = range(first, first + length)
        if run[-1] <= 65535 and not taken.intersection(run) and all(map(_is_free, run[1:])):
            taken.update(run)
            return first
    raise ServiceError(f"found no {length} consecutive free ports on {LOOPBACK}")


def _is_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def answers_ready(port: int, host: str = LOOPBACK, timeout: float = 1.0) -> bool:
    """True if `GET /ready` on host:port answers 200 (what HAProxy checks)."""
    connection = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        connection.request("GET", "/ready")
        return connection.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()


def ready_answer(port: int, host: str = LOOPBACK, timeout: float = 1.0) -> str:
    """What `GET /ready` on host:port answers: `200 ready`, `503 draining`, ... or `down`."""
    connection = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        connection.request("GET", "/ready")
        response = connection.getresponse()
        reasons = response.read().decode(errors="replace").strip().replace("\n", "; ")
        return f"{response.status} {reasons}"
    except (OSError, http.client.HTTPException):
        return "down"
    finally:
        connection.close()


def launch_node(spec: NodeSpec, log_dir: Path) -> ChildProcess:
    """Spawn one node without waiting for it."""
    return ChildProcess.spawn(spec.node_id, spec.argv(), log_dir / f"{spec.node_id}.log")


def wait_node(
    spec: NodeSpec, child: ChildProcess, cancel: threading.Event, timeout: float = 30.0
) -> None:
    """Return once every worker of the node answers ready; stop it if it never does."""
    try:
        wait_until(
            lambda: all(map(answers_ready, spec.stats_ports)),
            what=f"front-end {spec.node_id} on {spec.address} (ready on port {spec.stats_port})",
            timeout=timeout,
            child=child,
            cancel=cancel,
            interval=0.1,
        )
    except BaseException:
        child.stop(timeout=10.0)
        raise
