"""One Headwater front-end node: wiring only.  It builds the parts, starts and stops them.

The parts, bottom up: the log (``router.log``: the producer and the one reader), the dispatcher
(``router.dispatch``: who on this node receives what), the stores (sessions in
``frontend.sessions``, retained messages in ``frontend.retained``: in memory for one node, in
Redis for a cluster), the session manager (``frontend.sessions.manager``), the cluster
coordinator (``frontend.cluster``: liveness, takeover inbox, will sweep), and the listeners
(``frontend.listeners``: MQTT over TCP, TLS, WebSocket, behind a PROXY header or not) whose
connections are :class:`frontend.connection.MqttConnection`.

Start-up fails fast with one line naming what is at fault (a bad flag or ``HEADWATER_*``
variable, a password or ACL file line, an unreachable Kafka, a missing log topic).  SIGHUP
reads the settings again and applies those a running node may change (``client-events``), then
rereads the password and ACL files (``frontend.auth``) and disconnects the clients whose password
entry is gone or changed.  SIGINT and SIGTERM drain the node
(:meth:`Node.stop`): ``/ready`` says "draining" at once and the listeners close, the PUBLISHes
already given to Kafka get their PUBACK/PUBREC, every client is closed (its persistent session
stored by the release path), then the producer is flushed and the process exits 0, all within
``--drain-timeout`` (:func:`watch_drain` ends a process whose drain is not over by then).
``--workers N`` runs the node as N such processes sharing its ports (``frontend.workers``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import math
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

from redis.exceptions import RedisClusterException, RedisError

from frontend import events, listeners
from frontend.auth import Auth
from frontend.buffers import Budget
from frontend.cluster import Coordinator
from frontend.config import Listener, NodeConfig, config_from_args, log_settings, workers_setting
from frontend.config_file import parse_args, reread
from frontend.connection import MqttConnection, Services
from frontend.intake import Intake
from frontend.logs import setup_logging
from frontend.redis_clients import cluster_client, single_client
from frontend.retained import (
    MemoryRetainedStore,
    RedisRetainedStore,
    RetainedLimits,
    RetainedStore,
)
from frontend.sessions.manager import SessionManager
from frontend.sessions.redis import RedisClient, RedisSessionStore
from frontend.sessions.store import MemorySessionStore, SessionStore
from frontend.share_leases import RedisShareLeases
from frontend.stats import serve_stats, snapshot
from frontend.systree import SysTree
from frontend.values import ConfigError
from frontend.workers import run_workers
from mqttcore import compiled
from mqttcore.codec import ConnectBounds
from router.dispatch import Dispatcher
from router.history import HistoryLimits
from router.log import KafkaLog, LogSettings
from router.partitioner import Router
from router.record import wall_clock_stamps
from router.relays import Relays, RelaysConfig, RelaySettings
from router.shared import ShareLimits

log = logging.getLogger("headwater.node")

LISTEN_BACKLOG = 4096
"""Connections the kernel holds for the node before it accepts them (asyncio's default, 100,
overflows in a reconnect storm, and each dropped SYN is retried only a second later); Linux caps
it at ``net.core.somaxconn``."""

DRAIN_PUBLISHES = 10.0
"""Seconds a drain waits for the PUBLISHes already given to Kafka to be acknowledged to their
clients; a connection still waiting then is closed anyway (its client sends them again)."""

DRAIN_RELEASES = 10.0
"""Seconds a drain waits for the closed connections to go and their sessions to be stored."""

DRAIN_STOPS = 15.0
"""Seconds the parts of a node get, together, to stop once its clients are closed; one that
has not stopped by then is left, named in the log, and the node exits anyway: a drain ends."""

FLUSH_WAIT = 10.0
"""Seconds the producer's flush may take in a drain: a third of the parts' time at most, so a
Kafka that does not answer leaves the consumers and the coordinator theirs."""

DRAIN_POLL = 0.01
"""Seconds between two looks at the connections during a drain."""

DRAIN_EXIT = 3.0
"""Seconds of ``--drain-timeout`` kept for the process to exit once the node has stopped.  The
rest is the drain's budget: the PUBLISHes and the releases get a third of it each at most (so a
client that never answers leaves the parts their time), the parts what is left."""


class Node:
    """A running front-end."""

    def __init__(
        self,
        config: NodeConfig,
        sessions: SessionStore | None = None,
        retained: RetainedStore | None = None,
        auth: Auth | None = None,
    ) -> None:
        self.config = config
        self.router = Router(config.partitions, config.routing_depth)
        self.log = KafkaLog(
            LogSettings(
                config.kafka_bootstrap, config.topic, config.node_id, security=config.kafka_config
            ),
            self.router,
        )
        shares = ShareLimits(config.max_share_groups, config.max_share_groups_per_client)
        history = HistoryLimits(
            config.history_max_age, config.max_history, config.max_history_per_client
        )
        self.dispatcher = Dispatcher(self.log, self.router, shares, history)
        self.log.reader.on_records = self.dispatcher.dispatch
        stamps = wall_clock_stamps(config.node_id)
        self.retained_limits = RetainedLimits(config.max_retained, config.max_retained_bytes)
        self.systree = SysTree(
            config.node_id, config.sys_interval, stamps, self.log, self.dispatcher, self.stats
        )
        self.sessions = SessionManager(
            stamps,
            config.limits,
            sessions or MemorySessionStore(config.session_expiry),
            self.systree.serving(retained or MemoryRetainedStore(self.retained_limits)),
            self.dispatcher,
            self.log,
            events.Events(stamps, self.log, config.client_events),
        )
        self.services = Services(
            stamps,
            config.limits,
            config.max_packet_size,
            config.connect_timeout,
            auth or node_auth(config),
            self.log,
            self.sessions,
        )
        self.services.connect_bounds = ConnectBounds(config.max_connect_size, config.max_will_size)
        self.services.buffers = Budget(config.max_buffered_bytes)
        backlog, sent = self.dispatcher.backlog, self.services.traffic.sent
        self.services.intake = Intake(lambda: bool(backlog.clients), lambda: sum(sent))
        self.log.on_served = self.services.writes.flush
        tls = config.tls
        if tls is not None and tls.use_identity_as_username:
            self.services.certificate_identity = listeners.certificate_identity
        self.doors = listeners.Doors(
            lambda: MqttConnection(self.services),
            lambda: len(self.services.connections),
            self.services.deadlines,
            config.connect_timeout,
            tls=listeners.tls_context(tls) if tls is not None else None,
            proxy_protocol=config.proxy_protocol,
            proxy_allow=config.proxy_allow,
            ws_origins=config.ws_origins,
            max_connections=config.max_connections,
        )
        self.relays = Relays(
            RelaysConfig(config.topic, config.partitions, config.inbound_topic, config.export),
            RelaySettings(config.kafka_bootstrap, config.node_id, config.kafka_config),
            self.router,
            wall_clock_stamps(config.node_id),
            lambda message, partition, offset: self.sessions.retained.apply(
                message, partition, offset
            ),
        )
        self.endpoints = [Listener("mqtt", config.host, config.port), *config.listeners]
        """Every front door; the ports chosen for port 0 are written back at start."""
        self._servers: list[asyncio.Server] = []
        self._stats_server: asyncio.Server | None = None
        self._redis: RedisClient | None = None
        self.coordinator: Coordinator | None = None
        """The cluster's liveness, takeover inbox and sweep, once Redis is there."""
        self.given: tuple[list[str] | None, argparse.Namespace] | None = None
        """The command line and the settings it gave at start (:func:`serve`), read again on
        SIGHUP; None for a node built in code."""

    @property
    def connections(self) -> set[MqttConnection]:
        return self.services.connections

    async def start(self) -> None:
        if self.config.redis_url:
            await self._connect_redis(self.config.redis_url)
        await self.log.start()
        if self.coordinator is not None:
            await self.coordinator.sweep_dead_nodes()
        self.sessions.start()
        self.systree.start()
        await self.relays.start()
        for listener in self.endpoints:
            self._servers.append(
                await listeners.serve(listener, self.doors, LISTEN_BACKLOG, self.config.reuse_port)
            )
        self.config.port = self.endpoints[0].port
        if self.config.stats_host is not None:
            self._stats_server = await serve_stats(
                self.stats, self.not_ready, self.config.stats_host, self.config.stats_port
            )
            self.config.stats_port = self._stats_server.sockets[0].getsockname()[1]
        log.info("node %s serving %s", self.config.node_id, self.describe_listeners())
        log.info("node %s: %s", self.config.node_id, self.services.auth.describe_anonymous())
        modules = compiled.compiled_modules()
        log.info(
            "node %s: %s", self.config.node_id,
            f"{len(modules)} modules of the hot path compiled (mypyc)" if modules
            else "pure Python (installed with HEADWATER_COMPILE=0): a message costs more CPU",
        )  # fmt: skip

    @property
    def listening(self) -> dict[str, int]:
        """Kind (``mqtt``, ``mqtts``, ``ws``, ``wss``) -> the port it is served on."""
        return self.doors.listening

    def describe_listeners(self) -> str:
        allow = self.config.proxy_allow
        proxied = f" behind PROXY headers from {allow}" if self.config.proxy_protocol else ""
        doors = ", ".join(f"{lst.kind} on {lst.host}:{lst.port}" for lst in self.endpoints)
        return doors + proxied

    async def _connect_redis(self, url: str) -> None:
        connections = self.config.redis_connections
        make = cluster_client if self.config.redis_cluster else single_client
        client = make(url, connections)
        try:
            await client.ping()
        except (RedisError, RedisClusterException, OSError) as exc:
            await client.aclose()
            raise ConnectionError(f"Redis at {url} is unreachable: {exc}") from exc
        prefix = self.config.redis_prefix
        store = RedisSessionStore(client, prefix, self.config.session_expiry)
        sessions = self.sessions
        coordinator = Coordinator(
            store,
            self.config.node_id,
            sessions.release_requested,
            sessions.wills.publish_orphaned,
            sessions.taken_elsewhere,
            sessions.events.session_expired,
        )
        retained = RedisRetainedStore(
            client, self.config.routing_depth, prefix, self.retained_limits
        )
        sessions.join_cluster(store, self.systree.serving(retained), coordinator)
        self.dispatcher.shares.leases = RedisShareLeases(client, prefix, self.config.node_id)
        await coordinator.start()
        self.coordinator, self._redis = coordinator, client

    def reload(self) -> None:
        """SIGHUP: the settings read again (:meth:`_reload_settings`), then the password and ACL
        files: a client whose password entry is gone or changed is disconnected (as Mosquitto 2
        does); the others stay, and are judged by the new rules from their next packet on; a file
        that does not load keeps its old rules."""
        self._reload_settings()
        auth = self.services.auth
        auth.reload()
        revoked = [c for c in self.connections if c.login and not auth.still_passes(c.login)]
        for connection in revoked:
            # will published
            connection.shutdown("credentials no longer valid after a reload", events.NOT_AUTHORIZED)
        auth.revoked += len(revoked)
        if revoked:
            log.info("reload: %d clients disconnected, their credentials gone", len(revoked))

    def _reload_settings(self) -> None:
        """Apply the settings a reload may change (``client-events``: ``Setting.reloads``) as
        the file now gives them, and name the changed ones that wait for a restart; settings that
        do not load are all kept, the error logged."""
        if self.given is None:
            return
        argv, at_start = self.given
        try:
            _, config, waiting = reread(argv, at_start)
        except ConfigError as exc:
            log.error("reload: settings kept as they were: %s", exc)
            return
        if waiting:
            log.warning("reload: %s changed; applied at the next start", ", ".join(waiting))
        if config.client_events != self.config.client_events:
            self.sessions.events.switch(config.client_events)
            self.config.client_events = config.client_events
            log.info("reload: client events %s", "on" if config.client_events else "off")

    def stats(self) -> dict[str, Any]:
        return snapshot(
            self.config.node_id,
            self.router,
            self.log,
            self.dispatcher,
            self.services,
            doors=self.doors,
            retained=self.retained_limits,
            relays=self.relays.counts(),
            redis_reachable=self.coordinator is None or self.coordinator.redis_reachable,
        )

    def not_ready(self) -> list[str]:
        """Why this node should not be given new clients now (``GET /ready``); none: it should."""
        reasons = ["draining"] if self.services.draining else []
        if not self._servers or not all(server.is_serving() for server in self._servers):
            reasons.append("not accepting connections")
        if not self.log.available:
            reasons.append("Kafka is not writable")
        coordinator = self.coordinator
        if coordinator is not None and not coordinator.redis_reachable:
            reasons.append("Redis is unreachable")
        return reasons

    async def stop(self) -> None:
        """Drain, then stop: ``/ready`` turns "draining" and the listeners close (a load
        balancer sends no new client), reading stops, each connection is closed once its
        PUBLISHes in flight are acknowledged (up to ``DRAIN_PUBLISHES`` seconds), its session
        stored by the release path (up to ``DRAIN_RELEASES``), and the producer is flushed.

        A close by the server publishes the client's will: MQTT 3.1.1 deletes a will only on
        DISCONNECT from the client [MQTT-3.1.2-8], and a drain is no such thing.

        Each step ends by ``--drain-timeout`` less ``DRAIN_EXIT`` at the latest; a process
        also has :func:`watch_drain`, for what no step's bound can end (a blocked loop)."""
        started = time.monotonic()
        budget = max(0.0, self.config.drain_timeout - DRAIN_EXIT)
        self.services.draining = True
        for server in self._servers:
            server.close()
        self.doors.close()
        for connection in list(self.connections):
            connection.update_reading()  # no connection reads any more
        pending = sum(c.channel.pending_publishes for c in self.connections)
        acknowledged_by = started + min(DRAIN_PUBLISHES, budget / 3)
        closed, unfinished, persistent = await close_when_acknowledged(
            self.connections, acknowledged_by
        )
        released_by = time.monotonic() + min(DRAIN_RELEASES, budget / 3)
        stored = await wait_released(self.connections, self.sessions, persistent, released_by)
        if self._stats_server is not None:
            self._stats_server.close()
        self.sessions.events.close()  # every client is gone; the log stops next
        await self._stop_parts(min(time.monotonic() + DRAIN_STOPS, started + budget))
        self.services.auth.close()
        log.info(
            "node %s drained in %.2f s: %d clients closed, %d of %d sessions stored, "
            "%d publishes finished, %d unacknowledged",
            self.config.node_id, time.monotonic() - started, closed, stored, len(persistent),
            max(0, pending - unfinished), unfinished,
        )  # fmt: skip

    async def _stop_parts(self, deadline: float) -> None:
        """Stop $SYS, the sessions' saver, the relays, the share groups, the log, the
        coordinator, Redis and the listeners, in that order, by ``deadline``
        (``time.monotonic()``) in all."""
        parts: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
            ("$SYS", self.systree.stop),
            ("the sessions' saver", self.sessions.stop),
            ("the relays", self.relays.stop),
            ("the share groups", self.dispatcher.shares.stop),
            ("the log", lambda: self.log.stop(min(FLUSH_WAIT, self._left(deadline) / 3))),
        ]
        if self.coordinator is not None:
            parts.append(("the cluster coordinator", self.coordinator.stop))
        if self._redis is not None:
            parts.append(("Redis", self._redis.aclose))
        parts += [("a listener", server.wait_closed) for server in self._servers]
        for name, stop in parts:
            try:
                await asyncio.wait_for(stop(), self._left(deadline))
            except TimeoutError:
                log.warning(
                    "node %s: %s did not stop in time; exiting anyway; still waiting:\n%s",
                    self.config.node_id, name, still_waiting(),
                )  # fmt: skip

    @staticmethod
    def _left(deadline: float) -> float:
        return max(0.0, deadline - time.monotonic())


