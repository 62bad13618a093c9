"""One client's MQTT session state (section 4.1), pure: no I/O, no clock.

A session outlives connections when the client connected with cleanSession=0.  It holds:

* ``subscriptions``: topic filter -> granted QoS;
* ``inflight``: outbound QoS 1/2 messages sent but not completed, keyed by packet id, in the order
  they were first sent (dict order), each either awaiting PUBACK/PUBREC (``released`` false) or,
  for QoS 2, awaiting PUBCOMP after our PUBREL (``released`` true);
* ``queue``: messages waiting for a free in-flight slot or for a backed-up socket to drain, or
  for an offline client to come back (QoS 1/2 only: QoS 0 is not queued for a client that is
  away, as Mosquitto does by default);
* ``awaiting_rel``: inbound QoS 2 packet ids whose PUBLISH went to the log but whose PUBREL has
  not arrived, so a DUP resend is acknowledged again but never published twice [MQTT-4.3.3-2].

Invariants: at most ``max_inflight`` messages are in flight; a packet id is in ``inflight`` at most
once and never 0; ``queue`` holds at most ``max_queued`` messages, and takes one more only while
the bytes it holds (payload and topic, ``queued_bytes``) are under ``max_queued_bytes`` (so at most
that bound plus one message); when full a QoS 0 message is dropped before any QoS 1/2 one
(``dropped`` counts every message lost that way).  Packet ids are allocated from 1 upwards in a
new session and skip those still in use [MQTT-2.3.1-2].

Every PUBLISH leaves through ``permissions.may_read`` at the moment its bytes are made: taken
live, drained from the queue, or resent after a reconnect; a history delivery is judged by the
topic it was published on.  A message the rules refuse then is never sent and leaves the session
as if the client had acknowledged it (``done``), so rules changed while it waited (a reload)
apply to it.  A PUBREL is no message and is always resent.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Protocol

from mqttcore import topics
from mqttcore.codec import PublishTemplate, Wire, encode
from mqttcore.message import Message
from mqttcore.packets import Pubrel

MAX_PACKET_ID = 65535
DEFAULT_MAX_INFLIGHT = 32
"""Outbound QoS 1/2 messages in flight per session: see ``Limits``."""
DEFAULT_MAX_QUEUED = 1000
"""Messages a session's queue takes: see ``Limits``."""
DEFAULT_MAX_QUEUED_BYTES = 16 * 1024 * 1024
"""Bytes (payload and topic) a session's queue takes messages up to: see ``Limits``."""


class ReadPermission(Protocol):
    """Whether the client may be sent a message on ``topic`` now (``frontend.auth.Access``)."""

    def may_read(self, topic: str) -> bool: ...


class _ReadAnything:
    def may_read(self, topic: str) -> bool:
        return True


READ_ANYTHING = _ReadAnything()

_NO_IDS: frozenset[int] = frozenset()


@dataclass(slots=True, init=False)
class Outbound:
    """One application message on its way to this session's client (its own ``__init__``: see
    ``mqttcore.message.Message``)."""

    message: Message
    qos: int
    retain: bool
    template: PublishTemplate
    packet_id: int
    released: bool
    partition: int
    offset: int
    """Where the message is in the log (-1: not from the log's live stream)."""
    on_done: Callable[[], None] | None
    """Called once the client has acknowledged the message (shared subscriptions commit then)."""
    redeliver: Callable[[], None] | None
    """Hands the message to another member if this client leaves without acknowledging it."""

    def __init__(
        self,
        message: Message,
        qos: int,
        retain: bool,
        template: PublishTemplate,
        packet_id: int = 0,
        released: bool = False,
        partition: int = -1,
        offset: int = -1,
    ) -> None:
        self.message = message
        self.qos = qos
        self.retain = retain
        self.template = template
        self.packet_id = packet_id
        self.released = released
        self.partition = partition
        self.offset = offset
        self.on_done = None
        self.redeliver = None

    def done(self) -> None:
        if self.on_done is not None:
            on_done, self.on_done = self.on_done, None
            on_done()

    def first_send(self) -> Wire:
        return self.template.to_wire(self.packet_id or None, False, self.retain)

    def resend(self) -> Wire:
        """The packet that resumes this message's flow after a reconnect [MQTT-4.4.0-1]."""
        if self.released:
            return encode(Pubrel(self.packet_id))
        return self.template.to_wire(self.packet_id, True, self.retain)


