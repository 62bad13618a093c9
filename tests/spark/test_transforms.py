"""The jobs' pure transforms on static DataFrames: each aggregate against a hand count."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from mqttcore.message import Message
from router.record import HEADER, encode
from spark_streaming.jobs import device_silence, top_publishers, traffic
from spark_streaming.options import ANALYTICS_ORIGIN, JobOptions, OptionsError
from spark_streaming.source import MESSAGE_COLUMNS, decode_records

pytestmark = pytest.mark.spark

T0 = dt.datetime(2026, 3, 1, 12, 0, 0, tzinfo=dt.UTC)
SCHEMA = (
    "message_id binary, topic string, payload binary, qos int, retain boolean, "
    "client_id string, origin_node string, timestamp timestamp, event_time timestamp"
)


def messages(spark: SparkSession, rows: list[tuple[str, int, int, str, float]]) -> DataFrame:
    """Decoded messages from (topic, payload length, qos, client id, seconds after T0)."""
    data = []
    for topic, size, qos, client, after in rows:
        at = T0 + dt.timedelta(seconds=after)
        data.append((b"\0" * 16, topic, b"x" * size, qos, False, client, "node1", at, at))
    return spark.createDataFrame(data, SCHEMA)


def collect(df: DataFrame, *order: str) -> list[dict[str, Any]]:
    """Rows as dicts, times as seconds after T0 (independent of the Python process's zone)."""
    for name, kind in df.dtypes:
        if kind == "timestamp":
            seconds_after = F.unix_seconds(name) - F.lit(int(T0.timestamp()))
            df = df.withColumn(name, seconds_after)
    return [row.asDict() for row in (df.orderBy(*order) if order else df).collect()]


def options(job: str, **overrides: Any) -> JobOptions:
    return JobOptions(job=job, bootstrap="unused:9092", **overrides)


# -- decoding -------------------------------------------------------------------------------


def test_decode_keeps_headwater_records_and_drops_the_rest(spark: SparkSession) -> None:
    good = Message(
        "a/b/c", b"\x00\xff", 2, True, "dev-\u00e9", "node7", 1_767_225_600_123, b"i" * 16
    )
    values = [
        encode(good),
        b"\xc3\x01" + b"\x00" * 8 + encode(good)[10:],  # another schema's fingerprint
        HEADER + b"\x01",  # the right header, a truncated datum
        b"not avro at all",
    ]
    raw = spark.createDataFrame([(v,) for v in values], "value binary")
    rows = decode_records(raw).collect()
    assert len(rows) == 1
    row = rows[0]
    assert [row[c] for c in MESSAGE_COLUMNS[:-1]] == [
        bytearray(b"i" * 16),
        "a/b/c",
        bytearray(b"\x00\xff"),
        2,
        True,
        "dev-\u00e9",
        "node7",
    ]
    millis = decode_records(raw).select(F.unix_millis("event_time")).first()
    assert millis is not None and millis[0] == 1_767_225_600_123


# -- traffic --------------------------------------------------------------------------------


def test_traffic_counts_per_window_and_prefix(spark: SparkSession) -> None:
    df = messages(
        spark,
        [
            ("home/kitchen/temp", 10, 0, "a", 1),
            ("home/kitchen/humidity", 5, 1, "b", 2),
            ("home/kitchen", 7, 2, "a", 59.999),
            ("home/garage/door", 3, 1, "a", 30),
            ("home/kitchen/temp", 4, 0, "c", 60),  # next window
            ("office", 2, 0, "a", 61),  # fewer levels than the depth
        ],
    )
    got = collect(traffic.transform(df, options("traffic")), "window_start", "prefix")
    assert [
        (r["window_start"], r["window_end"], r["prefix"], r["messages"], r["bytes"]) for r in got
    ] == [
        (0, 60, "home/garage", 1, 3),
        (0, 60, "home/kitchen", 3, 22),
        (60, 120, "home/kitchen", 1, 4),
        (60, 120, "office", 1, 2),
    ]
    kitchen = got[1]
    assert (kitchen["publishers"], kitchen["qos0"], kitchen["qos1"], kitchen["qos2"]) == (
        2,
        1,
        1,
        1,
    )
    assert {str(r["date"]) for r in got} == {"2026-03-01"}


def test_traffic_prefix_depth_and_window_length(spark: SparkSession) -> None:
    df = messages(
        spark, [("a/b/c/d", 1, 0, "x", 1), ("a/b/e", 1, 0, "y", 200), ("a/z", 1, 1, "x", 3)]
    )
    depth1 = collect(traffic.transform(df, options("traffic", prefix_depth=1, window="5 minutes")))
    assert [(r["prefix"], r["messages"], r["publishers"]) for r in depth1] == [("a", 3, 2)]
    depth3 = traffic.transform(df, options("traffic", prefix_depth=3, window="1 hour"))
    assert sorted(r["prefix"] for r in depth3.collect()) == ["a/b/c", "a/b/e", "a/z"]


def test_traffic_approximate_publishers_and_analytics_excluded(spark: SparkSession) -> None:
    rows = [("t/p", 1, 0, f"client{i}", i % 50) for i in range(40)]
    df = messages(spark, rows).union(
        messages(spark, [("t/p", 1, 0, "x", 1)]).withColumn("origin_node", F.lit(ANALYTICS_ORIGIN))
    )
    approx = traffic.transform(df, options("traffic", distinct="approx")).first()
    assert approx is not None and approx["messages"] == 40
    assert abs(approx["publishers"] - 40) <= 4  # HLL++, rsd 5%
    included = traffic.transform(df, options("traffic", include_analytics=True)).first()
    assert included is not None and (included["messages"], included["publishers"]) == (41, 41)


def test_traffic_leaves_out_the_nodes_sys_reports_and_client_events(spark: SparkSession) -> None:
    df = messages(
        spark,
        [
            ("plant/a/temp", 4, 1, "dev1", 1),
            ("$SYS/brokers/node1/uptime", 2, 0, "", 2),
            ("$events/connected", 90, 0, "dev1", 3),
        ],
    )
    rows = collect(traffic.transform(df, options("traffic")))
    assert [(r["prefix"], r["messages"]) for r in rows] == [("plant/a", 1)]


# -- top publishers -------------------------------------------------------------------------


def test_top_publishers_ranks_by_rate_with_ties_by_client_id(spark: SparkSession) -> None:
    rows = [("t/a", 2, 0, "busy", s) for s in range(6)]
    rows += [("t/a", 1, 0, "bravo", s) for s in range(3)]
    rows += [("t/b", 1, 0, "alpha", s) for s in range(3)]
    rows += [("t/b", 1, 0, "quiet", 10)]
    rows += [("t/b", 1, 0, "quiet", 70), ("t/b", 1, 0, "alpha", 80)]  # second window
    got = collect(
        top_publishers.transform(messages(spark, rows), options("top_publishers", top=3)),
        "window_start",
        "rank",
    )
    first = [
        (r["rank"], r["client_id"], r["messages"], r["bytes"])
        for r in got
        if r["window_start"] == 0
    ]
    assert first == [(1, "busy", 6, 12), (2, "alpha", 3, 3), (3, "bravo", 3, 3)]
    top = got[0]
    assert top["messages_per_second"] == pytest.approx(6 / 60)
    assert top["share"] == pytest.approx(6 / 13) and top["publishers"] == 4
    second = [(r["rank"], r["client_id"]) for r in got if r["window_start"] == 60]
    assert second == [(1, "alpha"), (2, "quiet")]


# -- device silence -------------------------------------------------------------------------


def silence_options(**overrides: Any) -> JobOptions:
    settings: dict[str, Any] = {"lookback": 5, "min_active": 3, "silence": "3 minutes"}
    return options("device_silence", **{**settings, **overrides})


def test_device_silence_reports_a_regular_publisher_once(spark: SparkSession) -> None:
    rows = [("d/regular", 1, 0, "regular", 60 * m + 10) for m in range(8)]  # minutes 0..7
    rows += [("d/sparse", 1, 0, "sparse", 60 * m) for m in (0, 4)]  # only 2 active minutes
    rows += [("d/steady", 1, 0, "steady", 60 * m + 5) for m in range(40)]  # until the data ends
    got = collect(device_silence.transform(messages(spark, rows), silence_options()), "silent_at")
    assert got[0] == {
        "client_id": "regular",
        "last_seen": 7 * 60 + 10,
        "active_windows": 5,
        "lookback_start": 3 * 60,
        "silent_at": 11 * 60,
        "date": dt.date(2026, 3, 1),
    }
    # A static DataFrame ends: past its last event, every client is silent.  (A stream emits
    # that report only once later traffic moves the watermark past 43 minutes.)
    assert [(r["client_id"], r["silent_at"]) for r in got[1:]] == [("steady", 43 * 60)]


def test_device_silence_a_short_gap_is_not_silence_and_a_resumed_client_is_reported_again(
    spark: SparkSession,
) -> None:
    minutes = [0, 1, 2, 3, 5, 6, 7, 20, 21, 22]  # gap of 2 minutes (< 3), then one of 13
    rows = [("d/x", 1, 0, "x", 60 * m + 1) for m in minutes]
    got = collect(device_silence.transform(messages(spark, rows), silence_options()), "silent_at")
    assert [(r["last_seen"], r["active_windows"], r["silent_at"]) for r in got] == [
        (7 * 60 + 1, 4, 11 * 60),
        (22 * 60 + 1, 3, 26 * 60),
    ]


def test_device_silence_options_are_checked() -> None:
    with pytest.raises(OptionsError, match="multiple of --window"):
        device_silence.check(silence_options(silence="90 seconds"))
    with pytest.raises(OptionsError, match="--min-active"):
        device_silence.check(options("device_silence", lookback=3, min_active=4))
