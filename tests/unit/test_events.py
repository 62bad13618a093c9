"""Client events as records: topic, metadata and the JSON payload of docs/log.md."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

from frontend import events
from frontend.auth.acl import Access
from frontend.events import Events
from mqttcore.message import Message, MessageStamps
from router import record

NOW = 1_795_710_131_042


class FakeLog:
    """Takes what is produced (or refuses it, ``full``)."""

    def __init__(self) -> None:
        self.records: list[tuple[Message, str]] = []
        self.full = False

    def produce_quiet(self, messages: Sequence[Message], kind: str) -> int:
        if self.full:
            return 0
        self.records.extend((message, kind) for message in messages)
        return len(messages)


def make(enabled: bool = True) -> tuple[Events, FakeLog]:
    log = FakeLog()
    stamps = MessageStamps("node1", lambda: 0, b"\0" * 8)
    return Events(stamps, log, enabled, clock_ms=lambda: NOW, flush_after=0), log


def only(log: FakeLog) -> tuple[Message, dict[str, Any]]:
    [(message, kind)] = log.records
    assert kind == record.EVENT
    assert (message.qos, message.retain, message.origin_node) == (0, False, "node1")
    assert message.timestamp_ms == NOW
    body = json.loads(message.payload.decode())
    assert message.topic == f"$events/{body['event']}"
    assert message.client_id == body["client_id"]
    return message, body


def common(event: str, client_id: str = "dev1", username: str | None = None) -> dict[str, Any]:
    return {"event": event, "client_id": client_id, "username": username, "node": "node1",
            "timestamp": NOW}  # fmt: skip


def test_connected() -> None:
    sink, log = make()
    sink.connected("dev1", "alice", clean_session=True)
    assert only(log)[1] == {**common("connected", username="alice"), "clean_session": True}


def test_disconnected_reasons() -> None:
    for reason in events.REASONS:
        sink, log = make()
        sink.disconnected("dev1", None, reason)
        assert only(log)[1] == {**common("disconnected"), "reason": reason}


def test_subscribed_and_unsubscribed() -> None:
    sink, log = make()
    sink.subscribed("dev1", None, [("plant/#", 1), ("a/+/b", 0)])
    assert only(log)[1] == {
        **common("subscribed"),
        "filters": [{"filter": "plant/#", "qos": 1}, {"filter": "a/+/b", "qos": 0}],
    }
    sink, log = make()
    sink.unsubscribed("dev1", None, ("plant/#",))
    assert only(log)[1] == {**common("unsubscribed"), "filters": ["plant/#"]}


def test_session_expired() -> None:
    sink, log = make()
    sink.session_expired("dev1")
    assert only(log)[1] == common("session_expired")


def test_strings_are_escaped_and_utf8() -> None:
    sink, log = make()
    awkward = 'quote" back\\slash \n tab\t \x01 é ✓ 🚀'
    sink.connected(awkward, awkward, clean_session=False)
    sink.subscribed(awkward, None, [(awkward, 2)])
    for message, _ in log.records:
        body = json.loads(message.payload.decode("utf-8"))
        assert body["client_id"] == awkward == message.client_id
    assert json.loads(log.records[0][0].payload)["username"] == awkward
    assert json.loads(log.records[1][0].payload)["filters"] == [{"filter": awkward, "qos": 2}]


def test_a_record_of_the_log_format() -> None:
    """What the node writes reads back through the log's codec, kind header included."""
    sink, log = make()
    sink.disconnected("dev1", "u", events.KEEP_ALIVE_TIMEOUT)
    message, _ = log.records[0]
    assert record.decode(record.encode(message)) == message
    assert (record.KIND_HEADER, b"event") in record.headers(message, record.EVENT)


def test_off_writes_nothing_and_a_full_producer_is_counted() -> None:
    sink, log = make(enabled=False)
    sink.connected("dev1", None, clean_session=True)
    sink.disconnected("dev1", None, events.CLIENT_DISCONNECT)
    sink.subscribed("dev1", None, [("a", 0)])
    sink.unsubscribed("dev1", None, ["a"])
    sink.session_expired("dev1")
    assert log.records == [] and sink.written == 0
    sink, log = make()
    log.full = True
    sink.connected("dev1", None, clean_session=True)
    assert (sink.written, sink.lost) == (0, 1)


def test_no_client_may_publish_to_events() -> None:
    """[MQTT-4.7.2-1] keeps ``#`` subscribers away; publishing there is refused outright."""
    holder = SimpleNamespace(generation=0, acl=None, denied_publishes=0, denied_subscriptions=0,
                             denied_reads=0)  # no acl_file: everything else allowed  # fmt: skip
    access = Access(holder, "dev1", None)
    assert not access.may_publish("$events/connected")
    assert access.may_publish("events/connected")


async def test_events_wait_to_go_together_and_close_hands_them_over() -> None:
    log = FakeLog()
    sink = Events(MessageStamps("node1", lambda: 0, b"\0" * 8), log, flush_after=0.05)
    sink.connected("a", None, clean_session=True)
    sink.connected("b", None, clean_session=True)
    assert log.records == []  # not yet: they go together
    await eventually(lambda: len(log.records) == 2)
    assert [m.client_id for m, _ in log.records] == ["a", "b"] and sink.written == 2
    sink.disconnected("a", None, events.NODE_DRAIN)
    sink.close()  # a node's drain: what waits goes now, nothing after
    sink.disconnected("b", None, events.NODE_DRAIN)
    assert [m.client_id for m, _ in log.records] == ["a", "b", "a"]


async def test_a_reload_switches_events_and_what_waits_still_goes() -> None:
    log = FakeLog()
    sink = Events(MessageStamps("node1", lambda: 0, b"\0" * 8), log, flush_after=60)
    sink.connected("a", None, clean_session=True)
    sink.switch(False)  # a reload turned them off: what waited is handed over now
    sink.connected("b", None, clean_session=True)
    assert [m.client_id for m, _ in log.records] == ["a"] and not sink.enabled
    sink.switch(True)
    sink.connected("c", None, clean_session=True)
    sink.close()
    sink.switch(True)  # a reload during the drain: the log stops next, nothing more
    sink.connected("d", None, clean_session=True)
    assert [m.client_id for m, _ in log.records] == ["a", "c"] and sink.written == 2


async def eventually(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition never met"
        await asyncio.sleep(0.01)


def test_every_event_s_record_is_the_template_s_byte_for_byte() -> None:
    """The log hands a burst's records over through ``record.Template`` (the shared parts of a
    topic's records encoded once): for every kind of event, the bytes and headers are
    ``record.encode``'s and ``record.headers``', long and awkward strings included."""
    sink, log = make()
    long = "x" * 700 + "é✓"
    for username in (None, "alice", long):
        for client_id in ("dev1", 'quote" \\ é 🚀', long):
            sink.connected(client_id, username, clean_session=True)
            sink.connected(client_id, username, clean_session=False)
            for reason in events.REASONS:
                sink.disconnected(client_id, username, reason)
            sink.subscribed(client_id, username, [("plant/#", 1), (long, 2)])
            sink.unsubscribed(client_id, username, ["plant/#", long])
            sink.session_expired(client_id)
    templates: dict[str, record.Template] = {}
    for message, kind in log.records:
        template = templates.setdefault(message.topic, record.Template(message, kind))
        client = message.client_id.encode()
        assert template.fits(message, kind)
        assert template.value(message, client) == record.encode(message)
        assert template.headers(client) == record.headers(message, kind)
    assert {m.topic for m, _ in log.records} == {events.TOPIC_PREFIX + e for e in events.EVENTS}
