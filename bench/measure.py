"""Everything the benchmark reads off the machine, in one place: ``/proc``, psutil and Redis INFO.

The parsers are pure (text or a parsed ``INFO`` mapping in, numbers out); the readers around
them only open a file or ask the server.  What each figure is:

* resident memory and threads: ``VmRSS`` (KiB) and ``Threads`` of ``/proc/<pid>/status``;
* CPU time: ``utime + stime`` of ``/proc/<pid>/stat`` (fields 14 and 15, counted after the
  parenthesised command name, which may itself hold spaces and parentheses), every thread;
* CPU waited: the second field of ``/proc/<pid>/task/<pid>/schedstat`` (ns), the main thread's
  time ready to run while no core was free;
* CPU time stolen: ``steal`` of ``psutil.cpu_times()`` (the first line of ``/proc/stat``: the
  machine's time its hypervisor gave to other guests while this one had work), as a share of all
  the machine's CPU time in a window;
* the kernel's listen-queue overflows and SYN retransmissions (``/proc/net/netstat``), which
  explain slow TCP connects;
* a broker's processes: a pid and its children (a node of ``--workers N`` is a parent and N
  workers), read afresh at each reading;
* a Headwater node's own counters: its ``GET /stats`` JSON;
* Redis commands: ``total_commands_processed`` and ``cmdstat_*`` of ``INFO``.  A reading's own
  ``INFO`` is counted after it answered: between two readings exactly one command is ours.
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
"""Clock ticks per second, the unit of ``utime`` and ``stime``."""


def status_field(status: str, name: str) -> int:
    """A numeric field (``VmRSS``, ``Threads``) of the text of ``/proc/<pid>/status``."""
    for line in status.splitlines():
        if line.startswith(f"{name}:"):
            return int(line.split()[1])
    raise ValueError(f"no {name} line: the process has exited or is a zombie")


def vmrss_kib(status: str) -> int:
    return status_field(status, "VmRSS")


def cpu_ticks(stat: str) -> int:
    """``utime + stime`` in clock ticks from the text of ``/proc/<pid>/stat``."""
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])  # fields[0] is field 3 (state)


def rss_kib(pids: Sequence[int]) -> int:
    return sum(vmrss_kib(Path(f"/proc/{pid}/status").read_text()) for pid in pids)


def threads(pid: int) -> int:
    return status_field(Path(f"/proc/{pid}/status").read_text(), "Threads")


def cpu_seconds(pid: int, task: bool = False) -> float:
    """CPU seconds ``pid`` used, every thread (``task``: its main thread alone); 0 once gone."""
    path = f"/proc/{pid}/task/{pid}/stat" if task else f"/proc/{pid}/stat"
    try:
        return cpu_ticks(Path(path).read_text()) / CLOCK_TICKS
    except (OSError, ValueError, IndexError):
        return 0.0


JIT_THREADS = ("C1 CompilerThre", "C2 CompilerThre")
"""A JVM's JIT compiler threads, as ``/proc/<pid>/task/<tid>/comm`` names them (cut to 15)."""


def jit_seconds(pid: int) -> float:
    """CPU seconds the JIT compiler threads of the JVM ``pid`` used, those alive now (the JVM
    starts and ends them as the work comes); 0 for a process that is no JVM or is gone."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    ticks = 0
    for tid in tasks:
        try:
            if Path(f"/proc/{pid}/task/{tid}/comm").read_text().startswith(JIT_THREADS):
                ticks += cpu_ticks(Path(f"/proc/{pid}/task/{tid}/stat").read_text())
        except (OSError, ValueError, IndexError):
            continue
    return ticks / CLOCK_TICKS


def waited_seconds(pid: int) -> float:
    """Seconds the main thread of ``pid`` was ready to run but waited for a CPU; 0 once gone."""
    try:
        return int(Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of ``pid`` and every child it has now (the workers of a node)."""
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return cpu_seconds(pid)
    return cpu_seconds(pid) + sum(cpu_seconds(k.pid) for k in kids)


class Meter:
    """A count that only grows (``read(pid)``), per process, between ``restart`` and ``used``."""

    def __init__(self, pids: Sequence[int], read: Callable[[int], float] = cpu_seconds) -> None:
        self.pids, self.read = list(pids), read
        self.restart()

    def restart(self) -> None:
        self.start = [self.read(pid) for pid in self.pids]

    def used(self) -> list[float]:
        return [self.read(pid) - s for pid, s in zip(self.pids, self.start, strict=True)]


