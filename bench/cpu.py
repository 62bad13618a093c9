"""CPU time used during a measured window: by given processes, and by the rest of the machine.

The machine is shared (2 cores here), so a run's figures mean little without knowing how much
CPU *other* processes took meanwhile.  :class:`MachineMeter` reports that as cores: busy time of
the whole machine (``/proc/stat`` via psutil) minus the time of the processes the benchmark runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import psutil


def cpu_seconds(pid: int) -> float:
    """CPU seconds ``pid`` has used, all its threads (0 once it is gone)."""
    try:
        cpu = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return float(cpu.user + cpu.system)


def waited_seconds(pid: int) -> float:
    """Seconds the main thread of ``pid`` was ready to run but waited for a CPU (the second
    field of ``/proc/PID/task/PID/schedstat``, nanoseconds; 0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


class Meter:
    """A count that only grows (``read(pid)``), per process, between two samples."""

    def __init__(self, pids: Sequence[int], read: Callable[[int], float]) -> None:
        self._pids = list(pids)
        self._read = read
        self._start = self._sample()

    def _sample(self) -> list[float]:
        return [self._read(pid) for pid in self._pids]

    def restart(self) -> None:
        self._start = self._sample()

    def used(self) -> list[float]:
        return [end - start for start, end in zip(self._start, self._sample(), strict=True)]


class CpuMeter(Meter):
    """CPU seconds used by a set of processes (all their threads) between two samples."""

    def __init__(self, pids: Sequence[int]) -> None:
        super().__init__(pids, cpu_seconds)


class WaitMeter(Meter):
    """Seconds the main thread of each process waited for a CPU between two samples.  A broker
    whose event loop waits for a CPU answers PUBACKs that much later, whatever its own speed."""

    def __init__(self, pids: Sequence[int]) -> None:
        super().__init__(pids, waited_seconds)


def _busy() -> float:
    t = psutil.cpu_times()
    return float(sum(t) - t.idle - getattr(t, "iowait", 0.0))


class MachineMeter:
    """Busy CPU seconds of the whole machine, and of it those not used by ``ours``."""

    def __init__(self, ours: Sequence[int]) -> None:
        self._ours = CpuMeter(ours)
        self._start = _busy()

    def restart(self) -> None:
        self._ours.restart()
        self._start = _busy()

    def others(self) -> float:
        """CPU seconds the rest of the machine used since the start."""
        return max(0.0, _busy() - self._start - sum(self._ours.used()))


def settle(pids: Sequence[int], idle_share: float, timeout: float, step: float = 0.5) -> float:
    """Wait until ``pids`` together use less than ``idle_share`` of a core over ``step`` seconds
    (a broker still working off the previous run's backlog would skew the next run); return the
    seconds waited, ``timeout`` at most."""
    waited = 0.0
    meter = CpuMeter(pids)
    while waited < timeout:
        time.sleep(step)
        waited += step
        if sum(meter.used()) / step < idle_share:
            return waited
        meter.restart()
    return waited
