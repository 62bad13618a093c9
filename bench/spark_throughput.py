"""Throughput of the traffic job: records per second through Kafka source, Avro decoding and the
windowed aggregation, on this machine.

Produces ``--records`` log records (``router.record`` encoding, keyed and partitioned like a
front-end does) into a fresh topic, then runs the traffic job over them with the available-now
trigger and the ``noop`` sink, ``--runs`` times on one SparkSession (each run with a fresh
checkpoint, so each reads everything; the first run also pays for code generation and JIT
warm-up).  Two figures, best run: records / wall-clock seconds from query start to query end
(session start-up excluded), and records / seconds spent in micro-batches (excludes query
start-up and shutdown: the steady-state rate).  The topic is deleted afterwards.

    .venv/bin/python bench/spark_throughput.py --bootstrap 127.0.0.1:9092 --records 200000
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from headwater.services.kafka_admin import ensure_topic
from mqttcore.message import Message
from router.partitioner import Router, routing_key
from router.record import encode
from spark_streaming.options import JobOptions, Trigger
from spark_streaming.runner import run
from spark_streaming.source import build_session


def produce(bootstrap: str, topic: str, partitions: int, records: int, span_s: int) -> float:
    """Write ``records`` messages (100 prefixes, 1000 clients, 20-120 byte payloads) spread over
    the last ``span_s`` seconds of event time; the seconds it took."""
    router = Router(partitions, 2)
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1_000_000, "acks": "1"}
    )
    now_ms = int(time.time() * 1000)
    began = time.monotonic()
    for i in range(records):
        topic_name = f"site{i % 10}/area{i % 100 // 10}/dev{i % 1000}/telemetry"
        at = now_ms - span_s * 1000 + (i * span_s * 1000) // records
        message = Message(
            topic_name, b"x" * (20 + i % 101), i % 3, False, f"dev{i % 1000}", "bench", at,
            i.to_bytes(16, "big"),
        )  # fmt: skip
        while True:
            try:
                producer.produce(
                    topic,
                    encode(message),
                    routing_key(topic_name, 2).encode(),
                    partition=router.partition_for_topic(topic_name),
                )
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(60)
    return time.monotonic() - began


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bootstrap", default=os.environ.get("HEADWATER_KAFKA_BOOTSTRAP"))
    p.add_argument("--records", type=int, default=200_000)
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--span", type=int, default=600, help="seconds of event time covered")
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--shuffle-partitions", type=int, default=4)
    args = p.parse_args(argv)
    if not args.bootstrap:
        p.error("pass --bootstrap or set HEADWATER_KAFKA_BOOTSTRAP")

    topic = f"bench.spark.{uuid.uuid4().hex[:8]}"
    ensure_topic(args.bootstrap, topic, args.partitions, {})
    try:
        took = produce(args.bootstrap, topic, args.partitions, args.records, args.span)
        print(f"produced {args.records} records in {took:.1f} s ({args.records / took:.0f}/s)")
        spark = build_session("headwater-bench", args.master, args.shuffle_partitions)
        rates, batch_rates = [], []
        for n in range(1, args.runs + 1):
            with tempfile.TemporaryDirectory() as checkpoint:
                options = JobOptions(
                    job="traffic",
                    bootstrap=args.bootstrap,
                    topic=topic,
                    sink="noop",
                    checkpoint=checkpoint,
                    trigger=Trigger(available_now=True),
                    shuffle_partitions=args.shuffle_partitions,
                    query_name=f"bench_traffic_{n}",
                )
                summary = run(options, spark, quiet=True)
            assert summary.input_rows == args.records, summary
            rates.append(summary.input_rows / summary.seconds)
            batch_rates.append(summary.input_rows / summary.batch_seconds)
            print(f"run {n}: {summary.line()}")
        spark.stop()
    finally:
        AdminClient({"bootstrap.servers": args.bootstrap}).delete_topics([topic])
    cores = os.cpu_count()
    print(
        f"traffic job: {max(rates):.0f} records/s query start to end, "
        f"{max(batch_rates):.0f} records/s in micro-batches (best of {args.runs}); "
        f"{args.records} records, "
        f"{args.partitions} Kafka partitions, master {args.master}, shuffle partitions "
        f"{args.shuffle_partitions}; {cores} cores, {platform.machine()}, "
        f"Python {platform.python_version()}, {dt.date.today()}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
