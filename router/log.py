"""The interest-routing log: a node's Kafka producer, its one reader, and the pump that serves both.

Writes: each message goes to the partition its topic's routing key hashes to (see
``router.partitioner``), keyed by that routing key, with an idempotent producer and ``acks=all``.
Every record carries the headers of ``router.record.headers`` (the message's MQTT metadata and
its kind, ``kind``: who wrote it) and the message's own time as its Kafka timestamp
(docs/log.md).  ``produce`` never blocks: the record joins this loop iteration's outbox, which
goes to librdkafka at the end of it, one ``produce()`` per record (``produce_batch`` takes
neither headers nor timestamps; per message it cost no less, measured by
``tests/integration/log_produce_cost.py``); the QoS 0 records a hand-over gives one partition
share one delivery report (``router.outbox.Group``).  A full producer queue makes ``produce``
return False; the caller stops reading from its client and is called back once it has drained.
Records nobody waits for (client events) go by ``produce_quiet`` through a producer of their
own that lingers ``QUIET_LINGER_MS``.

Two gears for the records a client waits on.  A record handed to librdkafka goes out at once
(``linger.ms`` 0: the lowest latency, what a PUBACK waits on), but then each ``produce()`` wakes
the producer's broker thread, and under a flood that thread took about 38% of the node's CPU
(perf, QoS 1 fan-in flood; 13,000 msg/s), most of it waking to find the in-flight window full.
So while the node writes more than ``BUSY_RATE`` records a second it writes through a second
producer that lingers ``BATCH_LINGER_MS`` (one wake-up and one request per partition each
linger), and back through the first once under ``QUIET_RATE`` (:class:`Pace`).  The two never
interleave: at a change the outbox is held until every record of the producer left behind is
acknowledged (a few milliseconds), so each partition's records reach Kafka in the order they
were produced, as a single idempotent producer keeps them.

Reads: :class:`router.reader.LogReader`, one per node, whatever the number of clients, sessions
and share groups (its consumers are listed there).

librdkafka does the network work in its own C threads.  What is left, taking the records the
consumers have fetched and the producer's delivery reports, is done by a *pump* on the event
loop with non-blocking calls: at once again while there is work, every millisecond when idle.
So every callback runs in the loop thread, and the pump takes its turn among the client sockets
however busy they are (threads handing work to the loop were starved under uvloop: a node
flooded by publishers stopped delivering).  An idle look's 1 ms timer fires 1-2 ms late: 1.1 ms
of a delivery's 1.6 ms median at 1,000 msg/s.  A thread lent the live consumer to wake the loop
deadlocked (confluent-kafka 2.16 serializes a handle's calls: the loop's ``incremental_unassign``
waited, GIL held, for the thread's ``consume()``).  A record consumed here is never produced
again, so no message loops.
"""

from __future__ import annotations

import asyncio
import logging
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

from mqttcore.message import Message
from router import record
from router.batching import Batch
from router.outbox import DeliveryCallback, Outbox
from router.partitioner import Router
from router.reader import LogReader, Reader
from router.retry import ATTEMPT_SECONDS, Retries, retried
from router.shared import GroupLog
from router.topics import MAX_RECORD_BYTES

log = logging.getLogger("headwater.log")

PUMP_IDLE = 0.001
"""Seconds between two looks at the consumer and producer queues while nothing happens..."""

PUMP_QUIET = 0.02
"""...and once nothing has happened for ``PUMP_QUIET_AFTER`` looks: an idle node costs about 50
wake-ups a second, not 1000.  A PUBLISH wakes the pump at once; a record fetched after a quiet
spell waits at most this long to be seen."""

PUMP_QUIET_AFTER = 50

