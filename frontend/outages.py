"""What a client sees when Kafka or Redis fails: the one mapping from an outage to the wire.

An outage is not a protocol error: the client did nothing wrong, so it gets what lets it retry
safely, and nothing is acknowledged that is not durably written.

=====================  ==========================================  =================================
when                   what failed                                 what the client sees
=====================  ==========================================  =================================
CONNECT                Kafka marked unavailable; Redis error       CONNACK 3, then close
                       acquiring the session or keeping the will,
                       or no turn to open it within 120 s
PUBLISH QoS 1/2        Kafka refused or lost the record            no PUBACK/PUBREC; close (the
                                                                   client resends on reconnect)
PUBLISH retained,      Redis error storing the retained message    no PUBACK/PUBREC; close
QoS 2 persistent       or the QoS 2 packet id after the write
SUBSCRIBE              Kafka cannot say where partitions end       SUBACK 0x80 for every filter
                       within ``OUTAGE_SECONDS`` (asked again)
SUBSCRIBE, persistent  Redis error storing the subscription        no SUBACK; close (the client
                                                                   subscribes again on reconnect)
SUBSCRIBE ``$share``   Redis error taking the group's first step   no SUBACK; close
                       of leases (``router.shared``)
after SUBACK           Redis error reading retained messages       close (they come with the next
                                                                   SUBSCRIBE)
catching up (resumed   the log unreadable for ``OUTAGE_SECONDS``   close; the stored positions stay,
or queue full)         (60 s, ``router.retry``); a leader          the next connection catches up
                       election or a restart within it is ridden
                       out (retried, counted)
session save, release  Redis error                                 nothing; logged, the next save
                                                                   retries
=====================  ==========================================  =================================
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from confluent_kafka import KafkaException
from redis.exceptions import RedisClusterException, RedisError

from mqttcore import channel as ch
from mqttcore.packets import ConnackCode
from router.shared import LeaseError

log = logging.getLogger("headwater.outages")

STORE_ERRORS: tuple[type[Exception], ...] = (
    RedisError, RedisClusterException, OSError, LeaseError,
)  # fmt: skip
"""What the session and retained stores and the share groups' leases raise when Redis is
unreachable or failing."""
LOG_ERRORS: tuple[type[Exception], ...] = (KafkaException,)
"""What the log raises when Kafka refuses a request."""
OUTAGES = STORE_ERRORS + LOG_ERRORS


def kafka_unavailable_at_connect(channel: ch.Channel) -> list[ch.Action]:
    return channel.session_refused(ConnackCode.SERVER_UNAVAILABLE, "Kafka is unavailable")


def store_failed_at_connect(channel: ch.Channel, exc: Exception) -> list[ch.Action]:
    reason = f"the session store is unavailable: {exc}"
    return channel.session_refused(ConnackCode.SERVER_UNAVAILABLE, reason)


def publish_refused(channel: ch.Channel, topic: str, exc: Exception) -> list[ch.Action]:
    """Kafka refused the record outright (e.g. larger than the topic takes): never durable."""
    log.error(
        "client %s: publish to %r refused by Kafka (%s); closing without acknowledging",
        channel.client_id, topic, exc,
    )  # fmt: skip
    return channel.connection_lost("Kafka refused the message")


def publish_lost(
    channel: ch.Channel, topic: str, error: str, acknowledged: bool
) -> list[ch.Action]:
    """Kafka reported the write failed.  A QoS 0 message has no acknowledgement to withhold:
    the connection stays; a QoS 1/2 one closes it, unacknowledged."""
    log.error(
        "client %s: publish to %r not written to Kafka (%s); no acknowledgement sent%s",
        channel.client_id, topic, error, ", closing the connection" if acknowledged else "",
    )  # fmt: skip
    return channel.connection_lost("Kafka write failed") if acknowledged else []


def publish_not_stored(channel: ch.Channel, topic: str, exc: Exception) -> list[ch.Action]:
    """Written to the log, but what must be stored before the acknowledgement was not."""
    log.error(
        "client %s: %s not stored (%s); closing without acknowledging",
        channel.client_id, topic, exc,
    )  # fmt: skip
    return channel.connection_lost("session store unavailable")


def subscribe_failed(
    channel: ch.Channel, request: ch.AddSubscriptions, exc: Exception
) -> list[ch.Action]:
    log.warning("client %s: subscribe failed: %s", channel.client_id, exc)
    return channel.subscribed(request, failed=True)


def subscription_not_stored(channel: ch.Channel, exc: Exception) -> list[ch.Action]:
    """A persistent session's subscription could not be stored: no SUBACK claims it."""
    log.error(
        "client %s: subscription not stored (%s); closing without SUBACK", channel.client_id, exc
    )
    return channel.connection_lost("session store unavailable")


def retained_unavailable(channel: ch.Channel, exc: Exception) -> list[ch.Action]:
    log.error("client %s: retained messages unreadable (%s); closing", channel.client_id, exc)
    return channel.connection_lost("retained store unavailable")


def catch_up_failed(channel: ch.Channel, exc: BaseException) -> list[ch.Action]:
    """The missed messages could not be read for ``router.retry.OUTAGE_SECONDS`` (a leader
    election or a short outage is retried before this): the node cannot serve the client,
    so close rather than go live past them."""
    log.error("client %s: catching up failed (%r); closing", channel.client_id, exc)
    return channel.connection_lost("catching up failed")


def in_background(work: Coroutine[Any, Any, None], client_id: str, what: str) -> None:
    """Run work with no reply on the wire (a session save, a QoS 2 unmark, storing before an
    acknowledgement): a failure it does not handle itself is logged, nothing more."""
    task = asyncio.get_running_loop().create_task(work)
    task.add_done_callback(functools.partial(_report, client_id=client_id, what=what))


def _report(task: asyncio.Task[None], client_id: str, what: str) -> None:
    if not task.cancelled() and (error := task.exception()) is not None:
        log.warning("client %s: %s failed: %r", client_id or "-", what, error)


async def every(seconds: float, work: Callable[[], Awaitable[None]], what: str) -> None:
    """Run ``work`` every ``seconds``, for as long as the task lives.  A failure (Redis or Kafka
    away) is logged and the next turn tries again: the node keeps serving meanwhile."""
    while True:
        await asyncio.sleep(seconds)
        try:
            await work()
        except Exception as exc:
            log.warning("%s failed: %s", what, exc)
