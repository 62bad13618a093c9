"""HAProxy in TCP mode in front of the front-end nodes: one public MQTT port.

The generated configuration binds 127.0.0.1:<port> and spreads connections over the nodes with
`balance leastconn`, which suits long-lived MQTT connections better than round robin. Each node is
health-checked every second by `GET /ready` on its stats port (by TCP connect where it has none),
so a dead or stuck node, or one that cannot reach Kafka or Redis, stops getting new clients within
about two seconds.
Client and server timeouts are an hour: an MQTT connection idles between keep-alive PINGREQs, and
HAProxy must not cut it. HAProxy runs in the foreground (`-db`) as a child; SIGTERM stops it.
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from headwater.errors import MissingProgramError, ServiceError
from headwater.services.ports import LOOPBACK, port_accepts
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


def render_config(port: int, servers: Sequence[Server], host: str = LOOPBACK) -> str:
    """haproxy.cfg: a TCP frontend on host:port, a leastconn backend of `servers`."""
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
        "",
        "frontend mqtt",
        f"    bind {host}:{port}",
        "    default_backend frontends",
        "",
        "backend frontends",
        "    balance leastconn",
    ]
    if any(s.stats_port for s in servers):
        lines += ["    option httpchk GET /ready", "    http-check expect status 200"]
    lines.append("    default-server check inter 1s fall 2 rise 1")
    lines += [
        f"    server {s.name} {s.host}:{s.port}"
        + (f" check port {s.stats_port}" if s.stats_port else "")
        for s in servers
    ]
    return "\n".join(lines) + "\n"


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
    """HAProxy for `servers` on loopback `port`, started by `start()` and gone after `stop()`."""

    def __init__(
        self,
        state_dir: Path,
        port: int,
        servers: Sequence[Server],
        *,
        cancel: threading.Event | None = None,
    ) -> None:
        self.state_dir = state_dir.resolve()
        self.port = port
        self.servers = list(servers)
        self.cancel = cancel
        self.child: ChildProcess | None = None

    @property
    def config_path(self) -> Path:
        return self.state_dir / "haproxy.cfg"

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def start(self, timeout: float = 15.0) -> str:
        """Start HAProxy and return its address once the port accepts connections."""
        self.launch()
        return self.wait_ready(timeout)

    def launch(self) -> ChildProcess:
        """Write and check the config, then spawn HAProxy without waiting for it."""
        binary = require_haproxy()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(render_config(self.port, self.servers))
        check_config(binary, self.config_path)
        argv = [binary, "-db", "-f", str(self.config_path)]
        self.child = ChildProcess.spawn("haproxy", argv, self.state_dir / "haproxy.log")
        return self.child

    def wait_ready(self, timeout: float = 15.0) -> str:
        """Wait until the launched HAProxy accepts connections; stop it if it does not."""
        return self._ready_or_stop(
            lambda: wait_until(
                lambda: port_accepts(self.port),
                what=f"HAProxy on {self.address}",
                timeout=timeout,
                child=self.child,
                cancel=self.cancel,
                interval=0.05,
            ),
            self.address,
        )
