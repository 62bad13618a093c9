"""Which Kafka partitions this node needs, as reference counts.

Each subscription on the node acquires the partitions its filter needs
(:meth:`router.partitioner.Router.partitions_for_filter`) and releases them when it goes.  The
table counts holders per partition and reports only the transitions the consumer must act on:

* :meth:`InterestTable.acquire` returns the partitions whose count went from 0 to 1 (to assign);
* :meth:`InterestTable.release` returns those whose count went from 1 to 0 (to unassign).

Invariants: every count is positive (a partition at zero is absent); :meth:`assigned` is exactly
the set of partitions with a positive count; releasing a partition not held raises
:class:`ValueError` and changes nothing.  Pure: no consumer calls happen here.
"""

from __future__ import annotations

from collections.abc import Iterable


class InterestTable:
    """Reference counts of partition interest on one node."""

    __slots__ = ("_counts",)

    def __init__(self) -> None:
        self._counts: dict[int, int] = {}

    def acquire(self, partitions: Iterable[int]) -> set[int]:
        """Count one more holder of each partition; return those newly needed."""
        counts = self._counts
        fresh: set[int] = set()
        for partition in partitions:
            held = counts.get(partition, 0)
            counts[partition] = held + 1
            if held == 0:
                fresh.add(partition)
        return fresh

    def release(self, partitions: Iterable[int]) -> set[int]:
        """Count one holder less of each partition; return those no longer needed."""
        wanted = list(partitions)
        self._check_held(wanted)
        counts = self._counts
        freed: set[int] = set()
        for partition in wanted:
            held = counts[partition] - 1
            if held:
                counts[partition] = held
            else:
                del counts[partition]
                freed.add(partition)
        return freed

    def assigned(self) -> frozenset[int]:
        """The partitions with at least one holder."""
        return frozenset(self._counts)

    def count(self, partition: int) -> int:
        """How many holders ``partition`` has (0 if none)."""
        return self._counts.get(partition, 0)

    def _check_held(self, partitions: list[int]) -> None:
        demand: dict[int, int] = {}
        for partition in partitions:
            demand[partition] = demand.get(partition, 0) + 1
        for partition, n in demand.items():
            if self._counts.get(partition, 0) < n:
                raise ValueError(f"partition {partition} released more often than acquired")
