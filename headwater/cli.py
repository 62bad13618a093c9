"""The `headwater` command: `dev up|down|status|restart|roll`, `topics create`, `frontend`.

Argument parsing and dispatch only; the work lives in headwater.devcluster and headwater.services.
A `HeadwaterError` (something the user can fix) is printed as `headwater: error: <message>` on
stderr with exit code 1 and no traceback; a warning of the tooling (the `headwater` loggers) as
`headwater: warning: <message>`. `frontend` hands the rest of the command line, unparsed, to
`frontend.node.main`, which sets up its own logging.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path

from headwater.errors import HeadwaterError, SettingError
from headwater.settings import (
    KAFKA_BOOTSTRAP_ENV,
    KAFKA_BROKERS_ENV,
    MIN_INSYNC_REPLICAS_ENV,
    REPLICATION_FACTOR_ENV,
    external_kafka_bootstrap,
    mqtt_port,
    replication,
)
from router.topics import DEFAULT_PARTITIONS

DEFAULT_STATE_DIR = Path(".headwater")
Handler = Callable[[argparse.Namespace], int]


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return value


def _workers(text: str) -> int:
    from frontend.config import MAX_WORKERS

    value = int(text)
    if not 1 <= value <= MAX_WORKERS:
        raise argparse.ArgumentTypeError(f"must be 1..{MAX_WORKERS}, got {value}")
    return value


def _export(text: str) -> str:
    """An `--export` as a node takes it, checked now: a bad one stops `dev up` before it starts."""
    from router.relay_records import RelayError, parse_export

    try:
        parse_export(text)
    except RelayError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _dev_up(args: argparse.Namespace) -> int:
    from headwater.devcluster.up import UpOptions, run_up

    options = UpOptions(
        nodes=args.nodes,
        port=mqtt_port(args.port),
        state_dir=args.state_dir,
        partitions=args.partitions,
        kafka_brokers=args.kafka_brokers,
        replication_factor=args.replication_factor,
        min_insync_replicas=args.min_insync_replicas,
        tls_port=args.tls_port,
        ws_port=args.ws_port,
        password_file=args.password_file,
        acl_file=args.acl_file,
        workers=args.workers,
        exports=tuple(args.export),
    )
    return run_up(options)


def _dev_down(args: argparse.Namespace) -> int:
    from headwater.devcluster.down import run_down

    return run_down(args.state_dir)


def _dev_status(args: argparse.Namespace) -> int:
    from headwater.devcluster.control import run_status

    return run_status(args.state_dir)


def _dev_restart(args: argparse.Namespace) -> int:
    from headwater.devcluster.control import run_restart

    return run_restart(args.state_dir, args.node, timeout=args.timeout)


def _dev_roll(args: argparse.Namespace) -> int:
    from headwater.devcluster.control import run_roll

    return run_roll(args.state_dir, timeout=args.timeout)


def _topics_create(args: argparse.Namespace) -> int:
    from headwater.services.kafka_admin import broker_count, check_reachable, ensure_topic
    from router.topics import project_topics

    bootstrap = args.kafka_bootstrap or external_kafka_bootstrap()
    if bootstrap is None:
        raise SettingError(
            f"no Kafka to talk to: pass --kafka-bootstrap or set {KAFKA_BOOTSTRAP_ENV}"
        )
    check_reachable(bootstrap, setting=f"--kafka-bootstrap / {KAFKA_BOOTSTRAP_ENV}")
    brokers = broker_count(bootstrap)
    replicas = replication(args.replication_factor, args.min_insync_replicas, brokers)
    for topic in project_topics(args.partitions, replicas):
        ensure_topic(
            bootstrap,
            topic.name,
            topic.partitions,
            topic.config,
            replication_factor=topic.replication_factor,
        )
        print(
            f"headwater: topic {topic.name} ready ({topic.partitions} partitions, "
            f"replication factor {replicas.factor}, min ISR {replicas.min_insync})"
        )
    return 0


def run_frontend(argv: list[str]) -> int:
    """Run one front-end node; its flags are parsed by frontend.node."""
    from frontend.node import main as frontend_main

    return int(frontend_main(argv))


def run_analytics(argv: list[str]) -> int:
    """Run a Spark analytics job (built in, `sql QUERY` or `run FILE`); its flags are parsed by
    spark_streaming.cli. Without `--bootstrap` and HEADWATER_KAFKA_BOOTSTRAP, the job reads the
    Kafka of the dev cluster running from `.headwater` (what `make run` starts, on a port of its
    own choosing)."""
    from headwater.devcluster.state import running_kafka
    from spark_streaming.cli import main as analytics_main

    return int(analytics_main(argv, fallback_bootstrap=running_kafka(DEFAULT_STATE_DIR)))


def run_passwd(argv: list[str]) -> int:
    """Manage a Mosquitto password file; its flags (mosquitto_passwd's) are parsed there."""
    from headwater.passwd import main as passwd_main

    return passwd_main(argv)


def _add_replication(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--replication-factor",
        type=_positive,
        default=None,
        help=f"copies of each partition (${REPLICATION_FACTOR_ENV}; default: brokers, at most 3)",
    )
    parser.add_argument(
        "--min-insync-replicas",
        type=_positive,
        default=None,
        help=f"copies a write needs (${MIN_INSYNC_REPLICAS_ENV}; default: factor - 1, at least 1)",
    )


def _add_dev(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    dev = commands.add_parser("dev", help="a whole cluster on this machine")
    dev_commands = dev.add_subparsers(dest="dev_command", required=True, metavar="COMMAND")
    up = dev_commands.add_parser("up", help="start Kafka, Redis, front-ends and HAProxy")
    up.add_argument("--nodes", type=_count, default=3, help="front-end nodes (default 3)")
    up.add_argument("--port", type=int, default=None, help="MQTT port (default 1883)")
    up.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR, help="default .headwater")
    up.add_argument("--partitions", type=_positive, default=DEFAULT_PARTITIONS)
    up.add_argument(
        "--kafka-brokers",
        type=_positive,
        default=None,
        help=f"local Kafka brokers (${KAFKA_BROKERS_ENV}; default 1)",
    )
    _add_replication(up)
    up.add_argument(
        "--tls-port", type=int, default=8883, help="MQTT over TLS (default 8883; 0: off)"
    )
    up.add_argument(
        "--ws-port", type=int, default=8080, help="MQTT over WebSocket (default 8080; 0: off)"
    )
    up.add_argument("--password-file", type=Path, help="a mosquitto_passwd file for every node")
    up.add_argument("--acl-file", type=Path, help="a Mosquitto acl_file for every node")
    up.add_argument(
        "--workers",
        type=_workers,
        default=1,
        help="processes per front-end node sharing its ports, one per core (default 1)",
    )
    up.add_argument(
        "--export",
        action="append",
        default=[],
        type=_export,
        metavar="FILTER=KAFKA_TOPIC[:json|raw]",
        help="every node mirrors the messages FILTER matches into KAFKA_TOPIC (repeatable)",
    )
    up.add_argument("--foreground", action="store_true", help="the default: stay attached")
    up.set_defaults(handler=_dev_up)
    down = dev_commands.add_parser("down", help="stop a running `dev up`")
    down.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR)
    down.set_defaults(handler=_dev_down)
    status = dev_commands.add_parser("status", help="each process of a running `dev up`")
    status.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR)
    status.set_defaults(handler=_dev_status)
    restart = dev_commands.add_parser(
        "restart", help="drain one front-end node and wait until it is ready again"
    )
    restart.add_argument("node", help="the node's name, e.g. node1 (see `dev status`)")
    restart.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR)
    restart.add_argument("--timeout", type=float, default=60.0, help="seconds (default 60)")
    restart.set_defaults(handler=_dev_restart)
    roll = dev_commands.add_parser("roll", help="restart every front-end node in turn")
    roll.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR)
    roll.add_argument("--timeout", type=float, default=60.0, help="seconds per node (default 60)")
    roll.set_defaults(handler=_dev_roll)


