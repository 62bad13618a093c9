"""One loop iteration's records on their way to librdkafka (``router.log``'s writing side).

``KafkaLog.produce`` adds a record to the :class:`Outbox`; at the end of the iteration the outbox
hands them all over, one ``produce()`` each, in arrival order (``produce_batch`` takes neither
headers nor timestamps), and tells the sender of a record the producer refuses.  A record with a
callback (QoS 1 and 2: its sender waits for the report) has its own delivery report; the ones
without (QoS 0) that one hand-over gives one partition share one, carried by the first of them
(:class:`Group`).  This module runs compiled (setup.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

DeliveryCallback = Callable[[int, int, str | None], None]
"""Called in the event loop with (partition, offset, error); error is None once durable."""


OutboxRecord = tuple[
    int, bytes, bytes, "list[tuple[str, bytes]] | None", int, Any, "DeliveryCallback | None"
]
"""(partition, value, key, headers, timestamp, librdkafka's callback, whom to tell if refused):
a plain tuple, built once per message on the hot path."""


GroupReport = Callable[[int, "KafkaError | None", Any], None]
"""Told of a :class:`Group`'s delivery: (how many records, error or None, the carrier's report)."""


class Group:
    """The records without a callback of their own (QoS 0: nobody waits for them) that one
    hand-over gives one partition: the first carries the delivery report for them all.  They go
    to librdkafka together, so into the same or the next request, and are written, or time out,
    together; a report each cost the loop about 1.7 us a QoS 0 message (8% of its CPU in a QoS 0
    fan-in: ``confluent_kafka.Message`` built with copies of value and key, then a call)."""

    __slots__ = ("_report", "records")

    def __init__(self, report: GroupReport) -> None:
        self._report = report
        self.records = 0

    def __call__(self, err: KafkaError | None, msg: Any) -> None:
        self._report(self.records, err, msg)


class Outbox:
    """The records of this loop iteration, in arrival order, until they go to librdkafka together
    at the end of it, and whom to tell if one is refused.  A record without a callback is
    reported with its partition's :class:`Group` to ``report_group`` (none: not reported)."""

    __slots__ = ("_records", "_report_group")

    def __init__(self, report_group: GroupReport | None = None) -> None:
        self._records: list[OutboxRecord] = []
        self._report_group = report_group

    def __len__(self) -> int:
        return len(self._records)

    def add(
        self,
        partition: int,
        value: bytes,
        key: bytes,
        callback: Any,
        sender: DeliveryCallback | None,
        headers: list[tuple[str, bytes]] | None = None,
        timestamp: int = 0,
    ) -> None:
        """Add a record; ``timestamp`` 0 lets librdkafka stamp it with the time of producing."""
        self._records.append((partition, value, key, headers, timestamp, callback, sender))

    def send(
        self, producer: Producer | None, topic: str
    ) -> list[tuple[DeliveryCallback | None, int, str]]:
        """Hand every record over, one ``produce()`` each (``produce_batch`` takes neither
        headers nor timestamps); the records refused, as (sender, partition, error).  The queue
        is bounded before it fills (``KafkaLog.produce``), so only a fatal producer error
        refuses one."""
        records, self._records = self._records, []
        refused: list[tuple[DeliveryCallback | None, int, str]] = []
        if producer is None:
            error = str(KafkaException(KafkaError(KafkaError._DESTROY)))
            return [(r[6], r[0], error) for r in records]
        produce, report_group = producer.produce, self._report_group
        groups: dict[int, Group] = {}
        for partition, value, key, headers, timestamp, callback, sender in records:
            group = None
            if callback is None and report_group is not None:
                group = groups.get(partition)
                if group is None:  # this record carries its partition's group
                    callback = group = Group(report_group)
            try:
                # positional (``callback`` is the slot before its alias ``on_delivery``):
                # keywords cost produce() about 0.8 us a record to parse
                produce(
                    topic, value, key, partition, callback, None, timestamp,
                    headers,  # type: ignore[arg-type]  # the stub's list is invariant
                )  # fmt: skip
            except (KafkaException, BufferError) as exc:
                refused.append((sender, partition, str(exc)))  # the next one carries the group
                continue
            if group is not None:  # a group counts the records the producer took
                group.records += 1
                groups[partition] = group
        return refused