def still_waiting() -> str:
    """Where every task of the loop and every other thread is now: what a drain that ran out
    of time was waiting for."""
    lines: list[str] = []
    for task in asyncio.all_tasks():
        if task is not asyncio.current_task():
            frames = task.get_stack()
            where = "".join(traceback.format_stack(frames[-1], 1)) if frames else "(no frame)\n"
            lines.append(f"task {task.get_name()}: {task.get_coro()!r} at {where.strip()}")
    return "\n".join([*lines, threads_now()])


def threads_now() -> str:
    """Where every thread but this one is now."""
    lines: list[str] = []
    current = threading.get_ident()
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    for ident, frame in sys._current_frames().items():
        if ident != current:
            where = "".join(traceback.format_stack(frame, 3)).strip()
            lines.append(f"thread {names.get(ident, ident)}: {where}")
    return "\n".join(lines)


async def close_when_acknowledged(
    connections: set[MqttConnection], deadline: float
) -> tuple[int, int, list[str]]:
    """Stop reading every client and close each as soon as none of its PUBLISHes awaits the
    log (at ``deadline``, ``time.monotonic()``, at the latest).  How many were closed, how many
    PUBLISHes were left unacknowledged, and the client ids of the persistent sessions closed."""
    waiting = set(connections)
    closed = unfinished = 0
    persistent: list[str] = []
    while waiting:
        late = time.monotonic() >= deadline
        for connection in list(waiting):
            left = connection.channel.pending_publishes
            transport = connection.transport
            if left and not late and transport is not None and not transport.is_closing():
                continue
            waiting.discard(connection)
            if connection in connections:
                owned = connection.owned
                if owned is not None and owned.persistent:
                    persistent.append(owned.lease.client_id)
                closed += 1
                unfinished += left
                connection.shutdown()
        if waiting:
            await asyncio.sleep(DRAIN_POLL)
    return closed, unfinished, persistent


