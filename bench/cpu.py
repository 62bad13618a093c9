"""CPU time used during a measured window: by given processes, and by the rest of the machine.

The machine is shared (2 cores here), so a run's figures mean little without knowing how much
CPU *other* processes took meanwhile.  :class:`MachineMeter` reports that as cores: busy time of
the whole machine (``/proc/stat`` via psutil) minus the time of the processes the benchmark runs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import psutil


class CpuMeter:
    """CPU seconds used by a set of processes (all their threads) between two samples."""

    def __init__(self, pids: Sequence[int]) -> None:
        self._procs = [psutil.Process(pid) for pid in pids]
        self._start = self._sample()

    def _sample(self) -> list[float]:
        times = []
        for proc in self._procs:
            try:
                cpu = proc.cpu_times()
                times.append(cpu.user + cpu.system)
            except psutil.Error:
                times.append(0.0)
        return times

    def restart(self) -> None:
        self._start = self._sample()

    def used(self) -> list[float]:
        return [end - start for start, end in zip(self._start, self._sample(), strict=True)]


class WaitMeter:
    """Seconds the main thread of each process was ready to run but waited for a CPU, between
    two samples (the second field of ``/proc/PID/task/PID/schedstat``, nanoseconds).  A broker
    whose event loop waits for a CPU answers PUBACKs that much later, whatever its own speed."""

    def __init__(self, pids: Sequence[int]) -> None:
        self._pids = list(pids)
        self._start = self._sample()

    def _sample(self) -> list[float]:
        waited = []
        for pid in self._pids:
            try:
                with open(f"/proc/{pid}/task/{pid}/schedstat") as f:
                    waited.append(int(f.read().split()[1]) / 1e9)
            except (OSError, IndexError, ValueError):
                waited.append(0.0)
        return waited

    def restart(self) -> None:
        self._start = self._sample()

    def used(self) -> list[float]:
        return [end - start for start, end in zip(self._start, self._sample(), strict=True)]


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
