"""The top ``--top`` publishers of each event-time window, by message rate.

Two chained aggregations: messages and bytes per (tumbling ``--window``, ``client_id``), then per
window the publishers sorted by messages (ties: client id ascending) and cut to ``--top``.  One row
per (window, rank): ``client_id``, ``messages``, ``messages_per_second`` (messages / window length),
``bytes``, ``share`` (of all the window's messages) and ``publishers`` (in the window).

Append mode only: a window's ranking is emitted once, final, after the watermark passes its end
(Spark runs chained stateful aggregations in append mode only, and a partial ranking would be
wrong, not just early).  State per open window: one entry per publisher seen in it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark_streaming.events import events, tumbling, window_bounds
from spark_streaming.options import JobOptions, spark_interval

NAME = "top_publishers"
APPEND_ONLY = True
KEY = ("window_start", "rank")


def _busier_first(left: Column, right: Column) -> Column:
    """array_sort comparator: more messages first, then client id ascending."""
    return (
        F.when(left["messages"] > right["messages"], -1)
        .when(left["messages"] < right["messages"], 1)
        .when(left["client_id"] < right["client_id"], -1)
        .when(left["client_id"] > right["client_id"], 1)
        .otherwise(0)
    )


def transform(df: DataFrame, options: JobOptions) -> DataFrame:
    """Per-window publisher ranking of decoded messages ``df`` (static or streaming)."""
    per_client = (
        events(df, options)
        .groupBy(tumbling(options).alias("window"), "client_id")
        .agg(F.count(F.lit(1)).alias("messages"), F.sum(F.length("payload")).alias("bytes"))
    )
    window = F.window(F.window_time("window"), spark_interval(options.window))
    ranked = per_client.groupBy(window.alias("window")).agg(
        F.array_sort(
            F.collect_list(F.struct("messages", "client_id", "bytes")), _busier_first
        ).alias("ranking"),
        F.sum("messages").alias("window_messages"),
        F.count(F.lit(1)).alias("publishers"),
    )
    top = ranked.select(
        "window",
        "window_messages",
        "publishers",
        F.posexplode(F.slice("ranking", 1, options.top)).alias("position", "entry"),
    )
    return top.select(
        *window_bounds(),
        (F.col("position") + 1).alias("rank"),
        F.col("entry.client_id").alias("client_id"),
        F.col("entry.messages").alias("messages"),
        (F.col("entry.messages") / F.lit(options.window_seconds)).alias("messages_per_second"),
        F.col("entry.bytes").alias("bytes"),
        (F.col("entry.messages") / F.col("window_messages")).alias("share"),
        "publishers",
    )


def mqtt_subtopic(row: Mapping[str, Any]) -> str:
    """Rank ``n`` of a window goes to ``<--mqtt-topic>/n`` (``analytics/top_publishers/n``)."""
    return str(row["rank"])
