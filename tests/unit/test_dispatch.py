"""The dispatcher: one QoS rule for live, retained and catch-up delivery; catch-up obeys the
queue bound.  Over fakes of our own interfaces (``tests.unit.fakes``), no Kafka."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from mqttcore.codec import PublishTemplate
from mqttcore.message import Message
from mqttcore.session import Outbound, Session
from router.delivery import delivery_qos
from router.dispatch import Dispatcher
from router.history import start_time
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
    found = {"r/#": [before, after], "r/x": [before]}

    async def scan(topic_filter: str) -> AsyncIterator[list[Record]]:
        yield found[topic_filter]

    await dispatcher.deliver_retained(client.session, ["r/#", "r/x"], new, starts, scan)
    (publish,) = client.received()
    assert (publish.topic, publish.qos, publish.retain) == ("r/x", 2, True)


async def test_retained_batches_are_delivered_as_they_come_once_each() -> None:
    log = FakeLog()
    dispatcher, client = connected(log)
    filters = [("s/#", 0), ("s/+", 1)]
    starts, new = await dispatcher.subscribe(client.session, filters)
    p = partition_of("s/x")
    stored = [Record(p, starts[p] - 10 + i, 1, message(f"s/{i}", qos=1)) for i in range(5)]
    seen_before: list[int] = []

    async def scan(topic_filter: str) -> AsyncIterator[list[Record]]:
        for first in (0, 3):  # two batches, each delivered before the next is read
            seen_before.append(len(client.received()))
            yield stored[first : first + 3]

    await dispatcher.deliver_retained(client.session, ["s/#", "s/+"], new, starts, scan)
    assert seen_before == [0, 3, 5, 5]  # the second filter's batches: nothing more to send
    expected = [(f"s/{i}", 1, True) for i in range(5)]  # once, at the highest granted QoS
    assert [(x.topic, x.qos, x.retain) for x in client.received()] == expected


async def test_catch_up_never_drops_for_the_queue_bound_and_skips_qos_0() -> None:
    p = partition_of("d/1")
    missed = [message("d/1", qos=1, payload=b"%d" % i) for i in range(40)]
    missed.insert(5, message("d/1", qos=0, payload=b"qos0"))
    log = FakeLog({p: missed})
    dispatcher, client = connected(log, max_inflight=2, max_queued=3)
    session = client.session
    await dispatcher.resume(session, [("d/#", 1)], {p: 0})
    await pump(log, lambda: not dispatcher.is_behind(session), client.ack_all)
    await pump(log, session.settled, client.ack_all)
    assert [x.payload for x in client.received()] == [b"%d" % i for i in range(40)]
    assert session.dropped == 0 and dispatcher.counters.messages_dropped == 0
    assert dispatcher.counters.messages_replayed == 40


class Live:
    """A partition the log holds and the dispatcher reads live: ``publish`` appends records
    and dispatches them, as the reader would."""

    def __init__(self, log: FakeLog, dispatcher: Dispatcher, topic: str) -> None:
        self.topic = topic
        self.partition = partition_of(topic)
        self.records = log.partitions.setdefault(self.partition, [])
        self.dispatcher = dispatcher

    def publish(self, count: int, qos: int = 1) -> None:
        first = len(self.records)
        for i in range(first, first + count):
            self.records.append(message(self.topic, qos=qos, payload=b"%d" % i))
        self.dispatcher.dispatch(
            [Record(self.partition, o, 1, self.records[o]) for o in range(first, len(self.records))]
        )


async def subscribed_to_live(**limits: int) -> tuple[FakeLog, Dispatcher, FakeClient, Live]:
    """A client subscribed to ``d/#`` at QoS 1, and the live partition of ``d/1``."""
    log = FakeLog()
    dispatcher, client = connected(log, **limits)
    _, new = await dispatcher.subscribe(client.session, [("d/#", 1)])
    dispatcher.activate(client.session, new)
    return log, dispatcher, client, Live(log, dispatcher, "d/1")


