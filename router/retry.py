"""Riding out a leader election or a short Kafka outage: what is retried, for how long, counted.

A broker that restarts, or a partition whose leader moves, answers for some seconds with errors
that mean "not now": no leader yet ("Failed to query partition leaders: No leaders found", code
``_NOENT``, from a ListOffsets asked while no partition has a leader), not the leader, an unknown
partition while metadata is rebuilt, a timeout, a broken connection.  Every read the node makes
for its clients rides these out: the watermark queries (``router.log.Watermarks``), the live and
the catch-up consumer (``router.reader``, ``router.catchup``).  An attempt that fails so is made
again after a backoff growing from ``BACKOFF_FIRST`` to ``BACKOFF_MAX``, and every retry is
counted by what was retried (``/metrics``: ``headwater_kafka_retries_total{what}``).

**The one bound: ``OUTAGE_SECONDS``.**  A client is closed for the log only when its node cannot
serve it at all: a watermark query still failing, or a catch-up cursor that could take records
still getting none, ``OUTAGE_SECONDS`` after it began (the connection is then closed, its stored
positions kept: the next connection, perhaps to a node that reaches Kafka, reads on from there).
60 s because: a single broker killed and started again took 10-25 s here from the kill to its
first acknowledged write (JVM start, log recovery, KRaft election), and longer with the CPU
shared; a leader moving within a cluster takes the controller's broker session timeout (9 s by
default) plus the election; and the producer gives up on a PUBLISH after 30 s
(``--kafka-delivery-timeout-ms``'s default), closing its publisher.  Twice that without an
answer is an outage an operator sees (``/ready`` says "Kafka is not writable"), not an election.
An error that is not transient (an unknown topic at start, an authorization failure) is raised at
once, never retried.

**What never waits on a broker: a consumer's close** (:func:`close_aside`).  A close can wait
on a broker that stops answering (a stalled JVM, a network partition: SIGSTOP shows it), as
librdkafka's synchronous commit of the former share-group consumers did, which held a draining
node's event loop for good (``tests/integration/test_drain_faults.py``).  It runs in a daemon
thread of its own, never on the loop nor in its executor (whose shutdown ``asyncio.run`` waits
for without a bound): whoever awaits it bounds the wait, and the process exits whether or not it
returned.  A relay's thread (``router.relays``), which closes its own consumer, tells the loop it
ended the same way (:func:`settle_from_thread`).

**What never runs inside a consumer's close: a rebalance callback** (:func:`leave_group`).  A
subscribed consumer leaves its group (its rebalance events served by ``poll``) before
``close()``: a rebalance event that ``close()`` serves after librdkafka's group handler ended
blocks in confluent-kafka with the GIL held, so every thread of the process, for good.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException

log = logging.getLogger("headwater.log")

T = TypeVar("T")

OUTAGE_SECONDS = 60.0
"""How long the node rides out Kafka not answering a read before it closes the client waiting
for it (module docstring: why 60)."""

BACKOFF_FIRST = 0.05
"""Seconds before the first retry; each further one waits twice as long..."""

BACKOFF_MAX = 2.0
"""...up to this: a broker that is back is asked again within 2 s."""

ATTEMPT_SECONDS = 10.0
"""Seconds one request may take (librdkafka's request timeout): a bound is overrun by at most
this, the attempt under way when it passes."""

_TRANSIENT = frozenset({
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError.REQUEST_TIMED_OUT,
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.FENCED_LEADER_EPOCH,
    KafkaError.UNKNOWN_LEADER_EPOCH,
    KafkaError.OFFSET_NOT_AVAILABLE,
    KafkaError._NOENT,  # ListOffsets: "Failed to query partition leaders: No leaders found"
    KafkaError._TRANSPORT,
    KafkaError._TIMED_OUT,
    KafkaError._ALL_BROKERS_DOWN,
    KafkaError._WAIT_COORD,
})  # fmt: skip
"""Errors a leader election or a moment's outage explains: worth asking again."""


def transient(exc: BaseException) -> bool:
    """Whether ``exc`` is a Kafka error that asking again later may cure."""
    if not isinstance(exc, KafkaException):
        return False
    error = exc.args[0] if exc.args else None
    if not isinstance(error, KafkaError) or error.fatal():
        return False
    return error.retriable() or error.code() in _TRANSIENT


class Retries:
    """How many times each kind of read was made again (``what``: ``watermarks``, ``live``,
    ``catch_up``, ``fetch``); one addition per retry, read by ``/metrics``."""

    __slots__ = ("counts",)

    KINDS = ("watermarks", "live", "catch_up", "fetch")

    def __init__(self) -> None:
        self.counts: dict[str, int] = dict.fromkeys(self.KINDS, 0)

    def count(self, what: str, n: int = 1) -> None:
        self.counts[what] += n


class Backoff:
    """The pause before the next attempt of one kind of call that failed: ``BACKOFF_FIRST``,
    doubling up to ``BACKOFF_MAX``, back to the first after a success.  For the consumers,
    which the pump asks every turn: a failing one is not asked again before ``until``."""

    __slots__ = ("delay", "until")

    def __init__(self) -> None:
        self.delay = BACKOFF_FIRST
        self.until = 0.0
        """``time.monotonic()`` before which the call is not made again (0: no pause)."""

    def failed(self, now: float) -> float:
        """Pause after a failure at ``now``; the seconds paused."""
        paused = self.delay
        self.until = now + paused
        self.delay = min(paused * 2, BACKOFF_MAX)
        return paused

    def succeeded(self) -> None:
        self.delay, self.until = BACKOFF_FIRST, 0.0


async def retried(
    what: str,
    attempt: Callable[[], Awaitable[T]],
    retries: Retries,
    bound: float = OUTAGE_SECONDS,
) -> T:
    """``attempt()``'s answer, asked again with a backoff while it fails transiently; once
    ``bound`` seconds have passed (and at most one attempt's ``ATTEMPT_SECONDS`` more), or on
    any other error, the error is raised."""
    deadline = time.monotonic() + bound
    backoff = Backoff()
    while True:
        try:
            return await attempt()
        except KafkaException as exc:
            now = time.monotonic()
            if not transient(exc) or now + backoff.delay >= deadline:
                raise
            if backoff.delay == BACKOFF_FIRST:
                log.warning("%s: %s; retrying for up to %.0f s", what, exc, deadline - now)
            retries.count(what)
            await asyncio.sleep(backoff.failed(now))


def close_aside(consumer: Consumer) -> asyncio.Future[None]:
    """Close ``consumer`` in a daemon thread of its own; done once it is closed (module
    docstring: never on the loop nor in its executor)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def close() -> None:
        try:
            consumer.close()
        except (KafkaException, RuntimeError) as exc:
            log.warning("closing a consumer failed: %s", exc)
        finally:
            settle_from_thread(loop, done)

    threading.Thread(target=close, name="headwater-consumer-close", daemon=True).start()
    return done


LEAVE_SECONDS = 1.0
"""Seconds :func:`leave_group` serves a leaving consumer's rebalance events at most (all of them
are local to librdkafka: a stalled broker does not slow them)."""


def leave_group(consumer: Consumer, bound: float = LEAVE_SECONDS) -> None:
    """Leave ``consumer``'s group and serve every rebalance event it has or gets for that
    (``poll``: the records it returns are dropped, never committed), so that its ``close()``
    has none left to serve.  Call it, then ``close()``, from the consumer's one thread; only for
    a subscribed consumer (one assigned by hand keeps its assignment: this would wait ``bound``).

    Why: confluent-kafka runs a rebalance callback holding the GIL, and after the Python
    callback it asks librdkafka's group handler (``rd_kafka_rebalance_protocol``, then
    ``rd_kafka_assign``) with no timeout.  ``close()`` serves the events still queued; one that
    the group handler no longer waits for (an assignment made while the consumer's thread was
    not polling, a revocation after a session timeout) can be served after the handler has
    terminated, which drops the request unanswered: the call never returns, and no Python
    thread runs again (a draining node froze so, ``tests/integration/test_drain_faults.py``;
    py-spy showed ``Consumer_close`` -> ``Consumer_rebalance_cb`` ->
    ``rd_kafka_rebalance_protocol``).  Served here, before ``close()``, every event is answered
    by a live handler; unsubscribed and unassigned, the group makes no new one."""
    failed: list[str] = []
    try:
        consumer.unsubscribe()
    except (KafkaException, RuntimeError) as exc:
        failed.append(str(exc))
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        try:  # a callback's error is raised by poll: the events after it are served all the same
            if consumer.poll(0.05) is None and not consumer.assignment():
                break
        except (KafkaException, RuntimeError) as exc:
            failed.append(str(exc))
    if failed:
        log.warning("leaving a consumer group: %s", "; ".join(dict.fromkeys(failed)))


def settle_from_thread(loop: asyncio.AbstractEventLoop, done: asyncio.Future[None]) -> None:
    """Settle ``done``, a future of ``loop``, from another thread: what a thread the loop
    never joins does when it ends (the loop waits on the future, with a bound of its own)."""
    with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
        loop.call_soon_threadsafe(_settle, done)


def _settle(done: asyncio.Future[None]) -> None:
    if not done.done():
        done.set_result(None)
