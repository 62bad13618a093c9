"""Where a job's results go, and what a restart from the checkpoint guarantees for each.

* ``console``: rows printed per trigger (update mode by default: running totals).  No guarantee
  beyond "printed"; a checkpoint is optional.
* ``parquet``: Spark's file sink under ``--output``, partitioned by ``date`` (UTC day of the window
  or report) when the result has that column (every built-in job's does), append mode: final
  rows only.  Exactly-once: the sink's ``_spark_metadata`` log and the checkpoint commit each
  batch's files together, and readers that go through Spark (or honour ``_spark_metadata``)
  never see a file of an uncommitted batch.
* ``mqtt``: results published back into the log (``spark_streaming.mqtt_sink``): at-least-once
  into the log, deduplicable by message id.
* ``kafka``: each row as one record of ``--kafka-topic`` (on the log's Kafka): the row's ``value``
  column if it has one (string or binary; ``key`` too, if present), else the row as a JSON object.
  At-least-once: a batch re-run after a crash writes its rows again.
* ``memory``: an in-memory table named ``--query-name`` (default ``headwater_<job>``), for tests
  and notebooks.  ``noop``: computes and discards (benchmarks).

The source side is exactly-once in every case: Kafka offsets are committed to the checkpoint with
each batch, and the aggregation state is checkpointed with them, so a restart with the same
``--checkpoint`` neither re-reads nor loses a record.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.streaming.readwriter import DataStreamWriter

from spark_streaming.mqtt_sink import MqttSink
from spark_streaming.options import JobOptions


def start(
    result: DataFrame,
    options: JobOptions,
    mode: str,
    subtopic: Callable[[Mapping[str, Any]], str | None],
) -> tuple[StreamingQuery, Callable[[], None]]:
    """Start the streaming query writing ``result`` to the sink ``options`` names (``subtopic``:
    the MQTT sink's topic of a row); the second item releases what the sink holds (the MQTT
    sink's Kafka producer) once the query ended."""
    if options.sink == "kafka":
        result = kafka_rows(result)
    writer = result.writeStream.outputMode(mode).queryName(options.name)
    if options.trigger.available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=options.trigger.interval or "10 seconds")
    if options.checkpoint:
        writer = writer.option("checkpointLocation", options.checkpoint)
    if options.sink == "mqtt":
        sink = MqttSink(options, subtopic)
        return writer.foreachBatch(sink).start(), sink.close
    return _configure(writer, options, result.columns).start(), _nothing


def _configure(
    writer: DataStreamWriter, options: JobOptions, columns: list[str]
) -> DataStreamWriter:
    if options.sink == "console":
        return writer.format("console").option("truncate", "false").option("numRows", "1000")
    if options.sink == "parquet":
        writer = writer.format("parquet").option("path", str(options.output))
        return writer.partitionBy("date") if "date" in columns else writer
    if options.sink == "kafka":
        return (
            writer.format("kafka")
            .option("kafka.bootstrap.servers", options.bootstrap)
            .option("topic", str(options.kafka_topic))
        )
    return writer.format(options.sink)


def kafka_rows(result: DataFrame) -> DataFrame:
    """``result`` as the Kafka sink takes it: its ``value`` (and ``key``) columns if it has a
    ``value``, else each row as a JSON object in ``value``."""
    if "value" in result.columns:
        return result.select(*[c for c in ("key", "value") if c in result.columns])
    return result.select(F.to_json(F.struct(*result.columns)).alias("value"))


def _nothing() -> None:
    pass
