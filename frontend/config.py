"""A node's configuration: ``NodeConfig``, and the command line and ``HEADWATER_*`` variables that
fill it.

Every setting is a flag with an environment variable beside it (``--max-inflight`` /
``HEADWATER_MAX_INFLIGHT``) and a key of the configuration file (``max-inflight = 32``, read by
``frontend.config_file``).  A bad value stops start-up with one line naming the flag, the variable
and, when the value came from the file, the key and the file (:class:`ConfigError`); nothing here
connects to anything.  A flag's ``metavar`` tells the file its TOML type: :data:`INTEGER`,
:data:`SECONDS`, a yes/no switch is a boolean, any other a string.
"""

from __future__ import annotations

import argparse
import logging
import os
import resource
from dataclasses import dataclass, field

from frontend.buffers import DEFAULT_MAX_BUFFERED_BYTES
from frontend.mqtt.channel import Limits
from frontend.mqtt.codec import DEFAULT_MAX_CONNECT_SIZE, DEFAULT_MAX_WILL_SIZE
from frontend.proxy_protocol import LOOPBACK, AllowList
from frontend.retained import DEFAULT_MAX_RETAINED, DEFAULT_MAX_RETAINED_BYTES
from frontend.sessions.store import DEFAULT_EXPIRY
from router.shared import DEFAULT_MAX_SHARE_GROUPS, DEFAULT_MAX_SHARE_GROUPS_PER_CLIENT
from router.topics import MAX_RECORD_BYTES

DEFAULT_MAX_PACKET_SIZE = MAX_RECORD_BYTES - 128 * 1024
"""Largest PUBLISH accepted: its record (payload, topic, client id, ~40 bytes of framing)
must fit in what the log topic and the producer take (``router.topics.MAX_RECORD_BYTES``)."""
MAX_SESSION_EXPIRY = 10 * 365 * 86400
"""Ten years: longer is "never", which is 0."""


class ConfigError(ValueError):
    """A setting that stops start-up; the message names the flag and variable."""


class FileValue(str):
    """A setting's text read from the configuration file, with ``origin`` (``key in FILE``) for
    the messages of the checks below."""

    origin: str

    def __new__(cls, text: str, origin: str = "") -> FileValue:
        value = super().__new__(cls, text)
        value.origin = origin
        return value


INTEGER = "N"
"""The metavar of a flag whose file key is a TOML integer."""
SECONDS = "SECONDS"
"""The metavar of a flag whose file key is a TOML number (integer or float)."""
LOG_FORMATS = ("text", "json")
MAX_WORKERS = 64
"""Processes of one node at most (``--workers``)."""


LISTENER_KINDS = ("mqtt", "mqtts", "ws", "wss")
"""MQTT over TCP, over TLS, over WebSocket (path ``/mqtt``) and over secure WebSocket."""


@dataclass(slots=True)
class Listener:
    """One front door of a node (``frontend.listeners``)."""

    kind: str
    host: str
    port: int
    """0 until started: the port the system chose is written back."""


@dataclass(slots=True)
class TlsFiles:
    """What the TLS listeners (``mqtts``, ``wss``) serve with; Mosquitto's listener settings."""

    certfile: str
    keyfile: str
    cafile: str | None = None
    """CA of client certificates: a certificate a client presents is verified against it."""
    require_certificate: bool = False
    """Refuse the TLS handshake of a client without a valid certificate."""
    use_identity_as_username: bool = False
    """The client certificate's CN is the user name, and no password is asked (implies
    ``require_certificate``)."""


