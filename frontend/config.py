"""A node's settings: one table of declarations (:data:`SETTINGS`), and what is derived from it.

Each :class:`Setting` is declared once: its name (the flag without ``--``, the key of the
configuration file, and the variable ``HEADWATER_<NAME>``), its kind (the file's TOML type and how
text becomes a value, :data:`KINDS`), its default, its bounds and its help.  Everything else is
derived: the command line (:func:`build_parser`, each help ending in ``[HEADWATER_X]``), the file's
keys and types, the example file and the README's table (``frontend.config_file``, a unit test
keeps both equal to what it renders), the defaults of :class:`NodeConfig` and the one-setting checks
of :func:`config_from_args`.  Checks that span settings are the small functions after it: the TLS
files, the workers and their ports, anonymous clients and the ACL, ``--max-connections``' default.

Precedence is flag > variable > file > default: the parser's defaults hold the variables, and the
file fills the defaults whose variable is unset (``frontend.config_file``).  A bad value stops
start-up with one line naming the flag, the variable and, when the value came from the file, the key
and the file (:class:`ConfigError`); nothing here connects to anything.

A table of our own rather than pydantic-settings: what users see would change (its errors, its
command line), or be rebuilt around it at every point: argparse's abbreviations that
``frontend.workers`` relies on, yes/no switches, a tri-state ``--allow-anonymous``, messages that
name flag, variable, key and file.  The table is plain data; the rules are the few functions below.
"""

from __future__ import annotations

import argparse
import logging
import os
import resource
from dataclasses import dataclass, field
from typing import Any

from frontend.buffers import DEFAULT_MAX_BUFFERED_BYTES
from frontend.proxy_protocol import LOOPBACK, AllowList
from frontend.retained import DEFAULT_MAX_RETAINED, DEFAULT_MAX_RETAINED_BYTES
from frontend.sessions.redis import DEFAULT_PREFIX
from frontend.sessions.store import DEFAULT_EXPIRY
from frontend.values import (
    INTEGER,
    KINDS,
    LIST,
    METAVARS,
    SECONDS,
    SWITCH,
    TEXT,
    Append,
    ConfigError,
    FileValue,
    Parse,
    allow_list,
    checked,
    choice,
    existing_file,
    int_setting,
    kafka_config,
    label,
    origins,
    seconds_setting,
    switch_setting,
    variable_of,
)
from mqttcore.channel import Limits
from mqttcore.codec import DEFAULT_MAX_CONNECT_SIZE, DEFAULT_MAX_WILL_SIZE
from router.history import DEFAULT_MAX_HISTORY, DEFAULT_MAX_HISTORY_PER_CLIENT
from router.partitioner import DEFAULT_ROUTING_DEPTH
from router.relay_records import INBOUND_TOPIC, Export, inbound_topic_name, parse_export
from router.shared import DEFAULT_MAX_SHARE_GROUPS, DEFAULT_MAX_SHARE_GROUPS_PER_CLIENT
from router.topics import DEFAULT_PARTITIONS, MAX_RECORD_BYTES, MESSAGES_TOPIC

DEFAULT_MAX_PACKET_SIZE = MAX_RECORD_BYTES - 128 * 1024
"""Largest PUBLISH accepted: its record (payload, topic, client id, ~40 bytes of framing)
must fit in what the log topic and the producer take (``router.topics.MAX_RECORD_BYTES``)."""
MAX_SESSION_EXPIRY = 10 * 365 * 86400
"""Ten years: longer is "never", which is 0."""
MAX_WORKERS = 64
"""Processes of one node at most (``--workers``)."""
FILE_RESERVE = 200
"""Open files a node keeps besides its clients' and Redis's: librdkafka's sockets to each broker
and wake-up pipes (producer, reader, catch-up and share-group consumers), the listeners, the
stats port, log files, the interpreter's own."""
MIN_CONNECTIONS = 16
LOG_FORMATS = ("text", "json")
LISTENER_KINDS = ("mqtt", "mqtts", "ws", "wss")
"""MQTT over TCP, over TLS, over WebSocket (path ``/mqtt``) and over secure WebSocket."""


