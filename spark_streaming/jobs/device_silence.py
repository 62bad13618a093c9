"""Clients that published regularly, then went silent.

Event time is cut into tumbling buckets of ``--window`` (W).  A client is reported *silent* when,
for some bucket-aligned time T:

* it published in at least ``--min-active`` (k) of the ``--lookback`` (N) buckets before T, i.e.
  in [T - N*W, T), and its last message falls in the last of them, [T - W, T);
* it published nothing in [T, T + M), M = ``--silence`` (a multiple of W).

Each silence is reported once (T is fixed by the last message, rounded up to a bucket boundary),
when the watermark passes T + M: one row with ``client_id``, ``last_seen`` (its last message),
``active_windows`` (of the N), ``lookback_start`` (T - N*W) and ``silent_at`` (T + M: from then on
it had been silent for at least M, at most M + W).  A client that resumes and stops again is
reported again.  Silence is measured in event time, which other clients' traffic advances: if the
whole log goes quiet, nothing is reported until traffic resumes.

Implementation: sliding windows of length N*W + M sliding by W, aggregated per (window, client):
the set of buckets active in the first N*W, and the last event time.  The window whose first
N*W ends in the bucket of the last message and whose last M is empty is the one reported.  State:
(N*W + M)/W windows per active client, each a set of at most N bucket numbers; append mode only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_streaming.events import events
from spark_streaming.options import JobOptions, OptionsError, seconds, spark_interval

NAME = "device_silence"
APPEND_ONLY = True
KEY = ("client_id", "silent_at")


def check(options: JobOptions) -> None:
    """The silence must be a whole number of windows, and k at most N."""
    window, silence = options.window_seconds, seconds(spark_interval(options.silence))
    if silence % window:
        raise OptionsError(f"--silence {options.silence!r} is not a multiple of --window")
    if not 1 <= options.min_active <= options.lookback:
        raise OptionsError("--min-active must be between 1 and --lookback")


def transform(df: DataFrame, options: JobOptions) -> DataFrame:
    """Silence reports from decoded messages ``df`` (static or streaming)."""
    check(options)
    w = options.window_seconds
    head = options.lookback * w
    span = head + int(seconds(spark_interval(options.silence)))
    sliding = F.window("event_time", f"{span} seconds", f"{w} seconds")
    head_end = F.col("window.start") + F.expr(f"INTERVAL {head} SECONDS")
    bucket = F.floor(F.unix_millis("event_time") / F.lit(w * 1000))
    per_window = (
        events(df, options)
        .select("client_id", "event_time", sliding.alias("window"))
        .groupBy("window", "client_id")
        .agg(
            F.size(F.collect_set(F.when(F.col("event_time") < head_end, bucket))).alias("active"),
            F.max("event_time").alias("last_seen"),
        )
    )
    reported = per_window.where(
        (F.col("active") >= options.min_active)
        & (F.col("last_seen") < head_end)
        & (F.col("last_seen") >= head_end - F.expr(f"INTERVAL {w} SECONDS"))
    )
    return reported.select(
        "client_id",
        "last_seen",
        F.col("active").alias("active_windows"),
        F.col("window.start").alias("lookback_start"),
        F.col("window.end").alias("silent_at"),
        F.to_date(F.col("window.end")).alias("date"),
    )


def mqtt_subtopic(row: Mapping[str, Any]) -> str:
    """A report on client ``c`` goes to ``<--mqtt-topic>/c`` (``analytics/device_silence/c``)."""
    return str(row["client_id"])
