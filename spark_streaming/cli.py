"""``headwater analytics <job> [flags]``: run one Spark Structured Streaming job on the log.

``<job>`` is a built-in job, ``sql QUERY`` (the query, or a ``.sql`` file: a path, or the name of
one shipped in ``spark_streaming/sql/``) or ``run FILE.py`` (``spark_streaming.userjobs``).
Parsing only: the flags become a ``JobOptions``, checked before Spark starts, and
``spark_streaming.runner.run`` does the rest.  Bad flags exit 2 with one line naming the flag; so
does a query Spark refuses (its ``AnalysisException`` or ``ParseException`` message, no trace); a
query failing while it runs exits 1.  ``python -m spark_streaming.cli <job>`` and ``spark-submit
spark_streaming/cli.py <job>`` accept the same arguments.
"""

from __future__ import annotations

import argparse
import logging
import sys
from importlib import resources
from pathlib import Path

from pyspark.errors import AnalysisException, PySparkException

from router.partitioner import DEFAULT_ROUTING_DEPTH
from spark_streaming.jobs import JOBS
from spark_streaming.options import (
    DEFAULT_TOPIC,
    DEFAULT_TRIGGER,
    OUTPUT_MODES,
    SINKS,
    USER_JOBS,
    JobOptions,
    OptionsError,
    Trigger,
    validate,
)
from spark_streaming.payload_schema import payload_schema
from spark_streaming.runner import run
from spark_streaming.settings import KAFKA_BOOTSTRAP_ENV, SettingError, external_kafka_bootstrap


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _trigger(text: str) -> Trigger:
    try:
        return Trigger.parse(text)
    except OptionsError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="headwater analytics",
        description="Run a Spark Structured Streaming job on Headwater's log.",
    )
    p.add_argument("job", choices=(*JOBS, *USER_JOBS))
    p.add_argument(
        "target",
        nargs="?",
        default=None,
        metavar="QUERY|FILE",
        help="sql: the query or a .sql file; run: a .py file defining job(views)",
    )
    p.add_argument("--bootstrap", default=None, help=f"Kafka bootstrap [${KAFKA_BOOTSTRAP_ENV}]")
    p.add_argument(
        "--topic", default=DEFAULT_TOPIC, help=f"the log topic (default {DEFAULT_TOPIC})"
    )
    p.add_argument(
        "--master", default=None, help="Spark master (default: spark-submit's or local[*])"
    )
    p.add_argument("--window", default="1 minute", help="event-time window (default 1 minute)")
    p.add_argument(
        "--watermark", default="30 seconds", help="allowed lateness (default 30 seconds)"
    )
    p.add_argument("--prefix-depth", type=_positive, default=2, help="topic levels in a prefix")
    p.add_argument("--sink", choices=SINKS, default="console")
    p.add_argument("--output", default=None, help="directory of the parquet sink")
    p.add_argument(
        "--checkpoint", default=None, help="checkpoint directory (restarts resume there)"
    )
    p.add_argument(
        "--trigger",
        type=_trigger,
        default=Trigger.parse(DEFAULT_TRIGGER),
        help="available-now | processing-time=<duration> (default 10 seconds)",
    )
    p.add_argument(
        "--output-mode",
        choices=OUTPUT_MODES,
        default=None,
        help="default: update (running totals), append for parquet and final-rows jobs",
    )
    p.add_argument("--starting-offsets", default="earliest", help="earliest | latest | Kafka JSON")
    p.add_argument("--max-offsets-per-trigger", type=_positive, default=None)
    p.add_argument(
        "--distinct",
        choices=("exact", "approx"),
        default="exact",
        help="traffic: distinct publishers exactly or by HyperLogLog++",
    )
    p.add_argument("--top", type=_positive, default=10, help="top_publishers: ranks per window")
    p.add_argument("--lookback", type=_positive, default=10, help="device_silence: N windows")
    p.add_argument(
        "--min-active",
        type=_positive,
        default=5,
        help="device_silence: active in at least k of the N windows",
    )
    p.add_argument("--silence", default="5 minutes", help="device_silence: silent for M")
    p.add_argument("--mqtt-topic", default=None, help="mqtt sink base topic (analytics/<job>)")
    p.add_argument(
        "--routing-depth",
        type=_positive,
        default=DEFAULT_ROUTING_DEPTH,
        help="mqtt sink: the front-ends' routing depth",
    )
    p.add_argument(
        "--include-analytics",
        action="store_true",
        help="also count the analytics sink's own messages",
    )
    p.add_argument(
        "--payload-schema",
        default=None,
        help="sql/run: a DDL string or JSON Schema file; adds the parsed payload as `data`",
    )
    p.add_argument(
        "--include-node-records",
        action="store_true",
        help="sql/run: the messages view keeps $SYS reports, events and analytics results",
    )
    p.add_argument("--kafka-topic", default=None, help="kafka sink: the topic of the results")
    p.add_argument("--query-name", default=None)
    p.add_argument("--shuffle-partitions", type=_positive, default=4)
    return p