async def wait_released(
    connections: set[MqttConnection],
    sessions: SessionManager,
    persistent: list[str],
    deadline: float,
) -> int:
    """Wait (until ``deadline``, ``time.monotonic()``) for the sessions of ``persistent`` to be
    stored and the closed ``connections`` to go; how many sessions were stored.  A session not
    stored yet goes on being stored while the node's parts stop (``SessionManager.stop``); a
    connection still open then is aborted: its client does not read what was written to it,
    and a transport closes only once its buffer is written."""
    releasing = sessions.saver.releasing
    tasks = [releasing[c] for c in persistent if c in releasing]
    if tasks:
        await asyncio.wait(tasks, timeout=max(0.0, deadline - time.monotonic()))
    while connections and time.monotonic() < deadline:
        await asyncio.sleep(DRAIN_POLL)
    for connection in list(connections):
        if connection.transport is not None:
            connection.transport.abort()
    failed = sum(1 for t in tasks if not t.done() or t.cancelled() or t.exception())
    return len(persistent) - failed


GC_THRESHOLDS = (50_000, 50, 100)
"""The cycle collector's thresholds while the node serves.  Python's default (700, 10, 10) runs
a young collection every 700 net allocations of containers: at thousands of messages a second,
each a handful of short-lived objects, that took about 10% of a node's CPU (py-spy, issue 14),
and each full collection walked every session of an idle fleet.  Messages rarely make cycles;
the young generation still collects those that do, seventy times less often."""


