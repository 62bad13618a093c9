"""What a node reports about itself, over HTTP on its own port (``--stats-listen``).

* ``GET /stats``: a JSON snapshot, read from counters the parts keep anyway (the log, its reader,
  the dispatcher, the session manager, the connections); it costs no I/O.
* ``GET /metrics``: the same counters in Prometheus's text format (``frontend.metrics``).
* ``GET /live``: 200 while the node's event loop answers at all.
* ``GET /ready``: 200 while the node should be given new clients (listening, Kafka writable,
  Redis reachable, not shutting down), else 503 with the reasons: what a load balancer checks, so a
  stuck or stopping node gets no new connections (``headwater.services.haproxy``).

The responder is minimal HTTP/1.0, for ``headwater stats``, scrapers and health checks; it is
handed the snapshot and readiness functions, not the node.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

from frontend.connection import Services
from frontend.listeners import Doors
from frontend.metrics import CONTENT_TYPE, exposition
from frontend.retained import RetainedLimits
from router.dispatch import Dispatcher
from router.log import KafkaLog
from router.partitioner import Router

log = logging.getLogger("headwater.stats")


def snapshot(
    node_id: str,
    router: Router,
    klog: KafkaLog,
    dispatcher: Dispatcher,
    services: Services,
    *,
    doors: Doors,
    retained: RetainedLimits,
    relays: Mapping[str, int],
    redis_reachable: bool,
) -> dict[str, Any]:
    reader, counters, sessions = klog.reader, dispatcher.counters, services.sessions
    traffic = services.traffic
    positions = reader.positions()
    lag = {p: max(high - pos, 0) for p, (pos, high) in positions.items() if pos >= 0 and high >= 0}
    return {
        "node_id": node_id,
        "clients": dispatcher.client_count,
        "partitions_total": router.num_partitions,
        "assigned_partitions": reader.assigned(),
        "paused_partitions": reader.paused(),
        "positions": {str(p): pos for p, (pos, _) in positions.items()},
        "consumer_lag": {str(p): n for p, n in lag.items()},
        "records_fetched": reader.fetched_records,
        "bytes_fetched": reader.fetched_bytes,
        "records_dispatched": counters.records_dispatched,
        "messages_delivered": counters.messages_delivered,
        "messages_dropped": counters.messages_dropped,
        "messages_replayed": counters.messages_replayed,
        "records_lost_to_retention": counters.retention_lost,
        "sessions_catching_up": reader.catching_up,
        "clients_fell_behind": counters.fell_behind,
        "clients_behind": len(dispatcher.backlog.clients),
        "connects_waited": sessions.opening_waited,
        "sessions_saved": sessions.saver.sessions_saved,
        "sessions_active": sessions.saver.active,
        "sessions_expired": sessions.store.expired,
        "checkpoints_written": sessions.saver.checkpoints_written,
        "messages_produced": klog.produced,
        "produce_errors": klog.produce_errors,
        "producer_changes": klog.gear_changes,
        **{f"kafka_retries_{what}": n for what, n in klog.retries.counts.items()},
        "undecodable_records": reader.undecodable,
        "protocol_errors": services.protocol_errors,
        "connects_denied": services.auth.denied_connects,
        "publishes_denied": services.auth.denied_publishes,
        "subscriptions_denied": services.auth.denied_subscriptions,
        "deliveries_denied": services.auth.denied_reads,
        "logins_throttled": services.auth.throttle.throttled,
        "logins_shed": services.auth.hashing.shed,
        "clients_revoked": services.auth.revoked,
        "subscriptions_over_limit": services.subscriptions_refused,
        "retained_over_limit": retained.refused,
        "listeners": dict(doors.listening),
        "connections_arriving": len(doors.arriving),
        **doors.refused,
        "connect_timeouts": services.connect_timeouts,
        "buffered_bytes": services.buffers.held,
        "buffer_pauses": services.buffers.pauses,
        "buffer_paused_seconds": round(services.buffers.paused_seconds, 3),
        "intake_holds": services.intake.holds,
        "wills_published": sessions.wills.published,
        "orphaned_wills_published": sessions.wills.orphaned,
        "wills_lost": sessions.wills.lost,
        "client_events": sessions.events.enabled,
        "client_events_written": sessions.events.written,
        "client_events_lost": sessions.events.lost,
        "shared_groups": dispatcher.share_names(),
        "share_groups": len(dispatcher.shares.groups),
        "share_groups_refused": dispatcher.shares.refused,
        "history_streams": dispatcher.history_streams,
        "history_refused": dispatcher.history_refused,
        "share_messages_denied": dispatcher.shares.denied,
        "share_lease_failures": dispatcher.shares.lease_failures,
        "kafka_available": klog.available,
        "redis_reachable": redis_reachable,
        "connections": len(services.connections),
        "connections_opened": traffic.connections_opened,
        "bytes_received": traffic.bytes_received,
        "bytes_sent": traffic.bytes_sent,
        "messages_received_by_qos": {str(qos): n for qos, n in enumerate(traffic.received)},
        "messages_sent_by_qos": {str(qos): n for qos, n in enumerate(traffic.sent)},
        "produce_latency": klog.latency.snapshot(),
        "sessions_live_clean": sessions.live[0],
        "sessions_live_persistent": sessions.live[1],
        "sessions_resumed": sessions.resumed,
        "session_takeovers": sessions.takeovers,
        "session_takeovers_forced": sessions.takeovers_forced,
        "session_takeovers_refused": sessions.takeovers_refused,
        **relays,
    }


async def serve_stats(
    take_snapshot: Callable[[], dict[str, Any]],
    not_ready: Callable[[], list[str]],
    host: str,
    port: int,
) -> asyncio.Server:
    """Serve ``/stats``, ``/metrics``, ``/live`` and ``/ready``; ``not_ready`` says why the node
    should not be given new clients now (nothing: it should)."""
    metrics = exposition(take_snapshot)

    def answer(path: bytes) -> tuple[bytes, bytes]:
        if path == b"/stats":
            body = json.dumps(take_snapshot(), indent=2).encode()
            return b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n", body
        if path == b"/metrics":
            return b"HTTP/1.0 200 OK\r\nContent-Type: %s\r\n" % CONTENT_TYPE.encode(), metrics()
        if path == b"/live":
            return b"HTTP/1.0 200 OK\r\n", b"live\n"
        if path == b"/ready":
            reasons = not_ready()
            if not reasons:
                return b"HTTP/1.0 200 OK\r\n", b"ready\n"
            return b"HTTP/1.0 503 Service Unavailable\r\n", ("\n".join(reasons) + "\n").encode()
        return b"HTTP/1.0 404 Not Found\r\n", b"not found\n"

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readline(), 5)
            words = request.split()
            head, body = answer(words[1] if len(words) > 1 else b"")
            writer.write(head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
            await writer.drain()
        except (TimeoutError, ConnectionError) as exc:
            log.debug("stats request failed: %s", exc)
        finally:
            writer.close()

    return await asyncio.start_server(handle, host, port)