@dataclass(slots=True)
class NodeConfig:
    node_id: str
    host: str
    port: int
    kafka_bootstrap: str
    redis_url: str | None
    topic: str
    partitions: int
    routing_depth: int = 2
    max_packet_size: int = DEFAULT_MAX_PACKET_SIZE
    connect_timeout: float = 15.0
    password_file: str | None = None
    acl_file: str | None = None
    allow_anonymous: bool | None = None
    """Clients that prove no identity may connect (Mosquitto 2.0's ``allow_anonymous``); None:
    exactly when the node has no way to authenticate (``frontend.auth.anonymous_allowed``)."""
    listeners: list[Listener] = field(default_factory=list)
    """Front doors besides the plain MQTT one at ``host``:``port``."""
    tls: TlsFiles | None = None
    proxy_protocol: bool = False
    reuse_port: bool = False
    """Listeners bound with ``SO_REUSEPORT`` (the workers of ``--workers``)."""
    """Every listener expects a PROXY protocol v1 or v2 header first (from a load balancer)."""
    max_connections: int = field(default_factory=lambda: default_max_connections(50))
    """Connections at once, at most; by default what the open-file limit leaves."""
    max_connect_size: int = DEFAULT_MAX_CONNECT_SIZE
    """A CONNECT's bytes besides its will message, at most (``frontend.mqtt.codec``)."""
    max_will_size: int = DEFAULT_MAX_WILL_SIZE
    """A will message's bytes, at most."""
    max_buffered_bytes: int = DEFAULT_MAX_BUFFERED_BYTES
    """Bytes in clients' partial packets and output buffers, node-wide (``frontend.buffers``)."""
    proxy_allow: AllowList = field(default_factory=lambda: AllowList.parse(LOOPBACK))
    """The peers (load balancers) a PROXY header is believed from."""
    ws_origins: frozenset[str] = frozenset()
    """``Origin`` values a WebSocket upgrade may carry (lower case); empty: any."""
    redis_prefix: str = "hw:"
    redis_connections: int = 50
    """Connections to Redis at most; more requests at once wait for one (never refused)."""
    redis_cluster: bool = False
    """``redis_url`` names a node of a Redis Cluster."""
    session_expiry: float = DEFAULT_EXPIRY
    """Seconds a persistent session is kept once its client is gone; 0: forever."""
    stats_host: str | None = None
    stats_port: int = 0
    sys_interval: float = 0.0
    """Seconds between two ``$SYS`` reports (``frontend.systree``); 0: none.  Off for a node
    built in code (tests count their own traffic); the command line's default is 10."""
    max_share_groups: int = DEFAULT_MAX_SHARE_GROUPS
    """``$share`` groups with members on this node, at most (``router.shared``)."""
    max_share_groups_per_client: int = DEFAULT_MAX_SHARE_GROUPS_PER_CLIENT
    """``$share`` filters one client holds, at most."""
    max_retained: int = DEFAULT_MAX_RETAINED
    """Retained messages kept, cluster-wide (``frontend.retained``)."""
    max_retained_bytes: int = DEFAULT_MAX_RETAINED_BYTES
    """Bytes of retained messages (topic and stored record) kept, cluster-wide."""
    limits: Limits = field(default_factory=Limits)


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(f"HEADWATER_{name}", default)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="headwater frontend", description="Run one front-end node.")
    p.add_argument(
        "--config",
        metavar="FILE",
        default=_env("CONFIG"),
        help="a TOML file of settings, keys named as the flags without -- (example: "
        "docs/headwater.example.toml); flags and variables override it [HEADWATER_CONFIG]",
    )
    p.add_argument(
        "--node-id", default=_env("NODE_ID"), help="unique node name, required [HEADWATER_NODE_ID]"
    )
    p.add_argument(
        "--listen",
        default=_env("LISTEN", "127.0.0.1:1883"),
        help="host:port to serve MQTT on [HEADWATER_LISTEN]",
    )
    p.add_argument(
        "--workers",
        metavar=INTEGER,
        default=_env("WORKERS", "1"),
        help="processes sharing the listening ports (SO_REUSEPORT), one per core; worker i is "
        "node NODE_ID-i, its HTTP port the --stats-listen port + i-1 [HEADWATER_WORKERS]",
    )
    for kind, what in (
        ("tls", "MQTT over TLS"),
        ("ws", "MQTT over WebSocket at /mqtt"),
        ("wss", "MQTT over secure WebSocket at /mqtt"),
    ):
        flag = f"--{kind}-listen"
        p.add_argument(
            flag,
            default=_env(f"{kind.upper()}_LISTEN"),
            help=f"host:port to serve {what} on; off when unset [{_env_name(flag)}]",
        )
    p.add_argument(
        "--certfile",
        default=_env("CERTFILE"),
        help="server certificate (PEM) of the TLS listeners [HEADWATER_CERTFILE]",
    )
    p.add_argument(
        "--keyfile", default=_env("KEYFILE"), help="its private key (PEM) [HEADWATER_KEYFILE]"
    )
    p.add_argument(
        "--cafile",
        default=_env("CAFILE"),
        help="CA that client certificates are verified against [HEADWATER_CAFILE]",
    )
    p.add_argument(
        "--require-certificate",
        action="store_const",
        const="yes",
        default=_env("REQUIRE_CERTIFICATE", "no"),
        help="TLS clients must present a certificate signed by --cafile "
        "[HEADWATER_REQUIRE_CERTIFICATE=yes]",
    )
    p.add_argument(
        "--use-identity-as-username",
        action="store_const",
        const="yes",
        default=_env("USE_IDENTITY_AS_USERNAME", "no"),
        help="a TLS client certificate's CN is its user name (implies "
        "--require-certificate) [HEADWATER_USE_IDENTITY_AS_USERNAME=yes]",
    )
    p.add_argument(
        "--proxy-protocol",
        action="store_const",
        const="yes",
        default=_env("PROXY_PROTOCOL", "no"),
        help="every listener expects a PROXY protocol v1/v2 header first, as a load "
        "balancer sends it [HEADWATER_PROXY_PROTOCOL=yes]",
    )
    p.add_argument(
        "--reuse-port",
        action="store_const",
        const="yes",
        default=_env("REUSE_PORT", "no"),
        help="bind every listener with SO_REUSEPORT, so that several processes share its port "
        "(each worker of --workers is started with it) [HEADWATER_REUSE_PORT=yes]",
    )
    p.add_argument(
        "--max-connections",
        metavar=INTEGER,
        default=_env("MAX_CONNECTIONS"),
        help="connections at once; more are closed at accept; default: the open-file limit "
        f"(soft RLIMIT_NOFILE, `ulimit -n`) less {FILE_RESERVE} + --redis-connections, the "
        "files kept for Kafka, Redis, the listeners and logs [HEADWATER_MAX_CONNECTIONS]",
    )
    p.add_argument(
        "--max-connect-size",
        metavar=INTEGER,
        default=_env("MAX_CONNECT_SIZE", str(DEFAULT_MAX_CONNECT_SIZE)),
        help="bytes of a CONNECT besides its will message (client id, user name, password, will "
        "topic); a first packet that is no CONNECT, or a larger one, is closed before it is "
        "buffered [HEADWATER_MAX_CONNECT_SIZE]",
    )
    p.add_argument(
        "--max-will-size",
        metavar=INTEGER,
        default=_env("MAX_WILL_SIZE", str(DEFAULT_MAX_WILL_SIZE)),
        help="bytes of a will message [HEADWATER_MAX_WILL_SIZE]",
    )
    p.add_argument(
        "--max-buffered-bytes",
        metavar=INTEGER,
        default=_env("MAX_BUFFERED_BYTES", str(DEFAULT_MAX_BUFFERED_BYTES)),
        help="bytes held in clients' partial packets and output buffers, node-wide; past it "
        "the node stops reading until they hold 3/4 of it [HEADWATER_MAX_BUFFERED_BYTES]",
    )
    p.add_argument(
        "--proxy-allow",
        metavar="CIDR[,CIDR]",
        default=_env("PROXY_ALLOW", LOOPBACK),
        help="with --proxy-protocol, the load balancers' networks: a connection from any other "
        "peer is closed at accept [HEADWATER_PROXY_ALLOW]",
    )
    p.add_argument(
        "--ws-origins",
        metavar="ORIGIN[,ORIGIN]",
        default=_env("WS_ORIGINS"),
        help="the WebSocket listeners' allowed Origin headers (https://app.example.com); an "
        "upgrade with another is answered 403, one without any (not a browser) is served; "
        "any when unset [HEADWATER_WS_ORIGINS]",
    )
    p.add_argument(
        "--kafka-bootstrap",
        default=_env("KAFKA_BOOTSTRAP"),
        help="Kafka bootstrap servers, required [HEADWATER_KAFKA_BOOTSTRAP]",
    )
    p.add_argument(
        "--redis-url",
        default=_env("REDIS_URL"),
        help="sessions and retained messages; in memory when unset "
        "(one node only) [HEADWATER_REDIS_URL]",
    )
    p.add_argument(
        "--redis-connections",
        metavar=INTEGER,
        default=_env("REDIS_CONNECTIONS", "50"),
        help="connections to Redis at most; requests beyond wait their turn "
        "[HEADWATER_REDIS_CONNECTIONS]",
    )
    p.add_argument(
        "--redis-cluster",
        action="store_const",
        const="yes",
        default=_env("REDIS_CLUSTER", "no"),
        help="--redis-url names a node of a Redis Cluster [HEADWATER_REDIS_CLUSTER=yes]",
    )
    p.add_argument(
        "--redis-prefix",
        default=_env("REDIS_PREFIX", "hw:"),
        help="key prefix in Redis [HEADWATER_REDIS_PREFIX]",
    )
    p.add_argument(
        "--topic",
        default=_env("TOPIC", "headwater.messages"),
        help="the log topic [HEADWATER_TOPIC]",
    )
    p.add_argument(
        "--partitions",
        metavar=INTEGER,
        default=_env("PARTITIONS", "12"),
        help="partitions of the log topic [HEADWATER_PARTITIONS]",
    )
    p.add_argument(
        "--routing-depth",
        metavar=INTEGER,
        default=_env("ROUTING_DEPTH", "2"),
        help="topic levels in the routing key [HEADWATER_ROUTING_DEPTH]",
    )
    p.add_argument(
        "--max-packet-size",
        metavar=INTEGER,
        default=_env("MAX_PACKET_SIZE", str(DEFAULT_MAX_PACKET_SIZE)),
        help="largest accepted packet, bytes [HEADWATER_MAX_PACKET_SIZE]",
    )
    p.add_argument(
        "--max-inflight",
        metavar=INTEGER,
        default=_env("MAX_INFLIGHT", "32"),
        help="outbound QoS 1/2 messages in flight per client [HEADWATER_MAX_INFLIGHT]",
    )
    p.add_argument(
        "--max-queued",
        metavar=INTEGER,
        default=_env("MAX_QUEUED", "1000"),
        help="messages queued per client [HEADWATER_MAX_QUEUED]",
    )
    p.add_argument(
        "--max-queued-bytes",
        metavar=INTEGER,
        default=_env("MAX_QUEUED_BYTES", str(Limits().max_queued_bytes)),
        help="payload and topic bytes queued per client; beyond, QoS 1/2 messages wait in the "
        "log and QoS 0 ones are dropped [HEADWATER_MAX_QUEUED_BYTES]",
    )
    p.add_argument(
        "--max-subscriptions",
        metavar=INTEGER,
        default=_env("MAX_SUBSCRIPTIONS", str(Limits().max_subscriptions)),
        help="topic filters per client; a SUBSCRIBE beyond is refused (0x80); 0: no bound "
        "[HEADWATER_MAX_SUBSCRIPTIONS]",
    )
    p.add_argument(
        "--max-share-groups",
        metavar=INTEGER,
        default=_env("MAX_SHARE_GROUPS", str(DEFAULT_MAX_SHARE_GROUPS)),
        help="$share groups with members on this node (a Kafka consumer, about 4 threads, "
        "each); a $share filter opening one more is refused (0x80); 0: none "
        "[HEADWATER_MAX_SHARE_GROUPS]",
    )
    p.add_argument(
        "--max-share-groups-per-client",
        metavar=INTEGER,
        default=_env("MAX_SHARE_GROUPS_PER_CLIENT", str(DEFAULT_MAX_SHARE_GROUPS_PER_CLIENT)),
        help="$share filters per client; a SUBSCRIBE beyond is refused (0x80); 0: none "
        "[HEADWATER_MAX_SHARE_GROUPS_PER_CLIENT]",
    )
    p.add_argument(
        "--max-retained",
        metavar=INTEGER,
        default=_env("MAX_RETAINED", str(DEFAULT_MAX_RETAINED)),
        help="retained messages kept, cluster-wide; a retained PUBLISH beyond is delivered but "
        "not retained (counted) [HEADWATER_MAX_RETAINED]",
    )
    p.add_argument(
        "--max-retained-bytes",
        metavar=INTEGER,
        default=_env("MAX_RETAINED_BYTES", str(DEFAULT_MAX_RETAINED_BYTES)),
        help="bytes of retained messages (topic and record) kept, cluster-wide; a retained "
        "PUBLISH beyond is delivered but not retained (counted) [HEADWATER_MAX_RETAINED_BYTES]",
    )
    p.add_argument(
        "--session-expiry",
        metavar=SECONDS,
        default=_env("SESSION_EXPIRY", f"{DEFAULT_EXPIRY:g}"),
        help="seconds a persistent session is kept once its client is gone; 0: forever "
        "[HEADWATER_SESSION_EXPIRY]",
    )
    p.add_argument(
        "--password-file",
        default=_env("PASSWORD_FILE"),
        help="a mosquitto_passwd file (see `headwater passwd`); anonymous clients refused; "
        "reread on SIGHUP [HEADWATER_PASSWORD_FILE]",
    )
    p.add_argument(
        "--acl-file",
        default=_env("ACL_FILE"),
        help="a Mosquitto acl_file; reread on SIGHUP [HEADWATER_ACL_FILE]",
    )
    p.add_argument(
        "--allow-anonymous",
        nargs="?",
        const="yes",
        default=_env("ALLOW_ANONYMOUS"),
        help="yes or no: clients that prove no identity may connect, and get the acl_file's "
        "anonymous rules (a user name proves nothing without --password-file or "
        "--use-identity-as-username); unset: yes without either, no with one "
        "[HEADWATER_ALLOW_ANONYMOUS]",
    )
    p.add_argument(
        "--stats-listen",
        default=_env("STATS_LISTEN"),
        help="host:port for GET /stats (JSON); off when unset [HEADWATER_STATS_LISTEN]",
    )
    p.add_argument(
        "--sys-interval",
        metavar=SECONDS,
        default=_env("SYS_INTERVAL", "10"),
        help="seconds between $SYS reports; 0: none [HEADWATER_SYS_INTERVAL]",
    )
    p.add_argument(
        "--log-level",
        default=_env("LOG_LEVEL", "INFO"),
        help="DEBUG, INFO, WARNING or ERROR [HEADWATER_LOG_LEVEL]",
    )
    p.add_argument(
        "--log-format",
        default=_env("LOG_FORMAT", "text"),
        help="text, or json: one object per line (time, level, logger, message, exception) "
        "[HEADWATER_LOG_FORMAT]",
    )
    return p


