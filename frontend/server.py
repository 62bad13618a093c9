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
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from frontend import record
from frontend.auth import Authenticator, load_authenticator
from frontend.broker import Broker
from frontend.connection import MqttConnection
from frontend.log import KafkaLog, LogSettings, Record
from frontend.mqtt import topics
from frontend.mqtt.channel import Limits
from frontend.mqtt.codec import PublishTemplate
from frontend.record import Message
from frontend.redis_store import RedisRetainedStore, RedisSessionStore
from frontend.session import Outbound, Session, StoredOutbound, StoredSession
from frontend.stats import serve_stats
from frontend.stores import (
    Busy,
    Lease,
    MemoryRetainedStore,
    MemorySessionStore,
    RetainedStore,
    SessionStore,
)
from frontend.takeover import FORCE_AFTER, Coordinator
from headwater.topics import MAX_RECORD_BYTES
from router.partitioner import Router

log = logging.getLogger("headwater.server")

SAVE_INTERVAL = 1.0
DEFAULT_MAX_PACKET_SIZE = MAX_RECORD_BYTES - 128 * 1024
"""Largest PUBLISH accepted: its record (payload, topic, client id, ~40 bytes of framing)
must fit in what the log topic and the producer take (``headwater.topics.MAX_RECORD_BYTES``)."""


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
    max_packet_size: int = DEFAULT_MAX_PACKET_SIZE
    connect_timeout: float = 15.0
    password_file: str | None = None
    redis_prefix: str = "hw:"
    stats_host: str | None = None
    stats_port: int = 0
    limits: Limits = field(default_factory=Limits)


