"""The dev cluster's supervisor, with fake processes and a fake clock: who is restarted when."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from frontend import workers
from headwater.devcluster import supervisor as sv
from headwater.devcluster.state import ClusterState, ProcessRecord
from headwater.services.process import ProcessIdentity


class FakeChild:
    def __init__(self, pid: int) -> None:
        self.name = "node2"
        self.pid = pid
        self.identity = ProcessIdentity(pid, None)
        self.log_path = Path("node2.log")
        self.code: int | None = None

    def poll(self) -> int | None:
        return self.code


class Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def supervised(clock: Clock) -> tuple[sv.Supervisor, list[FakeChild], io.StringIO, list[int]]:
    out = io.StringIO()
    saves: list[int] = []
    state = ClusterState(parent=ProcessRecord("dev up", 1, None))
    supervisor = sv.Supervisor(state, lambda: saves.append(1), out, clock)
    children = [FakeChild(100)]

    def launch() -> Any:
        children.append(FakeChild(children[-1].pid + 1))
        return children[-1]

    supervisor.add(children[0], launch, [1883], ready_port=9000)  # type: ignore[arg-type]
    return supervisor, children, out, saves


def crash(supervisor: sv.Supervisor, children: list[FakeChild], clock: Clock, code: int) -> None:
    children[-1].code = code
    supervisor.poll()


def test_a_failing_process_waits_longer_each_time_up_to_the_most(clock: Clock) -> None:
    supervisor, children, out, _ = supervised(clock)
    delays = []
    for _ in range(7):
        crash(supervisor, children, clock, -9)
        delays.append(supervisor.services[0].delay)
        clock.now += delays[-1] - 0.01
        supervisor.poll()
        assert supervisor.services[0].record.state == "restarting"  # not yet
        clock.now += 0.01
        supervisor.poll()
        assert supervisor.services[0].record.state == "running"
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert "headwater: node2 exited with -9; restarting in 0.5 s\n" in out.getvalue()
    record = supervisor.state.children[0]
    assert (record.pid, record.restarts, record.ports) == (children[-1].pid, 7, [1883])


def test_a_process_that_ran_long_enough_starts_over_and_a_clean_exit_restarts_at_once(
    clock: Clock,
) -> None:
    supervisor, children, out, saves = supervised(clock)
    for _ in range(3):
        crash(supervisor, children, clock, 1)
        clock.now += supervisor.services[0].delay
        supervisor.poll()
    assert supervisor.services[0].delay == 2.0
    clock.now += workers.BACKOFF_RESET
    crash(supervisor, children, clock, 1)
    assert supervisor.services[0].delay == workers.BACKOFF_FIRST
    clock.now += workers.BACKOFF_FIRST
    supervisor.poll()
    crash(supervisor, children, clock, 0)  # drained on SIGTERM, e.g. `dev restart`
    assert "node2 exited with 0; restarting now" in out.getvalue()
    supervisor.poll()
    assert supervisor.state.children[0].state == "running"
    assert supervisor.state.children[0].restarts == 5
    assert len(saves) > 10  # the state file follows every change


def test_a_launch_that_fails_is_tried_again_later(clock: Clock) -> None:
    supervisor, children, out, _ = supervised(clock)

    def broken() -> Any:
        raise OSError("no such file")

    supervisor.services[0].launch = broken
    crash(supervisor, children, clock, -9)
    clock.now += 0.5
    supervisor.poll()
    assert supervisor.services[0].record.state == "restarting"
    assert "node2 did not start (no such file); trying again in 1 s" in out.getvalue()
