"""What the scale benchmark reads off the machine: a process's memory and CPU time from ``/proc``,
Redis's command counters from ``INFO``, and percentiles of a sample.

The parsers are pure (text or a parsed ``INFO`` mapping in, numbers out); the readers around them
only open a file or ask the server.  What each figure is:

* resident memory: ``VmRSS`` of ``/proc/<pid>/status``, in KiB (the kernel's "kB");
* CPU time: ``utime + stime`` of ``/proc/<pid>/stat`` (fields 14 and 15, counted after the
  parenthesised command name, which may itself hold spaces and parentheses), in clock ticks; the
  kernel sums them over every thread of the process;
* Redis commands: ``total_commands_processed`` and the ``cmdstat_*`` calls of ``INFO``.  The server
  counts a command once it has answered it, so a reading's own ``INFO`` is absent from that
  reading and present in every later one: between two readings exactly one command is ours.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
"""Clock ticks per second, the unit of ``utime`` and ``stime``."""


def vmrss_kib(status: str) -> int:
    """``VmRSS`` in KiB from the text of ``/proc/<pid>/status``."""
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise ValueError("no VmRSS line: the process has exited or is a zombie")


def cpu_ticks(stat: str) -> int:
    """``utime + stime`` in clock ticks from the text of ``/proc/<pid>/stat``."""
    fields = stat[stat.rindex(")") + 2 :].split()
    # fields[0] is field 3 (state): utime and stime are fields 14 and 15
    return int(fields[11]) + int(fields[12])


class ProcessMeter:
    """Memory and CPU time of a set of processes, summed, read from ``/proc``."""

    def __init__(self, pids: Sequence[int]) -> None:
        self.pids = list(pids)

    def rss_kib(self) -> int:
        return sum(vmrss_kib(Path(f"/proc/{pid}/status").read_text()) for pid in self.pids)

    def cpu_seconds(self) -> float:
        ticks = sum(cpu_ticks(Path(f"/proc/{pid}/stat").read_text()) for pid in self.pids)
        return ticks / CLOCK_TICKS


def netstat_counters(text: str) -> dict[str, int]:
    """The counters of ``/proc/net/netstat`` (or ``/proc/net/snmp``), named like
    "TcpExt.ListenOverflows": the file pairs a line of names with a line of values, each line
    starting with the group."""
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
"""The counters of ``/proc/net/netstat`` that explain slow TCP connects, and what they count.
They cover every socket of the network namespace, not only the benchmark's."""


def tcp_counters() -> dict[str, int]:
    try:
        counters = netstat_counters(Path("/proc/net/netstat").read_text())
    except OSError:
        return {}
    return {name: counters[name] for name in KERNEL_COUNTERS if name in counters}


# -- Redis ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RedisReading:
    """One ``INFO`` reading: commands processed in total and per command."""

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
    """Commands the server processed between two readings, ours excluded: the total, and the
    count per command (commands not run meanwhile left out)."""
    calls = {
        name: n - before.calls.get(name, 0)
        for name, n in after.calls.items()
        if n > before.calls.get(name, 0)
    }
    if "info" in calls:
        calls["info"] -= OWN_INFO_CALLS
        if calls["info"] <= 0:
            del calls["info"]
    return after.total - before.total - OWN_INFO_CALLS, calls


# -- samples ----------------------------------------------------------------------------------


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile (the smallest value with at least ``pct`` % of the sample at or
    below it); 0.0 for an empty sample."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return float(ordered[min(rank, len(ordered)) - 1])


# -- CPU over a window ------------------------------------------------------------------------


def busy_seconds() -> float:
    """CPU seconds the whole machine has been busy (all cores: not idle, not waiting for I/O)."""
    t = psutil.cpu_times()
    return float(sum(t) - t.idle - getattr(t, "iowait", 0.0))


@dataclass(frozen=True, slots=True)
class Usage:
    """CPU used over a window: shares of one core, and busy cores of the machine."""

    seconds: float
    broker: float
    """The broker's processes together."""
    load: tuple[float, ...]
    """Each load-generator process."""
    services: float
    """Kafka and Redis together (when the broker uses them)."""
    machine: float
    """Busy cores of the whole machine."""
    kernel: dict[str, int] = field(default_factory=dict)
    """Growth of the kernel's TCP counters (:data:`KERNEL_COUNTERS`) over the window."""

    @property
    def others(self) -> float:
        """Busy cores of processes that are not the benchmark's (the machine may be shared)."""
        return max(0.0, self.machine - self.broker - sum(self.load) - self.services)


CLIENT_BOUND = 0.85
"""A load-generator process using this share of a core or more was likely the bottleneck."""
MACHINE_BOUND = 0.9
"""A machine busy on this share of its cores or more was the bottleneck."""


def bottleneck(usage: Usage, cores: int) -> str:
    """What limited a run besides the broker, or "" when nothing did."""
    notes = []
    busiest = max(usage.load, default=0.0)
    if busiest >= CLIENT_BOUND:
        notes.append(f"client-bound: a load process used {busiest:.0%} of a core")
    if usage.machine >= MACHINE_BOUND * cores:
        notes.append(
            f"machine-bound: {usage.machine:.2f} of {cores} cores busy, "
            f"{usage.others:.2f} of them by processes not the benchmark's"
        )
    return "; ".join(notes)


class Window:
    """CPU of the broker, of each load process, of Kafka and Redis, and of the machine, since
    ``start()``."""

    def __init__(
        self, broker_pids: Sequence[int], load_pids: Sequence[int], service_pids: Sequence[int]
    ) -> None:
        self.meters = [ProcessMeter(broker_pids), ProcessMeter(service_pids)]
        self.meters += [ProcessMeter([pid]) for pid in load_pids]
        self.start()

    def start(self) -> None:
        self.started = time.monotonic()
        self.cpu0 = [m.cpu_seconds() for m in self.meters]
        self.machine0 = busy_seconds()
        self.kernel0 = tcp_counters()

    def usage(self) -> Usage:
        seconds = max(1e-9, time.monotonic() - self.started)
        shares = [
            (m.cpu_seconds() - c0) / seconds for m, c0 in zip(self.meters, self.cpu0, strict=True)
        ]
        machine = (busy_seconds() - self.machine0) / seconds
        kernel = {k: n - self.kernel0.get(k, 0) for k, n in tcp_counters().items()}
        return Usage(seconds, shares[0], tuple(shares[2:]), shares[1], machine, kernel)
