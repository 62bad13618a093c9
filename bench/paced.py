"""The paced scenarios of the main run (8 ``paced-qos1``, 9 ``cluster-paced-qos1``): QoS 1 fan-in
open loop at a fixed rate, every message accounted for.

The load is :mod:`bench.fanin`'s, as ``bench.scale``'s ``fanin`` runs it: ``--publishers``
connections in one :class:`bench.jobs.Worker`, each paced by :func:`bench.load.paced` at
``paced_rate / publishers`` messages per second from the start of the warm-up to the end of the
measured window, on schedule whatever the subscriber does, its packet identifiers drawn from a
window of ``paced_window`` unacknowledged PUBLISHes that only the broker's PUBACKs refill; one
subscriber in another worker PUBACKs everything.  Once the publishers are done (and their last
PUBACKs are in, ``ACK_WAIT`` at most), the subscriber drains: it waits for every PUBACKed message
until none has arrived for a while.  Then *lost* = PUBACKed and never received, *duplicates* =
received more than once.

Rates and CPU are over the measured window (``warmup`` seconds after the start, ``duration``
long); latencies (send -> receive, first copies) are of messages sent in it; the accounting covers
the whole run, warm-up included.
"""

from __future__ import annotations

import time
from contextlib import ExitStack

from bench.brokers import RunningBroker
from bench.cpu import CpuMeter, MachineMeter, WaitMeter
from bench.fanin import (
    Drain,
    MeasureWindow,
    OpenPublishers,
    OpenSubscriber,
    PublisherReport,
    PublishPaced,
    SubscriberReport,
    account,
)
from bench.jobs import Worker
from bench.load import ClientPlan, Timing
from bench.scenarios import (
    READY_TIMEOUT,
    Result,
    Scenario,
    Settings,
    endpoints_for,
    sleep_until,
)

ACK_WAIT = 10.0
"""After the schedule ends, seconds to wait for the publishers' last PUBACKs at most."""
DRAIN_IDLE = 5.0
"""The drain ends once nothing has arrived for this long (or ``drain_max``, if shorter)..."""
DRAIN_ROUNDS = 6.0
"""...or after ``DRAIN_ROUNDS * drain_max`` seconds (60 s; 18 s with ``--quick``); it ends at
once when every PUBACKed message has arrived."""
CLIENT_BOUND = 0.9
"""A load process that used this share of a core or more limited the run."""
BEHIND = 0.99
"""Publishers that sent less than this share of their schedule fell behind it."""


def run_paced(scenario: Scenario, broker: RunningBroker, settings: Settings, tag: str) -> Result:
    """One paced run against one broker; a failure becomes a failed result."""
    try:
        return measure(scenario, broker, settings, tag)
    except (RuntimeError, TimeoutError, OSError) as exc:
        return Result(scenario.key, broker.name, broker.label, ok=False, error=str(exc))