@dataclass(slots=True)
class StoredOutbound:
    """An in-flight message as a session store keeps it: a copy of its log record."""

    record: bytes
    qos: int
    retain: bool
    packet_id: int
    released: bool
    partition: int = -1
    offset: int = -1


@dataclass(slots=True)
class StoredSession:
    """What outlives a connection of a cleanSession=0 client.

    The messages a client missed are not here: ``positions`` says, per partition of the log,
    where its subscriptions' stream resumes; the log itself holds the messages.  Only the
    in-flight window (at most ``max_inflight`` messages) is kept as copies, because the client
    may be owed a PUBLISH (DUP=1) or a PUBREL for each.
    """

    subscriptions: dict[str, int]
    positions: dict[int, int]
    inflight: list[StoredOutbound]
    awaiting_rel: list[int]
    last_id: int = 0
    live_on: str = ""
    """While the session is live on a node: that node's id.  ``positions`` are then a lower
    bound, and the node's delivery checkpoint (numbered after ``live_since``) may be a later
    one; empty once the session was released with exact positions."""
    live_since: int = 0
    """The sequence number of ``live_on``'s last checkpoint when the session went live there:
    only a checkpoint numbered above it covers this session."""


class Session:
    """The state of one client identifier's session."""

    __slots__ = (
        "_last_id",
        "_queue",
        "_queued_qos0",
        "awaiting_rel",
        "changes",
        "clean",
        "client_id",
        "dropped",
        "inflight",
        "max_inflight",
        "max_queued",
        "max_queued_bytes",
        "permissions",
        "queued_bytes",
        "subscriptions",
    )

    def __init__(
        self,
        client_id: str,
        clean: bool,
        max_inflight: int = DEFAULT_MAX_INFLIGHT,
        max_queued: int = DEFAULT_MAX_QUEUED,
        max_queued_bytes: int = DEFAULT_MAX_QUEUED_BYTES,
    ) -> None:
        self.client_id = client_id
        self.clean = clean
        self.max_inflight = max_inflight
        self.max_queued = max_queued
        self.max_queued_bytes = max_queued_bytes
        self.queued_bytes = 0
        self.permissions: ReadPermission = READ_ANYTHING  # the channel's (``session_opened``)
        self.subscriptions: dict[str, int] = {}
        self.inflight: dict[int, Outbound] = {}
        self._queue: deque[Outbound] | None = None
        """Made when first needed: an empty deque takes 760 bytes, and most sessions of an
        idle fleet never queue."""
        self.awaiting_rel: AbstractSet[int] = _NO_IDS
        """A set from the first inbound QoS 2 message on (an empty one takes 216 bytes)."""
        self.dropped = 0
        self.changes = 0
        """Counts changes of the in-flight window: what a store must see again when it moved."""
        self._last_id = 0
        self._queued_qos0 = 0

    # -- outbound ---------------------------------------------------------------------------

    @property
    def queue(self) -> Sequence[Outbound]:
        """Messages waiting, oldest first."""
        return self._queue or ()

    def may_read(self, topic: str) -> bool:
        """Whether the client may be sent a message of ``topic`` now: the read rules its
        channel gave (asked again at each send, so a reload's rules hold at once), judging a
        history delivery by the topic it was published on."""
        return self.permissions.may_read(topics.original_topic(topic))

    def deliver(self, out: Outbound, online: bool, writable: bool = True) -> Wire | None:
        """Take a message for the client: the bytes to send now, or None (queued, or refused).

        ``online`` false: the client is away (QoS 0 is dropped, QoS 1/2 queued).  ``writable``
        false: it is connected but its socket is backed up, so the message waits in the queue,
        where the bound evicts QoS 0 first."""
        if not self.may_read(out.message.topic):
            _refuse(out)
            return None
        if not online:
            if out.qos > 0:
                self._enqueue(out)
            else:
                self.dropped += 1
                out.done()
            return None
        if writable and not self._queue:
            if out.qos == 0:
                out.done()
                return out.first_send()
            if len(self.inflight) < self.max_inflight:
                return self._send_inflight(out)
        self._enqueue(out)
        return None

    def has_room(self) -> bool:
        """True while a message from the log can be taken without the bound dropping one."""
        if self._queue:
            room = len(self._queue) < max(self.max_queued, 1)
            return room and self.queued_bytes < self.max_queued_bytes
        return len(self.inflight) < self.max_inflight or self.max_queued > 0  # bytes bound >= 1

    def half_empty(self) -> bool:
        """True once a full queue has drained to half of both bounds: when a refused sender may
        come back."""
        half = self.queued_bytes <= self.max_queued_bytes // 2
        return not self._queue or (half and len(self._queue) <= self.max_queued // 2)

    def puback(self, packet_id: int) -> list[Wire]:
        """A PUBACK from the client completes a QoS 1 flow; frees a slot for queued messages."""
        out = self.inflight.get(packet_id)
        if out is not None and out.qos == 1:
            self._complete(out)
        return self.drain()

    def pubrec(self, packet_id: int) -> bytes:
        """A PUBREC from the client: answer PUBREL and await PUBCOMP [MQTT-4.3.3-1]."""
        out = self.inflight.get(packet_id)
        if out is not None and out.qos == 2 and not out.released:
            out.released = True
            self.changes += 1
        return encode(Pubrel(packet_id))

    def pubcomp(self, packet_id: int) -> list[Wire]:
        out = self.inflight.get(packet_id)
        if out is not None and out.qos == 2 and out.released:
            self._complete(out)
        return self.drain()

    def _complete(self, out: Outbound) -> None:
        del self.inflight[out.packet_id]
        self.changes += 1
        out.done()

    def drain(self) -> list[Wire]:
        """Send queued messages while the in-flight window has room; those the read rules
        refuse now are done, not sent."""
        sent: list[Wire] = []
        queue = self._queue
        while queue:
            head = queue[0]
            if head.qos > 0 and len(self.inflight) >= self.max_inflight:
                break
            queue.popleft()
            self.queued_bytes -= _size(head)
            self._queued_qos0 -= head.qos == 0
            if not self.may_read(head.message.topic):
                _refuse(head)
            elif head.qos > 0:
                sent.append(self._send_inflight(head))
            else:
                head.done()
                sent.append(head.first_send())
        return sent

    def resume(self) -> list[Wire]:
        """What a resumed session sends first: every in-flight message again, DUP=1, in order
        (those the read rules refuse now are done instead), then the queue."""
        sent: list[Wire] = []
        for out in list(self.inflight.values()):
            if out.released or self.may_read(out.message.topic):
                sent.append(out.resend())
            else:
                del self.inflight[out.packet_id]
                self.changes += 1
                _refuse(out)
        return sent + self.drain()

    def _send_inflight(self, out: Outbound) -> Wire:
        out.packet_id = self._allocate_id()
        self.inflight[out.packet_id] = out
        self.changes += 1
        return out.first_send()

    def _enqueue(self, out: Outbound) -> None:
        if self._queue is None:
            self._queue = deque()
        while len(self._queue) >= self.max_queued or self.queued_bytes >= self.max_queued_bytes:
            if not self._evict_qos0():
                self.dropped += 1
                out.done()
                return
        self._queue.append(out)
        self.queued_bytes += _size(out)
        self._queued_qos0 += out.qos == 0

    def _evict_qos0(self) -> bool:
        if not self._queued_qos0:
            return False  # the common case under overload of QoS 1/2: no scan
        assert self._queue is not None
        for i, queued in enumerate(self._queue):
            if queued.qos == 0:
                del self._queue[i]
                self._queued_qos0 -= 1
                self.queued_bytes -= _size(queued)
                self.dropped += 1
                queued.done()
                return True
        return False

    def _allocate_id(self) -> int:
        candidate = self._last_id
        for _ in range(MAX_PACKET_ID):
            candidate = candidate % MAX_PACKET_ID + 1
            if candidate not in self.inflight:
                self._last_id = candidate
                return candidate
        raise RuntimeError("no free packet identifier")  # max_inflight < 65535 prevents this

    # -- inbound QoS 2 ----------------------------------------------------------------------

    def unfinished(self) -> list[Outbound]:
        """Messages the client has not acknowledged: in flight, then queued."""
        return [*self.inflight.values(), *self.queue]

    def snapshot(
        self, positions: dict[int, int], encode_record: Callable[[Outbound], bytes]
    ) -> StoredSession:
        """The state to store; queued messages from the log are left to ``positions``."""
        inflight = [
            StoredOutbound(
                encode_record(o), o.qos, o.retain, o.packet_id, o.released, o.partition, o.offset
            )
            for o in self.inflight.values()
        ]
        return StoredSession(
            dict(self.subscriptions), positions, inflight, sorted(self.awaiting_rel), self._last_id
        )

    def restore_inflight(self, stored: StoredSession, outbound: list[Outbound]) -> None:
        """Take back the in-flight window and QoS 2 state of a stored session."""
        for out in outbound:
            self.inflight[out.packet_id] = out
        self.awaiting_rel = set(stored.awaiting_rel)
        self._last_id = stored.last_id

    def settled(self) -> bool:
        """Nothing in flight and nothing queued."""
        return not self.inflight and not self._queue

    def queued_from_log(self) -> dict[int, int]:
        """Per partition, the lowest offset of a queued message from the log (not yet sent) that
        is read again if the client goes: QoS 1/2, and a history stream's QoS 0 too."""
        lowest: dict[int, int] = {}
        for out in self.queue:
            kept = out.qos > 0 or out.message.topic.startswith(topics.HISTORY_PREFIX)
            live = out.offset >= 0 and not out.retain and kept
            if live and out.offset < lowest.get(out.partition, out.offset + 1):
                lowest[out.partition] = out.offset
        return lowest

    def receive_qos2(self, packet_id: int, dup: bool) -> bool:
        """Record an inbound QoS 2 PUBLISH; False if it is a resend to acknowledge only.

        Only a DUP=1 PUBLISH can be a resend [MQTT-3.3.1-1].  A DUP=0 one with an id still
        marked is a new message: the client may reuse an id once it got PUBCOMP
        [MQTT-2.3.1-3], and our PUBCOMP may have gone out before the mark was cleared."""
        if dup and packet_id in self.awaiting_rel:
            return False
        if isinstance(self.awaiting_rel, set):
            self.awaiting_rel.add(packet_id)
        else:
            self.awaiting_rel = {packet_id}
        return True

    def release_qos2(self, packet_id: int) -> None:
        if isinstance(self.awaiting_rel, set):
            self.awaiting_rel.discard(packet_id)


def _size(out: Outbound) -> int:
    """What a queued message counts against ``max_queued_bytes``: its payload and topic (the
    topic's characters, its bytes for the ASCII topics of a fleet)."""
    return len(out.message.payload) + len(out.message.topic)


def _refuse(out: Outbound) -> None:
    """A message the read rules refuse at the moment it would be sent (the rules count it): a
    shared one goes to another member of its group, any other is as good as delivered."""
    if out.redeliver is not None:
        out.redeliver()
    else:
        out.done()