def _env_name(flag: str) -> str:
    """The variable beside ``flag``: ``--max-inflight`` -> ``HEADWATER_MAX_INFLIGHT``."""
    return "HEADWATER_" + flag.lstrip("-").replace("-", "_").upper()


def _label(flag: str, value: object) -> str:
    """Where a bad ``value`` came from: ``--flag / HEADWATER_FLAG``, and the file key if there."""
    where = f"{flag} / {_env_name(flag)}"
    return f"{where} / {value.origin}" if isinstance(value, FileValue) else where


def _int_setting(value: str | None, flag: str, low: int, high: int) -> int:
    try:
        number = int(value or "")
    except ValueError:
        raise ConfigError(f"{_label(flag, value)}: {value!r} is not an integer") from None
    if not low <= number <= high:
        raise ConfigError(f"{_label(flag, value)}: {number} is outside {low}..{high}")
    return number


def _seconds_setting(value: str | None, flag: str, high: float) -> float:
    where = _label(flag, value)
    try:
        seconds = float(value or "")
    except ValueError:
        raise ConfigError(f"{where}: {value!r} is not a number of seconds") from None
    if not 0 <= seconds <= high:
        raise ConfigError(f"{where}: {value} is outside 0..{high:.0f} seconds")
    return seconds


def _switch_setting(value: str, flag: str) -> bool:
    answer = {"yes": True, "true": True, "1": True, "no": False, "false": False, "0": False}
    if value.lower() not in answer:
        raise ConfigError(f"{_label(flag, value)}: {value!r} is not yes or no")
    return answer[value.lower()]


