"""Intake coupled to delivery (``frontend.intake``): free on a node whose loop is on time, whoever
is behind; on a saturated node with a client behind, no more PUBLISHes taken in than messages
delivered (plus a slack), a held connection resumed as deliveries come, or after ``MAX_HOLD``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from frontend.intake import LATE, MAX_HOLD, SLACK, TICK, Intake


async def eventually(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Return once ``condition()`` holds, looked at every millisecond; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"still waiting for {what} after {timeout:g} s"
        await asyncio.sleep(0.001)


class Reader:
    """A connection with PUBLISHes held back."""

    def __init__(self) -> None:
        self.resumed = 0

    def resume_intake(self) -> None:
        self.resumed += 1


class Node:
    """What the intake reads of a node: whether a client is behind, what was delivered."""

    def __init__(self, late: float = LATE) -> None:
        self.behind = True
        self.delivered = 0
        self.intake = Intake(lambda: self.behind, lambda: self.delivered, late)


def admitted(intake: Intake, reader: Reader, most: int = 10 * SLACK) -> int:
    """PUBLISHes the reader may handle now, one after the other (``most`` at most)."""
    n = 0
    while n < most and intake.admits(reader):
        n += 1
    return n


async def saturate(node: Node) -> None:
    """Turns of the loop longer than ``LATE`` until the intake couples to delivery."""

    def long_turn() -> bool:
        time.sleep(LATE + TICK)  # the node has no CPU to spare: its loop runs late
        return node.intake.coupled

    await eventually(long_turn, "the intake to couple", timeout=5.0)


async def test_a_node_on_time_takes_in_freely_however_far_a_client_is_behind() -> None:
    node, reader = Node(late=1.0), Reader()  # no tick a second late: on a shared test machine,
    # a 5 ms timer is sometimes 10 ms late without the node being saturated
    assert admitted(node.intake, reader) == 10 * SLACK  # the first look arms the watch
    ticks_run = time.monotonic() + 10 * TICK
    await eventually(lambda: time.monotonic() > ticks_run, "ten ticks on time")
    assert not node.intake.coupled
    assert admitted(node.intake, reader) == 10 * SLACK and not node.intake.waiting


async def test_a_saturated_node_takes_in_what_it_delivers() -> None:
    node, reader = Node(), Reader()
    admitted(node.intake, reader, 1)
    await saturate(node)
    assert admitted(node.intake, reader) == SLACK
    assert reader in node.intake.waiting and node.intake.holds == 1
    node.delivered += 10
    await eventually(lambda: reader.resumed == 1, "the held reader resumed")
    assert admitted(node.intake, reader) == 10
    assert node.intake.holds == 2


async def test_a_held_connection_waits_max_hold_at_most() -> None:
    node, reader = Node(), Reader()
    admitted(node.intake, reader, 1)
    await saturate(node)
    admitted(node.intake, reader)
    held = time.monotonic()
    await eventually(lambda: reader.resumed == 1, "the held reader resumed without deliveries")
    assert time.monotonic() - held >= MAX_HOLD - TICK
    assert admitted(node.intake, reader) == SLACK


async def test_intake_is_free_again_once_no_client_is_behind() -> None:
    node, reader = Node(), Reader()
    admitted(node.intake, reader, 1)
    await saturate(node)
    admitted(node.intake, reader)
    node.behind = False
    await eventually(lambda: reader.resumed == 1, "the held reader resumed")
    assert not node.intake.coupled
    assert admitted(node.intake, reader) == 10 * SLACK
    await eventually(lambda: node.intake._timer is None, "the watch to stop")


async def test_a_closed_connection_waits_no_more() -> None:
    node, reader = Node(), Reader()
    admitted(node.intake, reader, 1)
    await saturate(node)
    admitted(node.intake, reader)
    node.intake.forget(reader)
    node.behind = False
    await eventually(lambda: node.intake._timer is None, "the watch to stop")
    assert reader.resumed == 0


async def test_the_watch_stops_at_the_first_tick_no_publish_came_before() -> None:
    node, reader = Node(late=1.0), Reader()
    assert node.intake.admits(reader)  # a client is behind: the watch starts
    assert node.intake._timer is not None
    await eventually(lambda: node.intake._timer is None, "the watch to stop", timeout=1.0)
    assert node.intake.admits(reader) and node.intake._timer is not None  # and starts again


class Publisher(Reader):
    """A connection with PUBLISHes always waiting: resumed, it takes what the intake admits."""

    def __init__(self, intake: Intake) -> None:
        super().__init__()
        self.intake = intake
        self.taken = 0

    def resume_intake(self) -> None:
        super().resume_intake()
        self.taken += admitted(self.intake, self)


async def test_the_held_connections_take_the_grants_in_turn() -> None:
    node = Node()
    first, second, third = (Publisher(node.intake) for _ in range(3))
    admitted(node.intake, first, 1)
    await saturate(node)
    for publisher in (first, second, third):
        publisher.taken += admitted(node.intake, publisher)
    assert [p.taken for p in (first, second, third)] == [SLACK, 0, 0]
    for delivered in range(1, 7):  # one credit at a time, each to the next held connection
        node.delivered += 1
        await eventually(
            lambda n=delivered: first.taken + second.taken + third.taken == SLACK + n,
            "the credit taken",
        )
    assert [p.taken for p in (first, second, third)] == [SLACK + 2, 2, 2]
