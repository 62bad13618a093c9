"""``python -m bench <subcommand>``: the one entry point of the benchmark (``make bench``: ``all``).

Subcommands: ``throughput`` (issue 26's table beside mosquitto: :mod:`bench.throughput`),
``routing`` (what each of 3 nodes reads of the log: :mod:`bench.routing`), ``scale`` (idle
fleets, reconnect storm: :mod:`bench.scale`), ``sessions`` (takeover, replay, resume storm:
:mod:`bench.sessions`), ``profile`` (py-spy of one node: :mod:`bench.profile`), ``hostile``
(issue 20's probes: :mod:`bench.hostile`), ``history`` (reading the log through
``$history/...``: :mod:`bench.history`), ``spark`` (the traffic job: :mod:`bench.spark_job`),
``events`` (client events' cost a CONNECT, on against off: :mod:`bench.events`), and ``all``
(throughput, routing, scale, sessions, profile).

Each subcommand starts what it needs on one ``ExitStack`` (unwound on return, exception, Ctrl-C
or SIGTERM), measures, prints its markdown section and writes it between its markers in
``docs/benchmarks.md`` unless ``--no-write``; ``--quick`` is a smoke run (2 s runs, small fleets)
that writes nothing unless ``--output`` is given.  Headwater is always ``headwater dev up``
(``--headwater-rev REV``: of commit REV), shelled out: nothing here imports the product.
"""

from __future__ import annotations

import argparse
import datetime
import shlex
import signal
import sys
import tempfile
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from types import FrameType

from bench import (
    brokers,
    events,
    history,
    hostile,
    profile,
    routing,
    scale,
    sessions,
    spark_job,
    throughput,
)
from bench.report import DEFAULT_OUTPUT, write_section

COMMANDS = (
    "throughput", "routing", "scale", "sessions", "profile", "hostile", "history", "spark",
    "events", "all",
)  # fmt: skip
ALL = ("throughput", "routing", "scale", "sessions", "profile")
"""What ``all`` runs: ``hostile`` (minutes of probes), ``history`` (a million messages written
and read), ``spark`` and ``events`` (one cluster, rounds of windows with events on, off and on)
only when named."""
BROKERS = ("headwater", "mosquitto", "amqtt")


def progress(text: str) -> None:
    print(f"[bench {datetime.datetime.now():%H:%M:%S}] {text}", file=sys.stderr, flush=True)


def choose(spec: str, known: tuple[str, ...] | list[str], what: str) -> list[str]:
    if spec == "all":
        return list(known)
    names = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"python -m bench: unknown {what} {unknown}; known: {list(known)}")
    return [n for n in known if n in names]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    p.add_argument("command", choices=COMMANDS, help="what to run")
    p.add_argument(
        "--quick", action="store_true", help="smoke run; writes no report unless --output"
    )
    p.add_argument("--brokers", default="headwater,mosquitto", help=f"of {','.join(BROKERS)}")
    p.add_argument("--headwater-rev", metavar="REV", help="run `headwater dev up` of this commit")
    p.add_argument("--output", type=Path, help=f"report file [{DEFAULT_OUTPUT}]")
    p.add_argument("--no-write", action="store_true", help="print the report only")
    p.add_argument(
        "--work-dir",
        type=Path,
        help="logs here, and each cluster's state until it stops (its Kafka data then goes) "
        "[a temp dir]",
    )
    t = p.add_argument_group("throughput")
    t.add_argument("--scenarios", default="all", help=f"of {', '.join(throughput.SCENARIOS)} "
                   f"(events: of {', '.join(events.KEYS)})")  # fmt: skip
    t.add_argument("--duration", type=float, default=10.0, help="measured seconds per run [10]")
    t.add_argument("--warmup", type=float, default=2.0, help="warm-up seconds per run [2]")
    t.add_argument("--kafka-warmup", type=float, default=20.0, help="Kafka warm-up seconds [20]")
    t.add_argument("--nodes", type=int, default=1, help="Headwater nodes: 2 puts publishers and "
                   "subscriber on different nodes [1]")  # fmt: skip
    t.add_argument("--workers", default="1", help="Headwater --workers values compared [1]")
    t.add_argument("--paced-rate", type=float, default=20_000.0, help="paced QoS 1 msg/s [20000]")
    t.add_argument("--rate", type=float, default=1_000.0, help="latency runs msg/s [1000]")
    s = p.add_argument_group("routing, scale, profile, history, spark, events")
    s.add_argument("--messages", type=int, default=200, help="routing: QoS 1 per topic [200]")
    s.add_argument("--clients", type=int, default=10_000, help="scale: idle fleet size [10000]")
    s.add_argument("--storm", type=int, default=5_000, help="scale: reconnect storm size [5000]")
    s.add_argument("--idle", type=float, default=30.0, help="scale: idle window seconds [30]")
    s.add_argument("--seconds", type=int, default=10, help="profile: py-spy seconds [10]")
    s.add_argument("--records", type=int, default=200_000, help="spark: records [200000]")
    s.add_argument("--history", type=int, default=1_000_000, help="history: messages [1000000]")
    s.add_argument(
        "--runs",
        type=int,
        help="spark: runs of the job [2]; events: rounds of windows on, off and control [40]",
    )
    return p


