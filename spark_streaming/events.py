"""The event stream every job starts from, and the column expressions the jobs share.

``events`` takes decoded messages (``spark_streaming.source.decode_records``), drops the records
no client published: the nodes' ``$SYS`` reports and client events (``$events/...``), and the
records the analytics MQTT sink wrote itself (their ``origin_node`` is ``ANALYTICS_ORIGIN``;
counting them would make analytics of analytics) unless ``--include-analytics``, and declares the
watermark on ``event_time``: a window is
final once the newest event time seen is ``--watermark`` past its end, and rows arriving later
than that are dropped.  On a static DataFrame the watermark is a no-op, so transforms are pure.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from router.record import ANALYTICS, CLIENT, EVENT, SYS
from spark_streaming.options import JobOptions, spark_interval
from spark_streaming.source import node_kind


def events(messages: DataFrame, options: JobOptions) -> DataFrame:
    """``messages`` without the records of nodes and of the analytics sink, watermarked on
    ``event_time``."""
    dropped = [SYS, EVENT] if options.include_analytics else [SYS, EVENT, ANALYTICS]
    kept = messages.where(~F.coalesce(node_kind(), F.lit(CLIENT)).isin(dropped))
    return kept.withWatermark("event_time", spark_interval(options.watermark, 0))


def topic_prefix(topic: Column, depth: int) -> Column:
    """The first ``depth`` levels of an MQTT topic joined by ``/`` (all of it if shorter).

    The same rule as ``router.partitioner.routing_key``, so with the default depth of 2 a prefix is
    exactly the routing key that picks the topic's partition.
    """
    return F.concat_ws("/", F.slice(F.split(topic, "/", depth + 1), 1, depth))


def tumbling(options: JobOptions) -> Column:
    """The tumbling event-time window of ``--window`` each message falls in."""
    return F.window("event_time", spark_interval(options.window))


def window_bounds() -> list[Column]:
    """``window`` flattened to ``window_start``/``window_end``, and ``date`` for partitioning."""
    return [
        F.col("window.start").alias("window_start"),
        F.col("window.end").alias("window_end"),
        F.to_date(F.col("window.start")).alias("date"),
    ]
