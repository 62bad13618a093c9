"""Wills [MQTT-3.1.2-8]: published through the log like any message, retained ones stored too.

A connection that closes without DISCONNECT has its will published by its node; the will of a
connection whose node died is published by whichever node finds it first (``frontend.cluster``
and the session store hand it over).  Every will published, orphaned or lost is counted.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from frontend.retained import RetainedStore
from mqttcore.message import Message, MessageStamps
from router import record
from router.outbox import DeliveryCallback

log = logging.getLogger("headwater.sessions")


class WillLog(Protocol):
    """Where wills go: ``router.log.KafkaLog``."""

    def produce(
        self, message: Message, on_delivery: DeliveryCallback | None, kind: str = record.CLIENT
    ) -> bool: ...


class Wills:
    """This node's will publishing."""

    def __init__(self, stamps: MessageStamps, log_: WillLog, retained: RetainedStore) -> None:
        self.stamps = stamps
        self.log = log_
        self.retained = retained
        self.published = 0
        self.orphaned = 0
        """Of those, wills of connections whose node died."""
        self.lost = 0
        """Wills the producer could not take."""

    def publish(self, message: Message) -> None:
        """Publish a will: through the log like any message; retained wills update the store."""
        self.published += 1
        retained = self.retained

        def stored(partition: int, offset: int, error: str | None) -> None:
            if error is None and message.retain:
                asyncio.get_running_loop().create_task(retained.apply(message, partition, offset))

        if not self.log.produce(message, stored, kind=record.WILL):
            self.lost += 1
            log.error("will of %s lost: the producer queue is full", message.client_id)

    def publish_orphaned(self, wills: list[bytes]) -> None:
        """Publish the stored wills of connections that died with their node, from here."""
        for raw in wills:
            try:
                will = record.decode(raw)
            except record.RecordError as exc:
                log.error("a stored will is unreadable, not published: %s", exc)
                continue
            log.info("publishing the will of %s, whose node died", will.client_id)
            self.orphaned += 1
            self.publish(
                self.stamps.message(will.topic, will.payload, will.qos, will.retain, will.client_id)
            )
