"""The state file of a dev cluster: who runs, where, and how to find them again.

`<state-dir>/headwater.json` records the `dev up` process and each child it started (pid, start
time, log, ports, whether it runs or is being restarted, how often it was, since when it runs),
plus the endpoints. It is rewritten atomically (write, then rename) each time a child starts or
restarts, so that after a crash it still lists everything that may be running, and `dev status`,
`dev restart` and `dev roll` read it; a clean stop removes it.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from headwater.errors import ServiceError
from headwater.services.process import ProcessIdentity

STATE_FILE = "headwater.json"


@dataclass(slots=True)
class ProcessRecord:
    """One recorded process: its identity and where it logs."""

    name: str
    pid: int
    start_ticks: int | None
    log: str = ""
    state: str = "running"
    """`running`, `restarting` (exited; the supervisor starts it again) or `stopped`."""
    restarts: int = 0
    since: float = 0.0
    """When the current process started (seconds since the epoch)."""
    ports: list[int] = field(default_factory=list)
    ready_port: int | None = None
    """A front-end node's stats port, where `GET /ready` answers; None for other processes."""
    workers: int = 1
    """A front-end node's processes (`--workers`), answering on `ready_port` and the next ones."""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProcessRecord:
        known = {f.name for f in fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in known})

    @property
    def identity(self) -> ProcessIdentity:
        return ProcessIdentity(self.pid, self.start_ticks)

    @property
    def ready_ports(self) -> list[int]:
        """Where each worker of a front-end node answers `GET /ready`; none for other processes."""
        if self.ready_port is None:
            return []
        return [self.ready_port + i for i in range(self.workers)]


@dataclass(slots=True)
class ClusterState:
    """Everything `dev down` needs to stop a cluster."""

    parent: ProcessRecord
    children: list[ProcessRecord] = field(default_factory=list)
    endpoints: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ClusterState:
        return cls(
            parent=ProcessRecord.from_json(data["parent"]),
            children=[ProcessRecord.from_json(child) for child in data.get("children", [])],
            endpoints=dict(data.get("endpoints", {})),
        )


def state_path(state_dir: Path) -> Path:
    return state_dir / STATE_FILE


def write_state(state_dir: Path, state: ClusterState) -> None:
    """Replace the state file atomically."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_path(state_dir)
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(state.to_json(), indent=2) + "\n")
    os.replace(partial, path)


def read_state(state_dir: Path) -> ClusterState | None:
    """The recorded state, or None if there is no state file."""
    path = state_path(state_dir)
    try:
        data = json.loads(path.read_text())
        return ClusterState.from_json(data)
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as exc:
        raise ServiceError(f"state file {path} is unreadable ({exc}): remove it") from None


def running_kafka(state_dir: Path) -> str | None:
    """The Kafka bootstrap of the dev cluster running from `state_dir`, or None if none runs there
    (no state file, or its `dev up` process is gone)."""
    state = read_state(state_dir)
    if state is None or not state.parent.identity.alive():
        return None
    return state.endpoints.get("kafka")


def remove_state(state_dir: Path) -> None:
    state_path(state_dir).unlink(missing_ok=True)