NODE, LIMITS, OWN = "node", "limits", "own"
"""Where a value goes: the :class:`NodeConfig` field of its name, the :class:`Limits` field of
its name, or a function of its own below (a setting that makes part of a field, or none)."""


# -- the declarations ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Setting:
    """One setting, as everything that shows it derives it."""

    name: str
    """The flag without ``--``, the file's key; the variable is ``HEADWATER_`` + its upper case."""
    kind: str
    default: str | int | float | bool | None
    """As a file would write it; None: unset.  A switch unset by default is a tri-state."""
    help: str
    """For ``--help`` and the example file; the README adds :attr:`more`."""
    low: int = 0
    high: int = 0
    """Bounds of a number (seconds: from 0)."""
    into: str = NODE
    parse: Parse | None = None
    """A text setting's check; without one the text is the value."""
    more: str = ""
    metavar: str | None = None
    """What ``--help`` calls a text setting's value; a number's is its kind's."""
    required: bool = False
    """Start-up stops without it (it has no default)."""
    in_file: bool = True
    """A key of the file (not ``--config``: a file names no other file)."""
    reloads: bool = False
    """SIGHUP applies a new value to the running node (``frontend.node.Node.reload``); another
    setting's new value waits for the next start."""

    def __post_init__(self) -> None:
        types = KINDS[self.kind][0]
        if self.default is not None and type(self.default) not in types:
            raise TypeError(f"{self.name}: default {self.default!r} is not {self.kind}")

    @property
    def flag(self) -> str:
        return f"--{self.name}"

    @property
    def variable(self) -> str:
        return variable_of(self.name)

    @property
    def dest(self) -> str:
        return self.name.replace("-", "_")

    @property
    def text(self) -> str | None:
        """The default as a flag would give it."""
        if isinstance(self.default, bool):
            return "yes" if self.default else "no"
        if isinstance(self.default, float):
            return f"{self.default:g}"
        return None if self.default is None else str(self.default)

    @property
    def flag_only(self) -> bool:
        """A switch off by default, given bare (``--proxy-protocol``), set by its variable as
        ``=yes``; one on by default takes a value (``--client-events no``)."""
        return self.kind == SWITCH and self.default is False

    def value(self, text: str | None) -> Any:
        """``text`` checked and made the setting's value."""
        if self.kind == INTEGER:
            return int_setting(text, self.flag, self.low, self.high)
        if self.kind == SECONDS:
            return seconds_setting(text, self.flag, self.high)
        if self.kind == SWITCH:
            return None if text is None else switch_setting(text, self.flag)
        return self.parse(text, self.flag) if self.parse else text


def _listen(what: str) -> str:
    return f"host:port to serve {what} on; off when unset"


