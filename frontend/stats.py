"""What a node reports about itself: a JSON snapshot, served over HTTP at ``GET /stats``.

The snapshot is read from counters the parts keep anyway (log, broker, node); producing it costs
one round trip to the consumer thread for positions and watermarks.  The endpoint is a minimal
HTTP/1.0 responder on its own port (``--stats-listen``), for ``headwater stats`` and for scrapers.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from frontend.server import Node

log = logging.getLogger("headwater.stats")


async def snapshot(node: Node) -> dict[str, Any]:
    positions = await node.log.positions()
    lag = {p: max(high - pos, 0) for p, (pos, high) in positions.items() if pos >= 0 and high >= 0}
    broker, klog = node.broker.counters, node.log
    return {
        "node_id": node.config.node_id,
        "clients": node.broker.client_count,
        "partitions_total": node.router.num_partitions,
        "assigned_partitions": klog.assigned(),
        "positions": {str(p): pos for p, (pos, _) in positions.items()},
        "consumer_lag": {str(p): n for p, n in lag.items()},
        "records_fetched": klog.fetched_records,
        "bytes_fetched": klog.fetched_bytes,
        "records_dispatched": broker.records_dispatched,
        "messages_delivered": broker.messages_delivered,
        "messages_dropped": broker.messages_dropped,
        "messages_replayed": node.counters.messages_replayed,
        "records_lost_to_retention": node.counters.retention_lost,
        "messages_produced": klog.produced,
        "produce_errors": klog.produce_errors,
        "undecodable_records": klog.undecodable,
        "protocol_errors": node.counters.protocol_errors,
        "wills_published": node.counters.wills_published,
        "orphaned_wills_published": node.counters.orphaned_wills_published,
        "shared_groups": node.broker.share_names(),
        "kafka_available": klog.available,
    }


async def serve_stats(node: Node, host: str, port: int) -> asyncio.Server:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readline(), 5)
            if request.split(b" ")[1:2] == [b"/stats"]:
                body = json.dumps(await snapshot(node), indent=2).encode()
                head = b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n"
            else:
                body, head = b"not found\n", b"HTTP/1.0 404 Not Found\r\n"
            writer.write(head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
            await writer.drain()
        except (TimeoutError, ConnectionError) as exc:
            log.debug("stats request failed: %s", exc)
        finally:
            writer.close()

    return await asyncio.start_server(handle, host, port)