def _add_topics(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    topics = commands.add_parser("topics", help="Kafka topics of the project")
    topic_commands = topics.add_subparsers(dest="topics_command", required=True, metavar="COMMAND")
    create = topic_commands.add_parser("create", help="create the topics if missing")
    create.add_argument("--kafka-bootstrap", default=None, help=f"default ${KAFKA_BOOTSTRAP_ENV}")
    create.add_argument("--partitions", type=_positive, default=DEFAULT_PARTITIONS)
    _add_replication(create)
    create.set_defaults(handler=_topics_create)


def _stats(args: argparse.Namespace) -> int:
    from headwater import stats

    urls = args.url or stats.stats_urls(args.state_dir)
    stats.print_table([stats.fetch(url) for url in urls], sys.stdout)
    return 0


def _add_stats(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser("stats", help="each front-end's partitions, fetches and lag")
    parser.add_argument("url", nargs="*", help="a node's http://host:port/stats (default: dev up)")
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR)
    parser.set_defaults(handler=_stats)


def _certs(args: argparse.Namespace) -> int:
    from headwater.certs import DEV_HOSTS, ensure_dev_certs

    certs = ensure_dev_certs(args.dir, (*DEV_HOSTS, *args.host))
    print(f"headwater: CA certificate {certs.cafile}")
    print(f"headwater: server certificate {certs.server.cert}, key {certs.server.key}")
    return 0


def _add_certs(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser("certs", help="a dev CA and server certificate (kept if there)")
    parser.add_argument("--dir", type=Path, default=DEFAULT_STATE_DIR / "certs")
    parser.add_argument(
        "--host", action="append", default=[], help="another name of the server (repeatable)"
    )
    parser.set_defaults(handler=_certs)


class _WarningPrinter(logging.Handler):
    """Prints a warning of the tooling as `headwater: warning: <message>` on the current stderr."""

    def emit(self, record: logging.LogRecord) -> None:
        print(f"headwater: {record.levelname.lower()}: {record.getMessage()}", file=sys.stderr)


def _install_warning_printer() -> None:
    logger = logging.getLogger("headwater")
    if not any(isinstance(handler, _WarningPrinter) for handler in logger.handlers):
        logger.addHandler(_WarningPrinter(logging.WARNING))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="headwater", description="Headwater MQTT broker")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_dev(commands)
    _add_topics(commands)
    _add_stats(commands)
    _add_certs(commands)
    commands.add_parser("frontend", help="run one front-end node (flags: see frontend --help)")
    commands.add_parser(
        "analytics", help="a Spark job or your own SQL on the log (see analytics --help)"
    )
    commands.add_parser("passwd", help="manage a Mosquitto password file (see passwd --help)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args_list = sys.argv[1:] if argv is None else list(argv)
    try:
        if args_list[:1] == ["frontend"]:
            return run_frontend(args_list[1:])
        if args_list[:1] == ["analytics"]:
            return run_analytics(args_list[1:])
        if args_list[:1] == ["passwd"]:
            return run_passwd(args_list[1:])
        args = build_parser().parse_args(args_list)
        _install_warning_printer()
        handler: Handler = args.handler
        return handler(args)
    except HeadwaterError as exc:
        print(f"headwater: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