def _choice_setting(value: str, flag: str, choices: tuple[str, ...]) -> str:
    """The one of ``choices`` that ``value`` names, whatever its case."""
    chosen = [choice for choice in choices if choice.lower() == str(value).lower()]
    if not chosen:
        raise ConfigError(f"{_label(flag, value)}: {value!r} is not one of {', '.join(choices)}")
    return chosen[0]


def _address(value: str, flag: str) -> tuple[str, str]:
    host, sep, port = str(value).rpartition(":")
    if not sep or not host:
        raise ConfigError(f"{_label(flag, value)}: {value!r} is not host:port")
    return host, FileValue(port, value.origin) if isinstance(value, FileValue) else port


def log_settings(args: argparse.Namespace) -> tuple[str, str]:
    """The log level and format (``frontend.logs``), checked as every other setting is."""
    levels = tuple(logging.getLevelNamesMapping())
    level = _choice_setting(args.log_level, "--log-level", levels)
    return level, _choice_setting(args.log_format, "--log-format", LOG_FORMATS)


def workers_setting(args: argparse.Namespace, config: NodeConfig) -> int:
    """How many processes serve the node (``frontend.workers``), 1..:data:`MAX_WORKERS`.  More
    than one share every listener's port, so none may be 0 (each worker would get another), and
    their HTTP ports, the stats port and the next ones, must exist and be no listener's."""
    workers = _int_setting(args.workers, "--workers", 1, MAX_WORKERS)
    if workers == 1:
        return workers
    where = _label("--workers", args.workers)
    doors = [Listener("mqtt", config.host, config.port), *config.listeners]
    for door in doors:
        if door.port == 0:
            raise ConfigError(
                f"{where}: {workers} workers share the {door.kind} port, which must not be 0 "
                "(each worker would be given another)"
            )
    first = config.stats_port
    if not first:
        return workers
    last = first + workers - 1
    if last > 65535:
        raise ConfigError(f"{where}: the workers' HTTP ports {first}..{last} go beyond 65535")
    for door in doors:
        if first <= door.port <= last:
            raise ConfigError(
                f"{where}: the workers' HTTP ports {first}..{last} include the {door.kind} "
                f"port {door.port}"
            )
    return workers


