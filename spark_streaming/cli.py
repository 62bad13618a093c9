"""``headwater analytics <job> [flags]``: run one Spark Structured Streaming job on the log.

Parsing only: the flags become a ``JobOptions``, checked before Spark starts, and
``spark_streaming.runner.run`` does the rest.  Bad flags exit 2 with one line naming the flag; a
failed query exits 1.  ``python -m spark_streaming.cli <job>`` and ``spark-submit
spark_streaming/cli.py <job>`` accept the same arguments.
"""

from __future__ import annotations

import argparse
import sys

from pyspark.errors import PySparkException

from router.partitioner import DEFAULT_ROUTING_DEPTH
from spark_streaming.jobs import JOBS
from spark_streaming.options import (
    DEFAULT_TOPIC,
    DEFAULT_TRIGGER,
    OUTPUT_MODES,
    SINKS,
    JobOptions,
    OptionsError,
    Trigger,
    validate,
)
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
    p.add_argument("job", choices=tuple(JOBS))
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
        help="default: update for console/mqtt traffic, else append",
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
    )


def checked_options(argv: list[str], fallback_bootstrap: str | None = None) -> JobOptions:
    """Everything `main` checks before Spark starts: the flags parsed (argparse exits 2 on a bad
    one), the Kafka found, the options valid for the job; raises OptionsError or SettingError."""
    options = options_from_args(build_parser().parse_args(argv), fallback_bootstrap)
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
    try:
        summary = run(options)
    except PySparkException as exc:
        print(f"headwater analytics: {options.job} failed: {exc}", file=sys.stderr)
        return 1
    print(f"headwater analytics: {options.job}: {summary.line()}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
