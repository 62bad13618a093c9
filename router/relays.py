"""Relays between the log and the Kafka topics of its users: inbound (Kafka -> MQTT) and exports
(MQTT -> Kafka), each exactly once.

*Inbound.*  Any Kafka producer writes a record to the inbound topic (``--inbound-topic``): key =
the MQTT topic (UTF-8), value = the payload, optional headers ``mqtt.qos`` (``0``/``1``/``2``)
and ``mqtt.retain`` (``0``/``1``).  Each node's relay copies its share of those records into the
log as messages of kind ``inbound`` (``router.record``; no client id), routed as a client's
PUBLISH is, so the nodes' readers deliver them to every subscriber of the cluster.  A record with
no key, a key that is no valid MQTT topic name for a client to publish to (not UTF-8, empty,
wildcards, U+0000, over 65535 bytes or 200 levels [MQTT-4.7], or starting with ``$``, which
belongs to the brokers [MQTT-4.7.2-1]) or a bad header is counted by reason and skipped: it never
holds back the records after it.  A retained record is applied to the retained store (the callable
the node gives, as a client's retained PUBLISH is) once written, before its transaction commits.

*Exports.*  ``FILTER=KAFKA_TOPIC[:json|raw]`` (:func:`parse_export`): every message of the log
that the MQTT filter matches, but retained clears (RETAIN with no payload: no data), is written to
the user's topic keyed by its MQTT topic, as one JSON object (:func:`json_value`) or raw (value =
payload, the log's headers).

*Exactly once.*  Each relay is a consumer group shared by every node (one member each: a node reads
only its share of the partitions) and a transactional producer (``transactional.id`` per relay and
node): a batch's records and its consumer offsets are committed in one transaction
(``send_offsets_to_transaction``, KIP-447), so a record is copied once whatever node dies when.
A transaction that fails is aborted and the consumer rewound to the batch's first offsets, so the
batch is copied again; an aborted copy is never read, every reader of the log and of these topics
reading with ``isolation.level=read_committed`` (librdkafka's default, never changed here).
Order: one partition is read by one member at a time, in order, and produced in order by an
idempotent producer; an MQTT topic always maps to one partition of the log (its routing key) and,
keyed by its topic, to one partition of an export, so order per MQTT topic holds.

*Cost and outages.*  A relay is a thread of its own (it blocks on librdkafka's transactional
calls, never on the event loop) plus librdkafka's threads of one consumer and one producer; none
runs unless configured.  Kafka unreachable makes a relay retry with ``router.retry``'s backoff,
never the node fail; a fenced or failed producer is made anew, and so is one that saw its
brokers go away (librdkafka's may then never send a transaction's offsets); a relay stuck in a
transaction anyway (``STUCK_SECONDS``) is made anew whole.  A node killed inside a transaction
leaves it open until the broker aborts it (``TRANSACTION_TIMEOUT_MS`` and the broker's abort
scan): until then, read_committed readers of the partitions it wrote to, so every node's MQTT
delivery on them, wait at its first record (``docs/log.md``, "Transactions").
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka import Message as KafkaMessage
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from mqttcore.message import Message, MessageStamps
from router.partitioner import Router
from router.relay_records import (
    INBOUND_TOPIC,
    INVALID,
    Convert,
    Export,
    Output,
    export_converter,
    inbound_converter,
)
from router.retry import Backoff, leave_group, settle_from_thread
from router.topics import MAX_RECORD_BYTES, Replication, messages_topic

log = logging.getLogger("headwater.relays")

BATCH = 500
"""Records per transaction at most; fewer when fewer are waiting (a batch is what arrived while
the previous transaction committed, so the batch grows with the load)."""
WAIT_SECONDS = 0.5
"""Seconds a relay waits for a first record before it looks at its stop flag again."""
TRANSACTION_TIMEOUT_MS = 5_000
"""What the broker gives an open transaction before aborting it: how long a node killed inside
one holds back the read_committed readers of the partitions it wrote to (plus the broker's
abort scan, ``transaction.abort.timed.out.transaction.cleanup.interval.ms``: 10 s by default,
1 s in the Kafka we launch).  A transaction holds one batch and commits in milliseconds; 5 s
outlasts a partition leader's failover (``broker.session.timeout.ms`` 3 s in our clusters),
and a longer one is aborted and its batch copied again, never lost.  Also the time a
transaction's writes, and then its commit, may take here before the relay gives up on it."""
SESSION_TIMEOUT_MS = 6_000
"""A dead member's partitions go to the others after this (Kafka's smallest allowed by default)."""
STUCK_SECONDS = 3 * TRANSACTION_TIMEOUT_MS / 1000 + 2
"""Longer than a transaction may take (its writes, its commit and an abort, each bounded by
``TRANSACTION_TIMEOUT_MS``): a relay busy longer is stuck in librdkafka (seen before the stale
producer was remade: ``send_offsets_to_transaction`` not returning, its timeout notwithstanding,
librdkafka issues 5456 and 5511).  The relay is made anew, the new producer fencing the stuck
one, and the stuck consumer leaves the group after ``MAX_POLL_INTERVAL_MS``."""
MAX_POLL_INTERVAL_MS = 6 * TRANSACTION_TIMEOUT_MS
"""Longer than a relay's thread goes between two polls (a backoff, a new producer's
``init_transactions`` and a transaction with its abort)."""
WATCH_SECONDS = 5.0
"""Seconds between two looks for a stuck relay."""
STOP_SECONDS = 15.0
"""Seconds a relay's thread gets to finish its batch and leave its group at stop."""
ApplyRetained = Callable[[Message, int, int], Coroutine[Any, Any, None]]
"""Apply a retained message written to the log at (partition, offset) to the retained store."""