BUSY_RATE = 4000
"""Records a second above which the log writes through its lingering producer..."""
QUIET_RATE = 1500
"""...and below which it writes through the one that sends at once again."""
PACE_WINDOW = 0.05
"""Seconds over which the rate is measured."""
BATCH_LINGER_MS = 5.0
"""How long the lingering producer gathers records: at most that much later a PUBACK, only
while the node is busy.  At 1 ms its broker thread called ``poll()`` 19,000 times a second for
5,000 QoS 1 records a second (13.5% of a core); at 5 ms 10,000 times (7.9%), and the node's CPU
a paced QoS 1 message fell 12-30% at that rate (docs/benchmarks.md)."""

QUIET_LINGER_MS = 10
"""How long the quiet producer (``KafkaLog.produce_quiet``) gathers records before it sends
them: a burst of client events (``frontend.events``) costs one request per partition.  Through
the client-facing producer (linger 0) a burst went as many small requests: librdkafka's broker
thread took about 7% of the event loop's CPU in CONNECT+DISCONNECT cycles with events, under
1% without, and about 1% with a linger (each thread's CPU from ``/proc`` during ``python -m
bench throughput --scenarios connect-clean``)."""

LATENCY_BUCKETS_MS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000)
"""Upper bounds of the produce latency histogram's buckets (``/metrics``), in milliseconds."""


class LatencyHistogram:
    """Produce latencies in fixed buckets: per acknowledged message, librdkafka's own measure
    (``produce()`` to the broker's acknowledgement, ``Message.latency()``), one bisect and two
    additions; nothing is kept per message."""

    __slots__ = ("_bounds", "counts", "sum")

    def __init__(self) -> None:
        self._bounds = [ms / 1000 for ms in LATENCY_BUCKETS_MS]
        self.counts = [0] * (len(LATENCY_BUCKETS_MS) + 1)
        """Per bucket (not cumulative); the last counts what took longer than the last bound."""
        self.sum = 0.0
        """Seconds, all latencies added up."""

    def observe(self, seconds: float | None, messages: int = 1) -> None:
        """``messages`` that each took ``seconds`` (a QoS 0 ``router.outbox.Group``'s, or one)."""
        if seconds is not None:
            self.counts[bisect_left(self._bounds, seconds)] += messages
            self.sum += seconds * messages

    def snapshot(self) -> dict[str, object]:
        return {"buckets_ms": list(LATENCY_BUCKETS_MS), "counts": list(self.counts),
                "sum_seconds": self.sum}  # fmt: skip


@dataclass(slots=True)
class LogSettings:
    bootstrap: str
    topic: str
    node_id: str
    linger_ms: float = 0.0
    delivery_timeout_ms: int = 30_000
    queue_max_messages: int = 100_000
    fetch_batch: int = 1000
    security: Mapping[str, str] = field(default_factory=dict)
    """librdkafka's ``security.protocol``, ``sasl.*`` and ``ssl.*`` settings (``--kafka-config``),
    given to every client of the log: producer, consumers and admin client alike."""


SECURITY_KEYS = ("security.protocol", "sasl.", "ssl.")
"""What ``--kafka-config`` may set: librdkafka's security settings, nothing that changes how the
log behaves (acks, batching, timeouts stay the node's)."""


def security_settings(text: str) -> dict[str, str]:
    """librdkafka settings from a properties file's text: ``key=value`` lines, ``#`` comments.
    ValueError names a line that is not ``key=value`` or a key not in :data:`SECURITY_KEYS`."""
    settings = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, sep, value = (part.strip() for part in line.partition("="))
        if not sep or not key:
            raise ValueError(f"line {number} is not key=value")
        if not (key == SECURITY_KEYS[0] or key.startswith(SECURITY_KEYS[1:])):
            raise ValueError(f"line {number}: {key} is none of security.protocol, sasl.*, ssl.*")
        settings[key] = value
    return settings


