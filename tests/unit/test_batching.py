"""router.batching: calls of one loop iteration go out together, each caller gets its own
answer or error, and one batch of a kind is in flight at a time."""

from __future__ import annotations

import asyncio

import pytest

from router.batching import Batch


class Recorder:
    """A send that records the batches it was given and answers each call with its double,
    or with an error for negative numbers; it blocks until released."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.release = asyncio.Event()

    async def send(self, calls: list[int]) -> list[int | BaseException]:
        self.batches.append(calls)
        await self.release.wait()
        return [ValueError(n) if n < 0 else 2 * n for n in calls]


async def test_calls_of_one_iteration_go_out_together_and_get_their_own_answers() -> None:
    recorder = Recorder()
    batch: Batch[int, int] = Batch(recorder.send)
    recorder.release.set()
    assert await asyncio.gather(*(batch(n) for n in range(5))) == [0, 2, 4, 6, 8]
    assert recorder.batches == [[0, 1, 2, 3, 4]]


async def test_an_error_reaches_only_its_caller() -> None:
    recorder = Recorder()
    batch: Batch[int, int] = Batch(recorder.send)
    recorder.release.set()
    answers = await asyncio.gather(batch(1), batch(-1), batch(2), return_exceptions=True)
    assert answers[0] == 2 and answers[2] == 4 and isinstance(answers[1], ValueError)


async def test_a_failed_send_fails_every_caller_of_that_batch() -> None:
    async def broken(calls: list[int]) -> list[int | BaseException]:
        raise ConnectionError("Redis went away")

    batch: Batch[int, int] = Batch(broken)
    with pytest.raises(ConnectionError):
        await asyncio.gather(batch(1), batch(2))


async def test_calls_made_while_a_batch_is_in_flight_wait_and_go_out_together() -> None:
    recorder = Recorder()
    batch: Batch[int, int] = Batch(recorder.send)
    first = asyncio.ensure_future(batch(1))
    await asyncio.sleep(0)
    await asyncio.sleep(0)  # the first batch is out, and blocked
    later = [asyncio.ensure_future(batch(n)) for n in (2, 3, 4)]
    for _ in range(3):
        await asyncio.sleep(0)
    assert recorder.batches == [[1]]  # nothing else went out meanwhile
    recorder.release.set()
    assert await first == 2 and [await f for f in later] == [4, 6, 8]
    assert recorder.batches == [[1], [2, 3, 4]]


async def test_calls_submitted_one_after_the_other_go_out_together_in_that_order() -> None:
    recorder = Recorder()
    batch: Batch[int, int] = Batch(recorder.send)
    recorder.release.set()
    first, second = batch.submit(7), batch.submit(3)  # no await between: one batch
    assert (await second, await first) == (6, 14)
    assert recorder.batches == [[7, 3]]


async def test_a_bounded_batch_takes_its_most_and_the_rest_go_in_the_next() -> None:
    recorder = Recorder()
    batch: Batch[int, int] = Batch(recorder.send, most=2)
    recorder.release.set()
    assert await asyncio.gather(*(batch(n) for n in range(5))) == [0, 2, 4, 6, 8]
    assert recorder.batches == [[0, 1], [2, 3], [4]]