def measure(scenario: Scenario, broker: RunningBroker, settings: Settings, tag: str) -> Result:
    pub_at, sub_at = endpoints_for(scenario, broker)
    topics = [f"bench/{tag}-p{i}/t" for i in range(settings.publishers)]
    pubs = tuple(ClientPlan(f"{tag}-pub{i}", pub_at, (t,), 1) for i, t in enumerate(topics))
    sub = ClientPlan(f"{tag}-sub0", sub_at, tuple(topics), 1)
    rate = settings.paced_rate / settings.publishers
    with ExitStack() as stack:
        publisher, subscriber = Worker(f"{tag}-publishers"), Worker(f"{tag}-subscriber")
        stack.callback(publisher.stop)
        stack.callback(subscriber.stop)
        subscriber.submit(OpenSubscriber(sub))
        subscriber.result(READY_TIMEOUT)
        publisher.submit(OpenPublishers(pubs, rate, settings.paced_window, settings.payload))
        publisher.result(READY_TIMEOUT)
        start = time.monotonic() + 1.0
        measure_from = start + settings.warmup
        timing = Timing(start, measure_from, measure_from + settings.duration, ack_wait=ACK_WAIT)
        subscriber.submit(MeasureWindow(timing.measure_from, timing.end))
        subscriber.result(READY_TIMEOUT)
        load = CpuMeter([publisher.pid, subscriber.pid])
        meter = CpuMeter(broker.pids)
        waits = WaitMeter([p.pid for p in broker.processes])
        kafka = CpuMeter([broker.kafka.pid]) if broker.kafka is not None else None
        ours = [*broker.pids, publisher.pid, subscriber.pid, *kafka_pid(broker)]
        machine = MachineMeter(ours)
        publisher.submit(PublishPaced(timing))
        sleep_until(timing.measure_from)
        for m in (load, meter, machine, kafka, waits):
            if m is not None:
                m.restart()
        sleep_until(timing.end)
        window = time.monotonic() - timing.measure_from
        result = Result(scenario.key, broker.name, broker.label)
        result.broker_cpu = [u / window for u in broker.cpu_per_node(meter.used())]
        result.broker_waited = [w / window for w in waits.used()]
        result.kafka_cpu = kafka.used()[0] / window if kafka is not None else None
        result.other_cpu = machine.others() / window
        pub_cpu, sub_cpu = load.used()
        result.load_cpu = {"publishers": pub_cpu / window, "subscriber": sub_cpu / window}
        busy = [name for name, share in result.load_cpu.items() if share >= CLIENT_BOUND]
        if busy:
            result.notes.append(
                f"client-bound: the {' and '.join(busy)} process used {CLIENT_BOUND:.0%} of a core "
                "or more, so the figures are those of the load generator as much as the broker's"
            )
        pub_reports: list[PublisherReport] = publisher.result(
            settings.warmup + settings.duration + ACK_WAIT + 30.0
        )
        acked = sum(len(set(p.acked)) for p in pub_reports)
        idle = min(DRAIN_IDLE, settings.drain_max)
        most = DRAIN_ROUNDS * settings.drain_max
        drain_started = time.monotonic()
        subscriber.submit(Drain(acked, idle, most))
        sub_report: SubscriberReport = subscriber.result(most + 30.0)
        drained = time.monotonic() - drain_started
    scheduled = round(settings.paced_rate * (timing.end - timing.start))
    result = fill(result, pub_reports, sub_report, window, settings.paced_rate, scheduled)
    if result.lost and drained >= most:
        result.notes.append(
            f"the drain stopped at its limit of {most:g} s: messages still queued then count as "
            "lost"
        )
    return result


def kafka_pid(broker: RunningBroker) -> list[int]:
    return [broker.kafka.pid] if broker.kafka is not None else []


def fill(
    result: Result,
    pubs: list[PublisherReport],
    sub: SubscriberReport,
    window: float,
    rate: float,
    scheduled: int,
) -> Result:
    """The result's figures from the publishers' and the subscriber's reports; ``rate`` is the
    schedule's rate, ``scheduled`` the messages it called for over the whole run."""
    a = account(pubs, sub)
    result.offered = sum(p.sent_window for p in pubs) / window
    result.delivered = sub.received_window / window
    result.sent, result.scheduled_rate = a.sent, rate
    result.received, result.expected = a.distinct, a.acked
    result.acked, result.lost, result.duplicates = a.acked, a.lost, a.duplicates
    result.p50_ms, result.p99_ms, result.max_ms = sub.p50_ms, sub.p99_ms, sub.max_ms
    if a.unacked:
        result.notes.append(f"{a.unacked:,} sent and never PUBACKed (no delivery owed)")
    whole = a.sent / scheduled if scheduled else 0.0
    if min(result.schedule_share, whole) < BEHIND:
        result.notes.append(
            f"the publishers sent {result.schedule_share:.1%} of their schedule during the "
            f"measured window, {whole:.1%} over the whole run (warm-up included): the pacer "
            "waits while a publisher's window of unacknowledged PUBLISHes is full (slow "
            "PUBACKs), or the publishing process could not keep up"
        )
    result.notes.extend(a.problems)
    return result
