"""One analytics run: read the log, apply a job's transform, write to a sink, report progress.

The job is a built-in one (``spark_streaming.jobs``: ``transform`` of the decoded messages) or
a user's (``spark_streaming.userjobs``: a SQL query or a Python file over the views); either way
its result goes through the same sink and trigger plumbing (``spark_streaming.sinks``).

``run`` blocks until the query ends: at once when the log is drained (``available-now``), or on
Ctrl-C (a processing-time trigger), stopping the query cleanly so the checkpoint holds
every completed batch.  A listener prints one line per batch to stderr and adds up the records
read and the records dropped by ``read_messages`` (bad header, undecodable), returned as a
``RunSummary``.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.streaming.listener import StreamingQueryListener
from pyspark.sql.streaming.query import StreamingQuery

from spark_streaming import sinks
from spark_streaming.jobs import JOBS
from spark_streaming.options import USER_JOBS, JobOptions, validate
from spark_streaming.source import OBSERVATION, build_session, read_messages
from spark_streaming.userjobs import FileJob, SqlJob, user_job

Job = ModuleType | SqlJob | FileJob


@dataclass(slots=True)
class RunSummary:
    batches: int = 0
    input_rows: int = 0
    records: int = 0
    bad_header: int = 0
    undecodable: int = 0
    seconds: float = 0.0
    batch_seconds: float = 0.0
    batch_ids: list[int] = field(default_factory=list)

    def line(self) -> str:
        rate = self.input_rows / self.seconds if self.seconds else 0.0
        return (
            f"{self.batches} batches, {self.input_rows} records in {self.seconds:.1f} s "
            f"({rate:.0f}/s; {self.batch_seconds:.1f} s in batches); "
            f"dropped: {self.bad_header} with another header, "
            f"{self.undecodable} undecodable"
        )


class _Progress(StreamingQueryListener):
    """Adds up the progress of one query; ``finished`` is set when it terminates."""

    def __init__(self, summary: RunSummary, name: str, quiet: bool) -> None:
        self.summary = summary
        self.name = name
        self.quiet = quiet
        self.query_id: str | None = None
        self.finished = threading.Event()

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        p = event.progress
        if p.name != self.name:
            return
        s = self.summary
        s.batches += 1
        s.batch_ids.append(p.batchId)
        s.input_rows += p.numInputRows
        s.batch_seconds += p.batchDuration / 1000
        observed = p.observedMetrics.get(OBSERVATION)
        if observed is not None:
            s.records += observed["records"] or 0
            s.bad_header += observed["bad_header"] or 0
            s.undecodable += observed["undecodable"] or 0
        if not self.quiet:
            print(
                f"headwater analytics: batch {p.batchId}: {p.numInputRows} records, "
                f"{p.processedRowsPerSecond:.0f}/s",
                file=sys.stderr,
            )

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        if str(event.id) == self.query_id:
            self.finished.set()


def job_of(options: JobOptions) -> Job:
    """The job ``options.job`` names: a built-in job's module, or the user's job."""
    if options.job in USER_JOBS:
        return user_job(options)
    job = JOBS.get(options.job)
    if job is None:
        raise KeyError(f"no analytics job {options.job!r} (jobs: {', '.join(JOBS)})")
    return job


def result_of(spark: SparkSession, options: JobOptions, job: Job) -> Any:
    """The streaming DataFrame ``job`` computes from the log."""
    if isinstance(job, SqlJob | FileJob):
        return job.result(spark, options)
    messages = read_messages(
        spark,
        options.bootstrap,
        options.topic,
        options.starting_offsets,
        streaming=True,
        max_offsets_per_trigger=options.max_offsets_per_trigger,
    )
    return job.transform(messages, options)


def start_job(
    spark: SparkSession, options: JobOptions, job: Job | None = None
) -> tuple[StreamingQuery, Callable[[], None]]:
    """Start the streaming query of ``options.job`` on ``spark``; also return what releases
    the sink's resources once the query has ended."""
    job = job if job is not None else job_of(options)
    mode = validate(options, job.APPEND_ONLY)
    result = result_of(spark, options, job)
    return sinks.start(result, options, mode, job.mqtt_subtopic)


def run(options: JobOptions, spark: SparkSession | None = None, quiet: bool = False) -> RunSummary:
    """Run ``options.job`` until the log is drained (available-now) or until interrupted."""
    job = job_of(options)
    validate(options, job.APPEND_ONLY)
    if spark is None:
        spark = build_session(
            f"headwater-{options.title}", options.master, options.shuffle_partitions
        )
    summary = RunSummary()
    listener = _Progress(summary, options.name, quiet)
    spark.streams.addListener(listener)
    began = time.monotonic()
    try:
        query, release_sink = start_job(spark, options, job)
        listener.query_id = str(query.id)
        try:
            query.awaitTermination()
        except KeyboardInterrupt:
            query.stop()
        finally:
            release_sink()
        summary.seconds = time.monotonic() - began
        listener.finished.wait(10.0)  # progress events reach listeners asynchronously
    finally:
        spark.streams.removeListener(listener)
    return summary
