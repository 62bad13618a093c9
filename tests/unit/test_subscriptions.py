"""The subscription index's matching: what a topic's subscribers are, kept per topic between
records, stays true to every subscribe, unsubscribe, pending state and start offset.  Over a
fake of our log (``tests.unit.fakes``), no Kafka."""

from __future__ import annotations

from mqttcore.session import Session
from router import subscriptions
from router.partitioner import Router
from router.record import Record
from router.subscriptions import Subscriptions
from tests.unit.fakes import FakeLog, message

ROUTER = Router(4, 1)


def record(topic: str, offset: int, qos: int = 1) -> Record:
    return Record(ROUTER.route(topic)[0], offset, 1, message(topic, qos=qos))


async def subscribed(
    index: Subscriptions, client_id: str, filters: list[tuple[str, int]]
) -> Session:
    session = Session(client_id, clean=True)
    _, new = await index.add(session, filters)
    index.activate(client_id, new)
    return session


async def test_a_topic_matched_again_sees_each_later_subscribe_and_unsubscribe() -> None:
    index = Subscriptions(FakeLog(), ROUTER)  # type: ignore[arg-type]
    a = await subscribed(index, "a", [("s/1", 1)])
    assert index.match(record("s/1", 0)) == {"a": 1}
    b = await subscribed(index, "b", [("s/+", 0), ("#", 2)])
    assert index.match(record("s/1", 1)) == {"a": 1, "b": 2}
    await index.add(a, [("s/1", 0)])  # a new QoS for a filter held: not pending
    assert index.match(record("s/1", 2)) == {"a": 0, "b": 2}
    index.remove(b, ["#"])
    assert index.match(record("s/1", 3)) == {"a": 0, "b": 0}
    index.remove(a, ["s/1"])
    index.remove(b, ["s/+"])
    assert index.match(record("s/1", 4)) == {}


async def test_a_pending_subscription_waits_and_then_is_matched_from_its_start() -> None:
    log = FakeLog()
    index = Subscriptions(log, ROUTER)  # type: ignore[arg-type]
    await subscribed(index, "a", [("t", 1)])
    assert index.match(record("t", 0)) == {"a": 1}
    p = ROUTER.route("t")[0]
    index.dispatched[p] = 1
    log.partitions[p] = [message("t")] * 5  # the high watermark: 5
    session = Session("b", clean=True)
    starts, new = await index.add(session, [("t", 0)])
    assert starts[p] == 5
    assert index.match(record("t", 1)) == {"a": 1}  # "b" pending: the record waits for it
    assert index.match(record("t", 5)) == {"a": 1}
    index.activate("b", new)
    assert index.match(record("t", 2)) == {"a": 1}  # before b's start
    index.dispatched[p] = 5
    assert index.match(record("t", 5)) == {"a": 1, "b": 0}
    assert index.match(record("t", 6)) == {"a": 1, "b": 0}  # its start passed: kept as a plain one


async def test_what_is_kept_stays_bounded_whatever_the_topics() -> None:
    index = Subscriptions(FakeLog(), ROUTER)  # type: ignore[arg-type]
    await subscribed(index, "a", [("t/#", 0)])
    many = subscriptions.MATCHED_TOPICS + 10
    for i in range(many):  # half matched by "a", half by nobody: each a topic of its own
        topic = f"t/{i}" if i % 2 else f"u/{i}"
        assert index.match(record(topic, i)) == ({"a": 0} if i % 2 else {})
    assert 0 < len(index._matched) <= subscriptions.MATCHED_TOPICS
    assert index.match(record("t/" + "x" * 70_000, many)) == {"a": 0}
    assert all(len(topic) <= subscriptions.MATCHED_TOPIC_LENGTH for topic in index._matched)
