"""What the dispatcher costs per delivery: matching a record and handing it to each subscriber.

    python -m tests.integration.dispatch_cost [--rounds N]

``router.dispatch.Dispatcher`` (compiled, as a node runs it) over a fake log and clients of our
own (``tests.unit.fakes.FakeClient``: each takes its bytes from the session as a connection
does; they are dropped after each batch), in batches of 1,000 live QoS 0 records, as the pump
hands them over:

* ``fan-out``: one topic, 50 subscribers of it (``bench throughput``'s fan-out 1 -> 50);
* ``fan-in``: four topics ``lg/0`` to ``lg/3``, one subscriber of ``lg/#`` (its fan-in).

Printed: the loop thread's CPU (``time.thread_time``) per delivery, the median and the lowest of
``N`` rounds (the record objects built outside the timing; the collector tuned as a node's).  No
Kafka, no sockets: the matching and hand-over alone, to compare two builds (run it from each
checkout).  Not a test: the figure is in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from frontend.node import tune_gc
from mqttcore.session import Session
from router.dispatch import Dispatcher
from router.partitioner import Router
from router.record import Record
from tests.unit.fakes import FakeClient, FakeLog, message

ROUTER = Router(12, 1)
BATCH = 1000


async def measure(subscribers: int, filter_: str, topics: list[str], rounds: int) -> list[float]:
    """Per round, us of the loop thread per delivery."""
    dispatcher = Dispatcher(FakeLog(), ROUTER)  # type: ignore[arg-type]
    clients = []
    for i in range(subscribers):
        session = Session(f"sub-{i}", clean=True)
        client = FakeClient(session)
        dispatcher.attach(session, client)
        _, new = await dispatcher.subscribe(session, [(filter_, 0)])
        dispatcher.activate(session, new)
        clients.append(client)
    messages = [message(topics[i % len(topics)], qos=0) for i in range(BATCH)]
    tune_gc()  # as a node does once started
    next_offset: dict[int, int] = {}
    figures = []
    for _ in range(rounds):
        batch = []
        for m in messages:
            partition = ROUTER.route(m.topic)[0]
            offset = next_offset.get(partition, 0)
            next_offset[partition] = offset + 1
            batch.append(Record(partition, offset, 1, m))
        began = time.thread_time()
        dispatcher.dispatch(batch)
        spent = time.thread_time() - began
        figures.append(spent / (BATCH * subscribers) * 1e6)
        for client in clients:
            client.wire.clear()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    for name, subscribers, filter_, topics in (
        ("fan-out", 50, "fo/1", ["fo/1"]),
        ("fan-in", 1, "lg/#", [f"lg/{i}" for i in range(4)]),
    ):
        figures = asyncio.run(measure(subscribers, filter_, topics, args.rounds))
        print(f"{name}: {statistics.median(figures):.3f} us per delivery (median of "
              f"{args.rounds} rounds), lowest {min(figures):.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
