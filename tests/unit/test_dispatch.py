"""The dispatcher: one QoS rule for live, retained and catch-up delivery; catch-up obeys the
queue bound.  Over fakes of our own interfaces (``tests.unit.fakes``), no Kafka."""

from __future__ import annotations

import asyncio

import pytest

from frontend.mqtt.session import Session
from router.dispatch import Dispatcher, delivery_qos
from router.partitioner import Router
from router.record import Record
from tests.unit.fakes import FakeClient, FakeLog, message, pump

ROUTER = Router(4, 1)


def partition_of(topic: str) -> int:
    return ROUTER.route(topic)[0]


def connected(log: FakeLog, client_id: str = "c", **limits: int) -> tuple[Dispatcher, FakeClient]:
    dispatcher = Dispatcher(log, ROUTER)  # type: ignore[arg-type]
    client = FakeClient(Session(client_id, clean=False, **limits))
    dispatcher.attach(client.session, client)
    return dispatcher, client


@pytest.mark.parametrize(
    ("granted", "message_qos", "expected"), [(2, 1, 1), (1, 2, 1), (2, 2, 2), (0, 2, 0), (1, 0, 0)]
)
def test_the_granted_qos_capped_by_the_message(
    granted: int, message_qos: int, expected: int
) -> None:
    assert delivery_qos(granted, message_qos) == expected


async def test_a_record_matching_two_filters_is_delivered_once_at_the_highest_qos() -> None:
    log = FakeLog()
    dispatcher, client = connected(log)
    starts, new = await dispatcher.subscribe(client.session, [("a/+", 0), ("a/b", 2)])
    dispatcher.activate(client.session, new)
    p = partition_of("a/b")
    dispatcher.dispatch([Record(p, starts[p], 1, message("a/b", qos=1))])
    (publish,) = client.received()
    assert publish.topic == "a/b" and publish.qos == 1 and not publish.retain


async def test_records_for_a_pending_subscription_wait_for_activation_and_keep_log_order() -> None:
    log = FakeLog()
    dispatcher, client = connected(log)
    starts, new = await dispatcher.subscribe(client.session, [("a/b", 1)])
    p = partition_of("a/b")
    early = Record(p, starts[p] - 1, 1, message("a/b", payload=b"before"))
    later = [Record(p, starts[p] + i, 1, message("a/b", payload=b"%d" % i)) for i in range(3)]
    dispatcher.dispatch([early, *later])
    assert client.received() == []
    dispatcher.activate(client.session, new)
    assert [x.payload for x in client.received()] == [b"0", b"1", b"2"]


async def test_retained_messages_once_each_at_the_highest_qos_and_none_after_a_new_start() -> None:
    log = FakeLog()
    dispatcher, client = connected(log)
    starts, new = await dispatcher.subscribe(client.session, [("r/#", 2), ("r/x", 0)])
    p = partition_of("r/x")
    before = Record(p, starts[p] - 1, 1, message("r/x", qos=2, retain=True))
    after = Record(p, starts[p], 1, message("r/y", qos=2, retain=True))
    dispatcher.deliver_retained(
        client.session, {"r/#": [before, after], "r/x": [before]}, new, starts
    )
    (publish,) = client.received()
    assert (publish.topic, publish.qos, publish.retain) == ("r/x", 2, True)


async def test_catch_up_never_drops_for_the_queue_bound_and_skips_qos_0() -> None:
    p = partition_of("d/1")
    missed = [message("d/1", qos=1, payload=b"%d" % i) for i in range(40)]
    missed.insert(5, message("d/1", qos=0, payload=b"qos0"))
    log = FakeLog({p: missed})
    dispatcher, client = connected(log, max_inflight=2, max_queued=3)
    session = client.session
    starts, _ = await dispatcher.subscribe(session, [("d/#", 1)])
    replay = asyncio.ensure_future(dispatcher.replay(session, {p: 0}, starts))
    await pump(log, replay.done, client.ack_all)
    await pump(log, lambda: not session.queue and not session.inflight, client.ack_all)
    assert replay.result() == 40
    assert [x.payload for x in client.received()] == [b"%d" % i for i in range(40)]
    assert session.dropped == 0 and dispatcher.counters.messages_dropped == 0
    assert dispatcher.counters.messages_replayed == 40
