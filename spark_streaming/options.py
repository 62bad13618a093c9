"""What one analytics run is asked to do: job, log, windows, sink, checkpoint, trigger.

A job is a built-in one (``spark_streaming.jobs``), ``sql`` (``query`` over the views of
``spark_streaming.views``) or ``run`` (the ``job`` function of the Python file ``job_file``).

``JobOptions`` is plain data, built by ``spark_streaming.cli`` from the command line or directly by
tests and benchmarks; ``validate`` checks the combinations a sink or job cannot honour before any
Spark work starts.  Durations are Spark interval strings (``"1 minute"``, ``"30 seconds"``);
``seconds`` parses the subset the jobs need to do arithmetic on them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from router.partitioner import DEFAULT_ROUTING_DEPTH
from router.topics import MESSAGES_TOPIC

SINKS = ("console", "parquet", "mqtt", "kafka", "memory", "noop")
OUTPUT_MODES = ("append", "update", "complete")
USER_JOBS = ("sql", "run")
"""The jobs whose transform the user writes: a SQL query, or a Python file."""
DEFAULT_TOPIC = MESSAGES_TOPIC
DEFAULT_TRIGGER = "processing-time=10 seconds"
ANALYTICS_ORIGIN = "headwater-analytics"
"""``origin_node`` of the records the MQTT sink writes; jobs skip them unless asked not to."""

_UNITS = {
    "ms": 0.001,
    "millisecond": 0.001,
    "second": 1,
    "sec": 1,
    "s": 1,
    "minute": 60,
    "min": 60,
    "m": 60,
    "hour": 3600,
    "h": 3600,
    "day": 86400,
    "d": 86400,
    "week": 604800,
}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]+?)s?\s*$")


class OptionsError(ValueError):
    """Options that cannot run together; the message names the flag."""


def seconds(duration: str) -> float:
    """Seconds in a duration like ``"1 minute"``, ``"90 seconds"``, ``"2h"``."""
    match = _DURATION.match(duration.lower())
    if not match or match.group(2) not in _UNITS:
        raise OptionsError(f"not a duration: {duration!r} (expected e.g. '1 minute', '30 seconds')")
    return float(match.group(1)) * _UNITS[match.group(2)]


def spark_interval(duration: str, minimum: int = 1) -> str:
    """``duration`` as whole seconds, the form Spark's window() and withWatermark() accept."""
    value = seconds(duration)
    if value < minimum or value != int(value):
        raise OptionsError(f"{duration!r}: expected whole seconds, at least {minimum}")
    return f"{int(value)} seconds"


@dataclass(slots=True)
class Trigger:
    """``available-now`` (process what is in the log, then stop) or a processing-time interval."""

    available_now: bool = False
    interval: str | None = None

    @classmethod
    def parse(cls, text: str) -> Trigger:
        if text == "available-now":
            return cls(available_now=True)
        name, sep, value = text.partition("=")
        if name == "processing-time" and sep and value.strip():
            seconds(value)
            return cls(interval=value.strip())
        raise OptionsError(
            f"--trigger: expected available-now or processing-time=<duration>, got {text!r}"
        )


