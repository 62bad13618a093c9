"""Traffic per event-time window and topic prefix: messages, payload bytes, publishers, QoS mix.

One row per (tumbling ``--window`` of ``event_time``, first ``--prefix-depth`` topic levels):
``messages``, ``bytes`` (sum of payload lengths), ``publishers`` (distinct ``client_id``: exact,
``size(collect_set)``, by default; ``--distinct approx`` uses HyperLogLog++ with a 5% relative
standard deviation and constant state per window), ``qos0``/``qos1``/``qos2`` message counts.

In update mode (console, mqtt) each trigger emits the running totals of the windows it touched; in
append mode (parquet) a window is emitted once, final, after the watermark passes its end.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_streaming.events import events, topic_prefix, tumbling, window_bounds
from spark_streaming.options import JobOptions

NAME = "traffic"
APPEND_ONLY = False
KEY = ("window_start", "prefix")


def transform(df: DataFrame, options: JobOptions) -> DataFrame:
    """Per-window, per-prefix traffic of decoded messages ``df`` (static or streaming)."""
    if options.distinct == "approx":
        publishers = F.approx_count_distinct("client_id", 0.05)
    else:
        publishers = F.size(F.collect_set("client_id"))
    counts = (
        events(df, options)
        .groupBy(
            tumbling(options).alias("window"),
            topic_prefix(F.col("topic"), options.prefix_depth).alias("prefix"),
        )
        .agg(
            F.count(F.lit(1)).alias("messages"),
            F.sum(F.length("payload")).alias("bytes"),
            publishers.alias("publishers"),
            *[F.count(F.when(F.col("qos") == q, True)).alias(f"qos{q}") for q in (0, 1, 2)],
        )
    )
    return counts.select(
        *window_bounds(),
        "prefix",
        "messages",
        "bytes",
        F.col("publishers").cast("long").alias("publishers"),
        "qos0",
        "qos1",
        "qos2",
    )


def mqtt_subtopic(row: Mapping[str, Any]) -> str:
    """Results for prefix ``p`` go to ``<--mqtt-topic>/p`` (default ``analytics/traffic/p``)."""
    return str(row["prefix"])
