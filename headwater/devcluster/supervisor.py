"""Supervision of a dev cluster's children: a process that exits is started again, the rest run on.

Each child is registered with the function that launches it again on the same ports and state
directory (a node keeps its node id and ports, so HAProxy's configuration never changes). The
supervisor is polled from the thread that spawned the children (Linux's PR_SET_PDEATHSIG follows
the spawning thread). A child that exits with 0 was asked to (SIGTERM: a node drained, e.g. by
`headwater dev restart`) and is started at once; any other exit waits first, as a node's
workers do (`frontend.workers.next_delay`): 0.5 s doubling up to 10 s, back to 0.5 s once a
process has run 30 s. Each exit is logged as one line, e.g. `node2 exited with -9; restarting in
0.5 s`. Every change is written to the state file (`ProcessRecord`: pid, state, restarts, since).

Stopping is not the supervisor's business: once a stop is requested it is simply no longer
polled, and `dev up` stops each service's current process.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TextIO

from frontend.workers import next_delay, retry_delay
from headwater.devcluster.state import ClusterState, ProcessRecord
from headwater.errors import HeadwaterError
from headwater.services.process import ChildProcess

Launch = Callable[[], ChildProcess]


@dataclass(slots=True)
class Supervised:
    """One supervised service: its current process and how to start another."""

    child: ChildProcess
    launch: Launch
    record: ProcessRecord
    started: float
    """When the current process started (the monotonic clock)."""
    delay: float = 0.0
    """The last wait before a restart after a failure (0: none since it last ran long enough)."""
    due: float = 0.0
    """When a process being restarted is started again (the monotonic clock)."""


class Supervisor:
    """Restarts the children of a `dev up` that exit, and keeps the state file current."""

    def __init__(
        self,
        state: ClusterState,
        save: Callable[[], None],
        out: TextIO,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.state = state
        self.save = save
        self.out = out
        self.clock = clock
        self.services: list[Supervised] = []

    def add(
        self,
        child: ChildProcess,
        launch: Launch,
        ports: Sequence[int] = (),
        ready_port: int | None = None,
        workers: int = 1,
    ) -> Supervised:
        """Supervise `child` from now on; `launch` starts it again."""
        record = ProcessRecord(
            child.name,
            child.pid,
            child.identity.start_ticks,
            str(child.log_path),
            since=time.time(),
            ports=list(ports),
            ready_port=ready_port,
            workers=workers,
        )
        self.state.children.append(record)
        service = Supervised(child, launch, record, self.clock())
        self.services.append(service)
        self.save()
        return service

    def poll(self) -> None:
        """Notice the processes that exited, and start the ones whose wait is over."""
        now = self.clock()
        changed = False
        for service in self.services:
            if service.record.state == "running":
                code = service.child.poll()
                if code is not None:
                    self._exited(service, code, now)
                    changed = True
            elif service.record.state == "restarting" and now >= service.due:
                self._restart(service, now)
                changed = True
        if changed:
            self.save()

    def stopping(self) -> None:
        """Record that everything is being stopped (nothing is restarted any more)."""
        for service in self.services:
            service.record.state = "stopped"
        self.save()

    def _exited(self, service: Supervised, code: int, now: float) -> None:
        if code == 0:
            service.delay = 0.0
            when = "now"
        else:
            service.delay = next_delay(service.delay, now - service.started)
            when = f"in {service.delay:g} s"
        service.record.state = "restarting"
        service.due = now + service.delay
        self._say(f"{service.child.name} exited with {code}; restarting {when}")

    def _restart(self, service: Supervised, now: float) -> None:
        name = service.child.name
        try:
            child = service.launch()
        except (HeadwaterError, OSError) as exc:
            service.delay = retry_delay(service.delay)
            service.due = now + service.delay
            self._say(f"{name} did not start ({exc}); trying again in {service.delay:g} s")
            return
        service.child, service.started = child, now
        record = service.record
        record.pid, record.start_ticks = child.pid, child.identity.start_ticks
        record.state, record.since = "running", time.time()
        record.restarts += 1
        self._say(f"{name} restarted (pid {child.pid}, restart {record.restarts})")

    def _say(self, message: str) -> None:
        print(f"headwater: {message}", file=self.out, flush=True)