# -- one relay ------------------------------------------------------------------------------------


@dataclass(slots=True)
class RelaySettings:
    bootstrap: str
    node_id: str
    security: Mapping[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class RelayCounts:
    """What a relay did, read by ``/stats`` (written by its thread: plain integer additions)."""

    copied: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    aborted: int = 0
    """Transactions aborted (their batch copied again)."""


class Relay:
    """Copies ``source`` into what ``convert`` says, a batch per transaction, in a thread."""

    def __init__(
        self,
        name: str,
        settings: RelaySettings,
        source: str,
        convert: Convert,
        apply_retained: ApplyRetained | None = None,
        counts: RelayCounts | None = None,
    ) -> None:
        self.name = name
        self.settings = settings
        self.source = source
        self.convert = convert
        self.apply_retained = apply_retained
        self.counts = counts or RelayCounts()
        self.busy_since: float | None = None
        """``time.monotonic()`` when the transaction under way began; None between them."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._consumer: Consumer | None = None
        self._producer: Producer | None = None
        self._stopping = threading.Event()
        self._ended: asyncio.Future[None] | None = None
        """Settled by the thread as it ends: what ``stop`` waits on (never a join in the
        executor, whose shutdown would wait for a thread stuck in librdkafka)."""
        self._backoff = Backoff()
        self._stale = False
        """The producer saw its brokers go away: it is made anew before the next transaction."""
        self.assigned: list[int] = []
        """The source partitions this node copies now."""

    def _common(self) -> dict[str, Any]:
        return {
            "bootstrap.servers": self.settings.bootstrap,
            "client.id": f"headwater-{self.settings.node_id}-{self.name}",
            "socket.nagle.disable": True,
            "reconnect.backoff.max.ms": 1000,
            **self.settings.security,
        }

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._consumer = Consumer({
            **self._common(),
            "group.id": f"headwater.{self.name}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": SESSION_TIMEOUT_MS,
            "heartbeat.interval.ms": 1000,
            "max.poll.interval.ms": MAX_POLL_INTERVAL_MS,
            "fetch.wait.max.ms": 50,
        })  # fmt: skip
        self._consumer.subscribe([self.source], on_assign=self._assigned, on_revoke=self._revoked)
        self._ended = self._loop.create_future()
        threading.Thread(target=self._run, name=f"relay {self.name}", daemon=True).start()

    async def stop(self) -> None:
        """Stop after the batch under way (its transaction ends either way); a thread stuck in
        librdkafka longer than ``STOP_SECONDS`` is left behind (a daemon: exit does not wait)."""
        self._stopping.set()
        if self._ended is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._ended), STOP_SECONDS)
            except TimeoutError:
                log.warning(
                    "relay %s: not stopped after %g s; left behind", self.name, STOP_SECONDS
                )

    @property
    def running(self) -> bool:
        """Whether the relay's thread is there (started and not ended)."""
        return self._ended is not None and not self._ended.done()

    def renewed(self) -> Relay:
        """A relay like this one, sharing its counts, this one told to stop (not waited for)."""
        self._stopping.set()
        args = (self.name, self.settings, self.source, self.convert, self.apply_retained)
        return Relay(*args, counts=self.counts)

    def stuck(self, now: float) -> bool:
        """Whether a transaction has been under way longer than any of its calls may take."""
        return self.busy_since is not None and now - self.busy_since > STUCK_SECONDS

    def _assigned(self, _: Consumer, partitions: list[TopicPartition]) -> None:
        self.assigned = sorted({*self.assigned, *(tp.partition for tp in partitions)})

    def _revoked(self, _: Consumer, partitions: list[TopicPartition]) -> None:
        gone = {tp.partition for tp in partitions}
        self.assigned = [p for p in self.assigned if p not in gone]

    # -- the thread ----------------------------------------------------------------------------

    def _run(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        try:
            while not self._stopping.is_set():
                self._turn(consumer)
        finally:
            try:  # the others take its partitions at once; close() serves no rebalance then
                leave_group(consumer)
                consumer.close()
            finally:
                self._producer = None
                assert self._loop is not None and self._ended is not None
                settle_from_thread(self._loop, self._ended)

    def _turn(self, consumer: Consumer) -> None:
        if time.monotonic() < self._backoff.until:
            self._stopping.wait(self._backoff.until - time.monotonic())
            return
        try:
            if self._producer is None:  # at once: it aborts what a killed predecessor left open
                self._producer = self._new_producer()
            batch = self._take(consumer)
            if batch:
                self._copy(consumer, self._fresh_producer(consumer, batch), batch)
            self._backoff.succeeded()
        except KafkaException as exc:
            self._failed(exc)
        except Exception:  # never the end of the relay: a bug is logged, and retried
            log.exception("relay %s: failed; retrying", self.name)
            self._producer = None
            self._backoff.failed(time.monotonic())

    def _fresh_producer(self, consumer: Consumer, batch: list[KafkaMessage]) -> Producer:
        """The producer for ``batch``, made anew if it saw its brokers go away: librdkafka's
        transactional producer may keep a stale group coordinator after an outage and then
        never send the next transaction's offsets (``send_offsets_to_transaction`` blocking
        past its timeout: librdkafka issues 5456 and 5511).  A new one (same
        ``transactional.id``) finds the coordinators afresh, between two transactions, once a
        batch shows Kafka back, for the cost of one ``init_transactions``; if it cannot be
        made, the consumer is rewound to the batch."""
        assert self._producer is not None
        self._producer.poll(0)  # serves _on_error: an outage seen marks it stale
        if not self._stale:
            return self._producer
        log.info("relay %s: Kafka was unreachable; a new producer", self.name)
        self._producer.close()
        self._producer = None
        try:
            self._producer = self._new_producer()
        except KafkaException:
            _rewind(consumer, batch)
            raise
        return self._producer

    def _new_producer(self) -> Producer:
        producer = Producer({
            **self._common(),
            "transactional.id": f"headwater.{self.name}.{self.settings.node_id}",
            "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "message.max.bytes": MAX_RECORD_BYTES,
            "error_cb": self._on_error,
        })  # fmt: skip
        try:
            producer.init_transactions(TRANSACTION_TIMEOUT_MS / 1000)
        except KafkaException:
            producer.close()  # now: left to the collector, it could fence its successor
            raise
        producer.poll(0)  # what it reported while it started is no outage
        self._stale = False
        return producer

    def _on_error(self, error: KafkaError) -> None:
        if error.code() in (KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT):
            self._stale = True

    def _take(self, consumer: Consumer) -> list[KafkaMessage]:
        """The records waiting: the first within ``WAIT_SECONDS``, then those already fetched."""
        first = consumer.poll(WAIT_SECONDS)
        if first is None:
            return []
        batch = [first, *consumer.consume(BATCH - 1, 0)]
        records = [message for message in batch if message.error() is None]
        for message in batch:
            error = message.error()
            if error is not None:  # reported, not raised: the batch's records are taken anyway
                log.warning("relay %s: %s", self.name, error.str())
        return records

    def _copy(self, consumer: Consumer, producer: Producer, batch: list[KafkaMessage]) -> None:
        """One transaction: the batch's records and its offsets; aborted and rewound if it fails."""
        outputs = self._outputs(batch)
        self.busy_since = time.monotonic()
        deadline = self.busy_since + TRANSACTION_TIMEOUT_MS / 1000
        try:
            producer.begin_transaction()
            written = self._produce(producer, outputs, deadline)
            self._apply_retained(written, deadline)
            offsets = _next_offsets(batch)
            group = consumer.consumer_group_metadata()
            _retrying(lambda left: producer.send_offsets_to_transaction(offsets, group, left),
                      deadline)  # fmt: skip
            commit_by = time.monotonic() + TRANSACTION_TIMEOUT_MS / 1000
            _retrying(producer.commit_transaction, commit_by)
        except Exception as exc:  # Kafka's, or the retained store's: the batch is copied again
            self._abort(consumer, producer, batch, exc)
            return
        finally:
            self.busy_since = None
        self.counts.copied += len(outputs)

    def _outputs(self, batch: list[KafkaMessage]) -> list[Output]:
        outputs = []
        for source in batch:
            converted = self.convert(source)
            if isinstance(converted, Output):
                outputs.append(converted)
            elif converted is not None:
                self.counts.skipped[converted] += 1
                if self.counts.skipped[converted] == 1:
                    log.warning(
                        "relay %s: skipped a record of %s [%d] at %d: %s (counted from now on)",
                        self.name, source.topic(), source.partition(), source.offset(), converted,
                    )  # fmt: skip
        return outputs

    def _produce(
        self, producer: Producer, outputs: list[Output], deadline: float
    ) -> list[tuple[Message, int, int]]:
        """Write ``outputs``; once all are acknowledged, the retained ones with their places."""
        written: list[tuple[Message, int, int]] = []
        errors: list[str] = []

        def report(output: Output) -> Callable[[KafkaError | None, KafkaMessage], None]:
            def delivered(err: KafkaError | None, msg: KafkaMessage) -> None:
                if err is not None:
                    errors.append(err.str())
                elif output.retained is not None:
                    written.append((output.retained, msg.partition() or 0, msg.offset() or 0))

            return delivered

        for output in outputs:
            producer.produce(
                output.topic, output.value, output.key, partition=output.partition,
                on_delivery=report(output) if output.retained is not None else _check(errors),
                timestamp=output.timestamp, headers=list(output.headers),
            )  # fmt: skip
        left = producer.flush(_left(deadline))
        if left or errors:
            raise KafkaException(KafkaError(
                KafkaError._MSG_TIMED_OUT, f"{left} unwritten, errors: {errors[:3]}"
            ))  # fmt: skip
        return written

    def _apply_retained(self, written: list[tuple[Message, int, int]], deadline: float) -> None:
        """Apply the retained messages to the store (on the node's loop) before the commit: a
        failure aborts the batch, and the store keeps a topic's highest offset, so applying a
        message again, or one whose transaction was then aborted, leaves the latest in place."""
        if not written or self.apply_retained is None or self._loop is None:
            return
        apply = self.apply_retained
        for message, partition, offset in written:
            future = asyncio.run_coroutine_threadsafe(apply(message, partition, offset), self._loop)
            future.result(_left(deadline))

    def _abort(
        self, consumer: Consumer, producer: Producer, batch: list[KafkaMessage], exc: Exception
    ) -> None:
        self.counts.aborted += 1
        log.warning("relay %s: transaction aborted, its batch is copied again: %s", self.name, exc)
        try:
            producer.abort_transaction(TRANSACTION_TIMEOUT_MS / 1000)
        except KafkaException as failed:
            log.warning("relay %s: abort failed (%s); a new producer", self.name, failed)
            self._producer = None  # its successor's init_transactions aborts what this left open
        _rewind(consumer, batch)
        self._backoff.failed(time.monotonic())

    def _failed(self, exc: KafkaException) -> None:
        error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
        if error is None or error.fatal() or error.code() == KafkaError._FENCED:
            self._producer = None
        paused = self._backoff.failed(time.monotonic())
        if paused <= 0.1:
            log.warning("relay %s: %s; retrying", self.name, exc)


def _check(errors: list[str]) -> Callable[[KafkaError | None, KafkaMessage], None]:
    def delivered(err: KafkaError | None, _: KafkaMessage) -> None:
        if err is not None:
            errors.append(err.str())

    return delivered


def _left(deadline: float) -> float:
    """Seconds to ``deadline`` (``time.monotonic()``), at least a tenth: a call's timeout."""
    return max(deadline - time.monotonic(), 0.1)


def _retrying(call: Callable[[float], object], deadline: float) -> None:
    """``call(seconds left)`` again while it fails with an error that librdkafka says may be
    retried, until ``deadline`` (a commit that timed out may have happened: it is asked again,
    not aborted, for a transaction timeout more, until the broker would have aborted it)."""
    backoff = Backoff()
    while True:
        try:
            call(_left(deadline))
            return
        except KafkaException as exc:
            error = exc.args[0]
            now = time.monotonic()
            if not isinstance(error, KafkaError) or not error.retriable() or now > deadline:
                raise
            time.sleep(min(backoff.failed(now), _left(deadline)))


def _next_offsets(batch: list[KafkaMessage]) -> list[TopicPartition]:
    """Per partition of the batch, the offset after its last record (what the group commits)."""
    last: dict[tuple[str, int], int] = {}
    for message in batch:
        last[(message.topic() or "", message.partition() or 0)] = message.offset() or 0
    return [TopicPartition(t, p, o + 1) for (t, p), o in last.items()]


def _rewind(consumer: Consumer, batch: list[KafkaMessage]) -> None:
    """Back to each partition's first record of ``batch``; a partition no longer assigned is
    read by its new owner from the group's committed offset anyway."""
    first: dict[tuple[str, int], int] = {}
    for message in batch:
        first.setdefault((message.topic() or "", message.partition() or 0), message.offset() or 0)
    for (topic, partition), offset in first.items():
        try:
            consumer.seek(TopicPartition(topic, partition, offset))
        except KafkaException as exc:
            log.info("relay: partition %s [%d] not rewound: %s", topic, partition, exc)


# -- the node's relays -----------------------------------------------------------------------------


@dataclass(slots=True)
class RelaysConfig:
    log_topic: str
    partitions: int
    inbound_topic: str | None = INBOUND_TOPIC
    """None: no inbound relay."""
    exports: list[Export] = field(default_factory=list)


class Relays:
    """The node's inbound relay and exports: their topics made if missing, started, stopped."""

    def __init__(
        self,
        config: RelaysConfig,
        settings: RelaySettings,
        router: Router,
        stamps: MessageStamps,
        apply_retained: ApplyRetained,
    ) -> None:
        self.config = config
        self.settings = settings
        self.relays: list[Relay] = []
        """The inbound relay first if there is one, then the exports."""
        if config.inbound_topic:
            convert = inbound_converter(router, config.log_topic, stamps)
            name = f"inbound.{config.log_topic}"
            self.relays.append(Relay(name, settings, config.inbound_topic, convert, apply_retained))
        self.relays += [
            Relay(f"export.{e.topic}", settings, config.log_topic, export_converter(e))
            for e in config.exports
        ]
        self._watch: asyncio.TimerHandle | None = None

    @property
    def inbound(self) -> Relay | None:
        return self.relays[0] if self.config.inbound_topic else None

    @property
    def exports(self) -> list[Relay]:
        return self.relays[1:] if self.config.inbound_topic else self.relays

    async def start(self) -> None:
        if not self.relays:
            return
        wanted = [e.topic for e in self.config.exports]
        if self.config.inbound_topic:
            wanted.append(self.config.inbound_topic)
        await asyncio.get_running_loop().run_in_executor(None, self._create_topics, wanted)
        for relay in self.relays:
            relay.start()
        self._watch = asyncio.get_running_loop().call_later(WATCH_SECONDS, self._renew_stuck)

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
        await asyncio.gather(*(relay.stop() for relay in self.relays))

    def _renew_stuck(self) -> None:
        now = time.monotonic()
        for i, relay in enumerate(self.relays):
            if relay.stuck(now):
                log.warning("relay %s: stuck in a transaction; made anew", relay.name)
                self.relays[i] = relay.renewed()
                self.relays[i].start()
        self._watch = asyncio.get_running_loop().call_later(WATCH_SECONDS, self._renew_stuck)

    def _create_topics(self, names: list[str]) -> None:
        """Create the topics missing, with the log topic's partitions, replication and config."""
        admin = AdminClient(
            {"bootstrap.servers": self.settings.bootstrap, **self.settings.security}
        )
        meta = admin.list_topics(timeout=10)
        log_meta = meta.topics.get(self.config.log_topic)
        factor = 1
        if log_meta is not None and log_meta.partitions:
            factor = len(next(iter(log_meta.partitions.values())).replicas) or 1
        spec = messages_topic(self.config.partitions, Replication.for_factor(factor))
        missing = [
            NewTopic(name, self.config.partitions, factor, config=dict(spec.config))
            for name in dict.fromkeys(names)
            if name not in meta.topics
        ]
        if not missing:
            return
        for name, future in admin.create_topics(missing, request_timeout=10).items():
            try:
                future.result()
                log.info("created topic %s (%d partitions)", name, self.config.partitions)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise ConnectionError(f"cannot create topic {name!r}: {exc}") from exc

    def counts(self) -> dict[str, int]:
        """The relays' counters for ``/stats``: every key always present."""
        inbound = self.inbound.counts if self.inbound is not None else RelayCounts()
        exports = [e.counts for e in self.exports]
        return {
            "inbound_relayed": inbound.copied,
            **{f"inbound_skipped_{reason}": inbound.skipped[reason] for reason in INVALID},
            "exported": sum(c.copied for c in exports),
            "export_undecodable": sum(c.skipped["undecodable"] for c in exports),
            "relay_transactions_aborted": inbound.aborted + sum(c.aborted for c in exports),
        }
