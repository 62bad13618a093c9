"""The views a user's query reads: ``messages`` and ``events``, two streaming DataFrames of one log.

Both come from the log topic read with its headers (``spark_streaming.source``), decoded, and
split by ``record_kind``:

* ``messages``: ``topic``, ``payload`` (binary), ``qos``, ``retain``, ``client_id``,
  ``timestamp``, ``kind``, ``origin_node``, one row per application message.  The records nobody
  published through MQTT (``source.NODE_KINDS``: nodes' ``$SYS`` reports, client events, the
  analytics sink's results) are left out unless ``include_node_records``.  With a payload schema
  (``spark_streaming.payload_schema``) a ``data`` column holds the payload parsed as JSON
  (null where it does not parse).
* ``events``: the client events (kind ``event``, docs/log.md): ``event``, ``client_id``,
  ``username``, ``node``, ``reason``, ``clean_session``, ``filters`` (JSON text), ``timestamp``
  (the event's time, else the record's).

Both are watermarked on ``timestamp`` by ``--watermark``.  In a SQL query ``${window}`` and
``${watermark}`` stand for the flags' values in whole seconds (``60 seconds``), e.g.
``GROUP BY window(timestamp, '${window}')``.  On static DataFrames (``build_views(...,
streaming=False)``) the same views are a batch read: the watermark is a no-op.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from router.record import EVENT
from spark_streaming.options import JobOptions, spark_interval
from spark_streaming.payload_schema import payload_schema
from spark_streaming.source import NODE_KINDS, read_messages, record_kind

MESSAGES = "messages"
EVENTS = "events"
EVENT_FIELDS = (
    "event STRING, client_id STRING, username STRING, node STRING, timestamp BIGINT, "
    "reason STRING, clean_session BOOLEAN"
)


@dataclass(slots=True)
class Views:
    """What a user's job is given: the session, the two views, and the flags' durations."""

    spark: SparkSession
    messages: DataFrame
    events: DataFrame
    window: str
    """``--window`` in whole seconds, as ``window()`` takes it (``"60 seconds"``)."""
    watermark: str
    """``--watermark`` in whole seconds."""

    def sql(self, query: str) -> DataFrame:
        """``query`` over the views (registered as ``messages`` and ``events``), with
        ``${window}`` and ``${watermark}`` replaced by the flags' values."""
        text = query.replace("${window}", self.window).replace("${watermark}", self.watermark)
        return self.spark.sql(text)


def build_views(spark: SparkSession, options: JobOptions, streaming: bool = True) -> Views:
    """Read ``options.topic`` and register the ``messages`` and ``events`` temporary views."""
    decoded = read_messages(
        spark,
        options.bootstrap,
        options.topic,
        options.starting_offsets,
        streaming=streaming,
        max_offsets_per_trigger=options.max_offsets_per_trigger,
        headers=True,
    )
    views = views_of(spark, decoded, options)
    views.messages.createOrReplaceTempView(MESSAGES)
    views.events.createOrReplaceTempView(EVENTS)
    return views


def views_of(spark: SparkSession, decoded: DataFrame, options: JobOptions) -> Views:
    """The views of ``decoded`` messages (``source.decode_records`` output, with ``headers``)."""
    watermark = spark_interval(options.watermark, 0)
    kinded = decoded.withColumn("kind", record_kind(decoded))
    return Views(
        spark,
        messages_view(kinded, options).withWatermark("timestamp", watermark),
        events_view(kinded).withWatermark("timestamp", watermark),
        spark_interval(options.window),
        watermark,
    )


def messages_view(kinded: DataFrame, options: JobOptions) -> DataFrame:
    """The application messages of ``kinded`` (decoded, with ``kind``)."""
    if not options.include_node_records:
        kinded = kinded.where(~F.col("kind").isin(*NODE_KINDS))
    columns = ["topic", "payload", "qos", "retain", "client_id", "timestamp", "kind", "origin_node"]
    selected: list[Column | str] = list(columns)
    if options.payload_schema:
        text = F.col("payload").cast("string")
        parsed = F.from_json(text, payload_schema(options.payload_schema), {"mode": "PERMISSIVE"})
        selected.append(parsed.alias("data"))
    return kinded.select(*selected)


def events_view(kinded: DataFrame) -> DataFrame:
    """The client events of ``kinded``, their JSON payload as columns."""
    text = F.col("payload").cast("string")
    parsed = kinded.where(F.col("kind") == F.lit(EVENT)).select(
        "topic",
        F.col("timestamp").alias("_record_time"),
        F.from_json(text, EVENT_FIELDS, {"mode": "PERMISSIVE"}).alias("e"),
        F.get_json_object(text, "$.filters").alias("filters"),
        F.col("client_id").alias("_record_client"),
        F.col("origin_node").alias("_record_node"),
    )
    from_topic = F.substring_index(F.col("topic"), "/", -1)
    return parsed.select(
        F.coalesce(F.col("e.event"), from_topic).alias("event"),
        F.coalesce(F.col("e.client_id"), F.col("_record_client")).alias("client_id"),
        F.col("e.username").alias("username"),
        F.coalesce(F.col("e.node"), F.col("_record_node")).alias("node"),
        F.col("e.reason").alias("reason"),
        F.col("e.clean_session").alias("clean_session"),
        "filters",
        F.coalesce(F.timestamp_millis(F.col("e.timestamp")), F.col("_record_time")).alias(
            "timestamp"
        ),
    )
