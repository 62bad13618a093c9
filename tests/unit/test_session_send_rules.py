"""What a session sends is judged when it is sent, and what it queues is bounded in bytes.

The read rules (``Session.permissions``, the channel's) are asked as each PUBLISH is made: taken
live, drained from the queue, resent after a reconnect.  A message refused then is never sent and
is done, as if acknowledged.  The queue takes messages while the bytes it holds are under
``max_queued_bytes`` (one may cross it), exactly as it does under ``max_queued``: QoS 0 is
evicted first, and ``has_room`` says no so that QoS 1/2 messages are read back from the log.
"""

from __future__ import annotations

from mqttcore.channel import Channel, Limits
from mqttcore.codec import Decoder, PublishTemplate, Wire, wire_bytes
from mqttcore.packets import Connect, Publish, Pubrel
from mqttcore.session import Outbound, Session, StoredSession
from router.record import wall_clock_stamps

STAMPS = wall_clock_stamps("node-1")


class Rules:
    """Read rules that can change under the session, as a reload changes an ``Access``."""

    def __init__(self, *denied: str) -> None:
        self.denied = set(denied)
        self.refused: list[str] = []

    def may_read(self, topic: str) -> bool:
        if topic in self.denied:
            self.refused.append(topic)
            return False
        return True


class Message:
    """An outbound message that records whether it was completed (``done``)."""

    def __init__(self, topic: str, qos: int, payload: bytes = b"x") -> None:
        message = STAMPS.message(topic, payload, qos, False, "publisher")
        self.out = Outbound(message, qos, False, PublishTemplate(topic, payload, qos))
        self.done = False
        self.out.on_done = self._done

    def _done(self) -> None:
        self.done = True


def topics(chunks: list[Wire]) -> list[str]:
    sent = [p for data in chunks for p in Decoder().feed(wire_bytes(data))]
    assert all(isinstance(p, Publish) for p in sent), sent
    return [p.topic for p in sent if isinstance(p, Publish)]


def test_a_message_refused_when_taken_is_done_and_never_sent() -> None:
    session, rules = Session("c", clean=False), Rules("a/secret")
    session.permissions = rules
    refused = Message("a/secret", 1)
    assert session.deliver(refused.out, online=True) is None
    assert refused.done and not session.inflight and not session.queue
    assert rules.refused == ["a/secret"]


def test_a_queued_message_is_judged_again_when_it_is_drained() -> None:
    session, rules = Session("c", clean=False, max_inflight=1), Rules()
    session.permissions = rules
    first, secret, last = Message("a/1", 1), Message("a/secret", 1), Message("a/2", 1)
    assert session.deliver(first.out, online=True) is not None
    assert session.deliver(secret.out, online=True) is None  # queued: the window is full
    assert session.deliver(last.out, online=True) is None
    rules.denied.add("a/secret")  # a reload while they wait
    assert topics(session.puback(first.out.packet_id)) == ["a/2"]  # a/secret done, not sent
    assert secret.done and not last.done
    assert [o.message.topic for o in session.inflight.values()] == ["a/2"]
    assert session.queued_bytes == 0


def test_a_queued_qos0_message_is_judged_again_when_it_is_drained() -> None:
    session, rules = Session("c", clean=False), Rules()
    session.permissions = rules
    secret, fine = Message("a/secret", 0), Message("a/fine", 0)
    session.deliver(secret.out, online=True, writable=False)
    session.deliver(fine.out, online=True, writable=False)
    rules.denied.add("a/secret")
    assert topics(session.drain()) == ["a/fine"]
    assert secret.done and fine.done


def test_resume_resends_only_what_may_be_read_now_and_every_pubrel() -> None:
    stored = StoredSession({}, {}, [], [], 0)
    secret, fine, released = Message("a/secret", 1), Message("a/fine", 1), Message("a/secret", 2)
    for packet_id, m in enumerate((secret, fine, released), 1):
        m.out.packet_id = packet_id
    released.out.released = True  # PUBREC came: only a PUBREL is owed, no message
    session = Session("c", clean=False)
    session.restore_inflight(stored, [secret.out, fine.out, released.out])
    changes = session.changes
    session.permissions = Rules("a/secret")
    sent = [p for data in session.resume() for p in Decoder().feed(wire_bytes(data))]
    assert sent == [
        Publish("a/fine", b"x", 1, retain=False, dup=True, packet_id=2),
        Pubrel(3),
    ]
    assert secret.done and not fine.done
    assert sorted(session.inflight) == [2, 3]
    assert session.changes > changes  # the store sees the window without it