_LIMITS = Limits()
_RECORDS = "a retained PUBLISH beyond is delivered but not retained (counted)"
SETTINGS: dict[str, Setting] = {
    setting.name: setting
    for setting in (
        Setting("config", TEXT, None, "a TOML file of settings, keys named as the flags without "
                "-- (example: docs/headwater.example.toml); flags and variables override it",
                into=OWN, metavar="FILE", in_file=False),
        Setting("node-id", TEXT, None, "unique node name, required", required=True),
        Setting("listen", TEXT, "127.0.0.1:1883", "host:port to serve MQTT on", into=OWN),
        Setting("workers", INTEGER, 1, "processes sharing the listening ports (SO_REUSEPORT), "
                "one per core; worker i is node NODE_ID-i, its HTTP port the --stats-listen port "
                "+ i-1", 1, MAX_WORKERS, into=OWN, more='see "Every core: `--workers`" below'),
        Setting("tls-listen", TEXT, None, _listen("MQTT over TLS"), into=OWN),
        Setting("ws-listen", TEXT, None, _listen("MQTT over WebSocket at /mqtt"), into=OWN),
        Setting("wss-listen", TEXT, None, _listen("MQTT over secure WebSocket at /mqtt"),
                into=OWN),
        Setting("certfile", TEXT, None, "server certificate (PEM) of the TLS listeners",
                into=OWN, more="required by a TLS listener"),
        Setting("keyfile", TEXT, None, "its private key (PEM)", into=OWN),
        Setting("cafile", TEXT, None, "CA that client certificates are verified against",
                into=OWN),
        Setting("require-certificate", SWITCH, False, "TLS clients must present a certificate "
                "signed by --cafile", into=OWN),
        Setting("use-identity-as-username", SWITCH, False, "a TLS client certificate's CN is "
                "its user name (implies --require-certificate)", into=OWN,
                more="no password is asked"),
        Setting("proxy-protocol", SWITCH, False, "every listener expects a PROXY protocol v1/v2 "
                "header first, as a load balancer sends it"),
        Setting("reuse-port", SWITCH, False, "bind every listener with SO_REUSEPORT, so that "
                "several processes share its port (each worker of --workers is started with it)",
                more="without it, a port in use stops start-up"),
        Setting("max-connections", INTEGER, None, "connections at once; more are closed at "
                "accept; default: the open-file limit (soft RLIMIT_NOFILE, `ulimit -n`) less "
                f"{FILE_RESERVE} + --redis-connections, the files kept for Kafka, Redis, the "
                "listeners and logs", 1, 10**7, into=OWN,
                more="`ulimit -n` 20,000 leaves 19,750; a refusal is counted"),
        Setting("max-connect-size", INTEGER, DEFAULT_MAX_CONNECT_SIZE, "bytes of a CONNECT "
                "besides its will message (client id, user name, password, will topic); a first "
                "packet that is no CONNECT, or a larger one, is closed before it is buffered",
                64, 2**24),
        Setting("max-will-size", INTEGER, DEFAULT_MAX_WILL_SIZE, "bytes of a will message",
                0, 65535),
        Setting("max-buffered-bytes", INTEGER, DEFAULT_MAX_BUFFERED_BYTES, "bytes held in "
                "clients' partial packets and output buffers, node-wide; past it the node stops "
                "reading until they hold 3/4 of it", 1024 * 1024, 2**40,
                more="`headwater_buffer_pauses_total`"),
        Setting("proxy-allow", TEXT, LOOPBACK, "with --proxy-protocol, the load balancers' "
                "networks: a connection from any other peer is closed at accept",
                parse=allow_list, metavar="CIDR[,CIDR]", more="`proxy_not_allowed`"),
        Setting("ws-origins", TEXT, None, "the WebSocket listeners' allowed Origin headers "
                "(https://app.example.com); an upgrade with another is answered 403, one without "
                "any (not a browser) is served; any when unset",
                parse=origins, metavar="ORIGIN[,ORIGIN]"),
        Setting("kafka-bootstrap", TEXT, None, "Kafka bootstrap servers, required",
                required=True),
        Setting("kafka-config", TEXT, None, "a file of librdkafka security settings, key=value "
                "lines (security.protocol, sasl.*, ssl.*), for every Kafka client of the node",
                parse=kafka_config, metavar="FILE",
                more="e.g. `security.protocol=SASL_SSL`, `sasl.mechanism=PLAIN`, "
                "`sasl.username`, `sasl.password`, `ssl.ca.location`; other keys stop start-up"),
        Setting("redis-url", TEXT, None, "sessions and retained messages; in memory when unset "
                "(one node only)"),
        Setting("redis-connections", INTEGER, 50, "connections to Redis at most; requests "
                "beyond wait their turn", 2, 10_000, more="up to 10 s, rather than failing"),
        Setting("redis-cluster", SWITCH, False, "--redis-url names a node of a Redis Cluster",
                more="the node learns the others from it"),
        Setting("redis-prefix", TEXT, DEFAULT_PREFIX, "key prefix in Redis"),
        Setting("topic", TEXT, MESSAGES_TOPIC, "the log topic"),
        Setting("partitions", INTEGER, DEFAULT_PARTITIONS, "partitions of the log topic",
                1, 100_000, more="must equal the topic's"),
        Setting("inbound-topic", TEXT, INBOUND_TOPIC, "Kafka topic whose records (key: MQTT "
                "topic, value: payload, headers mqtt.qos, mqtt.retain) the nodes relay to MQTT "
                "subscribers, once; created like the log topic; \"\": none", metavar="TOPIC",
                parse=checked(inbound_topic_name), more='see "Kafka users"'),
        Setting("export", LIST, None, "mirror the messages FILTER matches into KAFKA_TOPIC "
                "(created if missing), JSON or raw, once each; repeatable", metavar="FILTER="
                "KAFKA_TOPIC[:json|raw]", parse=checked(parse_export, entries=True),
                more='the variable: one per line; the file: an array; see "Kafka users"'),
        Setting("routing-depth", INTEGER, DEFAULT_ROUTING_DEPTH, "topic levels in the routing "
                "key", 1, 64, more="hashed to pick a partition"),
        Setting("max-packet-size", INTEGER, DEFAULT_MAX_PACKET_SIZE, "largest accepted packet, "
                "bytes", 2, DEFAULT_MAX_PACKET_SIZE,
                more="what the log topic accepts less 128 KiB for the record's framing"),
        Setting("max-inflight", INTEGER, _LIMITS.max_inflight, "outbound QoS 1/2 messages in "
                "flight per client", 1, 65535, into=LIMITS),
        Setting("max-queued", INTEGER, _LIMITS.max_queued, "messages queued per client",
                0, 10_000_000, into=LIMITS, more="a bound on memory, not on delivery: beyond it "
                "QoS 1/2 messages are read back from the log when the client has room again, "
                "QoS 0 ones are dropped (counted)"),
        Setting("max-queued-bytes", INTEGER, _LIMITS.max_queued_bytes, "payload and topic bytes "
                "queued per client; beyond, QoS 1/2 messages wait in the log and QoS 0 ones are "
                "dropped", 1, 2**40, into=LIMITS, more="one more message may cross it; "
                "Mosquitto's `max_queued_bytes` has no bound by default"),
        Setting("max-subscriptions", INTEGER, _LIMITS.max_subscriptions, "topic filters per "
                "client; a SUBSCRIBE beyond is refused (0x80); 0: no bound", 0, 10**9,
                into=LIMITS, more="counted; Mosquitto and EMQX have no bound by default"),
        Setting("max-share-groups", INTEGER, DEFAULT_MAX_SHARE_GROUPS, "$share groups with "
                "members on this node (no thread each: a step of its leases in Redis every "
                "second); a $share filter opening one more is refused (0x80); 0: none", 0, 10_000,
                more="counted"),
        Setting("max-share-groups-per-client", INTEGER, DEFAULT_MAX_SHARE_GROUPS_PER_CLIENT,
                "$share filters per client; a SUBSCRIBE beyond is refused (0x80); 0: none",
                0, 10_000, more="counted"),
        Setting("history-max-age", SECONDS, 0, "seconds back a $history/<since>/ subscription "
                "may start at most (an earlier <since> starts there); 0: all the log holds",
                high=10**9),
        Setting("max-history", INTEGER, DEFAULT_MAX_HISTORY, "$history subscriptions read "
                "on this node at once (each a cursor of the catch-up consumer); a $history "
                "filter beyond is refused (0x80); 0: none", 0, 100_000, more="counted"),
        Setting("max-history-per-client", INTEGER, DEFAULT_MAX_HISTORY_PER_CLIENT,
                "$history filters per client; a SUBSCRIBE beyond is refused (0x80); 0: none",
                0, 10_000, more="counted"),
        Setting("max-retained", INTEGER, DEFAULT_MAX_RETAINED, "retained messages kept, "
                f"cluster-wide; {_RECORDS}", 1, 10**10, more="`retained_over_limit`, logged "
                "once a minute; Mosquitto has no bound, nor EMQX's `max_retained_messages` by "
                "default"),
        Setting("max-retained-bytes", INTEGER, DEFAULT_MAX_RETAINED_BYTES, "bytes of retained "
                f"messages (topic and record) kept, cluster-wide; {_RECORDS}", 1024, 2**50),
        Setting("session-expiry", SECONDS, DEFAULT_EXPIRY, "seconds a persistent session is "
                "kept once its client is gone; 0: forever", high=MAX_SESSION_EXPIRY,
                more="removed by Redis TTLs, counted by the nodes if Redis has "
                "`notify-keyspace-events Ex` (nodes set it at start where allowed)"),
        Setting("password-file", TEXT, None, "a mosquitto_passwd file (see `headwater passwd`); "
                "anonymous clients refused; reread on SIGHUP", parse=existing_file,
                more="which disconnects the clients whose entry is gone or changed"),
        Setting("acl-file", TEXT, None, "a Mosquitto acl_file; reread on SIGHUP",
                parse=existing_file, more="unset: all allowed but publishing to `$SYS`"),
        Setting("allow-anonymous", SWITCH, None, "yes or no: clients that prove no identity may "
                "connect, and get the acl_file's anonymous rules (a user name proves nothing "
                "without --password-file or --use-identity-as-username); unset: yes without "
                "either, no with one", into=OWN, more="Mosquitto 2.0's `allow_anonymous`, "
                "which takes a user name as given; with `--acl-file` and no way to "
                "authenticate, start-up stops unless it is `yes`"),
        Setting("stats-listen", TEXT, None, "host:port for GET /stats (JSON); off when unset",
                into=OWN, more="`GET /metrics` (Prometheus text format, the same counters); "
                "`GET /live`; `GET /ready`: 200 while listening with Kafka writable and Redis "
                "reachable and not draining, else 503 and the reasons (what `dev up`'s HAProxy "
                "checks); see Operations"),
        Setting("sys-interval", SECONDS, 10, "seconds between $SYS reports; 0: none",
                high=86400, more="see Operations"),
        Setting("client-events", SWITCH, True, "write connected, disconnected (and why), "
                "subscribed, unsubscribed and session_expired records to the log, on $events/...",
                reloads=True, more="docs/log.md, Client events; SIGHUP applies the `--config` "
                "file's value to a running node"),
        Setting("drain-timeout", INTEGER, 30, "seconds from SIGTERM or SIGINT to the exit at "
                "most: a drain not over by then ends the process at once (status 1)", 1, 3600),
        Setting("log-level", TEXT, "INFO", "DEBUG, INFO, WARNING or ERROR", into=OWN,
                parse=choice(tuple(logging.getLevelNamesMapping()))),
        Setting("log-format", TEXT, "text", "text, or json: one object per line (time, level, "
                "logger, message, exception)", into=OWN, parse=choice(LOG_FORMATS),
                more="`time` in ISO 8601 UTC; either way a warning or error repeated within 10 s "
                "(same logger and message template, e.g. one per client in a Redis outage) is "
                "written once, then one line says how many more times it came and the last one"),
    )
}  # fmt: skip
"""Every setting, in the order of ``--help``, the example file and the README."""


