"""The benchmark's Kafka-alone floor under the latency rows (``bench.kafka_floor``), on a real
Kafka: every record it writes is read back and timed, and the report says so."""

from __future__ import annotations

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