async def test_a_full_queue_reads_on_from_the_log_and_goes_live_again_without_gap_or_dup() -> None:
    log, dispatcher, client, live = await subscribed_to_live(max_inflight=2, max_queued=3)
    session = client.session
    live.publish(20)  # 2 in flight and 3 queued: the 6th finds the queue full
    assert dispatcher.is_behind(session) and dispatcher.counters.fell_behind == 1
    assert len(session.queue) == 3
    live.publish(20)  # not queued: read from the log later
    assert len(session.queue) == 3
    await pump(log, lambda: not dispatcher.is_behind(session), client.ack_all)
    await pump(log, session.settled, client.ack_all)
    live.publish(5)  # live again: straight to the client (2 in flight, 3 queued)
    assert not dispatcher.is_behind(session) and len(session.queue) == 3
    await pump(log, session.settled, client.ack_all)
    assert [x.payload for x in client.received()] == [b"%d" % i for i in range(45)]
    assert session.dropped == 0 and dispatcher.counters.messages_dropped == 0
    assert dispatcher.counters.messages_replayed == 35


async def test_qos_0_is_dropped_and_counted_while_a_client_is_behind() -> None:
    log, dispatcher, client, live = await subscribed_to_live(max_inflight=1, max_queued=1)
    session = client.session
    live.publish(3)  # one in flight, one queued, the third read later
    live.publish(4, qos=0)
    assert dispatcher.counters.messages_dropped == 4
    await pump(log, lambda: not dispatcher.is_behind(session), client.ack_all)
    await pump(log, session.settled, client.ack_all)
    assert [x.payload for x in client.received()] == [b"0", b"1", b"2"]


async def test_a_slow_client_that_never_catches_up_keeps_its_place_in_the_log() -> None:
    _, dispatcher, client, live = await subscribed_to_live(max_inflight=1, max_queued=2)
    session = client.session
    live.publish(10)
    # it received 0 (in flight) and has 1, 2 queued: the stream resumes at 1 if it goes now
    assert dispatcher.positions_for(session) == {live.partition: 1}
    client.ack_all()  # 1 goes out; 2 and nothing more queued: its place is 1 (in flight)
    assert dispatcher.positions_for(session) == {live.partition: 2}


async def test_records_that_waited_for_a_new_subscription_are_read_back_if_the_queue_fills() -> (
    None
):
    log = FakeLog()
    dispatcher, client = connected(log, max_inflight=1, max_queued=1)
    session = client.session
    live = Live(log, dispatcher, "d/1")
    live.publish(2, qos=0)  # before the SUBSCRIBE: never for this client
    _, new = await dispatcher.subscribe(session, [("d/#", 1)])
    live.publish(6)  # buffered while the subscription is pending
    dispatcher.activate(session, new)  # one in flight, one queued, the rest from the log
    assert dispatcher.is_behind(session)
    await pump(log, lambda: not dispatcher.is_behind(session) and session.settled(), client.ack_all)
    assert [x.payload for x in client.received()] == [b"%d" % i for i in range(2, 8)]


async def test_a_client_behind_rejoins_the_live_stream_while_it_never_stands_still() -> None:
    log, dispatcher, client, live = await subscribed_to_live(max_inflight=4, max_queued=4)
    session = client.session
    live.publish(20)  # 4 in flight and 4 queued: the 9th finds the queue full
    assert dispatcher.is_behind(session)

    def steady_traffic() -> None:  # a record every round: no round ends at the live edge
        client.ack_all()
        live.publish(1)

    await pump(log, lambda: not dispatcher.is_behind(session), steady_traffic)
    replayed = dispatcher.counters.messages_replayed
    live.publish(3)  # live again: straight to the client, not read back
    await pump(log, session.settled, client.ack_all)
    assert dispatcher.counters.messages_replayed == replayed
    assert [x.payload for x in client.received()] == [b"%d" % i for i in range(len(live.records))]


