"""The node-wide budget on buffered bytes (``frontend.buffers``): spent past its limit, readers
wait and are resumed under the low mark, transport backlogs are read again, pauses counted."""

from __future__ import annotations

import asyncio

from frontend.buffers import RECHECK, Budget


class Reader:
    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        self.paused = False

    def update_reading(self) -> None:
        """What a connection does with the budget after each read (``update_reading``)."""
        self.paused = self.budget.spent()
        if self.paused:
            self.budget.wait(self)


class Output:
    """A transport's write buffer, as ``_Output`` counts it."""

    def __init__(self, budget: Budget, size: int) -> None:
        self.budget = budget
        self.size = size
        self.backlog = 0

    def recount(self) -> int:
        change, self.backlog = self.size - self.backlog, self.size
        if self.backlog and change > 0:
            self.budget.backlogged.add(self)
        return change


async def test_readers_pause_past_the_limit_and_resume_under_the_low_mark() -> None:
    budget = Budget(1000)
    readers = [Reader(budget) for _ in range(3)]
    budget.change(1000)
    readers[0].update_reading()
    assert not readers[0].paused, "at the limit is not past it"
    budget.change(1)
    for reader in readers[:2]:
        reader.update_reading()
    assert [r.paused for r in readers] == [True, True, False]  # the third has not read since
    assert budget.pauses == 1
    budget.change(-200)  # 801: over the low mark (750) still
    assert readers[0].paused and budget.spent()
    budget.change(-100)
    assert not any(r.paused for r in readers) and not budget.waiting
    assert budget.pauses == 1 and budget.paused_seconds > 0


async def test_a_drained_transport_backlog_resumes_reading_without_a_write() -> None:
    budget = Budget(1000)
    output = Output(budget, 1500)
    budget.change(output.recount())
    reader = Reader(budget)
    reader.update_reading()
    assert reader.paused
    output.size = 0  # the client read it all: no callback tells the node
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20 * RECHECK
    while reader.paused and loop.time() < deadline:
        await asyncio.sleep(RECHECK / 2)
    assert not reader.paused and budget.held == 0
    assert not budget.backlogged


async def test_a_stale_backlog_is_read_again_before_the_budget_is_spent() -> None:
    budget = Budget(1000)
    output = Output(budget, 900)
    budget.change(output.recount())
    output.size = 100  # drained meanwhile
    budget.change(200)  # 1100 as counted, 300 in truth
    reader = Reader(budget)
    reader.update_reading()
    assert not reader.paused and budget.held == 300 and budget.pauses == 0