def declared(name: str) -> Any:
    """Setting ``name``'s declared default, checked and made its value."""
    return SETTINGS[name].value(SETTINGS[name].text)


def build_parser() -> argparse.ArgumentParser:
    """The command line; each default is its variable's text, else the declared one."""
    p = argparse.ArgumentParser(prog="headwater frontend", description="Run one front-end node.")
    for s in SETTINGS.values():
        shape: dict[str, Any] = {"metavar": s.metavar or METAVARS.get(s.kind)}
        if s.kind == SWITCH:
            shape = {"action": "store_const"} if s.flag_only else {"nargs": "?"}
            shape["const"] = "yes"
        elif s.kind == LIST:
            shape["action"] = Append
        note = f"[{s.variable}{'=yes' if s.flag_only else ''}]"
        default = os.environ.get(s.variable, s.text)
        p.add_argument(s.flag, default=default, help=f"{s.help} {note}", **shape)
    return p


# -- the node's configuration ----------------------------------------------------------------------


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
    """What a node runs with.  A field named as a setting (``routing_depth``, ``--routing-depth``)
    means what :data:`SETTINGS` says and defaults to its declared default; the first seven are
    given by a node built in code (``--listen`` makes ``host`` and ``port``)."""

    node_id: str
    host: str
    port: int
    kafka_bootstrap: str
    redis_url: str | None
    topic: str
    partitions: int
    routing_depth: int = declared("routing-depth")
    max_packet_size: int = declared("max-packet-size")
    connect_timeout: float = 15.0
    """Seconds a connection has to send its CONNECT."""
    password_file: str | None = declared("password-file")
    acl_file: str | None = declared("acl-file")
    allow_anonymous: bool | None = None
    """None: exactly when the node has no way to authenticate (``frontend.auth``)."""
    listeners: list[Listener] = field(default_factory=list)
    """Front doors besides the plain MQTT one at ``host``:``port``."""
    tls: TlsFiles | None = None
    proxy_protocol: bool = declared("proxy-protocol")
    reuse_port: bool = declared("reuse-port")
    max_connections: int = field(
        default_factory=lambda: default_max_connections(declared("redis-connections"))
    )
    max_connect_size: int = declared("max-connect-size")
    max_will_size: int = declared("max-will-size")
    max_buffered_bytes: int = declared("max-buffered-bytes")
    proxy_allow: AllowList = field(default_factory=lambda: declared("proxy-allow"))
    ws_origins: frozenset[str] = declared("ws-origins")
    redis_prefix: str = declared("redis-prefix")
    redis_connections: int = declared("redis-connections")
    redis_cluster: bool = declared("redis-cluster")
    kafka_config: dict[str, str] = field(default_factory=dict)
    """librdkafka's security settings for every Kafka client (``--kafka-config``)."""
    session_expiry: float = declared("session-expiry")
    stats_host: str | None = None
    stats_port: int = 0
    sys_interval: float = 0.0
    """Off for a node built in code (tests count their own traffic); the command line's is 10."""
    client_events: bool = False  # off in code too; the command line's: on
    max_share_groups: int = declared("max-share-groups")
    max_share_groups_per_client: int = declared("max-share-groups-per-client")
    history_max_age: float = declared("history-max-age")
    max_history: int = declared("max-history")
    max_history_per_client: int = declared("max-history-per-client")
    max_retained: int = declared("max-retained")
    max_retained_bytes: int = declared("max-retained-bytes")
    drain_timeout: int = declared("drain-timeout")
    inbound_topic: str = ""  # off in code (tests ask for it); the command line's: headwater.inbound
    export: list[Export] = field(default_factory=list)
    limits: Limits = field(default_factory=Limits)


