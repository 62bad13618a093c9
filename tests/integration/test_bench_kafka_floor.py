"""The benchmark's Kafka alone (``bench.kafka_floor``), on a real Kafka: under the latency rows,
every record it writes is read back and timed, and the report says so; under the fan-in rows, a
flood read back, with its rate and CPU a record."""

from __future__ import annotations

import os

import pytest

from bench import kafka_floor
from bench.throughput import Run, Settings, floor_sentence


def test_every_record_written_is_read_and_timed(kafka_bootstrap: str) -> None:
    floor = kafka_floor.measure(kafka_bootstrap, 200.0, 1.0)
    assert floor.sent == floor.received == 200
    assert 0.0 < floor.p50_ms <= floor.p99_ms < 1000.0
    assert 0.0 <= floor.stolen <= 1.0
    again = kafka_floor.measure(kafka_bootstrap, 200.0, 0.5)  # the topic exists now
    assert again.sent == again.received == 100


def test_the_report_gives_the_floor_only_when_measured() -> None:
    run = Run(Settings(), "cmd")
    assert floor_sentence(run) == ""
    run.kafka_floor = kafka_floor.Floor(10_000, 9_990, 0.55, 11.4, stolen=0.04)
    text = floor_sentence(run)
    assert (
        "p50 0.55 ms, p99 11.40 ms (9,990 of 10,000 read; 4% of the machine's CPU time stolen "
        "meanwhile)" in text
    )
    assert "floor under Headwater's latency rows" in text


def test_a_flood_is_read_back_and_its_cpu_a_record_counted(kafka_bootstrap: str) -> None:
    ceiling = kafka_floor.ceiling(kafka_bootstrap, 1.0, [os.getpid()], warmup=0.5)
    assert ceiling.records > 1_000  # read back in the measured second
    assert ceiling.rate == ceiling.records / 1.0
    assert 0.0 < ceiling.client_us < 1_000.0
    # the "Kafka" counted here is this process: read in /proc's ticks of 10 ms
    assert ceiling.kafka_us == pytest.approx(ceiling.client_us, rel=0.25)
    assert kafka_floor.ceiling(kafka_bootstrap, 0.5, warmup=0.2).kafka_us == 0.0  # none counted