def throughput_settings(args: argparse.Namespace) -> throughput.Settings:
    if args.quick:
        return throughput.Settings(2.0, 0.5, paced_rate=args.paced_rate, rate=args.rate,
                                   kafka_warmup=2.0, nodes=args.nodes, drain_max=10.0,
                                   settle_max=5.0)  # fmt: skip
    return throughput.Settings(
        args.duration, args.warmup, paced_rate=args.paced_rate, rate=args.rate,
        kafka_warmup=args.kafka_warmup, nodes=args.nodes,
    )  # fmt: skip


def run_command(
    command: str, args: argparse.Namespace, work: Path, line: str, hw: brokers.Headwater
) -> str:
    """One subcommand's markdown section."""
    names = choose(args.brokers, BROKERS, "brokers")
    if command == "throughput":
        keys = choose(args.scenarios, list(throughput.SCENARIOS), "scenarios")
        workers = tuple(int(w) for w in args.workers.split(","))
        done = throughput.run(work, names, keys, throughput_settings(args), hw, line, progress,
                             workers)  # fmt: skip
        return throughput.render(done)
    if command == "routing":
        layout = routing.Settings(messages=20, seconds=2.0 if args.quick else 4.0)
        layout = layout if args.quick else replace(layout, messages=args.messages)
        return routing.render(routing.run(work, hw, line, progress, layout))
    if command == "scale":
        settings = scale.Settings(args.clients, args.storm, args.idle)
        settings = scale.quick(settings) if args.quick else settings
        return scale.render(scale.run(work, names, settings, hw, line, progress))
    if command == "sessions":
        return sessions.run(work, hw, line, progress, args.quick)
    if command == "profile":
        svg_dir = work / "flame" if args.quick or args.no_write else profile.SVG_DIR
        seconds = 3 if args.quick else args.seconds
        ran = profile.run(work, hw, line, progress, seconds, svg_dir, args.output or DEFAULT_OUTPUT)
        return profile.render(ran)
    if command == "hostile":
        return hostile.render(hostile.run(work, names, line, progress, hw))
    if command == "events":
        rounds = 1 if args.quick else args.runs or 40
        settled = throughput_settings(args)
        keys = (
            events.KEYS
            if args.scenarios == "all"
            else choose(args.scenarios, events.KEYS, "scenarios")
        )
        return events.render(events.run(work, settled, rounds, hw, line, progress, tuple(keys)))
    if command == "history":
        messages = 50_000 if args.quick else args.history
        return history.render(history.run(work, hw, line, progress, messages))
    return spark_job.run(work, hw, progress, 20_000 if args.quick else args.records, args.runs or 2)


def stop_on_sigterm() -> None:
    def raise_interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, raise_interrupt)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    line = "python -m bench " + shlex.join(sys.argv[1:] if argv is None else argv)
    stop_on_sigterm()
    output = None if args.no_write else args.output or (None if args.quick else DEFAULT_OUTPUT)
    commands = ALL if args.command == "all" else (args.command,)
    with ExitStack() as stack:
        work = args.work_dir or Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="hw-bench-"))
        )
        work.mkdir(parents=True, exist_ok=True)
        hw = brokers.Headwater.at(args.headwater_rev, work)
        for command in commands:
            progress(f"running {command}" + (" (quick)" if args.quick else ""))
            (work / command).mkdir(parents=True, exist_ok=True)
            try:
                section = run_command(command, args, work / command, line, hw)
            except KeyboardInterrupt:
                progress("interrupted: stopping everything that was started")
                return 130
            except (RuntimeError, OSError) as exc:
                progress(f"{command} failed: {exc}")
                return 1
            print(section)
            if output is not None and command != "spark":
                write_section(output, section)
                progress(f"{command}: section written to {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