async def test_qos_1_subscribers_of_a_large_message_share_its_payload_not_a_copy() -> None:
    log = FakeLog()
    dispatcher, first = connected(log, "first")
    second = FakeClient(Session("second", clean=False))
    dispatcher.attach(second.session, second)
    second.session.deliver(Outbound(*_warm_up()), online=True)  # packet ids 2 and 1 from here
    p = partition_of("big/1")
    for client in (first, second):
        starts, new = await dispatcher.subscribe(client.session, [("big/+", 1)])
        dispatcher.activate(client.session, new)
    big = message("big/1", qos=1, payload=bytes(range(256)) * 64)  # 16 KB
    dispatcher.dispatch([Record(p, starts[p], 1, big)])
    (head_1, payload_1), (head_2, payload_2) = first.wire[-1], second.wire[-1]
    assert payload_1 is big.payload and payload_2 is big.payload  # one object, not copies
    assert head_1[:-2] == head_2[:-2] and head_1[-2:] == b"\0\1" and head_2[-2:] == b"\0\2"
    assert [p.payload for p in first.received()] == [big.payload]


def _warm_up() -> tuple[Message, int, bool, PublishTemplate]:
    warm = message("warm/up", qos=1)
    return warm, 1, False, PublishTemplate(warm.topic, warm.payload, 1)


# -- history streams (router.history) ------------------------------------------------------------

SINCE = "1970-01-01T00:00:05Z"
"""5,000 ms after the epoch: the records below are stamped 1,000 ms apart from 1,000."""


async def with_history(**limits: int) -> tuple[FakeLog, Dispatcher, FakeClient, Live]:
    """A client subscribed to ``d/#`` and to ``$history/<SINCE>/d/#`` (both QoS 1), over ten
    QoS 1 records of ``d/1`` stamped 1 to 10 s after the epoch, the first four before SINCE."""
    log = FakeLog()
    dispatcher, client = connected(log, **limits)
    live = Live(log, dispatcher, "d/1")
    for i in range(10):
        live.records.append(replace(message("d/1", payload=b"%d" % i), timestamp_ms=1000 * (i + 1)))
    _, new = await dispatcher.subscribe(client.session, [("d/#", 1), (f"$history/{SINCE}/d/#", 1)])
    dispatcher.activate(client.session, new)
    return log, dispatcher, client, live


async def test_a_history_stream_reads_from_its_time_then_goes_live_with_no_gap_or_duplicate() -> (
    None
):
    log, dispatcher, client, live = await with_history(max_inflight=2, max_queued=2)
    session = client.session
    assert dispatcher.is_behind(session)
    await pump(log, lambda: not dispatcher.is_behind(session), client.ack_all)
    live.publish(3)  # live now for both subscriptions: one copy each
    await pump(log, session.settled, client.ack_all)
    got = [(x.topic, int(x.payload)) for x in client.received()]
    history = [n for topic, n in got if topic == f"$history/{SINCE}/d/1"]
    plain = [n for topic, n in got if topic == "d/1"]
    assert history == [4, 5, 6, 7, 8, 9, 10, 11, 12]
    assert plain == [10, 11, 12]
    assert session.dropped == 0 and dispatcher.counters.messages_dropped == 0
    assert dispatcher.client_count == 1 and dispatcher.subscription_count == 2


async def test_history_keeps_qos_0_messages_while_the_queue_is_full() -> None:
    log = FakeLog()
    dispatcher, client = connected(log, max_inflight=1, max_queued=1)
    live = Live(log, dispatcher, "d/1")
    live.publish(6, qos=0)
    _, new = await dispatcher.subscribe(client.session, [("$history/earliest/d/1", 1)])
    dispatcher.activate(client.session, new)
    await pump(log, lambda: not dispatcher.is_behind(client.session), client.ack_all)
    live.publish(4, qos=0)  # live, past a full queue: read back from the log, not dropped
    await pump(log, lambda: len(client.received()) == 10, client.ack_all)
    assert [int(x.payload) for x in client.received()] == list(range(10))
    assert {x.qos for x in client.received()} == {0}
    assert dispatcher.counters.messages_dropped == 0


async def test_a_session_is_stored_where_its_history_stream_is() -> None:
    log, dispatcher, client, live = await with_history(max_inflight=1, max_queued=1)
    session = client.session
    # d/# is live at 10; the history stream has 4 in flight and 5 queued (its place: 4).
    assert dispatcher.positions_for(session) == {live.partition: 4}
    await pump(log, lambda: not dispatcher.is_behind(session), client.ack_all)
    await pump(log, session.settled, client.ack_all)
    assert dispatcher.positions_for(session) == {live.partition: 10}


