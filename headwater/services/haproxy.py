"""HAProxy in TCP mode in front of the front-end nodes: one public port per kind of client.

Up to three frontends, each with a backend of the nodes' listeners of its kind: plain MQTT on
`port`, MQTT over TLS on `tls_port` and MQTT over WebSocket on `ws_port` (0: that one is off).
HAProxy stays at layer 4: TLS and the WebSocket upgrade pass through untouched, and the node
terminates them, so HAProxy holds no key. With `send_proxy`, every connection to a node opens with
a PROXY protocol v2 header (`send-proxy-v2`): the node sees the client's own address, not
HAProxy's, and must be started with `--proxy-protocol`.

Connections are spread with `balance leastconn`, which suits long-lived MQTT connections better
than round robin. Each node is health-checked every second by `GET /ready` on its stats port (by
TCP connect where it has none), in every backend, so a dead or stuck node, or one that cannot reach
Kafka or Redis, stops getting new clients of any kind within about two seconds. Those checks carry
no PROXY header: HAProxy adds one to checks only if the server line has no `port` or `addr`
(configuration manual, `check-send-proxy`), and a `/ready` check has `check port <stats port>`.
Client and server timeouts are an hour: an MQTT connection idles between keep-alive PINGREQs, and
HAProxy must not cut it. HAProxy runs in the foreground (`-db`) as a child; SIGTERM stops it.
It counts as up once each of its ports is listening, read from /proc/net/tcp rather than probed
by connecting: HAProxy would pass a probe on to a node, which would log it as a failed TLS
handshake or a client gone before CONNECT.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from headwater.errors import MissingProgramError, ServiceError
from headwater.services.ports import LOOPBACK
from headwater.services.process import ChildProcess, LocalService, find_program
from headwater.services.readiness import wait_until

HAPROXY_HINT = "haproxy is required for the local cluster: apt-get install haproxy"


@dataclass(frozen=True, slots=True)
class Server:
    """One front-end node behind HAProxy."""

    name: str
    host: str
    port: int
    stats_port: int | None = None
    """Where the node answers ``GET /ready``: checked instead of a bare TCP connect, so a stuck
    node, or one that cannot reach Kafka or Redis, gets no new clients."""
    tls_port: int | None = None
    """The node's MQTT over TLS listener; None or 0: it has none."""
    ws_port: int | None = None
    """The node's MQTT over WebSocket listener; None or 0: it has none."""


@dataclass(frozen=True, slots=True)
class Route:
    """One public port of HAProxy and the backend of node listeners behind it."""

    frontend: str
    backend: str
    port: int
    kind: str
    """Which port of a `Server` the backend connects to: "mqtt", "mqtts" or "ws"."""

    def server_port(self, server: Server) -> int | None:
        ports = {"mqtt": server.port, "mqtts": server.tls_port, "ws": server.ws_port}
        return ports[self.kind]


def routes(port: int, tls_port: int = 0, ws_port: int = 0) -> list[Route]:
    """The frontends asked for: plain MQTT always, TLS and WebSocket unless their port is 0."""
    every = [
        Route("mqtt", "frontends", port, "mqtt"),
        Route("mqtts", "frontends_tls", tls_port, "mqtts"),
        Route("ws", "frontends_ws", ws_port, "ws"),
    ]
    return [route for route in every if route.port]


def render_config(
    port: int,
    servers: Sequence[Server],
    host: str = LOOPBACK,
    *,
    tls_port: int = 0,
    ws_port: int = 0,
    send_proxy: bool = False,
) -> str:
    """haproxy.cfg: a TCP frontend on host:<port> (and on host:<tls_port>, host:<ws_port> unless
    0), each with a leastconn backend of `servers`' listeners of that kind."""
    lines = [
        "global",
        "    nbthread 2",
        "",
        "defaults",
        "    mode tcp",
        "    timeout connect 5s",
        "    timeout client 1h",
        "    timeout server 1h",
        "    timeout check 2s",
        "    retries 2",
        "    option redispatch",
    ]
    for route in routes(port, tls_port, ws_port):
        lines += ["", f"frontend {route.frontend}", f"    bind {host}:{route.port}"]
        lines.append(f"    default_backend {route.backend}")
    for route in routes(port, tls_port, ws_port):
        lines += ["", *_backend(route, servers, send_proxy)]
    return "\n".join(lines) + "\n"


