"""Where a job's results go, and what a restart from the checkpoint guarantees for each.

* ``console``: rows printed per trigger (update mode by default: running totals).  No guarantee
  beyond "printed"; a checkpoint is optional.
* ``parquet``: Spark's file sink under ``--output``, partitioned by ``date`` (UTC day of the window
  or report), append mode: final rows only.  Exactly-once: the sink's ``_spark_metadata`` log and
  the checkpoint commit each batch's files together, and readers that go through Spark (or
  honour ``_spark_metadata``) never see a file of an uncommitted batch.
* ``mqtt``: results published back into the log (``spark_streaming.mqtt_sink``): at-least-once
  into the log, deduplicable by message id.
* ``memory``: an in-memory table named ``--query-name`` (default ``headwater_<job>``), for tests
  and notebooks.  ``noop``: computes and discards (benchmarks).

The source side is exactly-once in every case: Kafka offsets are committed to the checkpoint with
each batch, and the aggregation state is checkpointed with them, so a restart with the same
``--checkpoint`` neither re-reads nor loses a record.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

from pyspark.sql import DataFrame
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.streaming.readwriter import DataStreamWriter

from spark_streaming.mqtt_sink import MqttSink
from spark_streaming.options import JobOptions


def start(
    result: DataFrame, options: JobOptions, mode: str, job: ModuleType
) -> tuple[StreamingQuery, Callable[[], None]]:
    """Start the streaming query writing ``result`` to the sink ``options`` names; the second
    item releases what the sink holds (the MQTT sink's Kafka producer) once the query ended."""
    writer = result.writeStream.outputMode(mode).queryName(options.name)
    if options.trigger.available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=options.trigger.interval or "10 seconds")
    if options.checkpoint:
        writer = writer.option("checkpointLocation", options.checkpoint)
    if options.sink == "mqtt":
        sink = MqttSink(options, job.mqtt_subtopic)
        return writer.foreachBatch(sink).start(), sink.close
    return _configure(writer, options).start(), _nothing


def _configure(writer: DataStreamWriter, options: JobOptions) -> DataStreamWriter:
    if options.sink == "console":
        return writer.format("console").option("truncate", "false").option("numRows", "1000")
    if options.sink == "parquet":
        return writer.format("parquet").option("path", str(options.output)).partitionBy("date")
    return writer.format(options.sink)


def _nothing() -> None:
    pass
