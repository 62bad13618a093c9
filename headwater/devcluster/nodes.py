"""Front-end nodes of a dev cluster: how one is launched and when it counts as up.

A node is `python -m frontend` with the flags below (the contract with frontend/__main__.py).
It is up once its listening port accepts TCP connections; if it exits first, its log tail says why.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from headwater.services.ports import LOOPBACK, free_port, port_accepts
from headwater.services.process import ChildProcess
from headwater.services.readiness import wait_until
from router.topics import MESSAGES_TOPIC


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """Everything one front-end node is told on its command line."""

    node_id: str
    port: int
    kafka_bootstrap: str
    redis_url: str
    partitions: int
    stats_port: int

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    @property
    def stats_url(self) -> str:
        return f"http://{LOOPBACK}:{self.stats_port}/stats"

    def argv(self) -> list[str]:
        return [
            sys.executable, "-m", "frontend",
            "--node-id", self.node_id,
            "--listen", self.address,
            "--kafka-bootstrap", self.kafka_bootstrap,
            "--redis-url", self.redis_url,
            "--topic", MESSAGES_TOPIC,
            "--partitions", str(self.partitions),
            "--stats-listen", f"{LOOPBACK}:{self.stats_port}",
        ]  # fmt: skip


def node_specs(count: int, kafka_bootstrap: str, redis_url: str, partitions: int) -> list[NodeSpec]:
    """`count` nodes named node0.. on fresh loopback ports."""
    return [
        NodeSpec(f"node{i}", free_port(), kafka_bootstrap, redis_url, partitions, free_port())
        for i in range(count)
    ]


def launch_node(spec: NodeSpec, log_dir: Path) -> ChildProcess:
    """Spawn one node without waiting for it."""
    return ChildProcess.spawn(spec.node_id, spec.argv(), log_dir / f"{spec.node_id}.log")


def wait_node(
    spec: NodeSpec, child: ChildProcess, cancel: threading.Event, timeout: float = 30.0
) -> None:
    """Return once the node's port accepts connections; stop it if it never does."""
    try:
        wait_until(
            lambda: port_accepts(spec.port),
            what=f"front-end {spec.node_id} on {spec.address}",
            timeout=timeout,
            child=child,
            cancel=cancel,
            interval=0.1,
        )
    except BaseException:
        child.stop(timeout=10.0)
        raise
