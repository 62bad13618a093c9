"""The catch-up reader: many sessions' ranges from one consumer, and the log as the queue.

A real :class:`router.catchup.CatchUp` over a fake consumer (``tests.unit.fakes``): each cursor
must get exactly the records of its ranges, in log order, once each, however the others move;
one that has no room is left where it stopped and gets the rest later.
"""

from __future__ import annotations

import asyncio

from router.catchup import CatchUp
from router.record import Record
from tests.unit.fakes import FakeConsumer, decode, message

PARTITION = [message(f"t/{i}") for i in range(30)]


def reader() -> tuple[CatchUp, FakeConsumer]:
    consumer = FakeConsumer({0: PARTITION, 1: PARTITION[:10]})
    return CatchUp(consumer, "t", 4, decode), consumer


async def serve_until(catch_up: CatchUp, *tasks: asyncio.Task[None]) -> None:
    for _ in range(1000):
        if all(t.done() for t in tasks):
            return
        catch_up._checked = 0.0
        catch_up.serve()
        await asyncio.sleep(0)
    raise AssertionError("the reads never finished")


def offsets(got: list[Record], partition: int = 0) -> list[int]:
    return [r.offset for r in got if r.partition == partition]


async def test_each_cursor_gets_exactly_its_ranges_in_log_order() -> None:
    catch_up, _ = reader()
    a: list[Record] = []
    b: list[Record] = []
    ta = asyncio.ensure_future(catch_up.read({0: (5, 20), 1: (0, 10)}, _append(a), _yes))
    tb = asyncio.ensure_future(catch_up.read({0: (12, 30)}, _append(b), _yes))
    await serve_until(catch_up, ta, tb)
    assert offsets(a) == list(range(5, 20)) and offsets(a, 1) == list(range(10))
    assert offsets(b) == list(range(12, 30))
    assert [r.message.topic for r in b] == [f"t/{i}" for i in range(12, 30)]
    assert catch_up.cursors == set()


async def test_a_cursor_without_room_waits_and_gets_the_rest_later_while_others_go_on() -> None:
    catch_up, _ = reader()
    slow: list[Record] = []
    fast: list[Record] = []
    room = {"slow": True, "refused": False}

    def take_slow(rec: Record) -> bool:
        if len(slow) == 8 and not room["refused"]:
            room["slow"], room["refused"] = False, True  # full: offer this one again later
        if not room["slow"]:
            return False
        slow.append(rec)
        return True

    ts = asyncio.ensure_future(catch_up.read({0: (0, 30)}, take_slow, lambda: room["slow"]))
    tf = asyncio.ensure_future(catch_up.read({0: (0, 30)}, _append(fast), _yes))
    await serve_until(catch_up, tf)
    assert offsets(fast) == list(range(30))
    assert offsets(slow) == list(range(8)) and not ts.done()
    room["slow"] = True
    await serve_until(catch_up, ts)
    assert offsets(slow) == list(range(30))  # nothing lost, nothing twice


async def test_a_lone_slow_cursor_resumes_where_it_stopped_without_fetching_twice() -> None:
    catch_up, consumer = reader()
    got: list[Record] = []
    room = {"open": True}

    def take(rec: Record) -> bool:
        if not room["open"]:
            return False
        got.append(rec)
        room["open"] = len(got) % 5 != 0  # full after every 5th record
        return True

    task = asyncio.ensure_future(catch_up.read({0: (0, 30)}, take, lambda: True))
    for _ in range(1000):
        if task.done():
            break
        room["open"] = True  # the client worked through its queue
        catch_up._checked = 0.0
        catch_up.serve()
        await asyncio.sleep(0)
    assert offsets(got) == list(range(30))
    assert consumer.assigns == 1 and consumer.returned == 30


async def test_a_later_cursor_with_an_earlier_start_is_read_again_from_there() -> None:
    catch_up, consumer = reader()
    first: list[Record] = []
    second: list[Record] = []
    t1 = asyncio.ensure_future(catch_up.read({0: (10, 30)}, _append(first), _yes))
    for _ in range(3):
        catch_up.serve()
        await asyncio.sleep(0)
    assert first and not t1.done()
    t2 = asyncio.ensure_future(catch_up.read({0: (2, 6)}, _append(second), _yes))
    await serve_until(catch_up, t1, t2)
    assert offsets(first) == list(range(10, 30))
    assert offsets(second) == list(range(2, 6))
    catch_up.serve()
    assert consumer.position == {}  # nothing left assigned once every cursor is done


async def test_empty_ranges_return_at_once() -> None:
    catch_up, consumer = reader()
    await catch_up.read({0: (7, 7)}, _append([]), _yes)
    assert consumer.assigns == 0


def _append(into: list[Record]):  # type: ignore[no-untyped-def]
    def take(rec: Record) -> bool:
        into.append(rec)
        return True

    return take


def _yes() -> bool:
    return True


async def test_a_replay_still_waiting_when_the_log_stops_fails_instead_of_waiting_forever() -> None:
    catch_up, _ = reader()
    got: list[Record] = []
    waiting = asyncio.ensure_future(catch_up.read({0: (0, 30)}, _append(got), lambda: False))
    catch_up.serve()  # its first records handed over; then nothing serves it any more
    await asyncio.sleep(0)
    catch_up.stop()
    await asyncio.wait_for(asyncio.wait([waiting]), 1)
    assert isinstance(waiting.exception(), ConnectionError)
    assert catch_up.cursors == set()
