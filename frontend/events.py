"""Client events: what happened to a client's connection or session, written to the log.

Each event is one log record of kind ``event`` (``router.record.EVENT``), produced as any message
is, on the log's quiet producer (``KafkaLog.produce_quiet``): MQTT topic ``$events/<event>``, QoS
0, not retained, client id the client's, origin this node, and as payload a UTF-8 JSON object whose
fields are ``event``, ``client_id``, ``username`` (or null), ``node``, ``timestamp`` (ms, the
record's own) and, by event, ``clean_session`` (connected), ``reason`` (disconnected, one of
:data:`REASONS`), ``filters`` (subscribed, unsubscribed).  docs/log.md is the contract.

Invariants: one record per event and nothing kept per client; the JSON is built from the
event's fixed text and the escaped strings (no dict, no ``json.dumps`` of a whole object).
An event costs its connection a tuple appended to a list: the records are built and handed to
the log together, ``FLUSH_SECONDS`` after the first one waiting (one timer per node, only while
events wait), in one tight loop (handed over one by one as they happened, each cost its
connection about 20 us of cold ``produce()`` and encoding: 10% of a CONNECT cycle).  This
module runs compiled (setup.py): the loop builds each payload and message in C, and the log
encodes a burst's records through ``router.record.Template``.  The log's quiet producer then
sends them in one request per partition and they never wake the log's pump.
:meth:`Events.close` hands over what waits and stops writing, before the node's log stops.  A
node with ``--client-events no`` keeps and writes nothing; SIGHUP rereads the setting
(:meth:`switch`).  Who calls: the session manager
(``frontend.sessions.manager``: connected, subscribed, unsubscribed, disconnected with the
reason the connection gives) and the cluster's expiry listener (``frontend.cluster``: session
expired).  ``$events/...`` reaches only subscribers of a filter naming it whom the ACL lets
read it [MQTT-4.7.2-1]; no client may publish there (``frontend.auth.acl``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence
from json.encoder import encode_basestring  # the C escaper; keeps UTF-8 as it is
from typing import Final, Protocol

from mypy_extensions import mypyc_attr

from mqttcore.message import Message, MessageStamps
from router import record

CONNECTED: Final = "connected"
DISCONNECTED: Final = "disconnected"
SUBSCRIBED: Final = "subscribed"
UNSUBSCRIBED: Final = "unsubscribed"
SESSION_EXPIRED: Final = "session_expired"
EVENTS = (CONNECTED, DISCONNECTED, SUBSCRIBED, UNSUBSCRIBED, SESSION_EXPIRED)
TOPIC_PREFIX: Final = "$events/"

CLIENT_DISCONNECT: Final = "client_disconnect"
"""The client sent DISCONNECT."""
KEEP_ALIVE_TIMEOUT: Final = "keep_alive_timeout"
"""Nothing heard for 1.5 x the keep-alive [MQTT-3.1.2-24]."""
PROTOCOL_ERROR: Final = "protocol_error"
"""The client broke the protocol (malformed or forbidden packet)."""
TAKEN_OVER: Final = "taken_over"
"""A connection with the same client id took the session [MQTT-3.1.4-2]."""
NODE_DRAIN: Final = "node_drain"
"""The node closed it as it stopped."""
CONNECTION_LOST: Final = "connection_lost"
"""The network connection ended without DISCONNECT (or the node could not serve it on)."""
NOT_AUTHORIZED: Final = "not_authorized"
"""A reload took the client's credentials away."""
REASONS = (
    CLIENT_DISCONNECT, KEEP_ALIVE_TIMEOUT, PROTOCOL_ERROR, TAKEN_OVER, NODE_DRAIN,
    CONNECTION_LOST, NOT_AUTHORIZED,
)  # fmt: skip


FLUSH_SECONDS = 0.5
"""How long an event waits at most to be handed to the log with the others.  Most of what
events cost is the Kafka broker's work per request: at 1,500 CONNECT+DISCONNECT cycles a second
(``python -m tests.integration.events_cost``), a hand-over every 0.1 s cost the broker about 29
us a cycle more than no events and the loop 19 us; every 0.5 s, 11-24 and 8-20 us."""


class EventLog(Protocol):
    """Where events go: ``router.log.KafkaLog``."""

    def produce_quiet(self, messages: Sequence[Message], kind: str) -> int: ...


def _text(value: str | None) -> str:
    """A JSON string (or null): the C escaper, UTF-8 kept as it is."""
    return "null" if value is None else encode_basestring(value)


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


