"""The load generator and issue 26's table: the bench's own codec, the loss accounting, the
report, the one entry point, and short runs against a real mosquitto (real sockets)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from contextlib import ExitStack
from pathlib import Path

import psutil
import pytest

from bench import brokers, mqtt
from bench.__main__ import COMMANDS, build_parser
from bench.load import Report, Role
from bench.measure import Steal, jit_seconds, stolen_share
from bench.throughput import (
    SCENARIOS,
    Result,
    Run,
    Settings,
    account,
    measure,
    render,
    warmed,
)
from headwater.services.java import require_java


def test_the_codec_frames_what_it_encodes() -> None:
    buf = bytearray(mqtt.publish("lg/7", b"x" * 64, 9) + mqtt.publish("lg/8", b"y", qos=0))
    buf += mqtt.puback(9)[:3]
    packets = mqtt.split_all(buf)
    assert [mqtt.parse_publish(*p) for p in packets] == [
        mqtt.Publish("lg/7", b"x" * 64, 1, 9, False),
        mqtt.Publish("lg/8", b"y", 0, 0, False),
    ]
    assert buf == bytearray(mqtt.puback(9)[:3])  # an incomplete packet stays


def test_the_proxy_header_is_haproxys_v2_for_tcp4() -> None:
    header = mqtt.proxy_v2("127.0.0.1", 1883)
    assert header[:12] == b"\r\n\r\n\x00\r\nQUIT\n" and header[12:14] == b"\x21\x11"
    assert int.from_bytes(header[14:16], "big") == 12 == len(header) - 16
    assert header[-2:] == (1883).to_bytes(2, "big")
    assert mqtt.Endpoint("127.0.0.1", 1883).hello() == b""


def test_lost_is_acknowledged_and_never_received() -> None:
    pubs, subs = Report(), Report()
    pubs.acked = {1: {0, 1, 2, 3}, 2: {0, 1}}
    pubs.sent, pubs.sent_window = 7, 6
    subs.got = {1: {0, 2, 3}, 2: {0, 1, 5}}
    subs.received, subs.received_window, subs.duplicates = 7, 5, 1
    result = Result("fanin-qos1-paced", "headwater")
    account(result, [], subs, pubs, 2.0)
    assert (result.sent, result.lost, result.duplicates) == (6, 1, 1)
    assert (result.delivered, result.offered) == (2.5, 3.0)


def test_qos0_loss_counts_every_subscriber_copy() -> None:
    at = mqtt.Endpoint("127.0.0.1", 1)
    roles = [Role("sub", at, 25), Role("sub", at, 25), Role("flood0", at, 1)]
    pubs, subs = Report(sent=100), Report(received=4_900)
    result = Result("fanout-qos0", "mosquitto")
    account(result, roles, subs, pubs, 1.0)
    assert (result.sent, result.lost) == (5_000, 100)


def test_reports_merge() -> None:
    a = Report(sent=1, received=2, latencies=[0.1], acked={1: {0}}, errors=["x"])
    a.merge(Report(sent=3, received=4, latencies=[0.2], acked={1: {1}, 2: {0}}))
    assert (a.sent, a.received, a.latencies, a.acked) == (4, 6, [0.1, 0.2], {1: {0, 1}, 2: {0}})


def test_the_table_puts_mosquitto_first_and_the_ratio_last() -> None:
    run = Run(Settings(), "python -m bench throughput", "this checkout at abc", "2.0.11")
    run.labels = {"mosquitto": "mosquitto 2.0.11", "headwater": "Headwater (1 node)"}
    run.results = [
        Result("fanin-qos0", "mosquitto", delivered=95_190, sent=10, cpu_us=9.5),
        Result("fanin-qos0", "headwater", delivered=33_233, sent=10, cpu_us=30.3),
        Result("latency-qos1", "mosquitto", p50_ms=0.2, p99_ms=1.26),
        Result("latency-qos1", "headwater", error="FAILED: boom"),
    ]
    section = render(run)
    assert section.startswith("<!-- throughput:begin -->\n## Throughput")
    assert (
        "| scenario (64-byte payloads) | mosquitto 2.0.11 | Headwater (1 node) | "
        "ratio vs mosquitto 2.0.11 |" in section
    )
    assert (
        "| 95,190 msg/s, 9.5 us, lost 0.0% | 33,233 msg/s, 30.3 us, lost 0.0% | 0.35x |" in section
    )
    assert "| p99 1.26 ms (p50 0.20 ms), lost 0 | FAILED: boom |  |" in section


def test_headwaters_row_is_judged_by_issue_26s_targets() -> None:
    run = Run(Settings(), "python -m bench throughput", "this checkout at abc", "2.0.11")
    run.labels = {"mosquitto": "mosquitto 2.0.11", "headwater": "Headwater (1 node)"}
    run.results = [
        Result("fanin-qos0", "mosquitto", delivered=95_190, sent=10),
        Result("fanin-qos0", "headwater", delivered=47_600, sent=10),
        Result("fanin-qos1-paced", "mosquitto", delivered=19_998, p99_ms=10.7),
        Result("fanin-qos1-paced", "headwater", delivered=19_100, p99_ms=51.0),
        Result("fanout-qos0", "mosquitto", delivered=300_000, sent=10),
        Result("fanout-qos0", "headwater", delivered=510_000, sent=10),
        Result("latency-qos1", "headwater", p99_ms=2.9),
        Result("connect-clean", "headwater", delivered=3_000),
    ]
    rows = {line.split(" | ")[0][2:]: line for line in render(run).splitlines()}
    verdicts = {SCENARIOS[k].title: v for k, v in [
        ("fanin-qos0", "| met (>= 0.5x mosquitto) |"),
        ("fanin-qos1-paced", "| NOT met (>= 19,000 msg/s, p99 <= 50 ms, 0 lost) |"),
        ("fanout-qos0", "| met (>= 1.5x mosquitto and >= 500,000/s) |"),
        ("latency-qos1", "| met (p99 <= 3 ms) |"),
        ("connect-clean", "| not judged: no mosquitto figure (>= mosquitto) |"),
    ]}  # fmt: skip
    assert {t: rows[t].endswith(v) for t, v in verdicts.items()} == dict.fromkeys(verdicts, True)
    assert "| issue 26's target |" in render(run)


def test_one_entry_point_with_subcommands() -> None:
    assert set(COMMANDS) >= {"throughput", "scale", "sessions", "profile", "hostile", "spark"}
    args = build_parser().parse_args(
        ["throughput", "--brokers", "headwater,mosquitto", "--headwater-rev", "HEAD~3", "--quick"]
    )
    assert (args.command, args.headwater_rev, args.quick) == ("throughput", "HEAD~3", True)
    assert set(SCENARIOS) >= {"fanin-qos0", "fanin-qos1-paced", "fanin-qos1-flood",
                              "fanout-qos0", "latency-qos0", "latency-qos1", "connect-clean",
                              "connect-persistent", "connect-sub-clean",
                              "connect-sub-persistent"}  # fmt: skip


needs_mosquitto = pytest.mark.skipif(shutil.which("mosquitto") is None and
                                     not Path("/usr/sbin/mosquitto").exists(),
                                     reason="mosquitto is not installed")  # fmt: skip


@needs_mosquitto
def test_a_paced_qos1_run_against_mosquitto_delivers_everything_it_acknowledged(
    tmp_path: Path,
) -> None:
    s = Settings(duration=1.0, warmup=0.2, publishers=2, paced_rate=400.0, drain_max=5.0)
    with ExitStack() as stack:
        broker = brokers.start_mosquitto(tmp_path, stack)
        result = measure(SCENARIOS["fanin-qos1-paced"], broker, s, 100)
    assert result.error == ""
    assert 300 <= result.delivered <= 500 and result.sent >= 400
    assert (result.lost, result.duplicates) == (0, 0)
    assert 0 < result.p50_ms <= result.p99_ms < 1_000


@needs_mosquitto
def test_connect_cycles_against_mosquitto_are_counted(tmp_path: Path) -> None:
    s = Settings(duration=1.0, warmup=0.2, in_flight=20)
    with ExitStack() as stack:
        broker = brokers.start_mosquitto(tmp_path, stack)
        result = measure(SCENARIOS["connect-sub-clean"], broker, s, 100)
    assert not [n for n in result.notes if "failed cycles" in n] and result.delivered > 50
    assert result.cpu_us > 0


def test_an_older_revs_launcher_is_refused_a_flag_it_lacks_before_anything_starts(
    tmp_path: Path,
) -> None:
    hw = brokers.Headwater.at("12cb040", tmp_path)  # before `dev up --export` existed
    assert {"--nodes", "--port", "--state-dir", "--workers"} <= hw.up_flags
    assert "--export" not in hw.up_flags and "--export" in brokers.Headwater().up_flags
    with ExitStack() as stack, pytest.raises(RuntimeError, match=r"12cb0403ba .* has no --export"):
        hw.start(tmp_path, stack, up_args=["--export", "a/#=mirror"])
    assert not list(tmp_path.glob("cluster-*.log"))


def test_jit_seconds_reads_a_jvms_compiler_threads_and_nothing_else(tmp_path: Path) -> None:
    """The warm-up waits on these threads going quiet: a JVM that names them otherwise would end
    it after one turn, so a real JVM compiling (``-Xcomp``) must show some of their CPU."""
    java = require_java()
    source = tmp_path / "Spin.java"
    source.write_text(
        "public class Spin { public static void main(String[] a) throws Exception {"
        " Thread.sleep(60000); } }"
    )
    jvm = subprocess.Popen([java, "-Xcomp", str(source)])
    try:
        deadline = time.monotonic() + 30
        while jit_seconds(jvm.pid) == 0.0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert jit_seconds(jvm.pid) > 0.0
    finally:
        jvm.kill()
        jvm.wait()
    assert jit_seconds(os.getpid()) == 0.0  # no JVM: no compiler threads
    assert jit_seconds(jvm.pid) == 0.0  # gone


def test_the_report_says_how_long_kafka_was_warmed_and_how_quiet_its_jit_was() -> None:
    warm = Run(Settings(), "cmd", warmed=(47.2, 0.031))
    assert "Kafka warmed first by 47 s" in warmed(warm)
    assert "3.1% of a core" in warmed(warm)
    assert "still compiling" not in warmed(warm)
    assert "still compiling at WARM_MAX" in warmed(Run(Settings(), "cmd", warmed=(181.0, 0.2)))
    assert warmed(Run(Settings(), "cmd")) == "Kafka not warmed up"


def test_stolen_time_is_steal_over_all_of_the_machines_cpu_time() -> None:
    reading = type(psutil.cpu_times())._make  # user nice system idle iowait irq softirq steal ...
    before = reading([100.0, 0.0, 50.0, 800.0, 10.0, 0.0, 5.0, 35.0, 7.0, 0.0])
    after = reading([200.0, 0.0, 100.0, 900.0, 10.0, 0.0, 5.0, 85.0, 9.0, 0.0])
    assert stolen_share(before, after) == 50 / 300  # guest (7 -> 9) is inside user already
    assert stolen_share(before, before) == 0.0
    assert 0.0 <= Steal().share() <= 1.0


def test_the_report_says_what_its_stolen_share_is() -> None:
    run = Run(Settings(), "python -m bench throughput")
    run.labels = {"headwater": "Headwater (1 node)"}
    run.results = [Result("latency-qos1", "headwater", p99_ms=9.2)]
    assert "Stolen: the share of the machine's CPU time its hypervisor gave elsewhere" in " ".join(
        render(run).split()
    )


def test_the_report_says_where_the_machines_cpu_went_in_each_run() -> None:
    run = Run(Settings(), "python -m bench throughput")
    run.labels = {"mosquitto": "mosquitto 2.0.11", "headwater": "Headwater (1 node)"}
    run.results = [
        Result("fanin-qos1-paced", "mosquitto", broker_cpu=0.537, load_cpu=[0.93, 0.453]),
        Result("fanin-qos1-paced", "headwater", broker_cpu=0.904, services_cpu=[0.278, 0.004],
               load_cpu=[0.849, 0.217], stolen=0.0125),
        Result("fanin-qos0", "headwater", error="FAILED: boom"),
    ]  # fmt: skip
    lines = render(run).splitlines()
    cores = os.cpu_count() or 1
    idle = [
        max(0.0, cores - 0.537 - 1.383),
        max(0.0, cores - 0.904 - 0.282 - 1.066 - 0.0125 * cores),
    ]
    assert f"Where the machine's {cores} cores went in each measured window" in " ".join(lines)
    assert (
        f"| `fanin-qos1-paced` | mosquitto 2.0.11 | 54% | - | 138% | 0% | {idle[0]:.0%} |" in lines
    )
    assert (
        f"| `fanin-qos1-paced` | Headwater (1 node) | 90% | 28%, 0% | 107% | {0.0125 * cores:.0%} "
        f"| {idle[1]:.0%} |" in lines
    )
    assert not [line for line in lines if line.startswith("| `fanin-qos0`")]  # a failed run


def test_a_stopped_clusters_kafka_data_goes_and_its_logs_stay(tmp_path: Path) -> None:
    state = tmp_path / "cluster-1"
    for data in (state / "kafka" / "data", state / "kafka" / "broker-2" / "data"):
        data.mkdir(parents=True)
        (data / "meta.properties").write_text("node.id=1\n")
        (data / "headwater.messages-0").mkdir()
    (state / "kafka" / "kafka.log").write_text("started\n")
    (state / "nodes").mkdir()
    (state / "nodes" / "node0.log").write_text("ready\n")
    brokers.drop_kafka_data(state)
    assert sorted(p.relative_to(state).as_posix() for p in state.rglob("*")) == [
        "kafka", "kafka/broker-2", "kafka/kafka.log", "nodes", "nodes/node0.log",
    ]  # fmt: skip