def config_from_args(args: argparse.Namespace) -> NodeConfig:
    if not args.node_id:
        raise ConfigError("--node-id / HEADWATER_NODE_ID is required")
    if not args.kafka_bootstrap:
        raise ConfigError("--kafka-bootstrap / HEADWATER_KAFKA_BOOTSTRAP is required")
    host, port = _address(args.listen, "--listen")
    stats_host, stats_port = (
        _address(args.stats_listen, "--stats-listen") if args.stats_listen else (None, "0")
    )
    for flag in ("--password-file", "--acl-file"):
        _existing_file(getattr(args, flag[2:].replace("-", "_")), flag)
    redis_cluster = _switch_setting(args.redis_cluster, "--redis-cluster")
    if redis_cluster and not args.redis_url:
        raise ConfigError("--redis-cluster / HEADWATER_REDIS_CLUSTER needs --redis-url")
    limits = Limits(
        max_inflight=_int_setting(args.max_inflight, "--max-inflight", 1, 65535),
        max_queued=_int_setting(args.max_queued, "--max-queued", 0, 10_000_000),
        max_queued_bytes=_int_setting(args.max_queued_bytes, "--max-queued-bytes", 1, 2**40),
        max_subscriptions=_int_setting(args.max_subscriptions, "--max-subscriptions", 0, 10**9),
    )
    listeners = [
        Listener(kind, *_listen_setting(value, flag))
        for kind, flag in (
            ("mqtts", "--tls-listen"),
            ("ws", "--ws-listen"),
            ("wss", "--wss-listen"),
        )
        if (value := getattr(args, flag[2:].replace("-", "_")))
    ]
    return NodeConfig(
        node_id=args.node_id,
        host=host,
        port=_int_setting(port, "--listen", 0, 65535),
        stats_host=stats_host,
        stats_port=_int_setting(stats_port, "--stats-listen", 0, 65535),
        sys_interval=_seconds_setting(args.sys_interval, "--sys-interval", 86400),
        kafka_bootstrap=args.kafka_bootstrap,
        redis_url=args.redis_url,
        redis_prefix=args.redis_prefix,
        redis_connections=_int_setting(args.redis_connections, "--redis-connections", 2, 10_000),
        redis_cluster=redis_cluster,
        session_expiry=_seconds_setting(
            args.session_expiry, "--session-expiry", MAX_SESSION_EXPIRY
        ),
        topic=args.topic,
        partitions=_int_setting(args.partitions, "--partitions", 1, 100_000),
        routing_depth=_int_setting(args.routing_depth, "--routing-depth", 1, 64),
        max_share_groups=_int_setting(args.max_share_groups, "--max-share-groups", 0, 10_000),
        max_share_groups_per_client=_int_setting(
            args.max_share_groups_per_client, "--max-share-groups-per-client", 0, 10_000
        ),
        max_retained=_int_setting(args.max_retained, "--max-retained", 1, 10**10),
        max_retained_bytes=_int_setting(
            args.max_retained_bytes, "--max-retained-bytes", 1024, 2**50
        ),
        max_packet_size=_int_setting(
            args.max_packet_size, "--max-packet-size", 2, DEFAULT_MAX_PACKET_SIZE
        ),
        password_file=args.password_file,
        acl_file=args.acl_file,
        allow_anonymous=anonymous_setting(
            args.allow_anonymous,
            args.password_file,
            args.acl_file,
            _identity_setting(args, listeners),
        ),
        listeners=listeners,
        tls=_tls_setting(args, listeners),
        proxy_protocol=_switch_setting(args.proxy_protocol, "--proxy-protocol"),
        reuse_port=_switch_setting(args.reuse_port, "--reuse-port"),
        max_connections=_max_connections_setting(args),
        max_connect_size=_int_setting(args.max_connect_size, "--max-connect-size", 64, 2**24),
        max_will_size=_int_setting(args.max_will_size, "--max-will-size", 0, 65535),
        max_buffered_bytes=_int_setting(
            args.max_buffered_bytes, "--max-buffered-bytes", 1024 * 1024, 2**40
        ),
        proxy_allow=_proxy_allow_setting(args.proxy_allow),
        ws_origins=_ws_origins_setting(args.ws_origins),
        limits=limits,
    )


