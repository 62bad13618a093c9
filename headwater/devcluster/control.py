"""`headwater dev status`, `dev restart NODE` and `dev roll`: a running dev cluster, from outside.

They talk to the `dev up` process only through its state file (`<state-dir>/headwater.json`,
kept current by its supervisor) and signals. `status` prints one line per process. `restart`
sends the node's process group SIGTERM: the node drains (``frontend.node``) and exits 0, the
supervisor starts it again at once on the same ports, and `restart` returns once the state file
names a new process for the node and its `GET /ready` answers 200 (on every worker's port, for a
node of several `--workers`: the signal reaches the parent and its workers, one process group,
and they drain together). `roll` restarts every node
in turn, giving HAProxy `ROLL_SETTLE` seconds to see each one back before the next goes.
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path
from typing import TextIO

from headwater.devcluster.nodes import answers_ready, ready_answer
from headwater.devcluster.state import ClusterState, ProcessRecord, read_state
from headwater.errors import HeadwaterError, ServiceError
from headwater.services.process import signal_group

RESTART_TIMEOUT = 60.0
"""Seconds `dev restart` waits for a node to drain, start again and answer ready."""
ROLL_SETTLE = 2.0
"""Seconds between a node answering ready and the next one's restart: HAProxy checks every
second and needs one good answer (``headwater.services.haproxy``)."""


def running_state(state_dir: Path) -> ClusterState:
    """The state of the dev cluster running from `state_dir`; a HeadwaterError if none is."""
    state = read_state(state_dir)
    if state is None or not state.parent.identity.alive():
        raise HeadwaterError(f"no dev cluster is running from {state_dir} (start one: make run)")
    return state


def run_status(state_dir: Path, out: TextIO = sys.stdout) -> int:
    """One line per process of the running cluster; a HeadwaterError if none runs."""
    state = running_state(state_dir)
    print(f"dev up (pid {state.parent.pid}), state in {state_dir}", file=out)
    header = f"{'name':<10} {'pid':>7} {'state':<10} {'restarts':>8} {'uptime':>8}  ports"
    print(header, file=out)
    now = time.time()
    for record in state.children:
        print(_status_line(record, now), file=out)
    return 0


def _status_line(record: ProcessRecord, now: float) -> str:
    state = record.state
    if state == "running" and not record.identity.alive():
        state = "stopped"  # exited; the supervisor has not noticed yet
    uptime = _duration(now - record.since) if state == "running" and record.since else "-"
    ports = ",".join(map(str, record.ports)) or "-"
    line = f"{record.name:<10} {record.pid:>7} {state:<10} {record.restarts:>8} {uptime:>8}"
    line += f"  {ports}"
    answers = [ready_answer(port) for port in record.ready_ports]
    if len(answers) == 1:
        line += f"  ready: {answers[0]}"
    elif answers:
        line += "  ready: " + ", ".join(f"{i}: {a}" for i, a in enumerate(answers, 1))
    return line


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def nodes(state: ClusterState) -> list[ProcessRecord]:
    """The front-end nodes of the cluster, in start order."""
    return [record for record in state.children if record.ready_port is not None]


def run_restart(
    state_dir: Path, name: str, out: TextIO = sys.stdout, timeout: float = RESTART_TIMEOUT
) -> int:
    """Drain node `name` and wait until the supervisor's new process for it answers ready."""
    state = running_state(state_dir)
    found = [record for record in nodes(state) if record.name == name]
    if not found:
        names = ", ".join(record.name for record in nodes(state)) or "none"
        raise HeadwaterError(f"no front-end node {name!r} in the dev cluster (nodes: {names})")
    restart(state_dir, found[0], out, timeout)
    return 0


def run_roll(state_dir: Path, out: TextIO = sys.stdout, timeout: float = RESTART_TIMEOUT) -> int:
    """Restart every node in turn, each once the one before answers ready (and HAProxy saw it)."""
    started = time.monotonic()
    state = running_state(state_dir)
    for i, record in enumerate(nodes(state)):
        if i:
            time.sleep(ROLL_SETTLE)
        restart(state_dir, record, out, timeout)
    print(f"headwater: rolled {len(nodes(state))} nodes in {_seconds(started)}", file=out)
    return 0


def restart(state_dir: Path, record: ProcessRecord, out: TextIO, timeout: float) -> None:
    """SIGTERM the node of `record` (it drains and exits; the supervisor starts it again), then
    wait for its new process to answer ready."""
    started = time.monotonic()
    old = record.identity
    if old.alive():
        print(f"headwater: draining {record.name} (pid {old.pid})...", file=out, flush=True)
        signal_group(old.pid, signal.SIGTERM)
    deadline = started + timeout
    while True:
        current = _record(running_state(state_dir), record.name)
        if (
            current.pid != old.pid
            and current.state == "running"
            and current.identity.alive()
            and current.ready_ports
            and all(map(answers_ready, current.ready_ports))
        ):
            break
        if time.monotonic() >= deadline:
            raise ServiceError(
                f"{record.name} did not answer ready again within {timeout:g} s (log: {record.log})"
            )
        time.sleep(0.1)
    print(
        f"headwater: {record.name} restarted (pid {old.pid} -> {current.pid}) and ready "
        f"in {_seconds(started)}",
        file=out,
        flush=True,
    )


def _record(state: ClusterState, name: str) -> ProcessRecord:
    for record in state.children:
        if record.name == name:
            return record
    raise ServiceError(f"{name} is no longer in the dev cluster's state file")


def _seconds(started: float) -> str:
    return f"{time.monotonic() - started:.1f} s"
