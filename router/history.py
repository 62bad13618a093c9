"""History: a SUBSCRIBE to ``$history/<since>/<filter>`` reads what the log holds from a time on.

A history subscription is a stream of its own beside the session's plain subscriptions.  In the
index it is a :class:`HistoryView`: a session under an id of its own (the client's, U+0000 and
the filter: no client id holds U+0000 [MQTT-1.5.3-2]) whose only filter is ``<filter>``, and whose
queue, in-flight window and read rules are the client's (``owner``).  It starts *behind*: per
partition its filter's routing keys map to, at the first record stamped at or after ``<since>``
(Kafka's offsets for a time, ``KafkaLog.offsets_at``), or at the partition's start for
``earliest``.  From there the backlog catches it up as it does a returning session
(``router.backlog``): rounds through the node's one catch-up reader to where the live stream
is, handing records over only while the client's queue has room (a client reading a million
messages holds no more than its queue, starves no one, and loses none: the log is the queue),
then live, partition by partition, with no gap and no duplicate at the switch.

Unlike a returning session's, a history stream's QoS 0 messages are read back too: the history
of telemetry is what it is for.  Each message goes out on ``$history/<since>/<its topic>`` at
the lower of the subscription's QoS and its own, in log order per partition (so per topic), and
is judged by the read rules under its original topic (``mqttcore.session``).  A message whose
topic would pass 65535 bytes with the prefix cannot be sent and is counted as dropped.

Bounds (``HistoryLimits``): a client holds at most ``per_client`` history subscriptions and a
node runs at most ``per_node``; a SUBSCRIBE beyond gets 0x80 (counted), as for ``$share``.  Each
stream is a cursor of the one catch-up consumer, which offers every record it reads to each
cursor on its partition: the node bound caps that work.  ``max_age`` bounds how far back.

A persistent session stores one position per partition: the lowest of what its plain
subscriptions and its history streams still need (``Dispatcher.positions_for``).  A history
stream resumes from there, where it was; plain subscriptions of the same session may then get
again, at QoS 1/2, what they were given after that point (at least once, never lost).
"""

from __future__ import annotations

from dataclasses import dataclass

from mqttcore import topics
from mqttcore.codec import PublishTemplate
from mqttcore.message import Message
from mqttcore.session import Outbound, Session
from router.delivery import Counters, Subscriber

DEFAULT_MAX_HISTORY = 256
DEFAULT_MAX_HISTORY_PER_CLIENT = 4


@dataclass(frozen=True, slots=True)
class HistoryLimits:
    """``--history-max-age`` (seconds, 0: all the log holds), ``--max-history`` (streams per
    node) and ``--max-history-per-client``; a bound of 0 refuses every history filter."""

    max_age: float = 0.0
    per_node: int = DEFAULT_MAX_HISTORY
    per_client: int = DEFAULT_MAX_HISTORY_PER_CLIENT


def stream_id(client_id: str, history_filter: str) -> str:
    """The id a history subscription has in the index."""
    return f"{client_id}\0{history_filter}"


class HistoryView(Session):
    """One history subscription of ``owner``, as the index and the backlog see it."""

    __slots__ = ("owner", "real_filter", "since")

    def __init__(self, owner: Session, history_filter: str, since: str, real_filter: str) -> None:
        super().__init__(stream_id(owner.client_id, history_filter), owner.clean, 1, 0, 0)
        self.owner = owner
        self.since = since
        self.real_filter = real_filter

    def has_room(self) -> bool:
        return self.owner.has_room()

    def half_empty(self) -> bool:
        return self.owner.half_empty()


class HistoryFeed:
    """Hands a history stream's messages to the client's connection, under their history topic.
    For a UTC time, only messages stamped from then on: Kafka's offset for a time is the first
    record stamped at or after it, and a record after it may still carry an earlier time (two
    nodes' clocks), or the time may be still to come (the stream then starts live)."""

    __slots__ = ("counters", "prefix", "since_ms", "subscriber")

    def __init__(self, subscriber: Subscriber, since: str, counters: Counters) -> None:
        self.subscriber = subscriber
        self.prefix = f"{topics.HISTORY_PREFIX}{since}/"
        self.counters = counters
        self.since_ms = (topics.history_start_ms(since, 0) or 0) if since.endswith("Z") else 0

    def deliver(self, out: Outbound) -> None:
        m = out.message
        if m.timestamp_ms < self.since_ms:
            return
        message = Message(
            self.prefix + m.topic, m.payload, m.qos, m.retain, m.client_id, m.origin_node,
            m.timestamp_ms, m.message_id,
        )  # fmt: skip
        try:
            template = PublishTemplate(message.topic, message.payload, out.qos)
        except ValueError:  # the topic with the prefix passes 65535 bytes
            self.counters.messages_dropped += 1
            return
        self.subscriber.deliver(
            Outbound(message, out.qos, False, template, 0, False, out.partition, out.offset)
        )

    def stream_failed(self, error: BaseException) -> None:
        self.subscriber.stream_failed(error)


def start_time(since: str, now_ms: int, max_age: float) -> int | None:
    """The time (ms) a history subscription reads from: ``since``, but not more than
    ``max_age`` seconds back (0: as far as the log goes); None: the log's start."""
    start = topics.history_start_ms(since, now_ms)
    if not max_age:
        return start
    bound = now_ms - int(max_age * 1000)
    return bound if start is None or start < bound else start
