"""The scale benchmark's pure parts: /proc and Redis INFO parsing, percentiles, merging the load
workers' reports, the fan-in's loss accounting and the report's file section."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.__main__ import split_scale
from bench.fanin import IdLedger, PublisherReport, SubscriberReport, account
from bench.fleet import ConnectReport, StatusReport
from bench.measure import (
    OWN_INFO_CALLS,
    RedisReading,
    Usage,
    bottleneck,
    commands_between,
    cpu_ticks,
    netstat_counters,
    percentile,
    redis_reading,
    vmrss_kib,
)
from bench.scale_report import BEGIN, END, error_summary, write_section

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


def test_bottleneck_flags_a_saturated_load_process_and_a_busy_machine() -> None:
    calm = Usage(10.0, broker=0.5, load=(0.3, 0.2), services=0.1, machine=1.2)
    assert bottleneck(calm, cores=2) == ""
    client = Usage(10.0, broker=0.5, load=(0.9, 0.2), services=0.1, machine=1.7)
    assert bottleneck(client, cores=2).startswith("client-bound")
    busy = Usage(10.0, broker=0.2, load=(0.1, 0.1), services=0.1, machine=1.95)
    assert "machine-bound" in bottleneck(busy, cores=2)
    assert busy.others == pytest.approx(1.45)


def test_connect_reports_merge_counts_samples_and_span() -> None:
    a = ConnectReport(attempted=3, connected=2, refused={3: 1}, latencies=[0.1, 0.2])
    a.started, a.last_connack, a.errors = 100.0, 101.0, {"reset": 1}
    b = ConnectReport(attempted=4, connected=2, refused={3: 1, 5: 1}, closed=1, timed_out=0)
    b.started, b.last_connack, b.latencies, b.errors = 100.1, 102.5, [0.3, 0.4], {"reset": 2}
    merged = ConnectReport.merged([a, b])
    assert (merged.attempted, merged.connected) == (7, 4)
    assert merged.refused == {3: 2, 5: 1}
    assert merged.failed == 4  # 3 refused + 1 closed
    assert merged.latencies == [0.1, 0.2, 0.3, 0.4]
    assert merged.seconds == pytest.approx(2.5)
    assert merged.errors == {"reset": 3}


def test_status_reports_merge() -> None:
    a = StatusReport(devices=2, owed=4, owed_received=4, complete=2, last_complete=5.0)
    b = StatusReport(devices=3, owed=6, owed_received=5, complete=2, last_complete=7.0)
    b.incomplete = ["c9"]
    merged = StatusReport.merged([a, b])
    assert (merged.devices, merged.owed, merged.owed_received, merged.complete) == (5, 10, 9, 4)
    assert merged.last_complete == 7.0
    assert merged.incomplete == ["c9"]


def test_id_ledger_names_the_message_of_each_packet_id() -> None:
    ledger = IdLedger(range(1, 4))
    drawn = [ledger.popleft() for _ in range(3)]  # ids 1, 2, 3 for messages 0, 1, 2
    ledger.extend([2])  # PUBACK 2 frees it
    drawn.append(ledger.popleft())  # message 3 reuses id 2
    assert drawn == [1, 2, 3, 2]
    assert ledger.seq_of == {1: 0, 2: 3, 3: 2}
    assert ledger.drawn == 4


def test_fanin_accounting_counts_lost_as_acknowledged_and_never_received() -> None:
    pubs = [
        PublisherReport("t/0", sent=5, acked=[0, 1, 2, 3], drawn=5, lost_connection=False),
        PublisherReport("t/1", sent=3, acked=[0, 1, 2], drawn=3, lost_connection=False),
    ]
    sub = SubscriberReport(received=7, seen={"t/0": {0, 2, 3, 4}, "t/1": {0, 1}}, duplicates=1)
    a = account(pubs, sub)
    assert (a.sent, a.acked, a.distinct, a.received) == (8, 7, 6, 7)
    assert a.lost == 2  # t/0 seq 1 and t/1 seq 2: acknowledged, never received
    assert a.unacked == 1  # t/0 seq 4: received, but its PUBACK never came
    assert a.duplicates == 1
    assert a.problems == []


def test_fanin_accounting_reports_a_ledger_out_of_step() -> None:
    pubs = [PublisherReport("t/0", sent=5, acked=[0, 0], drawn=4, lost_connection=True)]
    problems = account(pubs, SubscriberReport()).problems
    assert len(problems) == 3


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


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("all", ("all", True)),
        ("single", ("single", False)),
        ("scale", ("", True)),
        ("fanin-qos0, scale", ("fanin-qos0", True)),
        ("fanin-qos0,routing", ("fanin-qos0,routing", False)),
    ],
)
def test_python_m_bench_runs_the_scale_scenarios_with_all_or_by_name(
    spec: str, expected: tuple[str, bool]
) -> None:
    assert split_scale(spec) == expected