def config_from_args(args: argparse.Namespace) -> NodeConfig:
    """The node's configuration: each setting checked alone, then the ones that go together."""
    for required in (s for s in SETTINGS.values() if s.required):
        if not getattr(args, required.dest):
            raise ConfigError(f"{required.flag} / {required.variable} is required")
    host, port = _listen_setting(args.listen, "--listen")
    stats_host, stats_port = (
        _listen_setting(args.stats_listen, "--stats-listen") if args.stats_listen else (None, 0)
    )
    node = _values(args, NODE)
    if node["redis_cluster"] and not node["redis_url"]:
        raise ConfigError("--redis-cluster / HEADWATER_REDIS_CLUSTER needs --redis-url")
    listeners = _listeners(args)
    identity = _identity_setting(args, listeners)
    return NodeConfig(
        **node,
        host=host,
        port=port,
        stats_host=stats_host,
        stats_port=stats_port,
        allow_anonymous=anonymous_setting(
            args.allow_anonymous, node["password_file"], node["acl_file"], identity
        ),
        listeners=listeners,
        tls=_tls_setting(args, listeners),
        max_connections=_max_connections_setting(args),
        limits=Limits(**_values(args, LIMITS)),
    )


def _values(args: argparse.Namespace, into: str) -> dict[str, Any]:
    """The checked values of the settings that go ``into`` a field of their name."""
    chosen = (s for s in SETTINGS.values() if s.into == into)
    return {s.dest: s.value(getattr(args, s.dest)) for s in chosen}


