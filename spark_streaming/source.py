"""Reading Headwater's log from Spark: the session, the Kafka source and the record decoding.

The session pulls ``spark-sql-kafka-0-10`` and ``spark-avro`` (the installed PySpark's version)
through ``spark.jars.packages``, with Ivy's cache pinned to ``$HEADWATER_CACHE/ivy`` (default
``~/.cache/headwater/ivy``): the first run downloads them from Maven Central, every later run
resolves them from that cache with no network.

A log record value is Avro single-object encoded (see ``router.record``): 10 header bytes
(``C3 01`` + the schema's CRC-64-AVRO fingerprint, little-endian), then the binary datum.
``read_messages`` keeps the records whose header is exactly ``router.record.HEADER`` and decodes
the rest of the value with spark-avro's ``from_avro`` against ``router.record.SCHEMA_TEXT``, the
``schemas`` package's ``mqtt_message.avsc`` read as package data (PERMISSIVE: a datum that does
not parse becomes a record of nulls, not a failed query).
Records with another header (a different schema, or not Headwater's at all) and undecodable data
are dropped, and counted as the observed metric ``headwater_records`` (``records``, ``bad_header``,
``undecodable``), which every streaming progress report carries.

The event time of a message is its ``timestamp``: when the front-end received the PUBLISH.

``record_kind`` tells who wrote a record (``router.record.KINDS``): its ``headwater.kind`` header
when the records were read with their headers, else what the value shows (``$SYS/...`` topics are
node reports, ``$events/...`` client events, ``origin_node`` ``headwater-analytics`` results of
the MQTT sink; records older than the headers have only the value).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.avro.functions import from_avro

from router.record import (
    ANALYTICS,
    CLIENT,
    EVENT,
    HEADER,
    HEADER_SIZE,
    KIND_HEADER,
    RETAINED_CLEAR,
    SCHEMA_TEXT,
    SYS,
)
from spark_streaming.options import ANALYTICS_ORIGIN
from spark_streaming.settings import cache_root

OBSERVATION = "headwater_records"
"""Name of the observed metric carrying the per-batch record, bad-header and undecodable counts."""
NODE_KINDS = (SYS, EVENT, ANALYTICS)
"""Records no client published: nodes' reports and client events, and the jobs' own results."""
SYS_PREFIX = "$SYS/"
EVENTS_PREFIX = "$events/"

MESSAGE_COLUMNS = (
    "message_id",
    "topic",
    "payload",
    "qos",
    "retain",
    "client_id",
    "origin_node",
    "timestamp",
)


def spark_version() -> str:
    """The installed PySpark's version, which the connector packages must match."""
    import pyspark

    return str(pyspark.__version__)


def packages(version: str | None = None) -> list[str]:
    """Maven coordinates of the Kafka source and Avro functions for Spark ``version``."""
    v = version or spark_version()
    return [
        f"org.apache.spark:spark-sql-kafka-0-10_2.13:{v}",
        f"org.apache.spark:spark-avro_2.13:{v}",
    ]


def ivy_dir(env: dict[str, str] | None = None) -> Path:
    """Ivy's home for the connector jars: ``$HEADWATER_CACHE/ivy`` or ``~/.cache/headwater/ivy``."""
    return cache_root(os.environ if env is None else env) / "ivy"


IVY_SETTINGS = """<ivysettings>
  <!-- Written by spark_streaming.source: Maven Central only, cached under this directory. -->
  <settings defaultResolver="central"/>
  <resolvers>
    <ibiblio name="central" m2compatible="true" root="{root}"/>
  </resolvers>
</ivysettings>
"""
MAVEN_CENTRAL = "https://repo1.maven.org/maven2/"


def ivy_settings(ivy: Path) -> Path:
    """An ivysettings.xml in ``ivy`` naming Maven Central as the one repository.

    Spark's default chain also tries ``~/.m2`` (where a half-populated local repository can hold a
    pom without its jar, failing the resolution) and spark-packages.org; with this file a run
    depends on Central and on Ivy's cache only, and on the cache only once it holds the jars.
    """
    path = ivy / "ivysettings.xml"
    text = IVY_SETTINGS.format(root=MAVEN_CENTRAL)
    if not path.exists() or path.read_text() != text:
        ivy.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return path


def session_conf(master: str | None = None, shuffle_partitions: int = 4) -> dict[str, str]:
    """The settings ``build_session`` applies (the master only if given: spark-submit sets it)."""
    ivy = ivy_dir()
    conf = {
        "spark.jars.packages": ",".join(packages()),
        "spark.jars.ivy": str(ivy),
        "spark.jars.ivySettings": str(ivy_settings(ivy)),
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.showConsoleProgress": "false",
        # collect_set (exact distinct publishers) is an object aggregate: past this many groups
        # per task Spark falls back to sorting, ~3x slower on the traffic job.
        "spark.sql.objectHashAggregate.sortBased.fallbackThreshold": "65536",
    }
    if master:
        conf["spark.master"] = master
        if master.startswith("local"):
            conf["spark.ui.enabled"] = "false"  # tests and benchmarks: no port 4040
    return conf