class Pace:
    """Which of the two producers the next records go to (module docstring): the lingering one
    while the rate is above ``BUSY_RATE``, the other again once it is below ``QUIET_RATE``,
    measured over windows of ``PACE_WINDOW``; a window without a record is quiet, whatever came
    before it."""

    __slots__ = ("_count", "_last", "_since", "batching")

    def __init__(self) -> None:
        self.batching = False
        self._count = 0
        self._since = 0.0
        self._last = 0.0

    def count(self, records: int, now: float) -> bool:
        """``records`` handed over at ``now``; whether to write through the lingering one."""
        if now - self._last >= PACE_WINDOW:  # a whole window without a record: quiet
            self.batching = False
            self._count, self._since = 0, now
        self._last = now
        self._count += records
        elapsed = now - self._since
        if elapsed >= PACE_WINDOW:
            rate = self._count / elapsed
            self._count, self._since = 0, now
            if rate >= BUSY_RATE:
                self.batching = True
            elif rate < QUIET_RATE:
                self.batching = False
        return self.batching


class Log(GroupLog, Protocol):
    """The node's log (:class:`KafkaLog`) as the dispatcher, the index and the backlog use it.
    They run compiled (setup.py), and a compiled function checks the class of an argument typed
    with a class: typed with this, they take the unit tests' fakes of it too."""

    @property
    def reader(self) -> Reader: ...

    async def low_watermarks(self, partitions: Iterable[int]) -> dict[int, int]: ...

    async def offsets_at(self, partitions: Iterable[int], time_ms: int) -> dict[int, int]: ...