async def test_unsubscribing_or_leaving_ends_the_history_stream() -> None:
    log, dispatcher, client, _ = await with_history()
    session = client.session
    dispatcher.unsubscribe(session, [f"$history/{SINCE}/d/#"])
    assert dispatcher.history_streams == 0 and not dispatcher.is_behind(session)
    assert list(session.subscriptions) == ["d/#"]
    dispatcher.unsubscribe(session, ["d/#"])
    assert log.reader.assigned() == []  # no stream needs the partition any more
    _, new = await dispatcher.subscribe(session, [(f"$history/{SINCE}/d/#", 1)])
    dispatcher.activate(session, new)
    dispatcher.detach(session, client)
    assert dispatcher.history_streams == 0 and dispatcher.client_count == 0
    assert log.reader.assigned() == []


def test_history_max_age_bounds_how_far_back() -> None:
    now = 1_800_000_000_000
    assert start_time("earliest", now, 0) is None  # all the log holds
    assert start_time("earliest", now, 60) == now - 60_000
    assert start_time("10m", now, 60) == now - 60_000
    assert start_time("30s", now, 60) == now - 30_000
    assert start_time("1970-01-01T00:00:01Z", now, 0) == 1_000


async def test_a_history_subscribe_the_log_cannot_answer_leaves_nothing_behind() -> None:
    log = FakeLog()
    dispatcher, client = connected(log)

    async def no_answer(partitions: object, time_ms: int) -> dict[int, int]:
        raise ConnectionError("Kafka is away")

    log.offsets_at = no_answer  # type: ignore[method-assign]
    with pytest.raises(ConnectionError):
        await dispatcher.subscribe(client.session, [("$history/10m/d/#", 1)])
    assert client.session.subscriptions == {} and log.reader.assigned() == []
    dispatcher.detach(client.session, client)
    assert dispatcher.history_streams == 0


async def test_a_utc_start_gives_only_messages_stamped_from_then_on() -> None:
    log = FakeLog()
    dispatcher, client = connected(log)
    live = Live(log, dispatcher, "d/1")
    stamps = [1000, 6000, 4000, 7000]  # the third from a node whose clock is behind
    for i, stamp in enumerate(stamps):
        live.records.append(replace(message("d/1", payload=b"%d" % i), timestamp_ms=stamp))
    _, new = await dispatcher.subscribe(client.session, [(f"$history/{SINCE}/d/#", 1)])
    dispatcher.activate(client.session, new)
    await pump(log, lambda: not dispatcher.is_behind(client.session), client.ack_all)
    assert [int(x.payload) for x in client.received()] == [1, 3]


async def test_a_resumed_history_stream_does_not_send_again_what_is_resent_in_flight() -> None:
    p = partition_of("d/1")
    log = FakeLog({p: [message("d/1", payload=b"%d" % i) for i in range(5)]})
    dispatcher, client = connected(log)
    session = client.session
    topic = "$history/earliest/d/1"
    in_flight = replace(log.partitions[p][2], topic=topic)  # restored from the store
    template = PublishTemplate(topic, in_flight.payload, 1)
    session.inflight[1] = Outbound(in_flight, 1, False, template, 1, False, p, 2)
    await dispatcher.resume(session, [("$history/earliest/d/#", 1), ("d/#", 1)], {p: 2})
    await pump(log, lambda: not dispatcher.is_behind(session), lambda: None)  # nothing acked
    got = sorted((x.topic, int(x.payload)) for x in client.received())
    assert got == [(topic, 3), (topic, 4), ("d/1", 2), ("d/1", 3), ("d/1", 4)]


# -- a partition whose every holder is behind is read once: by the catch-up alone -------------


def publish(log: FakeLog, topic: str, count: int, qos: int = 1) -> None:
    """``count`` more records on ``topic``'s partition, numbered on from those there."""
    held = log.partitions.setdefault(partition_of(topic), [])
    held += [message(topic, qos=qos, payload=b"%d" % (len(held) + i)) for i in range(count)]