def build_session(
    app_name: str = "headwater-analytics",
    master: str | None = None,
    shuffle_partitions: int = 4,
    extra: dict[str, str] | None = None,
) -> SparkSession:
    """A SparkSession able to read Headwater's log."""
    builder = SparkSession.builder.appName(app_name)
    for key, value in {**session_conf(master, shuffle_partitions), **(extra or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def read_kafka(
    spark: SparkSession,
    bootstrap: str,
    topic: str,
    starting_offsets: str = "earliest",
    streaming: bool = True,
    max_offsets_per_trigger: int | None = None,
    headers: bool = False,
) -> DataFrame:
    """The raw Kafka records of ``topic`` (key, value, partition, offset, ...; ``headers`` too
    if asked), committed ones only: the inbound relay writes into the log in transactions
    (``router.relays``), and Kafka's Java consumer, which Spark uses, reads uncommitted records
    unless told otherwise, so an aborted copy would be counted too."""
    options: dict[str, Any] = {
        "kafka.bootstrap.servers": bootstrap,
        "kafka.isolation.level": "read_committed",
        "subscribe": topic,
        "startingOffsets": starting_offsets,
        "failOnDataLoss": "false",
        "includeHeaders": str(headers).lower(),
    }
    if streaming:
        if max_offsets_per_trigger:
            options["maxOffsetsPerTrigger"] = str(max_offsets_per_trigger)
        return spark.readStream.format("kafka").options(**options).load()
    return spark.read.format("kafka").options(**options).load()


def header_ok(value: Column) -> Column:
    """True where the record value starts with this schema's single-object header."""
    return F.substring(value, 1, HEADER_SIZE) == F.lit(HEADER)


def decode_records(raw: DataFrame) -> DataFrame:
    """Headwater messages from raw records (a ``value`` column), dropping and counting the rest.

    Output columns: those of the Avro record (``timestamp`` is a Spark timestamp), plus
    ``event_time`` (= ``timestamp``) and the record's Kafka ``partition``, ``offset`` and
    ``headers`` when the input has them.
    """
    datum = F.expr(f"substring(value, {HEADER_SIZE + 1}, length(value) - {HEADER_SIZE})")
    good = header_ok(F.col("value"))
    place = [c for c in ("partition", "offset", "headers") if c in raw.columns]
    decoded = raw.select(
        *place,
        good.alias("_header_ok"),
        F.when(good, from_avro(datum, SCHEMA_TEXT, {"mode": "PERMISSIVE"})).alias("_m"),
    )
    # PERMISSIVE turns a datum that does not parse into a record of nulls; a real one has an id.
    parsed = F.col("_m.message_id").isNotNull()
    observed = decoded.observe(
        OBSERVATION,
        F.count(F.lit(1)).alias("records"),
        F.count(F.when(~F.col("_header_ok"), True)).alias("bad_header"),
        F.count(F.when(F.col("_header_ok") & ~parsed, True)).alias("undecodable"),
    )
    return observed.where(parsed).select(
        *place,
        *[F.col(f"_m.{name}").alias(name) for name in MESSAGE_COLUMNS],
        F.col("_m.timestamp").alias("event_time"),
    )


def read_messages(
    spark: SparkSession,
    bootstrap: str,
    topic: str,
    starting_offsets: str = "earliest",
    streaming: bool = True,
    max_offsets_per_trigger: int | None = None,
    headers: bool = False,
) -> DataFrame:
    """The decoded messages of Headwater's log topic ``topic`` (see ``decode_records``)."""
    raw = read_kafka(
        spark, bootstrap, topic, starting_offsets, streaming, max_offsets_per_trigger, headers
    )
    return decode_records(raw)


def node_kind() -> Column:
    """The kind of a record no client published, from its value alone (``topic``,
    ``origin_node``): ``sys``, ``event`` or ``analytics``; null for any other record."""
    return (
        F.when(F.col("origin_node") == F.lit(ANALYTICS_ORIGIN), F.lit(ANALYTICS))
        .when(F.col("topic").startswith(SYS_PREFIX), F.lit(SYS))
        .when(F.col("topic").startswith(EVENTS_PREFIX), F.lit(EVENT))
    )


def record_kind(messages: DataFrame) -> Column:
    """The ``headwater.kind`` of each decoded message: the header where ``messages`` has the
    records' ``headers`` and the record carries it, else as far as the value tells."""
    by_value = F.coalesce(
        node_kind(),
        F.when(F.col("retain") & (F.length("payload") == 0), F.lit(RETAINED_CLEAR)),
        F.lit(CLIENT),
    )
    if "headers" not in messages.columns:
        return by_value
    header = F.expr(f"get(filter(headers, h -> h.key = '{KIND_HEADER}'), 0).value")
    return F.coalesce(header.cast("string"), by_value)
