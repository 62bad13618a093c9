"""Reference counts of partition interest."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from router.interest import InterestTable


def test_first_acquire_and_last_release_are_reported() -> None:
    table = InterestTable()
    assert table.acquire([1, 2]) == {1, 2}
    assert table.acquire([2, 3]) == {3}
    assert table.assigned() == {1, 2, 3}
    assert table.release([2]) == set()
    assert table.release([1, 2]) == {1, 2}
    assert table.assigned() == {3}
    assert table.release([3]) == {3}
    assert table.assigned() == frozenset()


def test_acquire_accepts_any_iterable() -> None:
    table = InterestTable()
    assert table.acquire(frozenset(range(4))) == {0, 1, 2, 3}
    assert table.acquire(iter([0, 0])) == set()
    assert table.count(0) == 3
    assert table.count(9) == 0


def test_repeated_partition_in_one_call_counts_twice() -> None:
    table = InterestTable()
    assert table.acquire([5, 5]) == {5}
    assert table.release([5]) == set()
    assert table.release([5]) == {5}


def test_releasing_an_unheld_partition_raises_and_changes_nothing() -> None:
    table = InterestTable()
    table.acquire([1])
    with pytest.raises(ValueError):
        table.release([1, 2])
    with pytest.raises(ValueError):
        table.release([1, 1])
    assert table.count(1) == 1
    assert table.assigned() == {1}
    assert table.release(iter([1])) == {1}
    with pytest.raises(ValueError):
        table.release([1])


partition_sets = st.lists(st.integers(min_value=0, max_value=7), max_size=6)


@given(st.lists(st.tuples(st.booleans(), partition_sets), max_size=40))
def test_table_agrees_with_a_counter(ops: list[tuple[bool, list[int]]]) -> None:
    table = InterestTable()
    model: Counter[int] = Counter()
    for is_acquire, partitions in ops:
        before = {p for p, n in model.items() if n > 0}
        if is_acquire:
            model.update(partitions)
            after = {p for p, n in model.items() if n > 0}
            assert table.acquire(partitions) == after - before
        elif all(model[p] >= n for p, n in Counter(partitions).items()):
            model.subtract(partitions)
            after = {p for p, n in model.items() if n > 0}
            assert table.release(partitions) == before - after
        else:
            with pytest.raises(ValueError):
                table.release(partitions)
        assert table.assigned() == {p for p, n in model.items() if n > 0}
