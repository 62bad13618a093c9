"""``python -m bench spark``: records per second through the traffic job (Kafka source, Avro
decoding, the windowed aggregation) on this machine.

One node of ``headwater dev up`` writes the records: ``--records`` QoS 1 PUBLISHes (100 prefixes,
1,000 clients' topics, 20-120 byte payloads), every one PUBACKed, so every one is in the log.
Then the traffic job (:mod:`spark_streaming`, the product's analytics, run in this process to
read its progress) reads the log topic with the available-now trigger and the ``noop`` sink,
``--runs`` times on one SparkSession, each with a fresh checkpoint (the first also pays for code
generation and JIT).  Two figures, best run: records / seconds from query start to end, and
records / seconds in micro-batches.  The records' event times span the seconds of publishing.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import platform
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

from bench import mqtt
from bench.brokers import Headwater

TOPIC = "headwater.messages"


async def publish(at: mqtt.Endpoint, records: int) -> None:
    client = await mqtt.connected(at, "spark-bench-pub")
    for start in range(0, records, 5_000):
        await client.publish_all([
            (f"site{i % 10}/area{i % 100 // 10}/dev{i % 1000}/telemetry", b"x" * (20 + i % 101))
            for i in range(start, min(records, start + 5_000))
        ])  # fmt: skip
    client.close()


def run(work: Path, hw: Headwater, progress: Callable[[str], None], records: int, runs: int) -> str:
    # imported here: pyspark is the analytics extra's, and slow to import
    from spark_streaming.options import JobOptions, Trigger
    from spark_streaming.runner import run as run_job
    from spark_streaming.source import build_session

    rates, batch_rates, lines = [], [], []
    with ExitStack() as stack:
        b = hw.start(work, stack)
        asyncio.run(publish(b.endpoints[0], records))
        progress(f"spark: {records:,} records published through {b.label}")
        spark = build_session("headwater-bench", "local[2]", 4)
        for n in range(1, runs + 1):
            with tempfile.TemporaryDirectory() as checkpoint:
                options = JobOptions(
                    job="traffic", bootstrap=b.state["kafka"], topic=TOPIC, sink="noop",
                    checkpoint=checkpoint, trigger=Trigger(available_now=True),
                    shuffle_partitions=4, query_name=f"bench_traffic_{n}",
                )  # fmt: skip
                summary = run_job(options, spark, quiet=True)
            if summary.input_rows < records:  # more: the node's own records ($SYS, wills)
                raise RuntimeError(f"the job read {summary.input_rows} of {records} records")
            rates.append(summary.input_rows / summary.seconds)
            batch_rates.append(summary.input_rows / summary.batch_seconds)
            lines.append(f"run {n}: {summary.line()}")
            progress(lines[-1])
        spark.stop()
    lines.append(
        f"traffic job: {max(rates):.0f} records/s query start to end, {max(batch_rates):.0f} "
        f"records/s in micro-batches (best of {runs}); {records} records published, master "
        f"local[2], shuffle partitions 4; {os.cpu_count()} cores, {platform.machine()}, Python "
        f"{platform.python_version()}, {dt.date.today()}"
    )
    return "\n".join(lines)