@dataclass(slots=True)
class JobOptions:
    job: str
    bootstrap: str
    topic: str = DEFAULT_TOPIC
    master: str | None = None
    window: str = "1 minute"
    watermark: str = "30 seconds"
    prefix_depth: int = 2
    sink: str = "console"
    output: str | None = None
    checkpoint: str | None = None
    trigger: Trigger = field(default_factory=lambda: Trigger.parse(DEFAULT_TRIGGER))
    output_mode: str | None = None
    starting_offsets: str = "earliest"
    max_offsets_per_trigger: int | None = None
    distinct: str = "exact"
    top: int = 10
    lookback: int = 10
    min_active: int = 5
    silence: str = "5 minutes"
    mqtt_topic: str | None = None
    routing_depth: int = DEFAULT_ROUTING_DEPTH
    include_analytics: bool = False
    query_name: str | None = None
    shuffle_partitions: int = 4
    query: str | None = None
    """``sql``: the Spark SQL query."""
    job_file: str | None = None
    """``run``: the Python file defining ``job(views)``."""
    payload_schema: str | None = None
    """``sql``/``run``: a DDL string or a JSON Schema file; adds a parsed ``data`` column."""
    include_node_records: bool = False
    """``sql``/``run``: the ``messages`` view keeps the records nodes and jobs write."""
    kafka_topic: str | None = None
    """The ``kafka`` sink's topic."""

    @property
    def title(self) -> str:
        """The job's name in topics and query names: the file's stem for ``run``."""
        if self.job == "run" and self.job_file:
            return re.sub(r"[^A-Za-z0-9_]", "_", Path(self.job_file).stem)
        return self.job

    @property
    def window_seconds(self) -> int:
        return int(seconds(spark_interval(self.window)))

    @property
    def mqtt_base_topic(self) -> str:
        return self.mqtt_topic or f"analytics/{self.title}"

    @property
    def name(self) -> str:
        """The streaming query's name (and the memory sink's table)."""
        return self.query_name or f"headwater_{self.title}"


def validate(options: JobOptions, append_only: bool) -> str:
    """Check ``options`` for a job (``append_only``: it emits final rows only); the output mode."""
    if options.sink not in SINKS:
        raise OptionsError(f"--sink: expected one of {', '.join(SINKS)}, got {options.sink!r}")
    for flag, value, least in (
        ("--window", options.window, 1),
        ("--watermark", options.watermark, 0),
    ):
        try:
            spark_interval(value, least)
        except OptionsError as exc:
            raise OptionsError(f"{flag}: {exc}") from None
    if options.prefix_depth < 1:
        raise OptionsError(f"--prefix-depth must be at least 1, got {options.prefix_depth}")
    if options.distinct not in ("exact", "approx"):
        raise OptionsError(f"--distinct: expected exact or approx, got {options.distinct!r}")
    if options.sink == "parquet" and options.output is None:
        raise OptionsError("--sink parquet needs --output DIR")
    if options.sink in ("parquet", "mqtt", "kafka") and not options.checkpoint:
        raise OptionsError(
            f"--sink {options.sink} needs --checkpoint DIR (restarts continue there)"
        )
    _validate_kafka_sink(options)
    _validate_user_job(options)
    mode = options.output_mode or default_output_mode(options.sink, append_only)
    if mode not in OUTPUT_MODES:
        raise OptionsError(
            f"--output-mode: expected one of {', '.join(OUTPUT_MODES)}, got {mode!r}"
        )
    if mode != "append" and (append_only or options.sink == "parquet"):
        what = f"job {options.job}" if append_only else "the parquet sink"
        raise OptionsError(f"--output-mode {mode}: {what} writes final rows only (append)")
    return mode


def _validate_kafka_sink(options: JobOptions) -> None:
    if options.sink != "kafka":
        return
    if not options.kafka_topic:
        raise OptionsError("--sink kafka needs --kafka-topic TOPIC")
    if options.kafka_topic == options.topic:
        raise OptionsError(
            f"--kafka-topic: {options.kafka_topic!r} is the log itself; "
            "use --sink mqtt to publish results into it"
        )


def _validate_user_job(options: JobOptions) -> None:
    if options.job == "sql" and not (options.query or "").strip():
        raise OptionsError(
            "sql needs a QUERY, e.g. headwater analytics sql 'SELECT * FROM messages'"
        )
    if options.job == "run":
        if not options.job_file:
            raise OptionsError(
                "run needs a FILE defining job(views), e.g. headwater analytics run my_job.py"
            )
        if not Path(options.job_file).is_file():
            raise OptionsError(f"run: no such file: {options.job_file}")
    if options.job not in USER_JOBS and (options.payload_schema or options.include_node_records):
        raise OptionsError("--payload-schema and --include-node-records are options of sql and run")


def default_output_mode(sink: str, append_only: bool) -> str:
    """Live sinks show running totals (update); files and append-only jobs get final rows."""
    if append_only or sink == "parquet":
        return "append"
    return "update"
