"""The hostile-client probes' pure parts: the raw MQTT framing the load uses, each probe's cell,
the issue's table and the report's file section."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest

from bench.__main__ import build_parser
from bench.hostile import (
    BEGIN,
    END,
    PROBES,
    Deep,
    Flood,
    Groups,
    HostileRun,
    Outcome,
    Retained,
    Share,
    Theft,
    render,
    table,
)
from bench.mqtt import split_packet, varint
from bench.report import write_section


def test_varint_is_mqtt_remaining_length() -> None:
    assert varint(0) == b"\x00"
    assert varint(127) == b"\x7f"
    assert varint(128) == b"\x80\x01"
    assert varint(16_000_000) == b"\x80\xc8\xd0\x07"


def test_split_packet_takes_whole_packets_only() -> None:
    buf = bytearray(b"\x20\x02\x01\x00\x90\x03\x00\x01")
    assert split_packet(buf) == (0x20, b"\x01\x00")
    assert split_packet(buf) is None  # the SUBACK's last byte has not come
    buf += b"\x80"
    assert split_packet(buf) == (0x90, b"\x00\x01\x80")
    assert buf == bytearray()


def test_theft_cell_says_what_bob_and_alice_saw() -> None:
    today = Theft((0, True), 0, (0, True), 0)
    assert today.cell() == (
        "bob: CONNACK 0 (session present 1), got 0 of alice's messages; "
        "alice back: CONNACK 0 (session present 1), got 0 of her 5"
    )
    refused = Theft((5, False), 0, (0, True), 5)
    assert refused.cell() == (
        "bob: CONNACK 5 (session present 0); alice back: CONNACK 0 (session present 1), "
        "got 5 of her 5"
    )
    assert Theft(None, 0, None, 0).cell().startswith("bob: closed before a CONNACK;")


def test_memory_cells_give_signed_growth_in_mib() -> None:
    assert Flood(200, (60_000, 270_000)).cell() == (
        "200 of 200 still open after 3 s; RSS +205 MiB (at most)"
    )
    assert Deep(None, (8_000, 8_000)).cell() == "connection closed; RSS +0 MiB"
    assert Deep((0,) * 8, (60_000, 122_500)).cell() == "SUBACK 0x00 x8; RSS +61 MiB"
    assert Deep((0x80, 0, 0x80), (1024, 1024)).cell() == "SUBACK 0x00 x1, 0x80 x2; RSS +0 MiB"


def test_share_and_groups_cells() -> None:
    share = Share((("$share/q1/p.t/x", 0), ("$share/q1.p/t/x", 100)))
    assert share.cell() == "`$share/q1/p.t/x` 0 of 100, `$share/q1.p/t/x` 100 of 100"
    assert Groups(300, (22, 1223)).cell() == "threads 22 -> 1,223 (300 of 300 granted)"


def test_retained_cell_shows_redis_for_headwater_and_rss_otherwise() -> None:
    mib = 1024 * 1024
    headwater = Retained(5000, 0, (1, 1, 1), (6 * mib, 9 * mib, 8 * mib))
    assert headwater.cell() == (
        "5,000 of 5,000 stored, 0 left after the clear; "
        "Redis 6.0 MiB -> 9.0 MiB set -> 8.0 MiB cleared (33% given back)"
    )
    mosquitto = Retained(5000, 0, (8192, 12288, 12288))
    assert mosquitto.cell() == (
        "5,000 of 5,000 stored, 0 left after the clear; "
        "RSS 8.0 MiB -> 12.0 MiB -> 12.0 MiB (0% given back)"
    )


def run_of(outcomes: list[Outcome]) -> HostileRun:
    started = datetime.datetime(2026, 11, 26, 14, 0, tzinfo=datetime.UTC)
    run = HostileRun("python -m bench --scenarios hostile", started, "this checkout at abc")
    run.outcomes = outcomes
    run.seconds = 90.0
    return run


def test_table_has_a_row_per_probe_mosquitto_first_and_says_what_failed_or_did_not_run() -> None:
    run = run_of([
        Outcome("theft", "headwater", "Headwater (1 node)", Theft((0, True), 0, (0, True), 0)),
        Outcome("theft", "mosquitto", "mosquitto 2.0.11", Theft((0, True), 0, (0, True), 0)),
        Outcome("flood", "headwater", "headwater", error="headwater-n1 exited with code 2\nlog"),
    ])  # fmt: skip
    lines = table(run)
    assert lines[0] == "| probe | mosquitto 2.0.11 | Headwater (1 node) |"
    assert lines[1] == "|---|---|---|"
    assert len(lines) == 2 + len(PROBES)
    assert lines[2].startswith(f"| {PROBES['theft']} | bob: CONNACK 0")
    assert lines[3] == (
        f"| {PROBES['flood']} | not run | failed: headwater-n1 exited with code 2 |"
    )


def test_section_is_marked_and_replaces_its_own_part_only(tmp_path: Path) -> None:
    section = render(run_of([]))
    assert section.startswith(f"{BEGIN}\n## Hostile clients")
    assert section.rstrip("\n").endswith(END)
    assert "| Command | `python -m bench --scenarios hostile` |" in section
    assert "| Took | 1.5 min |" in section
    path = tmp_path / "benchmarks.md"
    path.write_text(f"# Benchmarks\n\nmain\n\n{BEGIN}\nold\n{END}\n\n## after\n")
    write_section(path, section, (BEGIN, END))
    text = path.read_text()
    assert "old" not in text
    assert text.startswith("# Benchmarks\n\nmain\n\n" + section.rstrip("\n"))
    assert text.endswith("\n\n## after\n")


def test_python_m_bench_runs_the_hostile_probes_by_their_subcommand() -> None:
    args = build_parser().parse_args(["hostile", "--brokers", "headwater,mosquitto"])
    assert (args.command, args.brokers) == ("hostile", "headwater,mosquitto")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--scenarios", "hostile"])