def options_from_args(
    args: argparse.Namespace, fallback_bootstrap: str | None = None
) -> JobOptions:
    """The job's options; the Kafka is `--bootstrap`, else HEADWATER_KAFKA_BOOTSTRAP, else
    `fallback_bootstrap` (the running dev cluster's, found by `headwater analytics`)."""
    bootstrap = args.bootstrap or external_kafka_bootstrap() or fallback_bootstrap
    if not bootstrap:
        raise OptionsError(
            f"no Kafka to read: pass --bootstrap, set {KAFKA_BOOTSTRAP_ENV}, "
            "or start a dev cluster here (make run)"
        )
    return JobOptions(
        job=args.job,
        bootstrap=bootstrap,
        topic=args.topic,
        master=args.master,
        window=args.window,
        watermark=args.watermark,
        prefix_depth=args.prefix_depth,
        sink=args.sink,
        output=args.output,
        checkpoint=args.checkpoint,
        trigger=args.trigger,
        output_mode=args.output_mode,
        starting_offsets=args.starting_offsets,
        max_offsets_per_trigger=args.max_offsets_per_trigger,
        distinct=args.distinct,
        top=args.top,
        lookback=args.lookback,
        min_active=args.min_active,
        silence=args.silence,
        mqtt_topic=args.mqtt_topic,
        routing_depth=args.routing_depth,
        include_analytics=args.include_analytics,
        query_name=args.query_name,
        shuffle_partitions=args.shuffle_partitions,
        query=sql_text(args.target) if args.job == "sql" and args.target else None,
        job_file=args.target if args.job == "run" else None,
        payload_schema=args.payload_schema,
        include_node_records=args.include_node_records,
        kafka_topic=args.kafka_topic,
    )


SHIPPED_SQL = "sql"
"""The directory of ``spark_streaming`` holding the SQL jobs shipped with the project."""


def sql_text(target: str) -> str:
    """The query ``target`` is: itself, or the text of the ``.sql`` file it names (a path, else
    the name of a shipped one)."""
    if not target.rstrip().endswith(".sql") or "\n" in target:
        return target
    path = Path(target)
    if path.is_file():
        return path.read_text()
    shipped = resources.files("spark_streaming").joinpath(SHIPPED_SQL, path.name)
    if shipped.is_file():
        return shipped.read_text()
    raise OptionsError(f"sql: no such SQL file: {target}")


def checked_options(argv: list[str], fallback_bootstrap: str | None = None) -> JobOptions:
    """Everything `main` checks before Spark starts: the flags parsed (argparse exits 2 on a bad
    one), the Kafka found, the options valid for the job; raises OptionsError or SettingError."""
    args = build_parser().parse_args(argv)
    if args.target is not None and args.job not in USER_JOBS:
        raise OptionsError(f"{args.job} takes no QUERY or FILE (only sql and run do)")
    options = options_from_args(args, fallback_bootstrap)
    if options.job in USER_JOBS:
        validate(options, append_only=False)
        if options.payload_schema:
            payload_schema(options.payload_schema)
        return options
    job = JOBS[options.job]
    validate(options, job.APPEND_ONLY)
    if hasattr(job, "check"):
        job.check(options)
    return options


def main(argv: list[str] | None = None, fallback_bootstrap: str | None = None) -> int:
    try:
        options = checked_options(sys.argv[1:] if argv is None else argv, fallback_bootstrap)
    except (OptionsError, SettingError) as exc:
        print(f"headwater analytics: error: {exc}", file=sys.stderr)
        return 2
    _quiet_query_context_loggers()
    try:
        summary = run(options)
    except (AnalysisException, OptionsError) as exc:  # ParseException is an AnalysisException
        print(f"headwater analytics: error: {exc}", file=sys.stderr)
        return 2
    except PySparkException as exc:
        print(f"headwater analytics: {options.title} failed: {exc}", file=sys.stderr)
        return 1
    print(f"headwater analytics: {options.title}: {summary.line()}", file=sys.stderr)
    return 0


QUERY_CONTEXT_LOGGERS = ("SQLQueryContextLogger", "DataFrameQueryContextLogger")
"""PySpark's loggers that print each analysis error (as JSON, with its trace) where it is raised:
``main`` prints the message once itself."""


def _quiet_query_context_loggers() -> None:
    for name in QUERY_CONTEXT_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)


if __name__ == "__main__":
    sys.exit(main())