_TOPICS: Final = {event: TOPIC_PREFIX + event for event in EVENTS}
_REASONS: Final = {reason: f',"reason":"{reason}"' for reason in REASONS}
"""Each event's own text for the reasons there are (built once, not per event)."""


# compiled, yet tests.integration.events_cost's interpreted subclass times its hand-overs
@mypyc_attr(allow_interpreted_subclasses=True)
class Events:
    """This node's client events; see the module's docstring."""

    __slots__ = (
        "_clock_ms", "_closed", "_flush_after", "_log", "_node", "_pending", "_stamps", "enabled",
        "lost", "written",
    )  # fmt: skip

    def __init__(
        self,
        stamps: MessageStamps,
        log_: EventLog,
        enabled: bool = True,
        clock_ms: Callable[[], int] = _wall_clock_ms,
        flush_after: float = FLUSH_SECONDS,
    ) -> None:
        self._stamps = stamps
        self._log = log_
        self._clock_ms = clock_ms
        self._flush_after = flush_after
        """0: each event is handed over at once."""
        self._pending: list[tuple[str, str, str | None, str, int]] = []
        """(event, client id, user name, tail, time) of the events waiting."""
        self._node = f',"node":{_text(stamps.origin_node)},"timestamp":'
        """The fixed middle of every payload: this node, then the time's key."""
        self.enabled = enabled
        """``--client-events``; a reload may switch it (:meth:`switch`), and the node turns it
        off for good before its log stops (:meth:`close`)."""
        self._closed = False
        self.written = 0
        self.lost = 0
        """Events the producer could not take (its queue full)."""

    def connected(self, client_id: str, username: str | None, clean_session: bool) -> None:
        if self.enabled:
            tail = ',"clean_session":true' if clean_session else ',"clean_session":false'
            self._write(CONNECTED, client_id, username, tail)

    def disconnected(self, client_id: str, username: str | None, reason: str) -> None:
        if self.enabled:
            tail = _REASONS.get(reason)
            if tail is None:
                tail = f',"reason":{_text(reason)}'
            self._write(DISCONNECTED, client_id, username, tail)

    def subscribed(
        self, client_id: str, username: str | None, granted: Iterable[tuple[str, int]]
    ) -> None:
        if self.enabled:
            filters = ",".join([f'{{"filter":{_text(f)},"qos":{qos}}}' for f, qos in granted])
            self._write(SUBSCRIBED, client_id, username, f',"filters":[{filters}]')

    def unsubscribed(self, client_id: str, username: str | None, filters: Iterable[str]) -> None:
        if self.enabled:
            names = ",".join([_text(name) for name in filters])
            self._write(UNSUBSCRIBED, client_id, username, f',"filters":[{names}]')

    def session_expired(self, client_id: str) -> None:
        """A persistent session nobody resumed was removed (its user name is not kept)."""
        if self.enabled:
            self._write(SESSION_EXPIRED, client_id, None, "")

    def _write(self, event: str, client_id: str, username: str | None, tail: str) -> None:
        """Keep the event for the next hand-over (``tail``: its own ``,"key":value`` text)."""
        pending = self._pending
        pending.append((event, client_id, username, tail, self._clock_ms()))
        if self._flush_after <= 0:
            self.flush()
        elif len(pending) == 1:
            asyncio.get_running_loop().call_later(self._flush_after, self.flush)

    def flush(self) -> None:
        """Build every waiting event's record and hand it to the log; one the producer cannot
        take is counted lost."""
        pending, self._pending = self._pending, []
        stamps, node = self._stamps, self._node
        origin = stamps.origin_node
        messages: list[Message] = []
        for event, client_id, username, tail, now in pending:
            data = (
                f'{{"event":"{event}","client_id":{_text(client_id)},"username":'
                f"{_text(username)}{node}{now}{tail}}}"
            ).encode()
            topic = _TOPICS.get(event) or TOPIC_PREFIX + event
            messages.append(Message(topic, data, 0, False, client_id, origin, now, stamps.new_id()))
        taken = self._log.produce_quiet(messages, record.EVENT)
        self.written += taken
        self.lost += len(messages) - taken

    def switch(self, enabled: bool) -> None:
        """Write events from now on, or stop (what waits is handed over); nothing after
        :meth:`close`."""
        if not self._closed:
            if not enabled and self._pending:
                self.flush()
            self.enabled = enabled

    def close(self) -> None:
        """Hand over what waits and write no more (the node's log stops next)."""
        self.flush()
        self.enabled = False
        self._closed = True
