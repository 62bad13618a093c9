"""What client events cost a node per CONNECT+DISCONNECT cycle, thread by thread.

    python -m tests.integration.events_cost [--bootstrap HOST:PORT] [--rate N] [--seconds S]

A ``KafkaLog`` started on a log topic of its own (its pump running and the collector tuned, as
a node's) and the node's ``Events``; every millisecond, ``N / 1000`` cycles' events
(``connected`` then ``disconnected``, 5,000 client ids) for ``S`` seconds, with events on and
then off, three rounds, medians printed:

* the loop thread's CPU per cycle (``time.thread_time``): the events' calls on the connection's
  path, the hand-over every ``FLUSH_SECONDS`` (building, encoding, ``produce()``), the pump's turns;
* the other threads' CPU per cycle (the process's less the loop's): librdkafka's, the quiet
  producer's among them;
* the calls on the connection's path alone, and the hand-over per event;
* the Kafka broker's CPU per cycle (``/proc``), when the tool started it (``--bootstrap``
  names one whose process it cannot see): writing the records is part of what events cost.

"Off" is the same loop with ``--client-events no``: what it costs is the loop and the pump
without events.  The difference against a CONNECT cycle's whole CPU (``python -m bench
throughput --scenarios connect-clean``) is the share of CONNECT/s that events take when the node
is CPU-bound.  Without ``--bootstrap`` (or ``HEADWATER_KAFKA_BOOTSTRAP``) a local Kafka is
started for the run.  Not a test: the figure is in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from bench.measure import cpu_seconds
from frontend.events import Events
from frontend.node import tune_gc
from headwater.services.kafka import LocalKafka
from headwater.services.kafka_admin import ensure_topic
from router.log import KafkaLog, LogSettings
from router.partitioner import Router
from router.record import wall_clock_stamps
from router.topics import messages_topic

PARTITIONS = 12
CLIENTS = 5000
ROUNDS = 3


def process_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def broker_cpu(pid: int | None) -> float:
    """Seconds of CPU the broker process has used (0 when it is not ours to see)."""
    return 0.0 if pid is None else cpu_seconds(pid)


class TimedEvents(Events):
    """The node's ``Events``, timing its hand-overs."""

    __slots__ = ("handed", "handing")

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.handing, self.handed = 0.0, 0

    def flush(self) -> None:
        began, waiting = time.thread_time(), len(self._pending)
        super().flush()
        self.handing += time.thread_time() - began
        self.handed += waiting


async def measure(
    bootstrap: str, topic: str, rate: int, seconds: float, on: bool, broker: int | None
) -> list[float]:
    """(loop thread, other threads, the connection's calls, hand-over per event, the broker)
    in us."""
    log = KafkaLog(LogSettings(bootstrap, topic, "bench"), Router(PARTITIONS))
    await log.start()
    tune_gc()  # as a node does once started
    events = TimedEvents(wall_clock_stamps("bench"), log, enabled=on)
    await asyncio.sleep(2.0)  # the producers' connections made
    per_ms = max(1, round(rate / 1000))
    cycles, calls = 0, 0.0
    began, loop_began, cpu_began = time.monotonic(), time.thread_time(), process_cpu()
    broker_began = broker_cpu(broker)
    due = began
    while time.monotonic() - began < seconds:
        t = time.thread_time()
        for _ in range(per_ms):
            client = f"device-{cycles % CLIENTS}"
            events.connected(client, None, clean_session=True)
            events.disconnected(client, None, "client_disconnect")
            cycles += 1
        calls += time.thread_time() - t
        due += 0.001
        await asyncio.sleep(max(0.0, due - time.monotonic()))
    loop_cpu, cpu = time.thread_time() - loop_began, process_cpu() - cpu_began
    kafka = broker_cpu(broker) - broker_began
    events.close()
    await log.stop()
    per_event = events.handing / events.handed if events.handed else 0.0
    return [x * 1e6 for x in (loop_cpu / cycles, (cpu - loop_cpu) / cycles, calls / cycles,
                              per_event, kafka / cycles)]  # fmt: skip


async def run(bootstrap: str, rate: int, seconds: float, broker: int | None = None) -> None:
    topic = f"events-cost-{uuid.uuid4().hex[:8]}"
    ensure_topic(bootstrap, topic, PARTITIONS, messages_topic(PARTITIONS).config)
    runs: dict[bool, list[list[float]]] = {True: [], False: []}
    for _ in range(ROUNDS):
        for on in (True, False):
            runs[on].append(await measure(bootstrap, topic, rate, seconds, on, broker))
    for on, figures in runs.items():
        loop, others, calls, handing, kafka = (
            statistics.median(f[i] for f in figures) for i in range(5)
        )
        seen = f"{kafka:5.1f} us/cycle" if broker is not None else "not seen"
        print(f"events {'on ' if on else 'off'}: loop thread {loop:5.1f} us/cycle, other threads "
              f"{others:4.1f} us/cycle; the connection's calls {calls:4.1f} us/cycle, hand-over "
              f"{handing:4.2f} us/event; the Kafka broker {seen}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", default=os.environ.get("HEADWATER_KAFKA_BOOTSTRAP"))
    parser.add_argument("--rate", type=int, default=2000, help="cycles per second [2000]")
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args()
    if args.bootstrap:
        asyncio.run(run(args.bootstrap, args.rate, args.seconds))
        return
    with tempfile.TemporaryDirectory() as scratch, LocalKafka(Path(scratch)) as kafka:
        broker = kafka.child.pid if kafka.child is not None else None
        asyncio.run(run(kafka.bootstrap, args.rate, args.seconds, broker))


if __name__ == "__main__":
    main()