def node_auth(config: NodeConfig) -> Auth:
    """The node's password and ACL files, and who logs in how (``frontend.auth``)."""
    tls = config.tls
    certificates = tls is not None and tls.use_identity_as_username
    return Auth(
        config.password_file,
        config.acl_file,
        allow_anonymous=config.allow_anonymous,
        certificates=certificates,
    )


def tune_gc() -> None:
    """Collect what start-up left, keep the rest out of later collections, collect rarely."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


async def serve(
    config: NodeConfig, given: tuple[list[str] | None, argparse.Namespace] | None = None
) -> None:
    """Run a node until SIGINT or SIGTERM; ``given``: what its settings came from (SIGHUP
    reads them again)."""
    node = Node(config)
    node.given = given
    await node.start()
    tune_gc()
    stats = f", stats on {config.stats_host}:{config.stats_port}" if config.stats_host else ""
    others = ", ".join(f"{lst.kind} on {lst.host}:{lst.port}" for lst in node.endpoints[1:])
    others = f" ({others})" if others else ""
    print(
        f"headwater node {config.node_id} ready on {config.host}:{config.port}{others}{stats}",
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)  # either drains (a second one changes nothing)
    loop.add_signal_handler(signal.SIGHUP, node.reload)
    await stop.wait()
    log.info("node %s draining", config.node_id)
    watch_drain(config.drain_timeout, config.node_id)
    await node.stop()


DRAIN_EXPIRED = 1
"""The exit status of a process whose drain ran out of ``--drain-timeout``."""

DRAIN_REPORT = 1.0
"""Seconds the report of an expired drain may take (a stderr nobody reads blocks it)."""


DRAIN_BACKSTOP = 5.0
"""Seconds past the drain's bound (and its report) at which the kernel ends a process whose
drain-watch thread could not run: a C call holding the GIL stops every Python thread (a fresh-clone
run saw a node outlive its bound so, its watch silent).  SIGALRM, whose default action ends the
process; no handler is installed for it."""


def watch_drain(seconds: float, node_id: str) -> threading.Timer:
    """The drain's bound for the whole process, kept by a thread of its own: no step's bound
    ends a drain whose event loop is blocked (librdkafka's synchronous commit, waiting on a
    stalled broker, held one for good), nor the exit's wait for threads.  If the process is
    still there ``seconds`` after the drain began, where each thread is goes to the log and it
    exits at once with ``DRAIN_EXPIRED``; if even that thread cannot run, the kernel ends it
    ``DRAIN_BACKSTOP`` seconds later (``signal.alarm``, armed from the main thread)."""

    def expire() -> None:
        reporter = threading.Thread(
            target=_report_expired, args=(seconds, node_id), name="drain-expired", daemon=True
        )
        reporter.start()
        reporter.join(DRAIN_REPORT)
        os._exit(DRAIN_EXPIRED)

    timer = threading.Timer(seconds, expire)
    timer.name, timer.daemon = "drain-watch", True
    timer.start()
    if threading.current_thread() is threading.main_thread():
        signal.alarm(math.ceil(seconds + DRAIN_REPORT + DRAIN_BACKSTOP))
    return timer


def _report_expired(seconds: float, node_id: str) -> None:
    log.error(
        "node %s: the drain did not end within %g s (--drain-timeout); exiting now; threads:\n%s",
        node_id, seconds, threads_now(),
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
        level, log_format = log_settings(args)
        config = config_from_args(args)
        workers = workers_setting(args, config)
    except ConfigError as exc:
        print(f"headwater frontend: {exc}", file=sys.stderr)
        return 2
    setup_logging(level, log_format)
    if workers > 1:
        return run_workers(sys.argv[1:] if argv is None else argv, config, workers)
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
    try:
        asyncio.run(serve(config, (argv, args)))
    except (ConnectionError, ValueError, OSError) as exc:
        print(f"headwater frontend: {exc}", file=sys.stderr)
        return 1
    return 0