def log_settings(args: argparse.Namespace) -> tuple[str, str]:
    """The log level and format (``frontend.logs``), checked as every other setting is."""
    return value_of(args, "log-level"), value_of(args, "log-format")


def value_of(args: argparse.Namespace, name: str) -> Any:
    """Setting ``name`` as ``args`` give it, checked."""
    return SETTINGS[name].value(getattr(args, SETTINGS[name].dest))


def _address(value: str, flag: str) -> tuple[str, str]:
    host, sep, port = str(value).rpartition(":")
    if not sep or not host:
        raise ConfigError(f"{label(flag, value)}: {value!r} is not host:port")
    return host, FileValue(port, value.origin) if isinstance(value, FileValue) else port


def _listen_setting(value: str, flag: str) -> tuple[str, int]:
    host, port = _address(value, flag)
    return host, int_setting(port, flag, 0, 65535)


def _listeners(args: argparse.Namespace) -> list[Listener]:
    """The front doors besides the plain MQTT one."""
    doors = (("mqtts", "tls-listen"), ("ws", "ws-listen"), ("wss", "wss-listen"))
    return [
        Listener(kind, *_listen_setting(value, SETTINGS[name].flag))
        for kind, name in doors
        if (value := getattr(args, SETTINGS[name].dest))
    ]