def stolen_share(before: Any, after: Any) -> float:
    """The share of the machine's CPU time its hypervisor took between two readings of
    ``psutil.cpu_times()`` (``/proc/stat``'s first line): steal over all the times but guest and
    guest_nice, which are already counted in user and nice."""
    times = [f for f in after._fields if f not in ("guest", "guest_nice")]
    total = sum(getattr(after, f) - getattr(before, f) for f in times)
    return (after.steal - before.steal) / total if total > 0 else 0.0


class Steal:
    """``stolen_share`` since it was made."""

    def __init__(self) -> None:
        self.start = psutil.cpu_times()

    def share(self) -> float:
        return stolen_share(self.start, psutil.cpu_times())


def settle(pids: Sequence[int], idle_share: float, timeout: float, step: float = 0.5) -> float:
    """Wait until ``pids`` together use less than ``idle_share`` of a core over ``step`` seconds
    (a broker still working off the last run would skew the next); the seconds waited."""
    waited, meter = 0.0, Meter(pids)
    while waited < timeout:
        time.sleep(step)
        waited += step
        if sum(meter.used()) / step < idle_share:
            return waited
        meter.restart()
    return waited


# -- the kernel's TCP counters ----------------------------------------------------------------


def netstat_counters(text: str) -> dict[str, int]:
    """The counters of ``/proc/net/netstat``, named like "TcpExt.ListenOverflows": the file pairs
    a line of names with a line of values, each line starting with the group."""
    counters: dict[str, int] = {}
    lines = text.splitlines()
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        group, _, keys = names.partition(":")
        for key, value in zip(keys.split(), values.partition(":")[2].split(), strict=False):
            counters[f"{group}.{key}"] = int(value)
    return counters


KERNEL_COUNTERS = {
    "TcpExt.ListenOverflows": "listen-queue overflows",
    "TcpExt.TCPSynRetrans": "SYN retransmissions",
}
"""The counters that explain slow TCP connects; they cover every socket of the namespace."""


def tcp_counters() -> dict[str, int]:
    try:
        counters = netstat_counters(Path("/proc/net/netstat").read_text())
    except OSError:
        return {}
    return {name: counters[name] for name in KERNEL_COUNTERS if name in counters}


def node_stats(url: str) -> dict[str, Any]:
    """A node's ``GET /stats`` snapshot."""
    with urllib.request.urlopen(url, timeout=10) as answer:
        stats: dict[str, Any] = json.loads(answer.read())
        return stats


# -- Redis ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RedisReading:
    total: int
    calls: dict[str, int]


def redis_reading(info: Mapping[str, Any]) -> RedisReading:
    """The counters of a parsed ``INFO all`` (redis-py's ``Redis.info("all")``)."""
    calls = {
        key.removeprefix("cmdstat_"): int(value["calls"])
        for key, value in info.items()
        if key.startswith("cmdstat_") and isinstance(value, Mapping)
    }
    return RedisReading(int(info["total_commands_processed"]), calls)


OWN_INFO_CALLS = 1
"""Commands of ours between two readings: the first reading's INFO."""


def commands_between(before: RedisReading, after: RedisReading) -> tuple[int, dict[str, int]]:
    """Commands processed between two readings, ours excluded: the total, and per command."""
    calls = {
        n: c - before.calls.get(n, 0) for n, c in after.calls.items() if c > before.calls.get(n, 0)
    }
    if "info" in calls:
        calls["info"] -= OWN_INFO_CALLS
        if calls["info"] <= 0:
            del calls["info"]
    return after.total - before.total - OWN_INFO_CALLS, calls


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile; 0.0 for an empty sample."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return float(ordered[min(max(1, math.ceil(pct / 100 * len(ordered))), len(ordered)) - 1])


# -- the machine and the software -------------------------------------------------------------


def machine() -> str:
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    model = next(
        (ln.split(":", 1)[1].strip() for ln in cpuinfo if ln.startswith("model name")), "?"
    )
    mem_kib = status_field(Path("/proc/meminfo").read_text(), "MemTotal")
    debian = Path("/etc/debian_version")
    distro = f"Debian {debian.read_text().strip()}" if debian.exists() else platform.system()
    return (
        f"nproc {os.cpu_count()}, CPU {model}, RAM {mem_kib / 1024 / 1024:.1f} GiB, "
        f"{distro}, Linux {platform.release()}"
    )


def load_average() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def python_version() -> str:
    return f"{platform.python_implementation()} {sys.version.split()[0]}"
