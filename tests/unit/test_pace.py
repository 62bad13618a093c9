"""Which of the log's two producers records go to (``router.log.Pace``): the lingering one
while the node writes more than ``BUSY_RATE`` records a second, the other again below
``QUIET_RATE``, a quiet spell counted as such."""

from __future__ import annotations

from router.log import BUSY_RATE, PACE_WINDOW, QUIET_RATE, Pace


def feed(pace: Pace, rate: float, seconds: float, start: float) -> tuple[bool, float]:
    """Records at ``rate`` a second for ``seconds``, in 1 ms iterations; the last answer."""
    now, batching = start, pace.batching
    for _ in range(round(seconds * 1000)):
        now += 0.001
        batching = pace.count(round(rate / 1000), now)
    return batching, now


def test_a_busy_node_lingers_and_a_quiet_one_sends_at_once() -> None:
    pace = Pace()
    batching, now = feed(pace, BUSY_RATE / 2, 1.0, 0.0)
    assert not batching  # 1000 records a second: every PUBACK as soon as Kafka answers
    batching, now = feed(pace, BUSY_RATE * 2, 2 * PACE_WINDOW, now)
    assert batching
    batching, now = feed(pace, (BUSY_RATE + QUIET_RATE) / 2, 1.0, now)
    assert batching  # between the two rates: it stays as it is
    batching, now = feed(pace, QUIET_RATE / 2, 2 * PACE_WINDOW, now)
    assert not batching


def test_the_first_record_after_a_quiet_spell_goes_at_once() -> None:
    pace = Pace()
    batching, now = feed(pace, BUSY_RATE * 4, 0.5, 0.0)
    assert batching
    assert not pace.count(50, now + 3.0)  # 50 records after 3 s of none: a quiet window


def test_a_busy_spells_last_records_do_not_outlive_the_quiet_after_it() -> None:
    pace = Pace()
    batching, now = feed(pace, BUSY_RATE * 4, 3.5 * PACE_WINDOW, 0.0)  # ends mid-window
    assert batching
    assert not pace.count(1, now + 4 * PACE_WINDOW)