def _backend(route: Route, servers: Sequence[Server], send_proxy: bool) -> list[str]:
    """One backend: the servers that have a listener of the route's kind, health-checked."""
    members = [(s, p) for s in servers if (p := route.server_port(s))]
    lines = [f"backend {route.backend}", "    balance leastconn"]
    if any(s.stats_port for s, _ in members):
        lines += ["    option httpchk GET /ready", "    http-check expect status 200"]
    lines.append("    default-server check inter 1s fall 2 rise 1")
    proxy = " send-proxy-v2" if send_proxy else ""
    lines += [
        f"    server {s.name} {s.host}:{p}{proxy}"
        + (f" check port {s.stats_port}" if s.stats_port else "")
        for s, p in members
    ]
    return lines


def listening_ports(host: str = LOOPBACK) -> set[int]:
    """TCP ports listening on IPv4 `host` or on every address (Linux's /proc/net/tcp)."""
    wanted = {_proc_address(host), _proc_address("0.0.0.0")}
    ports = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, port = local.split(":")
        if state == "0A" and address in wanted:  # 0A: TCP_LISTEN
            ports.add(int(port, 16))
    return ports


def _proc_address(host: str) -> str:
    """An IPv4 address as /proc/net/tcp writes it: the 32-bit word in host byte order, in hex."""
    return f"{int.from_bytes(socket.inet_aton(host), sys.byteorder):08X}"


def require_haproxy() -> str:
    """Path of the haproxy binary, or a MissingProgramError saying what to install."""
    binary = find_program("haproxy")
    if binary is None:
        raise MissingProgramError(HAPROXY_HINT)
    return binary


def check_config(binary: str, config: Path) -> None:
    """Raise a ServiceError with HAProxy's own words if `config` does not parse."""
    result = subprocess.run(
        [binary, "-c", "-q", "-f", str(config)], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        output = (result.stdout + result.stderr).strip()
        raise ServiceError(f"HAProxy rejected {config}:\n{output}")


class LocalHAProxy(LocalService):
    """HAProxy for `servers` on loopback `port` (and `tls_port`, `ws_port` unless 0), started by
    `start()` and gone after `stop()`."""

    def __init__(
        self,
        state_dir: Path,
        port: int,
        servers: Sequence[Server],
        *,
        tls_port: int = 0,
        ws_port: int = 0,
        send_proxy: bool = False,
        cancel: threading.Event | None = None,
    ) -> None:
        self.state_dir = state_dir.resolve()
        self.port = port
        self.tls_port = tls_port
        self.ws_port = ws_port
        self.send_proxy = send_proxy
        self.servers = list(servers)
        self.cancel = cancel
        self.child: ChildProcess | None = None

    @property
    def config_path(self) -> Path:
        return self.state_dir / "haproxy.cfg"

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def render(self) -> str:
        return render_config(
            self.port,
            self.servers,
            tls_port=self.tls_port,
            ws_port=self.ws_port,
            send_proxy=self.send_proxy,
        )

    def start(self, timeout: float = 15.0) -> str:
        """Start HAProxy and return its address once its ports listen."""
        self.launch()
        return self.wait_ready(timeout)

    def launch(self) -> ChildProcess:
        """Write and check the config, then spawn HAProxy without waiting for it."""
        binary = require_haproxy()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(self.render())
        check_config(binary, self.config_path)
        argv = [binary, "-db", "-f", str(self.config_path)]
        self.child = ChildProcess.spawn("haproxy", argv, self.state_dir / "haproxy.log")
        return self.child

    def wait_ready(self, timeout: float = 15.0) -> str:
        """Wait until every port of the launched HAProxy listens; stop it if one does not.
        Returns the plain MQTT address."""
        ports = [route.port for route in routes(self.port, self.tls_port, self.ws_port)]
        return self._ready_or_stop(
            lambda: wait_until(
                lambda: listening_ports().issuperset(ports),
                what=f"HAProxy on {LOOPBACK} port{'s' if len(ports) > 1 else ''} "
                + ", ".join(map(str, ports)),
                timeout=timeout,
                child=self.child,
                cancel=self.cancel,
                interval=0.05,
            ),
            self.address,
        )
