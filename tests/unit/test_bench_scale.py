"""The measurement parts every subcommand shares (/proc and Redis INFO parsing, percentiles, the
report's file section) and the scale subcommand's cells."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.measure import (
    OWN_INFO_CALLS,
    RedisReading,
    commands_between,
    cpu_ticks,
    netstat_counters,
    percentile,
    redis_reading,
    vmrss_kib,
)
from bench.report import error_summary, markers, write_section
from bench.scale import Connects, Idle, Storm, idle_cells, storm_cell

BEGIN, END = markers("scale")

STATUS = """Name:\tpython
Umask:\t0022
State:\tS (sleeping)
VmPeak:\t  812340 kB
VmRSS:\t   57244 kB
RssAnon:\t   40000 kB
Threads:\t9
"""


def test_vmrss_is_read_in_kib() -> None:
    assert vmrss_kib(STATUS) == 57244


def test_vmrss_missing_is_an_error() -> None:
    with pytest.raises(ValueError):
        vmrss_kib("Name:\tzombie\nState:\tZ (zombie)\n")


def stat_line(comm: str, utime: int, stime: int) -> str:
    # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime
    return f"4242 ({comm}) S 1 4242 4242 0 -1 4194560 100 0 0 0 {utime} {stime} 0 0 20 0 9 0\n"


@pytest.mark.parametrize("comm", ["python", "a b", "x) S 1 2 (y", "(("])
def test_cpu_ticks_are_utime_plus_stime_whatever_the_command_name(comm: str) -> None:
    assert cpu_ticks(stat_line(comm, 1234, 56)) == 1290


def test_netstat_pairs_names_with_values() -> None:
    text = (
        "TcpExt: SyncookiesSent ListenOverflows ListenDrops\n"
        "TcpExt: 3 17 19\n"
        "IpExt: InNoRoutes InOctets\n"
        "IpExt: 0 123456789012\n"
    )
    counters = netstat_counters(text)
    assert counters["TcpExt.ListenOverflows"] == 17
    assert counters["TcpExt.ListenDrops"] == 19
    assert counters["IpExt.InOctets"] == 123456789012


def info(total: int, **calls: int) -> dict[str, object]:
    parsed: dict[str, object] = {"total_commands_processed": total, "redis_version": "7.0.15"}
    for name, n in calls.items():
        parsed[f"cmdstat_{name}"] = {"calls": n, "usec": 10 * n, "usec_per_call": 10.0}
    return parsed


def test_redis_reading_takes_the_total_and_the_calls_per_command() -> None:
    reading = redis_reading(info(40, hset=30, evalsha=9, hello=1))
    assert reading == RedisReading(40, {"hset": 30, "evalsha": 9, "hello": 1})


def test_commands_between_readings_leave_our_own_info_out() -> None:
    # The first reading's INFO is counted after it answered: it shows in the second reading only.
    before = redis_reading(info(40, hset=30, evalsha=9, hello=1))
    after = redis_reading(info(40 + 25 + OWN_INFO_CALLS, hset=50, evalsha=14, hello=1, info=1))
    total, calls = commands_between(before, after)
    assert total == 25
    assert calls == {"hset": 20, "evalsha": 5}


def test_commands_between_keep_info_calls_that_are_not_ours() -> None:
    before = redis_reading(info(10, info=2))
    after = redis_reading(info(10 + 3 + OWN_INFO_CALLS, info=2 + 3 + OWN_INFO_CALLS))
    assert commands_between(before, after) == (3, {"info": 3})


def test_percentile_is_nearest_rank() -> None:
    values = [float(x) for x in range(100, 0, -1)]  # 1..100, unordered
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile(values, 100) == 100.0
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) == 0.0
    assert percentile([1.0, 2.0, 3.0, 1000.0], 99) == 1000.0


def test_write_section_replaces_its_own_part_only(tmp_path: Path) -> None:
    path = tmp_path / "benchmarks.md"
    path.write_text("# Benchmarks\n\nmain table\n")
    write_section(path, f"{BEGIN}\nfirst\n{END}\n")
    sessions = "<!-- sessions:begin -->\nsessions\n<!-- sessions:end -->\n"
    path.write_text(path.read_text() + "\n" + sessions)
    write_section(path, f"{BEGIN}\nsecond\n{END}\n")
    text = path.read_text()
    assert "first" not in text
    assert text.index("main table") < text.index("second") < text.index("sessions")


def test_write_section_starts_a_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "docs" / "benchmarks.md"
    write_section(path, f"{BEGIN}\nonly\n{END}\n")
    assert path.read_text() == f"# Benchmarks\n\n{BEGIN}\nonly\n{END}\n"


def test_a_failure_is_summed_up_on_one_line() -> None:
    traceback = "node n1 exited (log: x.log); last lines:\n  File 'a.py'\n    f()\nKeyError: 'k'\n"
    assert error_summary(traceback) == "node n1 exited (log: x.log); last lines: ... KeyError: 'k'"
    assert error_summary("timed out") == "timed out"
    assert error_summary("") == "?"


def test_connects_give_the_rate_and_the_connect_times() -> None:
    tally = Connects(connected=500, refused=2, seconds=0.5, times=[0.01] * 98 + [0.2, 0.3])
    assert tally.text() == "1,000/s (500 in 0.50 s; p50 10.0 ms, p99 200.0 ms; 2 refused)"


def test_idle_cells_give_memory_per_connection_and_per_filter() -> None:
    idle = Idle("Headwater (1 node)", Connects(connected=1000, seconds=1.0, times=[0.001]))
    idle.rss_kib, idle.cpu, idle.redis_per_s = (50_000, 54_000, 54_100, 54_600), 0.0125, 21.0
    cells = idle_cells(idle)
    assert cells[1:] == ["4.10 KB", "1.25% of a core", "21.0/s", "512 B"]
    failed = Idle("mosquitto", Connects(), error="refused")
    assert idle_cells(failed) == ["FAILED: refused"] * 5


def test_the_storm_cell_counts_persistent_sessions_and_owed_messages() -> None:
    st = Storm("mosquitto", 301, Connects(connected=301, present=151, seconds=2.0), 2.5, 302)
    assert storm_cell(st) == (
        "last CONNACK after 2.0 s, all owed messages after 2.5 s; 0 refused; sessions present "
        "151/151; owed received 302/302 (0 duplicates)"
    )
