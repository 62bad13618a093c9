"""What the log's headers and timestamps cost per message on a node's produce path.

    python -m tests.integration.log_produce_cost [--bootstrap HOST:PORT] [--messages N]

``KafkaLog.produce`` (encode, route, headers, outbox) and the end of the loop iteration that hands
the outbox to librdkafka, for ``N`` QoS 1 messages of 64 bytes on 50 topics, 100 per iteration,
at most 5,000 awaiting their delivery report; three rounds of three variants, medians printed:

* ``batch``: the path before headers: one ``produce_batch`` per partition per iteration, no
  headers, librdkafka's own timestamp (``produce_batch`` takes neither headers nor timestamps);
* ``single``: one ``produce()`` per record, no headers;
* ``headers``: today's path: one ``produce()`` per record, with the five headers and the
  message's time.

Figures: the event loop thread's CPU in the produce path (``time.thread_time``), the process's
CPU (librdkafka's threads included), and wall time, each per message.  Without ``--bootstrap``
(or ``HEADWATER_KAFKA_BOOTSTRAP``) a local Kafka is started for the run.  Not a test: the figure
is in docs/log.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from headwater.services.kafka import LocalKafka
from headwater.services.kafka_admin import ensure_topic
from mqttcore.message import Message
from router import record
from router.log import KafkaLog, LogSettings
from router.outbox import DeliveryCallback, Outbox
from router.partitioner import Router

PARTITIONS = 6
PER_ITERATION = 100
IN_FLIGHT = 5000
VARIANTS = ("batch", "single", "headers")


def send_batches(outbox: Any, producer: Any, topic: str) -> list[Any]:
    """The outbox's records as the log sent them before headers: a batch per partition."""
    records, outbox._records = outbox._records, []
    batches: dict[int, list[dict[str, Any]]] = {}
    for partition, value, key, _headers, _timestamp, callback, _sender in records:
        batches.setdefault(partition, []).append({"value": value, "key": key, "callback": callback})
    for partition, batch in batches.items():
        producer.produce_batch(topic, batch, partition)
    return []


@contextlib.contextmanager
def variant(name: str) -> Iterator[None]:
    headers, send = record.headers, Outbox.send
    if name in ("batch", "single"):
        record.headers = lambda message, kind=record.CLIENT: None  # type: ignore[assignment,return-value]
    if name == "batch":
        Outbox.send = send_batches  # type: ignore[assignment,method-assign]
    try:
        yield
    finally:
        record.headers, Outbox.send = headers, send  # type: ignore[method-assign]


def messages(n: int) -> list[Message]:
    payload = os.urandom(64)
    return [
        Message(f"plant/line{i % 50}/temp", payload, 1, False, f"sensor-{i % 500}", "bench",
                1_700_000_000_000 + i, i.to_bytes(16, "big"))
        for i in range(n)
    ]  # fmt: skip


async def measure(bootstrap: str, n: int, name: str) -> tuple[float, float, float]:
    """(loop thread CPU, process CPU, wall), microseconds per message."""
    topic = f"cost-{uuid.uuid4().hex[:8]}"
    ensure_topic(bootstrap, topic, PARTITIONS, {})
    log = KafkaLog(LogSettings(bootstrap, topic, "bench"), Router(PARTITIONS, 2))
    await log.start()
    batch = messages(n)
    delivered = 0

    def report(partition: int, offset: int, error: str | None) -> None:
        nonlocal delivered
        assert error is None, error
        delivered += 1

    on_delivery: DeliveryCallback = report
    try:
        with variant(name):
            wall, before, thread = (
                time.perf_counter(),
                resource.getrusage(resource.RUSAGE_SELF),
                0.0,
            )
            for start in range(0, n, PER_ITERATION):
                began = time.thread_time()
                for message in batch[start : start + PER_ITERATION]:
                    log.produce(message, on_delivery)
                log._send_outbox()  # the end of the iteration, as the loop's call_soon does
                thread += time.thread_time() - began
                while start - delivered > IN_FLIGHT:
                    await asyncio.sleep(0.001)
                await asyncio.sleep(0)
            while delivered < n:
                await asyncio.sleep(0.001)
            wall = time.perf_counter() - wall
            after = resource.getrusage(resource.RUSAGE_SELF)
    finally:
        await log.stop()
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return thread / n * 1e6, cpu / n * 1e6, wall / n * 1e6


async def run(bootstrap: str, n: int) -> None:
    runs: dict[str, list[tuple[float, float, float]]] = {name: [] for name in VARIANTS}
    for _ in range(3):
        for name in VARIANTS:
            runs[name].append(await measure(bootstrap, n, name))
    for name, figures in runs.items():
        loop, cpu, wall = (statistics.median(f[i] for f in figures) for i in range(3))
        print(f"{name:8} produce path {loop:5.2f} us/msg  process CPU {cpu:5.2f} us/msg  "
              f"wall {wall:5.2f} us/msg")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", default=os.environ.get("HEADWATER_KAFKA_BOOTSTRAP"))
    parser.add_argument("--messages", type=int, default=100_000)
    args = parser.parse_args()
    if args.bootstrap:
        asyncio.run(run(args.bootstrap, args.messages))
        return
    with tempfile.TemporaryDirectory() as state, LocalKafka(Path(state)) as kafka:
        asyncio.run(run(kafka.bootstrap, args.messages))


if __name__ == "__main__":
    main()
