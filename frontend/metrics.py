"""The node's counters in Prometheus's text format, for ``GET /metrics`` (``prometheus_client``).

Nothing is counted twice: the collector reads, at scrape time, the counters the parts keep anyway
(the same ones ``/stats`` shows, through the node's snapshot function) and hands them to
``prometheus_client`` as metric families.  A scrape costs the snapshot, never work per message:
the parts only add to integers (:class:`Traffic` is the client connections' share, and the log's
produce latencies are bucket counts in a fixed array, ``router.log.LatencyHistogram``).
Names follow Prometheus's conventions: ``headwater_`` prefix, ``_total`` for counters, base units.
Counters that ``/stats`` keeps under separate keys (refusals, drops, denials) are also one family
each with a ``reason`` label, for dashboards (``docker/grafana/dashboards/headwater.json``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from router.retry import Retries

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(slots=True)
class Traffic:
    """What the node's client connections carried, counted by them (``frontend.connection``,
    ``frontend.publishing``): one integer increment per read, write or PUBLISH."""

    connections_opened: int = 0
    bytes_received: int = 0
    bytes_sent: int = 0
    received: list[int] = field(default_factory=lambda: [0, 0, 0])
    """PUBLISH packets accepted from clients (handed to the log), by QoS."""
    sent: list[int] = field(default_factory=lambda: [0, 0, 0])
    """PUBLISH packets written to clients, by QoS (resends of unacknowledged ones included)."""


COUNTERS = {
    "records_fetched": "Records the node fetched from the log: live, catch-up and share groups.",
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
    "sessions_resumed": "CONNECTs that found a stored session (session present).",
    "session_takeovers": "Sessions acquired from a connection that still held them, here or on "
    "another node [MQTT-3.1.4-2].",
    "session_takeovers_forced": "Of those, sessions taken by force from a node that did not let go "
    "in time.",
    "session_takeovers_refused": "CONNECTs refused (CONNACK 5) for a client id whose session "
    "belongs to another identity (user name or certificate).",
    "checkpoints_written": "Delivery checkpoints this node process wrote.",
    "messages_produced": "Messages the log acknowledged as written.",
    "produce_errors": "Messages the log failed to write.",
    "producer_changes": "Changes between the log's producer that sends at once and the one "
    "that lingers while the node is busy.",
    "undecodable_records": "Records in the log that could not be decoded (skipped).",
    "protocol_errors": "Connections closed for a protocol violation.",
    "connects_denied": "CONNECTs refused: bad credentials, none, a throttled address, or a will "
    "the ACL denies.",
    "publishes_denied": "PUBLISH packets the ACL denied (acknowledged, never written).",
    "subscriptions_denied": "SUBSCRIBE filters the ACL denied (0x80).",
    "deliveries_denied": "Messages a subscription matched that the ACL let the client not read.",
    "logins_throttled": "CONNECTs refused (CONNACK 5) without a password check, their address "
    "having failed too many logins (also counted in connects_denied).",
    "logins_shed": "CONNECTs answered CONNACK 3: too many password checks waiting already.",
    "clients_revoked": "Clients disconnected by a reload (SIGHUP): their password entry gone or "
    "changed.",
    "subscriptions_over_limit": "SUBSCRIBE filters refused for --max-subscriptions (0x80).",
    "retained_over_limit": "Retained PUBLISHes not retained for --max-retained or "
    "--max-retained-bytes (delivered to subscribers all the same).",
    "share_groups_refused": "$share filters refused (0x80), or not served after a resume, for "
    "--max-share-groups or --max-share-groups-per-client.",
    "share_messages_denied": "Shared messages no member on this node may read (finished unread).",
    "share_lease_failures": "Steps of a share group's leases that Redis did not answer (the "
    "group's partitions are not served once its leases may have passed to another node).",
    "history_refused": "$history filters refused (0x80) for --max-history or "
    "--max-history-per-client.",
    "refused_max_connections": "Connections closed at accept for --max-connections.",
    "proxy_header_errors": "Connections closed for a malformed, truncated or missing PROXY header.",
    "handshake_timeouts": "Connections without their PROXY header, TLS handshake or WebSocket "
    "upgrade done within the connect timeout.",
    "tls_handshake_failures": "TLS handshakes that failed (not TLS, bad or missing certificate).",
    "websocket_upgrades_refused": "HTTP requests refused an upgrade (path, subprotocol, headers).",
    "websocket_errors": "WebSocket connections closed for a text or malformed frame.",
    "connect_timeouts": "Connections closed for sending no CONNECT within the connect timeout.",
    "proxy_not_allowed": "Connections closed at accept: a PROXY header is believed only from "
    "--proxy-allow.",
    "buffer_pauses": "Times the clients' partial packets and output passed --max-buffered-bytes "
    "and the node stopped reading.",
    "buffer_paused_seconds": "Time the node spent not reading for --max-buffered-bytes.",
    "intake_holds": "Times a connection's PUBLISHes waited for delivery to catch up: the node was "
    "saturated and a client behind (frontend.intake).",
    "connections_opened": "MQTT connections made (after any PROXY header, TLS and upgrade).",
    "bytes_received": "Bytes received from clients (MQTT packets, after TLS and WebSocket).",
    "bytes_sent": "Bytes sent to clients (MQTT packets, before TLS and WebSocket).",
    "wills_published": "Wills published.",
    "orphaned_wills_published": "Wills of connections whose node died, published here.",
    "wills_lost": "Wills the producer could not take.",
    "client_events_written": "Client events ($events/...) handed to the log.",
    "inbound_relayed": "Records of the inbound topic this node copied into the log.",
    "inbound_skipped_no_topic": "Inbound records skipped: no key (the MQTT topic).",
    "inbound_skipped_bad_topic": "Inbound records skipped: a key that is no topic a client may "
    "publish to (not UTF-8, empty, wildcards, $, too long or deep).",
    "inbound_skipped_bad_header": "Inbound records skipped: mqtt.qos not 0-2 or mqtt.retain not "
    "0/1.",
    "exported": "Messages this node copied into --export topics.",
    "export_undecodable": "Log records the exports could not decode (skipped).",
    "relay_transactions_aborted": "Relay transactions aborted (their batch copied again).",
}

GAUGES = {
    "connections": "MQTT connections open now, with a session or still before CONNACK.",
    "connections_arriving": "Connections in their PROXY header, TLS handshake or upgrade now.",
    "buffered_bytes": "Bytes held in clients' partial packets and output buffers now.",
    "clients": "Connected clients.",
    "clients_behind": "Clients reading on from the log now.",
    "share_groups": "$share groups with members on this node now.",
    "history_streams": "$history subscriptions this node reads for now.",
    "sessions_catching_up": "Sessions the catch-up consumer is reading for now.",
    "sessions_active": "Persistent sessions the saver looks at each round.",
    "kafka_available": "1 while Kafka takes writes.",
    "redis_reachable": "1 while the node's last heartbeat reached Redis (or it has none).",
    "client_events": "1 while the node writes client events (--client-events; SIGHUP rereads it).",
}

REFUSED = {
    "refused_max_connections": "max_connections",
    "proxy_not_allowed": "proxy_not_allowed",
    "proxy_header_errors": "proxy_header",
    "handshake_timeouts": "handshake_timeout",
    "tls_handshake_failures": "tls_handshake",
    "websocket_upgrades_refused": "websocket_upgrade",
    "websocket_errors": "websocket_frame",
    "connect_timeouts": "connect_timeout",
}
"""``/stats`` key -> ``reason`` of ``headwater_connections_refused_total``."""

DROPPED = {
    "messages_dropped": "client_bound",
    "records_lost_to_retention": "retention",
    "produce_errors": "produce_failed",
    "wills_lost": "will_lost",
    "client_events_lost": "client_event_lost",
    "undecodable_records": "undecodable",
}
"""``/stats`` key -> ``reason`` of ``headwater_drops_total``."""

DENIED = {
    "connects_denied": "connect",
    "publishes_denied": "publish",
    "subscriptions_denied": "subscribe",
    "deliveries_denied": "deliver",
}
"""``/stats`` key -> ``action`` of ``headwater_denials_total``."""

RETRIED = {f"kafka_retries_{what}": what for what in Retries.KINDS}
"""``/stats`` key -> ``what`` of ``headwater_kafka_retries_total`` (``router.retry``)."""


def _labelled(
    name: str, doc: str, label: str, stats: dict[str, Any], keys: dict[str, str]
) -> Metric:
    family = CounterMetricFamily(name, doc, labels=[label])
    for key, value in keys.items():
        family.add_metric([value], stats[key])
    return family


def _by_qos(name: str, doc: str, counts: dict[str, int]) -> Metric:
    family = CounterMetricFamily(name, doc, labels=["qos"])
    for qos, count in counts.items():
        family.add_metric([qos], count)
    return family


def _histogram(name: str, doc: str, latency: dict[str, Any]) -> Metric:
    """``router.log.LatencyHistogram.snapshot()`` (per-bucket counts) as cumulative buckets."""
    buckets, total = [], 0
    for bound_ms, count in zip(latency["buckets_ms"], latency["counts"], strict=False):
        total += count
        buckets.append((repr(bound_ms / 1000), float(total)))  # le="0.001", ..., "10.0"
    buckets.append(("+Inf", float(sum(latency["counts"]))))
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=latency["sum_seconds"])


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
        yield from self._families(stats)
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
        yield GaugeMetricFamily(
            "headwater_paused_partitions",
            "Assigned partitions the live reader does not read now: every local holder is "
            "behind, and the catch-up reads them.",
            value=len(stats["paused_partitions"]),
        )

    def _families(self, stats: dict[str, Any]) -> Iterator[Metric]:
        """The families with labels, read from the same snapshot."""
        yield _labelled(
            "headwater_connections_refused", "Connections closed before or instead of their "
            "CONNECT, by reason.", "reason", stats, REFUSED,
        )  # fmt: skip
        yield _labelled(
            "headwater_drops", "Messages lost, by reason (a client's bound, retention, a failed "
            "write to the log, a will the producer could not take, an undecodable record).",
            "reason", stats, DROPPED,
        )  # fmt: skip
        yield _labelled(
            "headwater_denials", "What authentication and the ACLs refused, by action.",
            "action", stats, DENIED,
        )  # fmt: skip
        yield _labelled(
            "headwater_kafka_retries", "Reads of the log made again after a leader election or "
            "a short outage: watermark queries, live and catch-up consume calls, fetch errors.",
            "what", stats, RETRIED,
        )  # fmt: skip
        yield _by_qos(
            "headwater_messages_received",
            "PUBLISH packets accepted from clients, by QoS.",
            stats["messages_received_by_qos"],
        )
        yield _by_qos(
            "headwater_messages_sent",
            "PUBLISH packets written to clients, by QoS (resends included).",
            stats["messages_sent_by_qos"],
        )
        yield _histogram(
            "headwater_produce_latency_seconds",
            "Time from producing a message to Kafka's acknowledgement of it (acks=all).",
            stats["produce_latency"],
        )
        live = GaugeMetricFamily(
            "headwater_sessions_live", "Sessions of clients connected here now, by kind.",
            labels=["kind"],
        )  # fmt: skip
        live.add_metric(["clean"], stats["sessions_live_clean"])
        live.add_metric(["persistent"], stats["sessions_live_persistent"])
        yield live


def exposition(snapshot: Callable[[], dict[str, Any]]) -> Callable[[], bytes]:
    """What ``GET /metrics`` answers: a registry of its own per node, read at each call."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(snapshot))
    return lambda: generate_latest(registry)