# -- settings that go together ---------------------------------------------------------------------


def workers_setting(args: argparse.Namespace, config: NodeConfig) -> int:
    """How many processes serve the node (``frontend.workers``), 1..:data:`MAX_WORKERS`.  More
    than one share every listener's port, so none may be 0 (each worker would get another), and
    their HTTP ports, the stats port and the next ones, must exist and be no listener's."""
    workers: int = value_of(args, "workers")
    if workers == 1:
        return workers
    where = label("--workers", args.workers)
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


def anonymous_setting(
    value: str | None, password_file: str | None, acl_file: str | None, certificates: bool
) -> bool | None:
    """``--allow-anonymous``: None when unset.  An acl_file on a node with no way to
    authenticate would judge every client by its anonymous rules: start-up stops unless
    ``--allow-anonymous yes`` says that is meant (``headwater dev up`` asks the same)."""
    allowed: bool | None = SETTINGS["allow-anonymous"].value(value)
    if acl_file and not password_file and not certificates and allowed is not True:
        raise ConfigError(
            f"{label('--acl-file', acl_file)}: without --password-file or "
            "--use-identity-as-username (and a TLS listener) a user name proves nothing, so "
            "every client would get the acl_file's anonymous rules; give one of them, or "
            "--allow-anonymous yes / HEADWATER_ALLOW_ANONYMOUS=yes if that is what you mean"
        )
    return allowed


def _identity_setting(args: argparse.Namespace, listeners: list[Listener]) -> bool:
    """Whether clients are known by their certificates (``--use-identity-as-username`` with a
    TLS listener)."""
    secure = any(lst.kind in ("mqtts", "wss") for lst in listeners)
    return secure and bool(value_of(args, "use-identity-as-username"))


def default_max_connections(redis_connections: int) -> int:
    """What the open-file limit leaves for clients: its soft value (``ulimit -n``) less
    :data:`FILE_RESERVE` and the Redis connections (at least :data:`MIN_CONNECTIONS`)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20  # Linux's own ceiling (fs.nr_open)
    return max(MIN_CONNECTIONS, soft - FILE_RESERVE - redis_connections)


def _max_connections_setting(args: argparse.Namespace) -> int:
    if args.max_connections is None:
        return default_max_connections(value_of(args, "redis-connections"))
    value: int = value_of(args, "max-connections")
    return value


def _tls_setting(args: argparse.Namespace, listeners: list[Listener]) -> TlsFiles | None:
    """The certificate files, required when a TLS listener is on and checked to exist."""
    secure = [
        f"--{'tls' if lst.kind == 'mqtts' else 'wss'}-listen"
        for lst in listeners
        if lst.kind in ("mqtts", "wss")
    ]
    if not secure:
        return None
    for name in ("certfile", "keyfile"):
        if not getattr(args, name):
            raise ConfigError(f"--{name} / {variable_of(name)} is required by {secure[0]}")
        existing_file(getattr(args, name), f"--{name}")
    identity = bool(value_of(args, "use-identity-as-username"))
    required = bool(value_of(args, "require-certificate")) or identity
    if required and not args.cafile:
        flag = "--use-identity-as-username" if identity else "--require-certificate"
        raise ConfigError(f"{flag} / {variable_of(flag)} needs --cafile")
    return TlsFiles(
        args.certfile,
        args.keyfile,
        existing_file(args.cafile, "--cafile"),
        require_certificate=required,
        use_identity_as_username=identity,
    )
