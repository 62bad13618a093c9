"""One Headwater front-end node: configuration, start-up, serving, orderly shutdown.

``Node`` wires the parts together: the Kafka log (writes and interest-driven reads), the broker
(subscriptions and dispatch), the session and retained stores, authentication, and the listening
socket whose connections are :class:`frontend.connection.MqttConnection`.

Start-up fails fast with one line naming the setting at fault (a bad flag or ``HEADWATER_*``
variable, an unreachable Kafka, a missing log topic).  Shutdown (SIGINT/SIGTERM) stops accepting,
closes every client as a server-side close (so their wills are published [MQTT-3.1.2-8]), flushes
the producer and stops the consumer.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from dataclasses import dataclass, field

from frontend.auth import Authenticator, load_authenticator
from frontend.broker import Broker
from frontend.connection import MqttConnection
from frontend.log import KafkaLog, LogSettings
from frontend.mqtt.channel import Limits
from frontend.record import Message
from frontend.session import Session
from frontend.stats import serve_stats
from frontend.stores import MemoryRetainedStore, MemorySessionStore, RetainedStore, SessionStore
from router.partitioner import Router

log = logging.getLogger("headwater.server")


class ConfigError(ValueError):
    """A setting that stops start-up; the message names the flag and variable."""


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
    max_packet_size: int = 268_435_455
    connect_timeout: float = 15.0
    password_file: str | None = None
    stats_host: str | None = None
    stats_port: int = 0
    limits: Limits = field(default_factory=Limits)


@dataclass(slots=True)
class NodeCounters:
    protocol_errors: int = 0
    wills_published: int = 0


class Node:
    """A running front-end."""

    def __init__(
        self,
        config: NodeConfig,
        sessions: SessionStore | None = None,
        retained: RetainedStore | None = None,
        auth: Authenticator | None = None,
    ) -> None:
        self.config = config
        self.router = Router(config.partitions, config.routing_depth)
        self.log = KafkaLog(
            LogSettings(config.kafka_bootstrap, config.topic, config.node_id),
            self.router,
            self._on_records,
        )
        self.broker = Broker(self.log, self.router)
        self.sessions: SessionStore = sessions or MemorySessionStore()
        self.retained: RetainedStore = retained or MemoryRetainedStore()
        self.auth = auth or load_authenticator(config.password_file)
        self.counters = NodeCounters()
        self.connections: set[MqttConnection] = set()
        self._server: asyncio.Server | None = None
        self._stats_server: asyncio.Server | None = None

    async def start(self) -> None:
        await self.log.start()
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: MqttConnection(self), self.config.host, self.config.port, reuse_address=True
        )
        sock = self._server.sockets[0].getsockname()
        self.config.port = sock[1]
        if self.config.stats_host is not None:
            self._stats_server = await serve_stats(
                self, self.config.stats_host, self.config.stats_port
            )
            self.config.stats_port = self._stats_server.sockets[0].getsockname()[1]
        log.info("node %s serving MQTT on %s:%s", self.config.node_id, sock[0], sock[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._stats_server is not None:
            self._stats_server.close()
        for connection in list(self.connections):
            connection.shutdown()
        await asyncio.sleep(0)  # let the wills reach the producer queue
        await self.broker.stop()
        await self.log.stop()
        if self._server is not None:
            await self._server.wait_closed()

    # -- what connections ask of the node -----------------------------------------------------

    async def open_session(self, client_id: str, clean: bool) -> tuple[Session, bool]:
        """The session for a CONNECT, and whether one was present [MQTT-3.2.2-1, -2]."""
        self.broker.take_over(client_id)
        if clean:
            self.broker.discard(client_id)
            await self.sessions.discard(client_id)
            return self._new_session(client_id, True), False
        session = self.broker.session_of(client_id) or await self.sessions.load(client_id)
        if session is None:
            return self._new_session(client_id, False), False
        return session, True

    def _new_session(self, client_id: str, clean: bool) -> Session:
        limits = self.config.limits
        return Session(client_id, clean, limits.max_inflight, limits.max_queued)

    def keep_session(self, session: Session) -> None:
        asyncio.get_running_loop().create_task(self.sessions.save(session))

    def publish_will(self, message: Message) -> None:
        """Publish a will: through the log like any message; retained wills update the store."""
        self.counters.wills_published += 1
        retained = self.retained

        def stored(partition: int, offset: int, error: str | None) -> None:
            if error is None and message.retain:
                asyncio.get_running_loop().create_task(retained.apply(message, partition, offset))

        if not self.log.produce(message, stored):
            log.error("will of %s lost: the producer queue is full", message.client_id)

    def _on_records(self, batch: list) -> None:  # type: ignore[type-arg]
        self.broker.dispatch(batch)


# -- command line ---------------------------------------------------------------------------


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(f"HEADWATER_{name}", default)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="headwater frontend", description="Run one front-end node.")
    p.add_argument(
        "--node-id", default=_env("NODE_ID"), help="unique node name [HEADWATER_NODE_ID]"
    )
    p.add_argument(
        "--listen",
        default=_env("LISTEN", "127.0.0.1:1883"),
        help="host:port to serve MQTT on [HEADWATER_LISTEN]",
    )
    p.add_argument(
        "--kafka-bootstrap",
        default=_env("KAFKA_BOOTSTRAP"),
        help="Kafka bootstrap servers [HEADWATER_KAFKA_BOOTSTRAP]",
    )
    p.add_argument("--redis-url", default=_env("REDIS_URL"), help="[HEADWATER_REDIS_URL]")
    p.add_argument(
        "--topic",
        default=_env("TOPIC", "headwater.messages"),
        help="the log topic [HEADWATER_TOPIC]",
    )
    p.add_argument(
        "--partitions",
        default=_env("PARTITIONS", "12"),
        help="partitions of the log topic [HEADWATER_PARTITIONS]",
    )
    p.add_argument(
        "--routing-depth",
        default=_env("ROUTING_DEPTH", "2"),
        help="topic levels in the routing key [HEADWATER_ROUTING_DEPTH]",
    )
    p.add_argument(
        "--max-packet-size",
        default=_env("MAX_PACKET_SIZE", "268435455"),
        help="largest accepted packet, bytes [HEADWATER_MAX_PACKET_SIZE]",
    )
    p.add_argument(
        "--max-inflight",
        default=_env("MAX_INFLIGHT", "20"),
        help="outbound QoS 1/2 messages in flight per client [HEADWATER_MAX_INFLIGHT]",
    )
    p.add_argument(
        "--max-queued",
        default=_env("MAX_QUEUED", "1000"),
        help="messages queued per client [HEADWATER_MAX_QUEUED]",
    )
    p.add_argument(
        "--password-file",
        default=_env("PASSWORD_FILE"),
        help="user:sha256-hex lines; anonymous clients refused [HEADWATER_PASSWORD_FILE]",
    )
    p.add_argument(
        "--stats-listen",
        default=_env("STATS_LISTEN"),
        help="host:port for GET /stats (JSON); off when unset [HEADWATER_STATS_LISTEN]",
    )
    p.add_argument("--log-level", default=_env("LOG_LEVEL", "INFO"), help="[HEADWATER_LOG_LEVEL]")
    return p


def _int_setting(value: str | None, flag: str, low: int, high: int) -> int:
    env = "HEADWATER_" + flag.lstrip("-").replace("-", "_").upper()
    try:
        number = int(value or "")
    except ValueError:
        raise ConfigError(f"{flag} / {env}: {value!r} is not an integer") from None
    if not low <= number <= high:
        raise ConfigError(f"{flag} / {env}: {number} is outside {low}..{high}")
    return number


def _address(value: str, flag: str) -> tuple[str, str]:
    host, sep, port = str(value).rpartition(":")
    if not sep or not host:
        env = "HEADWATER_" + flag.lstrip("-").replace("-", "_").upper()
        raise ConfigError(f"{flag} / {env}: {value!r} is not host:port")
    return host, port


def config_from_args(args: argparse.Namespace) -> NodeConfig:
    if not args.node_id:
        raise ConfigError("--node-id / HEADWATER_NODE_ID is required")
    if not args.kafka_bootstrap:
        raise ConfigError("--kafka-bootstrap / HEADWATER_KAFKA_BOOTSTRAP is required")
    host, port = _address(args.listen, "--listen")
    stats_host, stats_port = (
        _address(args.stats_listen, "--stats-listen") if args.stats_listen else (None, "0")
    )
    if args.password_file and not os.path.isfile(args.password_file):
        raise ConfigError(
            f"--password-file / HEADWATER_PASSWORD_FILE: no file {args.password_file}"
        )
    limits = Limits(
        max_inflight=_int_setting(args.max_inflight, "--max-inflight", 1, 65535),
        max_queued=_int_setting(args.max_queued, "--max-queued", 0, 10_000_000),
    )
    return NodeConfig(
        node_id=args.node_id,
        host=host,
        port=_int_setting(port, "--listen", 0, 65535),
        stats_host=stats_host,
        stats_port=_int_setting(stats_port, "--stats-listen", 0, 65535),
        kafka_bootstrap=args.kafka_bootstrap,
        redis_url=args.redis_url,
        topic=args.topic,
        partitions=_int_setting(args.partitions, "--partitions", 1, 100_000),
        routing_depth=_int_setting(args.routing_depth, "--routing-depth", 1, 64),
        max_packet_size=_int_setting(args.max_packet_size, "--max-packet-size", 2, 268_435_460),
        password_file=args.password_file,
        limits=limits,
    )


async def serve(config: NodeConfig) -> None:
    node = Node(config)
    await node.start()
    stats = f", stats on {config.stats_host}:{config.stats_port}" if config.stats_host else ""
    print(
        f"headwater node {config.node_id} ready on {config.host}:{config.port}{stats}", flush=True
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("node %s shutting down", config.node_id)
    await node.stop()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=str(args.log_level).upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        config = config_from_args(args)
    except ConfigError as exc:
        print(f"headwater frontend: {exc}", file=sys.stderr)
        return 2
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
    try:
        asyncio.run(serve(config))
    except (ConnectionError, ValueError, OSError) as exc:
        print(f"headwater frontend: {exc}", file=sys.stderr)
        return 1
    return 0