def anonymous_setting(
    value: str | None, password_file: str | None, acl_file: str | None, certificates: bool
) -> bool | None:
    """``--allow-anonymous``: None when unset.  An acl_file on a node with no way to
    authenticate would judge every client by its anonymous rules: start-up stops unless
    ``--allow-anonymous yes`` says that is meant (``headwater dev up`` asks the same)."""
    allowed = None if value is None else _switch_setting(value, "--allow-anonymous")
    if acl_file and not password_file and not certificates and allowed is not True:
        raise ConfigError(
            f"{_label('--acl-file', acl_file)}: without --password-file or "
            "--use-identity-as-username (and a TLS listener) a user name proves nothing, so "
            "every client would get the acl_file's anonymous rules; give one of them, or "
            "--allow-anonymous yes / HEADWATER_ALLOW_ANONYMOUS=yes if that is what you mean"
        )
    return allowed


def _identity_setting(args: argparse.Namespace, listeners: list[Listener]) -> bool:
    """Whether clients are known by their certificates (``--use-identity-as-username`` with a
    TLS listener)."""
    secure = any(lst.kind in ("mqtts", "wss") for lst in listeners)
    return secure and _switch_setting(args.use_identity_as_username, "--use-identity-as-username")


FILE_RESERVE = 200
"""Open files a node keeps besides its clients' and Redis's: librdkafka's sockets to each broker
and wake-up pipes (producer, reader, catch-up and share-group consumers), the listeners, the
stats port, log files, the interpreter's own."""