def test_the_channel_gives_the_session_its_read_rules() -> None:
    channel = Channel(STAMPS, Limits())
    channel.handle_in(Connect("c", clean_session=False))
    session, rules = Session("c", clean=False), Rules()
    channel.session_opened(session, False, rules)  # type: ignore[arg-type]
    assert session.permissions is rules


# -- the byte bound ---------------------------------------------------------------------------


def test_the_queue_takes_messages_while_its_bytes_are_under_the_bound() -> None:
    session = Session("c", clean=False, max_inflight=1, max_queued=1000, max_queued_bytes=300)
    assert session.deliver(Message("t", 1, b"0" * 99).out, online=True) is not None  # in flight
    queued = [Message("t", 1, b"q" * 99) for _ in range(3)]
    for m in queued[:2]:
        assert session.has_room()
        session.deliver(m.out, online=True)
    assert session.queued_bytes == 200 and session.has_room()
    session.deliver(queued[2].out, online=True)  # crosses the bound: taken
    assert session.queued_bytes == 300 and not session.has_room()
    assert not session.half_empty()
    late = Message("t", 1, b"late")
    session.deliver(late.out, online=True)  # a sender that did not ask: dropped, counted
    assert late.done and session.dropped == 1 and len(session.queue) == 3
    session.puback(1)  # one leaves the queue for the window
    assert session.queued_bytes == 200 and session.has_room() and not session.half_empty()
    session.puback(2)
    assert session.queued_bytes == 100 and session.half_empty()


def test_qos0_is_evicted_first_when_the_bytes_are_full() -> None:
    session = Session("c", clean=False, max_inflight=1, max_queued=1000, max_queued_bytes=200)
    session.deliver(Message("t", 1).out, online=True)  # fills the window
    small = [Message("t", 0, b"z" * 49) for _ in range(4)]
    for m in small:
        session.deliver(m.out, online=True, writable=False)  # a backed-up socket: queued
    assert session.queued_bytes == 200
    big = Message("t", 2, b"B" * 119)
    session.deliver(big.out, online=True, writable=False)  # the oldest QoS 0 makes way
    assert [m.done for m in small] == [True, False, False, False]
    assert session.dropped == 1
    assert [o.qos for o in session.queue] == [0, 0, 0, 2]
    assert session.queued_bytes == 150 + 120  # under the bound, so it crosses it
    again = Message("t", 1, b"!")
    session.deliver(again.out, online=True, writable=False)  # over: QoS 0 go until under
    assert session.dropped == 3 and [o.qos for o in session.queue] == [0, 2, 1]
    assert session.queued_bytes == 50 + 120 + 2


def test_a_message_larger_than_the_bound_is_taken_by_an_empty_queue() -> None:
    session = Session("c", clean=False, max_inflight=1, max_queued_bytes=10)
    session.deliver(Message("t", 1).out, online=True)
    huge = Message("t", 1, b"h" * 1000)
    assert session.has_room()
    session.deliver(huge.out, online=True)
    assert not huge.done and len(session.queue) == 1 and not session.has_room()


def test_a_shared_message_refused_when_sent_goes_to_another_member_not_acknowledged() -> None:
    session, rules = Session("c", clean=False, max_inflight=1), Rules()
    session.permissions = rules
    handed_on: list[str] = []
    first, shared = Message("g/open", 1), Message("g/secret", 1)
    shared.out.redeliver = lambda: handed_on.append(shared.out.message.topic)
    assert session.deliver(first.out, online=True) is not None
    assert session.deliver(shared.out, online=True) is None  # queued behind the window
    rules.denied.add("g/secret")  # the rules change (SIGHUP) while it waits
    assert session.puback(first.out.packet_id) == []
    assert handed_on == ["g/secret"] and not shared.done  # its group still owes it to someone