@dataclass(slots=True)
class NodeCounters:
    protocol_errors: int = 0
    wills_published: int = 0
    orphaned_wills_published: int = 0
    """Wills of connections that died with another node (or this node's previous process)."""
    messages_replayed: int = 0
    retention_lost: int = 0


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
        self._saver: asyncio.Task[None] | None = None
        self._redis: aioredis.Redis | None = None
        self._releasing: dict[str, asyncio.Task[None]] = {}
        self.coordinator: Coordinator | None = None

    async def start(self) -> None:
        if self.config.redis_url:
            await self._connect_redis(self.config.redis_url)
        await self.log.start()
        if self.coordinator is not None:
            await self.coordinator.sweep_wills()
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
        self._saver = loop.create_task(self._save_periodically())
        log.info("node %s serving MQTT on %s:%s", self.config.node_id, sock[0], sock[1])

    async def _connect_redis(self, url: str) -> None:
        client = aioredis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
        try:
            await client.ping()
        except (RedisError, OSError) as exc:
            raise ConnectionError(f"Redis at {url} is unreachable: {exc}") from exc
        prefix = self.config.redis_prefix
        store = RedisSessionStore(client, prefix)
        self.sessions = store
        self.retained = RedisRetainedStore(client, self.config.routing_depth, prefix)
        self.coordinator = Coordinator(
            store, self.config.node_id, self.broker.take_over, self.publish_orphaned_wills
        )
        await self.coordinator.start()
        self._redis = client

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._stats_server is not None:
            self._stats_server.close()
        if self._saver is not None:
            self._saver.cancel()
        for connection in list(self.connections):
            connection.shutdown()
        for _ in range(100):  # until every connection has stored its session and gone
            if not self.connections:
                break
            await asyncio.sleep(0.01)
        if self._releasing:
            await asyncio.gather(*self._releasing.values(), return_exceptions=True)
        await self.broker.stop()
        await self.log.stop()
        if self.coordinator is not None:
            await self.coordinator.stop()
        if self._redis is not None:
            await self._redis.aclose()
        if self._server is not None:
            await self._server.wait_closed()

    # -- sessions -----------------------------------------------------------------------------

    async def acquire_session(
        self, client_id: str, clean: bool
    ) -> tuple[Lease, StoredSession | None]:
        """Own the session of ``client_id``, taking it over from its current connection, on this
        node or another, if it has one [MQTT-3.1.4-2].  A previous connection that died with its
        node has its will published now, before the new one is accepted [MQTT-3.1.2-8]."""
        deadline = time.monotonic() + FORCE_AFTER
        asked, force = False, False
        while True:
            answer = await self.sessions.acquire(client_id, self.config.node_id, clean, force)
            if not isinstance(answer, Busy):
                if answer.orphaned_will is not None:
                    self.publish_orphaned_wills([answer.orphaned_will])
                return answer.lease, answer.state
            if answer.owner == self.config.node_id:
                force = not await self._release_local(client_id)
            elif not asked:
                assert self.coordinator is not None
                await self.coordinator.request_release(answer.owner, client_id)
                asked = True
            elif time.monotonic() > deadline:
                log.warning("node %s did not release %s: taking it", answer.owner, client_id)
                force = True
            else:
                await asyncio.sleep(0.01)

    async def _release_local(self, client_id: str) -> bool:
        """Close our own connection of ``client_id`` and wait until it let go; False if there
        was nothing to wait for (a stale lease)."""
        self.broker.take_over(client_id)
        await asyncio.sleep(0)
        releasing = self._releasing.get(client_id)
        if releasing is None:
            return False
        await asyncio.gather(releasing, return_exceptions=True)
        return True

    def release_session(self, lease: Lease, state: StoredSession | None) -> None:
        task = asyncio.get_running_loop().create_task(self.sessions.release(lease, state))
        self._releasing[lease.client_id] = task
        task.add_done_callback(lambda _: self._forget_release(lease.client_id, task))

    def _forget_release(self, client_id: str, task: asyncio.Task[None]) -> None:
        if self._releasing.get(client_id) is task:
            del self._releasing[client_id]
        if not task.cancelled() and task.exception() is not None:
            log.error("storing the session of %s failed: %s", client_id, task.exception())

    def new_session(self, client_id: str, clean: bool) -> Session:
        limits = self.config.limits
        return Session(client_id, clean, limits.max_inflight, limits.max_queued)

    def restore_outbound(self, stored: StoredOutbound) -> Outbound:
        message = record.decode(stored.record)
        template = PublishTemplate(message.topic, message.payload, stored.qos)
        return Outbound(
            message, stored.qos, stored.retain, template, stored.packet_id, stored.released,
            stored.partition, stored.offset,
        )  # fmt: skip

    def snapshot(self, session: Session, positions: dict[int, int] | None = None) -> StoredSession:
        if positions is None:
            positions = self.broker.positions_for(session)
        return session.snapshot(positions, lambda out: record.encode(out.message))

    async def _save_periodically(self) -> None:
        """Persistent sessions are saved every second, so a node crash loses at most that."""
        while True:
            await asyncio.sleep(SAVE_INTERVAL)
            for connection in list(self.connections):
                try:
                    await connection.save_session()
                except Exception as exc:  # Redis down: keep serving, keep trying
                    log.warning("saving sessions failed: %s", exc)
                    break

    async def replay(
        self,
        deliver: Callable[[Outbound | None], bool],
        session: Session,
        stored: StoredSession,
        starts: dict[int, int],
    ) -> int:
        """Deliver what ``session`` missed: QoS 1/2 records matching its subscriptions between
        its stored positions and ``starts`` (where its live stream begins).  ``deliver`` takes
        one message (None: just ask) and answers whether the client is still there.  Returns
        the number of messages delivered."""
        ranges = {p: (stored.positions.get(p, end), end) for p, end in starts.items()}
        await self._skip_expired(session.client_id, ranges)
        filters = {f: q for f, q in session.subscriptions.items() if not topics.parse_shared(f)}
        resent = {(o.partition, o.offset) for o in session.inflight.values()}
        count = 0
        async for batch in self.log.replay(ranges):
            for rec in batch:
                if (rec.partition, rec.offset) in resent:
                    continue
                granted = max(
                    (q for f, q in filters.items() if topics.matches(f, rec.message.topic)),
                    default=0,
                )
                qos = min(granted, rec.message.qos)
                if qos == 0:
                    continue  # QoS 0 is not kept for a client that was away
                template = PublishTemplate(rec.message.topic, rec.message.payload, qos)
                out = Outbound(
                    rec.message, qos, False, template, partition=rec.partition, offset=rec.offset
                )
                if not deliver(out):
                    return count
                count += 1
            while len(session.queue) > session.max_queued // 2 and deliver(None):
                await asyncio.sleep(0.005)  # the client works through its backlog first
        self.counters.messages_replayed += count
        return count

    async def _skip_expired(self, client_id: str, ranges: dict[int, tuple[int, int]]) -> None:
        """Records retention already removed cannot be replayed: count them and go on."""
        wanted = [p for p, (start, end) in ranges.items() if start < end]
        for partition, low in (await self.log.low_watermarks(wanted)).items():
            start, end = ranges[partition]
            if start < low:
                lost = min(low, end) - start
                self.counters.retention_lost += lost
                log.warning(
                    "session %s: %d records of partition %d were removed by retention "
                    "before it came back; continuing without them",
                    client_id,
                    lost,
                    partition,
                )
                ranges[partition] = (min(low, end), end)

    def publish_will(self, message: Message) -> None:
        """Publish a will: through the log like any message; retained wills update the store."""
        self.counters.wills_published += 1
        retained = self.retained

        def stored(partition: int, offset: int, error: str | None) -> None:
            if error is None and message.retain:
                asyncio.get_running_loop().create_task(retained.apply(message, partition, offset))

        if not self.log.produce(message, stored):
            log.error("will of %s lost: the producer queue is full", message.client_id)

    def publish_orphaned_wills(self, wills: list[bytes]) -> None:
        """Publish the stored wills of connections that died with their node, from here."""
        for raw in wills:
            try:
                will = record.decode(raw)
            except record.RecordError as exc:
                log.error("a stored will is unreadable, not published: %s", exc)
                continue
            log.info("publishing the will of %s, whose node died", will.client_id)
            self.counters.orphaned_wills_published += 1
            self.publish_will(
                Message.create(
                    will.topic, will.payload, will.qos, will.retain, will.client_id,
                    self.config.node_id,
                )
            )  # fmt: skip

    def _on_records(self, batch: list[Record]) -> None:
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
    p.add_argument(
        "--redis-url",
        default=_env("REDIS_URL"),
        help="sessions and retained messages; in memory when unset "
        "(one node only) [HEADWATER_REDIS_URL]",
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
        default=_env("MAX_PACKET_SIZE", str(DEFAULT_MAX_PACKET_SIZE)),
        help="largest accepted packet, bytes [HEADWATER_MAX_PACKET_SIZE]",
    )
    p.add_argument(
        "--max-inflight",
        default=_env("MAX_INFLIGHT", "32"),
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
        redis_prefix=args.redis_prefix,
        topic=args.topic,
        partitions=_int_setting(args.partitions, "--partitions", 1, 100_000),
        routing_depth=_int_setting(args.routing_depth, "--routing-depth", 1, 64),
        max_packet_size=_int_setting(
            args.max_packet_size, "--max-packet-size", 2, DEFAULT_MAX_PACKET_SIZE
        ),
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