async def test_a_partition_whose_only_holder_is_behind_is_read_once_then_live_again() -> None:
    log = FakeLog()
    dispatcher, client = connected(log, max_inflight=2, max_queued=3)
    session, p, reader = client.session, partition_of("d/1"), log.reader
    _, new = await dispatcher.subscribe(session, [("d/#", 1)])
    dispatcher.activate(session, new)
    publish(log, "d/1", 20)
    reader.serve_live(dispatcher.dispatch)  # 2 in flight, 3 queued: the 6th finds it full
    assert dispatcher.is_behind(session) and reader.is_paused(p)
    publish(log, "d/1", 3000)  # the live read stands still: nothing dispatched
    assert reader.serve_live(dispatcher.dispatch) == 0

    def ack_and_read_live() -> None:
        client.ack_all()
        reader.serve_live(dispatcher.dispatch)

    await pump(log, lambda: not dispatcher.is_behind(session), ack_and_read_live)
    assert not reader.is_paused(p)
    publish(log, "d/1", 5)  # live again: straight to the client
    reader.serve_live(dispatcher.dispatch)
    await pump(log, session.settled, client.ack_all)
    assert [x.payload for x in client.received()] == [b"%d" % i for i in range(3025)]
    # each record read once: the first 20 and the last 5 live, the 3,000 between by the catch-up
    assert dispatcher.counters.records_dispatched == 25
    assert dispatcher.counters.messages_replayed >= 3000


async def slow_and_fast() -> tuple[FakeLog, Dispatcher, FakeClient, FakeClient]:
    """Two subscribers of ``d/#``: a slow one at QoS 1 (1 in flight, 1 queued), one at QoS 0."""
    log = FakeLog()
    dispatcher, slow = connected(log, max_inflight=1, max_queued=1)
    fast = FakeClient(Session("fast", clean=True))
    dispatcher.attach(fast.session, fast)
    for client, qos in ((slow, 1), (fast, 0)):
        _, new = await dispatcher.subscribe(client.session, [("d/#", qos)])
        dispatcher.activate(client.session, new)
    return log, dispatcher, slow, fast


async def test_a_live_holder_keeps_the_partition_read_live() -> None:
    log, dispatcher, slow, fast = await slow_and_fast()
    publish(log, "d/1", 10)
    log.reader.serve_live(dispatcher.dispatch)
    assert dispatcher.is_behind(slow.session)
    assert not log.reader.is_paused(partition_of("d/1"))  # the QoS 0 subscriber is live
    publish(log, "d/1", 10)
    assert log.reader.serve_live(dispatcher.dispatch) == 10
    assert [x.payload for x in fast.received()] == [b"%d" % i for i in range(20)]


async def test_a_new_subscription_resumes_a_paused_partition() -> None:
    log = FakeLog()
    dispatcher, slow = connected(log, max_inflight=1, max_queued=1)
    _, new = await dispatcher.subscribe(slow.session, [("d/#", 1)])
    dispatcher.activate(slow.session, new)
    publish(log, "d/1", 10)
    log.reader.serve_live(dispatcher.dispatch)
    assert log.reader.is_paused(partition_of("d/1"))
    late = FakeClient(Session("late", clean=True))
    dispatcher.attach(late.session, late)
    _, new = await dispatcher.subscribe(late.session, [("d/1", 1)])
    assert not log.reader.is_paused(partition_of("d/1"))
    dispatcher.activate(late.session, new)
    publish(log, "d/1", 3)  # after its SUBACK: the live read gives it these
    log.reader.serve_live(dispatcher.dispatch)
    assert [x.payload for x in late.received()] == [b"10", b"11", b"12"]


async def test_a_partition_found_with_a_live_holder_is_looked_at_again_only_later() -> None:
    log, dispatcher, _, fast = await slow_and_fast()
    p = partition_of("d/1")
    publish(log, "d/1", 10)
    log.reader.serve_live(dispatcher.dispatch)  # walked: the QoS 0 subscriber is live
    dispatcher.unsubscribe(fast.session, ["d/#"])
    publish(log, "d/1", 10)
    log.reader.serve_live(dispatcher.dispatch)
    assert not log.reader.is_paused(p)  # not walked again so soon (a storm has thousands)
    dispatcher.backlog._looked.clear()  # LOOK_AGAIN has passed
    publish(log, "d/1", 10)
    log.reader.serve_live(dispatcher.dispatch)
    assert log.reader.is_paused(p)