class KafkaLog:
    """One node's connection to the log: the producer, the admin client and the reader."""

    def __init__(self, settings: LogSettings, router: Router) -> None:
        self.settings = settings
        self.router = router
        self.available = False
        self.produced = 0
        self.produce_errors = 0
        self.latency = LatencyHistogram()
        self.retries = Retries()
        """Reads made again after a leader election or a short outage (``router.retry``)."""
        self.reader = LogReader(settings.topic, settings.fetch_batch, self.retries)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._producer: Producer | None = None
        """The producer records go to now: ``_immediate`` or ``_batching`` (:class:`Pace`)."""
        self._immediate: Producer | None = None
        self._batching: Producer | None = None
        self._pace = Pace()
        self.gear_changes = 0
        """Changes from one producer to the other (``Pace``)."""
        self._holding = False
        """The outbox waits for the producer left behind to have every record acknowledged."""
        self._quiet: Producer | None = None
        """``produce_quiet``'s producer: the same log, lingering ``QUIET_LINGER_MS``."""
        self._running = False
        self._pump_handle: asyncio.Handle | None = None
        self._idle_looks = 0
        self.watermarks = Watermarks(settings.topic, self.retries)
        self._probing: asyncio.Future[None] | None = None
        self._reports: list[tuple[DeliveryCallback, int, int, str | None]] = []
        self._blocked: list[Callable[[], None]] = []
        self.on_served: Callable[[], None] = lambda: None
        """Called after a pump's turn that served something (the node writes out then)."""
        self._outbox = Outbox(self._count_group)

    # -- life cycle ---------------------------------------------------------------------------

    def _common(self) -> dict[str, Any]:
        return {
            "bootstrap.servers": self.settings.bootstrap,
            "error_cb": self._on_error,
            # Small requests on a quiet link otherwise wait for the previous one's ACK (Nagle
            # meeting delayed ACKs): tens to hundreds of milliseconds of tail latency.
            "socket.nagle.disable": True,
            # librdkafka backs off reconnecting up to 10 s by default: a broker that is back
            # would wait that long for its first PUBLISH; 1 s at most bounds it.
            "reconnect.backoff.max.ms": 1000,
            **self.settings.security,
        }

    def consumer(self, group_id: str, **config: Any) -> Consumer:
        """A consumer of the log for the reader (offsets never auto-committed)."""
        return Consumer({
            **self._common(),
            "client.id": f"headwater-{self.settings.node_id}",
            "group.id": group_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": False,
            "fetch.wait.max.ms": 100,
            "fetch.queue.backoff.ms": 5,
            **config,
        })  # fmt: skip

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.watermarks.admin = AdminClient(self._common())
        await self._loop.run_in_executor(None, self._check_topic)
        self._immediate = self._new_producer("", {"linger.ms": self.settings.linger_ms})
        self._batching = self._new_producer("-batch", {"linger.ms": BATCH_LINGER_MS})
        self._producer = self._immediate
        self._quiet = self._new_producer("-quiet", {
            "linger.ms": QUIET_LINGER_MS,
            "on_delivery": self._quiet_lost,
            "delivery.report.only.error": True,
        })  # fmt: skip
        node = self.settings.node_id
        live = self.consumer(f"headwater-node-{node}")
        # the catch-up consumer's prefetch is what a replay holds in memory at most
        catch_up = self.consumer(
            f"headwater-catchup-{node}", **{"queued.max.messages.kbytes": 8192}
        )
        shares = self.consumer(f"headwater-shares-{node}", **{"queued.max.messages.kbytes": 8192})
        for consumer in (live, catch_up, shares):
            # Learn the topic's leaders now: a consumer that first meets the topic when a
            # partition is assigned waits for librdkafka's next metadata scan (up to a second).
            await self._loop.run_in_executor(None, consumer.list_topics, self.settings.topic, 10)
        self.reader.start(live, catch_up, shares)
        self._running = True
        self._pump_handle = self._loop.call_soon(self._pump)
        self.available = True

    def _new_producer(self, name: str, config: dict[str, Any]) -> Producer:
        return Producer({
            **self._common(),
            "client.id": f"headwater-{self.settings.node_id}{name}",
            "enable.idempotence": True,
            "acks": "all",
            "message.timeout.ms": self.settings.delivery_timeout_ms,
            "queue.buffering.max.messages": self.settings.queue_max_messages,
            "message.max.bytes": MAX_RECORD_BYTES,
            **config,
        })  # fmt: skip

    def _check_topic(self) -> None:
        admin = self.watermarks.admin
        assert admin is not None
        try:
            meta = admin.list_topics(self.settings.topic, timeout=10)
        except KafkaException as exc:
            raise ConnectionError(
                f"Kafka at {self.settings.bootstrap} is unreachable: {exc}"
            ) from exc
        topic = meta.topics.get(self.settings.topic)
        if topic is None or topic.error is not None:
            raise ConnectionError(f"log topic {self.settings.topic!r} does not exist in Kafka")
        if len(topic.partitions) != self.router.num_partitions:
            raise ValueError(
                f"log topic {self.settings.topic!r} has {len(topic.partitions)} partitions, "
                f"--partitions says {self.router.num_partitions}"
            )

    async def stop(self, flush_timeout: float = 10.0) -> None:
        loop = asyncio.get_running_loop()
        self._running = False
        if self._pump_handle is not None:
            self._pump_handle.cancel()
        if self._holding and self._producer is not None:  # the change of producer, done now
            await loop.run_in_executor(None, self._producer.flush, flush_timeout)
            self._holding = False
            self._producer = self._batching if self._pace.batching else self._immediate
            self._hand_over()
        elif self._producer is not None:
            self._send_outbox()
        for producer in (self._immediate, self._batching):
            if producer is not None:
                await loop.run_in_executor(None, producer.flush, flush_timeout)
        if self._quiet is not None:
            await loop.run_in_executor(None, self._quiet.flush, flush_timeout)
        await self.reader.stop()
        # let librdkafka's threads and sockets go now, not at a GC pass
        self._producer = self._immediate = self._batching = self._quiet = None
        self.watermarks.admin = None

    def _on_error(self, error: KafkaError) -> None:
        if error.code() == KafkaError._ALL_BROKERS_DOWN:
            self.available = False
        log.warning("Kafka: %s", error.str())

    def _probe(self) -> None:
        """While Kafka is marked unavailable, ask it for metadata; an answer marks it back up."""
        assert self._producer is not None
        try:
            self._producer.list_topics(self.settings.topic, timeout=1.0)
        except KafkaException:
            return
        log.info("Kafka available again")
        self.available = True

    # -- writing ------------------------------------------------------------------------------

    def produce(
        self, message: Message, on_delivery: DeliveryCallback | None, kind: str = record.CLIENT
    ) -> bool:
        """Queue ``message`` for the log, with its headers (``kind`` says who wrote it: one of
        ``router.record.KINDS``) and its own time as the record's timestamp; False if the
        producer queue is full (retry later).  ``on_delivery`` is told once it is durable (or
        not); a QoS 0 message passes None and is counted with its hand-over's group."""
        producer = self._producer
        assert producer is not None
        outbox = self._outbox
        if len(outbox) + len(producer) >= self.settings.queue_max_messages:
            return False
        partition, key = self.router.route(message.topic)
        outbox.add(
            partition, record.encode(message), key, self._reporter(on_delivery), on_delivery,
            record.headers(message, kind), message.timestamp_ms,
        )  # fmt: skip
        if len(outbox) == 1 and self._loop is not None:
            self._loop.call_soon(self._send_outbox)
        return True

    def produce_quiet(self, messages: Sequence[Message], kind: str) -> int:
        """Queue records nobody waits for (client events, ``frontend.events``) on the quiet
        producer: sent within ``QUIET_LINGER_MS`` together, never waking the pump, no report
        asked but a failure's (counted in ``produce_errors``; confluent-kafka still hands every
        record's report to the next hand-over's ``poll()``, which drops the successes: about 1
        us a record on the loop).  How many it took: a full queue
        refuses the rest.  Per record only its own parts are new: each topic's shared ones are
        encoded once a burst (``record.Template``), the topic routed once."""
        producer = self._quiet
        if producer is None:
            return 0
        producer.poll(0)  # the last hand-over's failures, if any, reported
        produce, topic = producer.produce, self.settings.topic
        # a burst's few topics, routed once, their records' shared parts encoded once
        shapes: dict[str, tuple[record.Template, int, bytes]] = {}
        for taken, message in enumerate(messages):
            shape = shapes.get(message.topic)
            if shape is None:
                partition, key = self.router.route(message.topic)
                shape = shapes[message.topic] = (record.Template(message, kind), partition, key)
            template = shape[0]
            client = message.client_id.encode()
            if template.fits(message, kind):
                value, headers = template.value(message, client), template.headers(client)
            else:
                value, headers = record.encode(message), record.headers(message, kind)
            try:
                # positional: produce()'s keywords cost it about 0.7 us a record to parse
                produce(
                    topic, value, shape[2], shape[1], None, None, message.timestamp_ms,
                    headers,  # type: ignore[arg-type]  # list invariance
                )  # fmt: skip
            except (BufferError, KafkaException):
                return taken
        return len(messages)

    def _quiet_lost(self, err: KafkaError | None, _: Any) -> None:
        if err is not None:
            self.produce_errors += 1
            log.warning("a client event was lost by Kafka: %s", err.str())

    def _reporter(self, on_delivery: DeliveryCallback | None) -> Any:
        """librdkafka's delivery callback for one record, None for a QoS 0 one (its hand-over's
        ``router.outbox.Group`` reports it); a partial: a mypyc closure keeps itself in its own
        environment, a reference cycle per record left to the cycle collector."""
        if on_delivery is None:
            return None
        return partial(self._report, on_delivery)

    def _report(self, on_delivery: DeliveryCallback, err: KafkaError | None, msg: Any) -> None:
        """In the pump's ``poll()``, which then takes ``_reports`` (the pump swaps the list)."""
        self.latency.observe(msg.latency())
        error = err.str() if err else None
        self._reports.append((on_delivery, msg.partition(), msg.offset(), error))

    def _send_outbox(self) -> None:
        """This iteration's records to librdkafka; one refused fails like an undelivered one:
        its sender is told, never acknowledged.  At a change of producer they wait until the
        one left behind has every record acknowledged (the pump sends them then)."""
        outbox = self._outbox
        if not outbox or self._holding:
            return
        batching = self._pace.count(len(outbox), time.monotonic())
        wanted = self._batching if batching else self._immediate
        if wanted is not self._producer:
            if self._producer is not None and len(self._producer) > 0:
                self._holding = True
                self._wake_pump()  # the reports that let the change happen
                return
            self._producer = wanted
            self.gear_changes += 1
        self._hand_over()

    def _hand_over(self) -> None:
        for sender, partition, error in self._outbox.send(self._producer, self.settings.topic):
            self.produce_errors += 1
            if sender is None:
                log.warning("a QoS 0 message was refused by the producer: %s", error)
            else:
                sender(partition, -1, error)
        if self._idle_looks >= PUMP_QUIET_AFTER:  # reports are due soon
            self._wake_pump()

    def _wake_pump(self) -> None:
        self._idle_looks = 0
        if self._running and self._loop is not None:
            if self._pump_handle is not None:
                self._pump_handle.cancel()
            self._pump_handle = self._loop.call_soon(self._pump)

    def when_writable(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` in the loop once the producer queue has room again."""
        self._blocked.append(callback)

    def _count_group(self, records: int, err: KafkaError | None, msg: Any) -> None:
        """A ``router.outbox.Group`` of QoS 0 records written (or lost) together."""
        self.latency.observe(msg.latency(), records)
        if err is not None:
            self.produce_errors += records
            log.warning("%d QoS 0 message(s) lost by Kafka: %s", records, err.str())

    # -- the pump -----------------------------------------------------------------------------

    def _pump(self) -> None:
        """Take fetched records and delivery reports; come back at once if there were any."""
        busy = self._serve_producer() | self.reader.serve()
        if not self.available:
            self._start_probe()
        if self._running and self._loop is not None:
            if busy:
                self.on_served()
                self._idle_looks = 0
                self._pump_handle = self._loop.call_soon(self._pump)
            else:
                self._idle_looks += 1
                wait = PUMP_IDLE if self._idle_looks < PUMP_QUIET_AFTER else PUMP_QUIET
                self._pump_handle = self._loop.call_later(wait, self._pump)

    def _serve_producer(self) -> bool:
        for producer in (self._immediate, self._batching):
            if producer is not None and len(producer) > 0:
                producer.poll(0)  # runs the delivery callbacks, which fill self._reports
        if self._holding and self._producer is not None and len(self._producer) == 0:
            self._holding = False  # every record of the one left behind acknowledged
            wanted = self._batching if self._pace.batching else self._immediate
            if wanted is not self._producer:  # (the rate may have come back meanwhile)
                self._producer = wanted
                self.gear_changes += 1
            self._hand_over()
        if not self._reports and not self._blocked:
            return False
        reports, self._reports = self._reports, []
        self._deliver_reports(reports)
        return bool(reports)

    def _start_probe(self) -> None:
        if self._probing is None and self._loop is not None:
            self._probing = self._loop.run_in_executor(None, self._probe)
            self._probing.add_done_callback(self._probe_done)

    def _probe_done(self, _: asyncio.Future[None]) -> None:
        if self._loop is not None:  # the next probe a second later at the earliest
            self._loop.call_later(1.0, setattr, self, "_probing", None)

    def _deliver_reports(
        self, reports: list[tuple[DeliveryCallback, int, int, str | None]]
    ) -> None:
        for callback, partition, offset, error in reports:
            if error is None:
                self.produced += 1
                self.available = True
            else:
                self.produce_errors += 1
            callback(partition, offset, error)
        if (
            self._blocked
            and self._producer is not None
            and len(self._producer) < (self.settings.queue_max_messages // 2)
        ):
            blocked, self._blocked = self._blocked, []
            for resume in blocked:
                resume()

    # -- where partitions begin and end ---------------------------------------------------------

    async def high_watermarks(self, partitions: Iterable[int]) -> dict[int, int]:
        """Where each partition ends now: the offset the next record will get."""
        return await self.watermarks.high(partitions)

    async def low_watermarks(self, partitions: Iterable[int]) -> dict[int, int]:
        """Where each partition begins now: older records are gone (retention)."""
        return await self.watermarks.low(partitions)

    async def offsets_at(self, partitions: Iterable[int], time_ms: int) -> dict[int, int]:
        """Per partition, the offset of its first record stamped at or after ``time_ms`` (its
        high watermark if there is none yet)."""
        return await self.watermarks.at(partitions, time_ms)


_NO_RECORD_SINCE = -1
"""Kafka's answer to a time with no record at or after it."""


class Watermarks:
    """Where the log's partitions begin and end, asked of Kafka's admin client.  The ends are
    asked once per loop iteration for every caller: a reconnect storm resubscribes thousands.
    Both are asked again while Kafka answers with a leader election's or a short outage's
    errors, for up to ``router.retry.OUTAGE_SECONDS`` (each retry counted as ``watermarks``).
    During an election Kafka may also answer a partition with no error and offset -1001 (seen
    with a three-broker cluster whose leader was SIGKILLed): that is no answer either, never an
    offset (a session resumed at it would skip what it missed), and is asked again too."""

    def __init__(self, topic: str, retries: Retries) -> None:
        self.topic = topic
        self.retries = retries
        self.admin: AdminClient | None = None
        """The node's one admin client, while the log runs (the log checks its topic with it)."""
        self._ends: Batch[list[int], dict[int, int]] = Batch(self._ends_of_many)

    async def high(self, partitions: Iterable[int]) -> dict[int, int]:
        wanted = sorted(partitions)
        return await retried("watermarks", lambda: self._ends(wanted), self.retries)

    async def low(self, partitions: Iterable[int]) -> dict[int, int]:
        wanted = sorted(partitions)
        return await retried("watermarks", lambda: self._list(wanted, True), self.retries)

    async def at(self, partitions: Iterable[int], time_ms: int) -> dict[int, int]:
        wanted = sorted(partitions)
        found = await retried("watermarks", lambda: self._list(wanted, at=time_ms), self.retries)
        later = [p for p, offset in found.items() if offset == _NO_RECORD_SINCE]
        return found | (await self.high(later) if later else {})

    async def _ends_of_many(self, calls: list[list[int]]) -> list[dict[int, int] | BaseException]:
        ends = await self._list(sorted(set().union(*calls)))
        return [{p: ends[p] for p in call} for call in calls]

    async def _list(
        self, partitions: list[int], earliest: bool = False, at: int | None = None
    ) -> dict[int, int]:
        assert self.admin is not None, "the log is not started"
        if not partitions:
            return {}
        if at is not None:
            spec = OffsetSpec.for_timestamp(at)
        else:
            spec = OffsetSpec.earliest() if earliest else OffsetSpec.latest()  # type: ignore[no-untyped-call]
        futures = self.admin.list_offsets(
            {TopicPartition(self.topic, p): spec for p in partitions},
            request_timeout=ATTEMPT_SECONDS,
        )
        result: dict[int, int] = {}
        for tp, future in futures.items():
            info = await asyncio.wrap_future(future)
            if info.offset < 0 and not (at is not None and info.offset == _NO_RECORD_SINCE):
                # no error, yet no offset: asked while no broker leads it
                raise KafkaException(KafkaError(
                    KafkaError.LEADER_NOT_AVAILABLE,
                    f"no offset for partition {tp.partition} ({info.offset}): no leader yet",
                ))  # fmt: skip
            result[tp.partition] = info.offset
        return result
