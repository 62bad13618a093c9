"""The MQTT sink: analytics results written back into the log as MQTT messages.

Each result row becomes one application message on ``<base>/<subtopic>`` (e.g.
``analytics/traffic/sensors/kitchen``; ``<base>`` alone for a row without a subtopic) whose
payload is the row as a JSON object (timestamps as ISO-8601 UTC strings).  It is encoded exactly
as a front-end encodes a PUBLISH (a ``Message`` from ``router.record.wall_clock_stamps``, then
``router.record.encode``), keyed by its routing key and
written to the partition ``router.partitioner.Router`` picks, so every front-end delivers it to
subscribers of a matching filter like any other message.  ``origin_node`` is
``ANALYTICS_ORIGIN``, which the jobs skip.

Delivery: ``foreachBatch`` runs ``write_batch`` on the driver, which collects the batch's rows
(aggregates: a few per window), produces them with an idempotent producer (``acks=all``), waits
until every record is acknowledged, then records the batch id in ``<checkpoint>/mqtt_sink/``.
Spark re-runs a batch only if it did not complete; a re-run finding the batch id recorded does
nothing, so a batch is written once unless the driver dies between the acknowledgement and the
record of it.  In that window the batch is written again, with the same message ids: ids are a
hash of the checkpoint, batch id, topic and payload, so readers of the log can deduplicate.
Hence: at-least-once into the log, exactly-once per message id; MQTT subscribers (QoS 1) see
at-least-once, as MQTT promises.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import DateType, TimestampNTZType, TimestampType

from mqttcore.message import Message
from router.partitioner import Router, routing_key
from router.record import ANALYTICS, encode, headers, wall_clock_stamps
from spark_streaming.options import ANALYTICS_ORIGIN, JobOptions

MARKERS = "mqtt_sink"
KEEP_MARKERS = 100


class SinkError(RuntimeError):
    """A batch that could not be written completely; Spark fails the query and can retry it."""


def log_partitions(bootstrap: str, topic: str, timeout: float = 10.0) -> int:
    """The partition count of the log topic (the router's modulus)."""
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=timeout)
    entry = metadata.topics.get(topic)
    if entry is None or entry.error is not None or not entry.partitions:
        raise SinkError(f"log topic {topic!r} not found at {bootstrap}")
    return len(entry.partitions)


def safe_level(text: str) -> str:
    """``text`` usable inside a topic name: wildcards and NUL replaced by ``_``."""
    return text.replace("+", "_").replace("#", "_").replace("\x00", "_") or "_"


def as_strings(df: DataFrame) -> DataFrame:
    """Timestamps as ISO-8601 UTC text and dates as ``YYYY-MM-DD`` (the session is in UTC)."""
    columns = []
    for f in df.schema.fields:
        if isinstance(f.dataType, TimestampType | TimestampNTZType):
            text = F.date_format(F.col(f.name), "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'")
            columns.append(text.alias(f.name))
        elif isinstance(f.dataType, DateType):
            columns.append(F.col(f.name).cast("string").alias(f.name))
        else:
            columns.append(F.col(f.name))
    return df.select(*columns)


class MqttSink:
    """A ``foreachBatch`` function publishing result rows as MQTT messages through the log."""

    def __init__(
        self,
        options: JobOptions,
        subtopic: Callable[[Mapping[str, Any]], str | None],
        qos: int = 1,
    ) -> None:
        self.options = options
        self.subtopic = subtopic
        self.qos = qos
        self.client_id = f"{ANALYTICS_ORIGIN}-{options.title}"
        self.checkpoint = str(options.checkpoint)
        self._stamps = wall_clock_stamps(ANALYTICS_ORIGIN)
        self._router: Router | None = None
        self._producer: Producer | None = None
        self.written = 0

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        self.write_batch(batch, batch_id)

    def write_batch(self, batch: DataFrame, batch_id: int) -> None:
        markers = _Markers(batch, f"{self.checkpoint.rstrip('/')}/{MARKERS}")
        if markers.done(batch_id):
            return
        rows = [row.asDict(recursive=True) for row in as_strings(batch).collect()]
        self._produce_all(rows, batch_id)
        markers.record(batch_id)
        markers.prune(batch_id - KEEP_MARKERS)

    def message(self, row: Mapping[str, Any], batch_id: int) -> Message:
        """The MQTT message carrying ``row``, with an id that a re-run of the batch repeats."""
        level = self.subtopic(row)
        base = self.options.mqtt_base_topic
        topic = base if level is None else f"{base}/{safe_level(level)}"
        payload = json.dumps(row, sort_keys=True, separators=(",", ":")).encode()
        message = self._stamps.message(topic, payload, self.qos, False, self.client_id)
        seed = b"|".join(
            (self.checkpoint.encode(), str(batch_id).encode(), topic.encode(), payload)
        )
        message.message_id = hashlib.sha256(seed).digest()[:16]
        return message

    def _produce_all(self, rows: list[dict[str, Any]], batch_id: int) -> None:
        producer, router = self._connect()
        errors: list[str] = []

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                errors.append(str(err))

        for row in rows:
            message = self.message(row, batch_id)
            self._produce(producer, router, message, delivered)
        if producer.flush(30.0) or errors:
            raise SinkError(f"batch {batch_id}: not every result was acknowledged: {errors[:3]}")
        self.written += len(rows)

    def _produce(
        self, producer: Producer, router: Router, message: Message, delivered: Callable[..., None]
    ) -> None:
        key = routing_key(message.topic, router.depth).encode()
        partition = router.partition_for_topic(message.topic)
        while True:
            try:
                producer.produce(
                    self.options.topic,
                    encode(message),
                    key,
                    partition=partition,
                    on_delivery=delivered,
                    timestamp=message.timestamp_ms,
                    headers=headers(message, ANALYTICS),  # type: ignore[arg-type]
                )
                return
            except BufferError:
                producer.poll(0.1)

    def _connect(self) -> tuple[Producer, Router]:
        if self._producer is None or self._router is None:
            partitions = log_partitions(self.options.bootstrap, self.options.topic)
            self._router = Router(partitions, self.options.routing_depth)
            self._producer = Producer(
                {
                    "bootstrap.servers": self.options.bootstrap,
                    "enable.idempotence": True,
                    "acks": "all",
                    "linger.ms": 5,
                    "client.id": self.client_id,
                }
            )
        return self._producer, self._router

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(30.0)
            self._producer = None


class _Markers:
    """Batch ids already written, as empty files in the checkpoint's file system (Hadoop API)."""

    def __init__(self, batch: DataFrame, directory: str) -> None:
        spark: Any = batch.sparkSession  # py4j handles are untyped
        self._path = spark._jvm.org.apache.hadoop.fs.Path
        self._dir = directory
        hadoop_conf = spark.sparkContext._jsc.hadoopConfiguration()
        self._fs = self._path(directory).getFileSystem(hadoop_conf)

    def _file(self, batch_id: int) -> Any:
        return self._path(f"{self._dir}/{batch_id}")

    def done(self, batch_id: int) -> bool:
        return bool(self._fs.exists(self._file(batch_id)))

    def record(self, batch_id: int) -> None:
        self._fs.create(self._file(batch_id), True).close()

    def prune(self, below: int) -> None:
        if below >= 0 and self._fs.exists(self._file(below)):
            self._fs.delete(self._file(below), False)
