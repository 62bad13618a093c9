"""The node's counters in Prometheus's text format, for ``GET /metrics`` (``prometheus_client``).

Nothing is counted twice: the collector reads, at scrape time, the counters the parts keep anyway
(the same ones ``/stats`` shows, through the node's snapshot function) and hands them to
``prometheus_client`` as metric families.  A scrape costs the snapshot, never work per message.
Names follow Prometheus's conventions: ``headwater_`` prefix, ``_total`` for counters, base units.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

COUNTERS = {
    "records_fetched": "Records the node's live reader fetched from the log.",
    "bytes_fetched": "Bytes of those records.",
    "records_dispatched": "Records the dispatcher matched against local subscriptions.",
    "messages_delivered": "Messages handed to local clients (live, catch-up, retained, shared).",
    "messages_dropped": "Messages a client's bound dropped (QoS 0, retained and shared only).",
    "messages_replayed": "QoS 1/2 messages read back from the log for clients that were behind.",
    "records_lost_to_retention": "Records removed by retention before a session came back.",
    "clients_fell_behind": "Times a client's queue was full and it read on from the log.",
    "connects_waited": "Store requests of CONNECTs that waited for their turn (admission).",
    "sessions_saved": "Session writes to the store.",
    "sessions_expired": "Persistent sessions removed after the session expiry.",
    "checkpoints_written": "Delivery checkpoints this node process wrote.",
    "messages_produced": "Messages the log acknowledged as written.",
    "produce_errors": "Messages the log failed to write.",
    "undecodable_records": "Records in the log that could not be decoded (skipped).",
    "protocol_errors": "Connections closed for a protocol violation.",
    "connects_denied": "CONNECTs refused: bad credentials, none, or a will the ACL denies.",
    "publishes_denied": "PUBLISH packets the ACL denied (acknowledged, never written).",
    "subscriptions_denied": "SUBSCRIBE filters the ACL denied (0x80).",
    "deliveries_denied": "Messages a subscription matched that the ACL let the client not read.",
    "subscriptions_over_limit": "SUBSCRIBE filters refused for --max-subscriptions (0x80).",
    "refused_max_connections": "Connections closed at accept for --max-connections.",
    "proxy_header_errors": "Connections closed for a malformed, truncated or missing PROXY header.",
    "handshake_timeouts": "Connections without their PROXY header, TLS handshake or WebSocket "
    "upgrade done within the connect timeout.",
    "tls_handshake_failures": "TLS handshakes that failed (not TLS, bad or missing certificate).",
    "websocket_upgrades_refused": "HTTP requests refused an upgrade (path, subprotocol, headers).",
    "websocket_errors": "WebSocket connections closed for a text or malformed frame.",
    "connect_timeouts": "Connections closed for sending no CONNECT within the connect timeout.",
    "wills_published": "Wills published.",
    "orphaned_wills_published": "Wills of connections whose node died, published here.",
    "wills_lost": "Wills the producer could not take.",
}

GAUGES = {
    "connections_arriving": "Connections in their PROXY header, TLS handshake or upgrade now.",
    "clients": "Connected clients.",
    "clients_behind": "Clients reading on from the log now.",
    "sessions_catching_up": "Sessions the catch-up consumer is reading for now.",
    "sessions_active": "Persistent sessions the saver looks at each round.",
    "kafka_available": "1 while Kafka takes writes.",
    "redis_reachable": "1 while the node's last heartbeat reached Redis (or it has none).",
}


class SnapshotCollector(Collector):
    """Turns one ``/stats`` snapshot into metric families at each scrape."""

    def __init__(self, snapshot: Callable[[], dict[str, Any]]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        stats = self._snapshot()
        for name, doc in COUNTERS.items():
            yield CounterMetricFamily(f"headwater_{name}", doc, value=stats[name])
        for name, doc in GAUGES.items():
            yield GaugeMetricFamily(f"headwater_{name}", doc, value=float(stats[name]))
        lag = GaugeMetricFamily(
            "headwater_consumer_lag", "Records the live reader is behind, per partition.",
            labels=["partition"],
        )  # fmt: skip
        for partition, records in stats["consumer_lag"].items():
            lag.add_metric([partition], records)
        yield lag
        yield GaugeMetricFamily(
            "headwater_assigned_partitions",
            "Partitions the live reader reads.",
            value=len(stats["assigned_partitions"]),
        )


def exposition(snapshot: Callable[[], dict[str, Any]]) -> Callable[[], bytes]:
    """What ``GET /metrics`` answers: a registry of its own per node, read at each call."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(snapshot))
    return lambda: generate_latest(registry)