MIN_CONNECTIONS = 16


def default_max_connections(redis_connections: int) -> int:
    """What the open-file limit leaves for clients: its soft value (``ulimit -n``) less
    :data:`FILE_RESERVE` and the Redis connections (at least :data:`MIN_CONNECTIONS`)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20  # Linux's own ceiling (fs.nr_open)
    return max(MIN_CONNECTIONS, soft - FILE_RESERVE - redis_connections)


def _max_connections_setting(args: argparse.Namespace) -> int:
    if args.max_connections is None:
        redis = _int_setting(args.redis_connections, "--redis-connections", 2, 10_000)
        return default_max_connections(redis)
    return _int_setting(args.max_connections, "--max-connections", 1, 10**7)


def _proxy_allow_setting(value: str) -> AllowList:
    try:
        return AllowList.parse(str(value))
    except ValueError as exc:
        raise ConfigError(f"{_label('--proxy-allow', value)}: {exc}") from None


def _ws_origins_setting(value: str | None) -> frozenset[str]:
    """Origins as browsers send them (RFC 6454): scheme://host[:port], compared in lower case."""
    words = (word.strip().rstrip("/").lower() for word in (value or "").split(","))
    origins = frozenset(word for word in words if word)
    for origin in origins:
        scheme, sep, host = origin.partition("://")
        if not sep or not scheme or not host or "/" in host:
            raise ConfigError(
                f"{_label('--ws-origins', value)}: {origin!r} is not scheme://host[:port]"
            )
    return origins


