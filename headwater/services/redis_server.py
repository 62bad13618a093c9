"""Redis for sessions: a local `redis-server` child, a local Redis Cluster, or an external one
checked with PING.

`LocalRedis(state_dir, appendonly=...)` runs Debian's redis-server on a free loopback port with its
working directory, log file and (when `appendonly` is set) its append-only file under `state_dir`.
RDB snapshots are always off: tests want no persistence at all, and `dev up` wants the AOF, which
survives a crash with at most a second of writes lost. Ready means it answers PING. Expired-key
events are on (`notify-keyspace-events Ex`): nodes count expired sessions by them, and a restarted
server keeps the setting.

`LocalRedisCluster(state_dir, masters=3)` runs that many such servers with cluster mode on (each
with its cluster bus on a second free port), joins them with `redis-cli --cluster create` and no
replicas, and is ready once every one reports `cluster_state:ok`.
"""

from __future__ import annotations

import subprocess
import threading
import urllib.parse
from pathlib import Path
from typing import Self

import redis

from headwater.errors import MissingProgramError, ServiceError
from headwater.services.ports import LOOPBACK, free_port
from headwater.services.process import ChildProcess, LocalService, find_program
from headwater.services.readiness import wait_until
from headwater.settings import REDIS_URL_ENV

REDIS_HINT = (
    "redis-server is required to run the local Redis: "
    "apt-get install redis-server, or set HEADWATER_REDIS_URL"
)


def require_redis_server() -> str:
    """Path of the redis-server binary, or a MissingProgramError saying what to install."""
    binary = find_program("redis-server")
    if binary is None:
        raise MissingProgramError(REDIS_HINT)
    return binary


def redact(url: str) -> str:
    """`url` with any password replaced by ***, fit for messages."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def pings(url: str, timeout: float = 1.0) -> bool:
    """True if Redis at `url` answers PING within `timeout` seconds."""
    client = redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout)
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()


def check_reachable(url: str, timeout: float = 5.0, setting: str = REDIS_URL_ENV) -> None:
    """Raise a ServiceError naming `setting` unless Redis at `url` answers PING."""
    client = redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout)
    try:
        client.ping()
    except (redis.RedisError, OSError) as exc:
        raise ServiceError(
            f"Redis at {redact(url)} (setting {setting}) is unreachable: {exc}"
        ) from None
    finally:
        client.close()


class LocalRedis(LocalService):
    """One redis-server under `state_dir`, started by `start()` and gone after `stop()`.

    SIGTERM makes Redis flush its append-only file before it exits."""

    def __init__(
        self,
        state_dir: Path,
        *,
        appendonly: bool = False,
        cluster: bool = False,
        cancel: threading.Event | None = None,
    ) -> None:
        self.state_dir = state_dir.resolve()
        self.appendonly = appendonly
        self.cluster = cluster
        self.cancel = cancel
        self.port: int | None = None
        self.bus_port: int | None = None
        self.child: ChildProcess | None = None

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("LocalRedis is not started")
        return f"redis://{LOOPBACK}:{self.port}/0"

    def argv(self, binary: str, port: int) -> list[str]:
        """The redis-server command line: loopback only, foreground, persistence as configured,
        and, for a cluster member, cluster mode with its bus on `bus_port`."""
        argv = [
            binary,
            "--bind", LOOPBACK,
            "--port", str(port),
            "--protected-mode", "yes",
            "--daemonize", "no",
            "--dir", str(self.state_dir),
            "--logfile", "",
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "everysec",
            "--notify-keyspace-events", "Ex",
        ]  # fmt: skip
        if self.cluster:
            assert self.bus_port is not None, "a cluster member's bus port is picked at launch"
            argv += [
                "--cluster-enabled", "yes",
                "--cluster-config-file", str(self.state_dir / "nodes.conf"),
                "--cluster-port", str(self.bus_port),
            ]  # fmt: skip
        return argv

    def start(self, timeout: float = 30.0) -> str:
        """Start redis-server and return its URL once it answers PING."""
        self.launch()
        return self.wait_ready(timeout)

    def launch(self) -> ChildProcess:
        """Spawn redis-server on a free port without waiting for it."""
        binary = require_redis_server()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        if self.cluster:
            self.bus_port = free_port()
        log_path = self.state_dir / "redis.log"
        self.child = ChildProcess.spawn("redis", self.argv(binary, self.port), log_path)
        return self.child

    def wait_ready(self, timeout: float = 30.0) -> str:
        """Wait until the launched Redis answers PING; stop it if it does not."""
        return self._ready_or_stop(
            lambda: wait_until(
                lambda: pings(self.url),
                what=f"Redis at {self.url}",
                timeout=timeout,
                child=self.child,
                cancel=self.cancel,
                interval=0.05,
            ),
            self.url,
        )


class LocalRedisCluster:
    """`masters` cluster-mode redis-servers under `state_dir`, joined into one Redis Cluster with
    no replicas; started and stopped together, and usable as a context manager that does both.

    `url` names the first master: a cluster client learns the others from it."""

    def __init__(
        self, state_dir: Path, masters: int = 3, *, cancel: threading.Event | None = None
    ) -> None:
        self.state_dir = state_dir.resolve()
        self.cancel = cancel
        self.nodes = [
            LocalRedis(self.state_dir / f"node{i}", cluster=True, cancel=cancel)
            for i in range(1, masters + 1)
        ]

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def start(self, timeout: float = 30.0) -> str:
        """Start every server, create the cluster, and return its URL once every node serves."""
        try:
            for node in self.nodes:
                node.launch()
            for node in self.nodes:
                node.wait_ready(timeout)
            self._create(timeout)
            wait_until(
                lambda: all(_cluster_ok(node.url) for node in self.nodes),
                what=f"Redis Cluster at {self.url}",
                timeout=timeout,
                cancel=self.cancel,
                interval=0.05,
            )
        except BaseException:
            self.stop()
            raise
        return self.url

    def _create(self, timeout: float) -> None:
        """`redis-cli --cluster create`: the slots split evenly over the masters."""
        cli = find_program("redis-cli")
        if cli is None:
            raise MissingProgramError(REDIS_HINT)
        addresses = [f"{LOOPBACK}:{node.port}" for node in self.nodes]
        argv = [cli, "--cluster", "create", *addresses, "--cluster-replicas", "0", "--cluster-yes"]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        if result.returncode != 0:
            output = (result.stdout + result.stderr).strip()
            raise ServiceError(f"creating the Redis Cluster failed:\n{output}")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _cluster_ok(url: str) -> bool:
    """True once the server at `url` says its cluster serves every slot."""
    client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1)
    try:
        info = client.cluster("INFO")
        return bool(info.get("cluster_state") == "ok")
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()