def _existing_file(path: str | None, flag: str) -> str | None:
    if path and not os.path.isfile(path):
        raise ConfigError(f"{_label(flag, path)}: no file {path}")
    return path


def _listen_setting(value: str, flag: str) -> tuple[str, int]:
    host, port = _address(value, flag)
    return host, _int_setting(port, flag, 0, 65535)


def _tls_setting(args: argparse.Namespace, listeners: list[Listener]) -> TlsFiles | None:
    """The certificate files, required when a TLS listener is on and checked to exist."""
    secure = [
        f"--{'tls' if lst.kind == 'mqtts' else 'wss'}-listen"
        for lst in listeners
        if lst.kind in ("mqtts", "wss")
    ]
    if not secure:
        return None
    for flag in ("--certfile", "--keyfile"):
        if not getattr(args, flag[2:]):
            raise ConfigError(f"{flag} / {_env_name(flag)} is required by {secure[0]}")
        _existing_file(getattr(args, flag[2:]), flag)
    identity = _switch_setting(args.use_identity_as_username, "--use-identity-as-username")
    required = _switch_setting(args.require_certificate, "--require-certificate") or identity
    if required and not args.cafile:
        flag = "--use-identity-as-username" if identity else "--require-certificate"
        raise ConfigError(f"{flag} / {_env_name(flag)} needs --cafile")
    return TlsFiles(
        args.certfile,
        args.keyfile,
        _existing_file(args.cafile, "--cafile"),
        require_certificate=required,
        use_identity_as_username=identity,
    )
