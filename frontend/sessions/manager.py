"""The session manager: one owner for a session's whole life on this node.

A connection calls it in this order, and nothing else decides a session's life: :meth:`open`
(admit, acquire, restore), :meth:`serve` once the CONNACK is out (resume, or let go at once if
another node asked meanwhile), :meth:`subscribe`/:meth:`subscribed`/:meth:`unsubscribe` and the
QoS 2 marks while connected, and :meth:`end` as the connection closes (the will, then release).
Requests from the cluster (``frontend.cluster`` only carries them) come in through
:meth:`release_requested` and :meth:`taken_elsewhere`; the manager closes the connection it
serves the session with itself (:class:`Holder`), never through the router.

A session's life: **admit** (at most ``OPENING_AT_ONCE`` sessions are acquired at once; a storm
of CONNECTs waits its turn), **acquire** (own the client id's session in the store, taking it
over from its current connection on this node or another [MQTT-3.1.4-2]; a previous connection
that died with its node has its will published first [MQTT-3.1.2-8]; a session belonging to
another identity is refused, :class:`NotOwnerError`, its connection and state untouched),
**restore** (the stored in-flight window and QoS 2 state), **resume** (subscribe again and catch
up from the log from the stored positions, see ``router.backlog``), **save** (what changed, in
batches, and the node's checkpoint: ``frontend.sessions.saver``), and **release** (store what
lasts, or forget a clean session) when the connection ends.  Wills are published by
``frontend.sessions.wills``, asked by this manager only; the steps clients and analytics may want
to know of (connected, subscribed, unsubscribed, disconnected and why) are told to
``frontend.events`` by this manager only.

Invariants: a session is owned by at most one connection in the cluster, fenced by its lease;
a session is only ever acquired under the identity that made it (``frontend.sessions.store``);
every write to the store carries the lease; until a returning session's subscriptions are
registered again, what is saved for it is the stored positions it resumed from.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from frontend import outages
from frontend.events import CONNECTION_LOST, EventLog, Events
from frontend.outages import in_background
from frontend.retained import RetainedStore
from frontend.sessions.saver import Holder, Owned, Saver
from mqttcore.channel import Limits, will_message
from mqttcore.codec import PublishTemplate
from mqttcore.message import Message, MessageStamps
from mqttcore.packets import Connect
from mqttcore.session import Outbound, Session, StoredOutbound, StoredSession

__all__ = ["Holder", "NotOwnerError", "Opened", "Owned", "SessionManager"]
from frontend.sessions.store import Busy, Lease, NotOwner, SessionStore
from frontend.sessions.wills import WillLog, Wills
from router import record
from router.dispatch import Dispatcher

log = logging.getLogger("headwater.sessions")

T = TypeVar("T")
Taken = tuple[Lease, StoredSession | None]
"""An acquired session: its lease and what was stored of it."""
Gone = Callable[[], bool]
"""Whether the connection went away (while its session was being opened)."""

FORCE_AFTER = 1.5
"""Seconds a CONNECT waits for another node to let go of its session before taking it by force
(``frontend.cluster``'s docstring: the fencing token moves on, and the old owner is told)."""

OPENING_AT_ONCE = 1024
"""Sessions asked of the store at once; a storm of CONNECTs beyond waits its turn, in order.
Their requests go out in batches (``router.batching``), so a Redis that stops answering fails a
thousand CONNECTs with one timeout, not one timeout per few."""

POLL_FIRST, POLL_MOST = 0.01, 0.1
"""Seconds between two looks at a session another node was asked to let go of: from 10 ms,
doubling up to 100 ms (a storm has thousands waiting at once)."""

OPENING_WAIT = 120.0
"""Seconds a CONNECT waits for its turn before the store counts as unavailable (CONNACK 3): far
longer than a storm takes to drain (15,000 reconnects on 3 nodes of this 2-core machine took
9-22 s in ``bench.scale``), since a busy node answers later rather than refusing; a Redis that
fails answers sooner, through its own timeouts."""


class SessionLog(WillLog, EventLog, Protocol):
    """The log, as wills and client events are written to it: ``router.log.KafkaLog``.  This
    module runs compiled (setup.py), and a compiled function checks the class of an argument
    typed with a class: typed with protocols, it takes the unit tests' fakes too."""


class Cluster(Protocol):
    """The other nodes, as a takeover reaches them: ``frontend.cluster.Coordinator``."""

    async def request_release(self, owner: str, client_id: str) -> None: ...

    async def tell_taken(self, owner: str, client_id: str, token: int) -> None: ...


class NotOwnerError(Exception):
    """The client id's session belongs to another identity: the CONNECT is refused
    (CONNACK 5) and the session left as it is."""


@dataclass(slots=True)
class Opened:
    """A session :meth:`SessionManager.open` acquired and restored for a connection: answer the
    CONNACK, then hand it to :meth:`SessionManager.serve`."""

    owned: Owned
    stored: StoredSession | None
    """What was stored of it (None: a new session)."""
    asked_to_let_go: bool = False
    """Another node asked for the session while it was being acquired here."""

    @property
    def present(self) -> bool:
        """CONNACK's session present flag [MQTT-3.2.2-2]."""
        return self.stored is not None


class SessionManager:
    """Acquire, restore, resume, save and release the sessions of this node's connections."""

    def __init__(
        self,
        stamps: MessageStamps,
        limits: Limits,
        store: SessionStore,
        retained: RetainedStore,
        dispatcher: Dispatcher,
        log_: SessionLog,
        events: Events | None = None,
    ) -> None:
        self.node_id = stamps.origin_node
        self.stamps = stamps
        self.limits = limits
        self.store = store
        self.retained = retained
        self.dispatcher = dispatcher
        self.coordinator: Cluster | None = None
        self.wills = Wills(stamps, log_, retained)
        self.events = events or Events(stamps, log_, enabled=False)
        """Told each step of a session's life clients and analytics may want to know of."""
        self._opening = asyncio.Semaphore(OPENING_AT_ONCE)
        self._served: dict[str, Owned] = {}
        """The sessions connections here serve now, by client id."""
        self._acquiring: dict[str, int] = {}
        """Client ids being acquired here now (how many connections are at it)."""
        self._asked_to_let_go: set[str] = set()
        """Of those, the ones another node asked for meanwhile."""
        self.opening_waited = 0
        """Store requests of CONNECTs that waited for their turn (admission control)."""
        self.live = [0, 0]  # sessions served here now: [clean, persistent]
        self.resumed = self.takeovers = self.takeovers_forced = self.takeovers_refused = 0
        """CONNECTs with a stored session; takeovers, by force, refused (another identity)."""
        self.saver = Saver(self.node_id, store, dispatcher)

    def join_cluster(
        self, store: SessionStore, retained: RetainedStore, coordinator: Cluster
    ) -> None:
        """Keep sessions and retained messages in the cluster's stores from now on (called
        before the node serves anyone), and take sessions over through ``coordinator``."""
        self.store, self.retained, self.coordinator = store, retained, coordinator
        self.saver.store = store
        self.wills.retained = retained

    def start(self) -> None:
        self.saver.start()

    async def stop(self) -> None:
        await self.saver.stop()

    # -- acquire and restore --------------------------------------------------------------------

    async def acquire(
        self, client_id: str, clean: bool, will: Message | None, identity: str = ""
    ) -> Taken:
        """Own ``client_id``'s session as ``identity``, and read what was stored; store errors and
        :class:`NotOwnerError` raise.  ``will`` is kept in case the node dies with the client."""
        self._acquiring[client_id] = self._acquiring.get(client_id, 0) + 1
        try:
            lease, stored = await self._acquire(client_id, clean, identity)
            if will is not None:
                await self.store.keep_will(lease, record.encode(will))
            if stored is not None and stored.live_on:
                await self.saver.catch_up_with_checkpoint(stored)
            return lease, stored
        finally:
            self._acquiring[client_id] -= 1
            if not self._acquiring[client_id]:
                del self._acquiring[client_id]

    def attach(
        self, lease: Lease, stored: StoredSession | None, clean: bool, holder: Holder
    ) -> Owned:
        """The acquired session, restored, served by ``holder`` from now on; call
        :meth:`resume` next if ``stored`` has subscriptions."""
        limits = self.limits
        session = Session(
            lease.client_id, clean, limits.max_inflight, limits.max_queued, limits.max_queued_bytes
        )
        if stored is not None:
            session.restore_inflight(stored, [_restore(o) for o in stored.inflight])
        owned = Owned(lease, session, holder)
        self._served[lease.client_id] = owned
        self.live[owned.persistent] += 1
        self.saver.went_live(owned)
        self.dispatcher.attach(session, holder)
        return owned

    async def open(
        self, client_id: str, connect: Connect, holder: Holder, gone: Gone, identity: str
    ) -> Opened | None:
        """A CONNECT by ``identity``: acquire the session and restore it, served by ``holder``
        from now on; :meth:`serve` it once the CONNACK is out.  None if the connection went
        away meanwhile (``gone`` says), keeping what was stored.  Store errors raise, and
        :class:`NotOwnerError`."""
        will = will_message(connect.will, client_id, self.stamps) if connect.will else None
        asked = False
        try:
            lease, stored = await self.acquire(client_id, connect.clean_session, will, identity)
        finally:
            if client_id not in self._acquiring and client_id in self._asked_to_let_go:
                self._asked_to_let_go.discard(client_id)
                asked = True
        if gone():
            self.abandon(lease, stored)
            return None
        owned = self.attach(lease, stored, connect.clean_session, holder)
        owned.username = connect.username
        self.resumed += stored is not None
        self.events.connected(client_id, connect.username, connect.clean_session)
        return Opened(owned, stored, asked)

    def serve(self, opened: Opened) -> None:
        """After the CONNACK: a session another node asked for meanwhile is let go at once
        (closed like any connection taken over, its will published); a returning one is caught
        up from the log in the background (a failure closes it through its holder)."""
        owned, stored = opened.owned, opened.stored
        if owned.closed:
            return
        if opened.asked_to_let_go:
            owned.holder.takeover()
        elif stored is not None and stored.subscriptions:
            task = asyncio.get_running_loop().create_task(self.resume(owned, stored))
            task.add_done_callback(lambda done: _report_failure(done, owned.holder))

    def release_requested(self, client_id: str) -> None:
        """Another node asks for ``client_id``'s session [MQTT-3.1.4-2]: close its connection
        here, which stores the session and lets go; one still being opened here is closed as
        soon as it is open (the other node would otherwise take the session by force)."""
        if client_id in self._acquiring:
            self._asked_to_let_go.add(client_id)
        owned = self._served.get(client_id)
        if owned is None:
            return
        task = asyncio.get_running_loop().create_task(self._let_go_if_held(owned))
        task.add_done_callback(lambda done: _report_failure(done, owned.holder))

    async def _let_go_if_held(self, owned: Owned) -> None:
        """Close the connection of a session another node asks for: with its will if the lease
        is still ours, without it if the session was taken by force meanwhile (this node was
        stuck; the taker published the will, and its news may reach the inbox after the
        request)."""
        try:
            held = await self.store.holds(owned.lease)
        except outages.STORE_ERRORS:
            held = True  # cannot tell: let go as asked, as before
        if owned.closed:
            return
        if held:
            owned.holder.takeover()
        else:
            client_id = owned.lease.client_id
            log.warning("client %s: session taken by force elsewhere; closing", client_id)
            owned.holder.lose_session()

    def taken_elsewhere(self, client_id: str, token: int) -> None:
        """Another node took ``client_id``'s session by force with ``token`` (this node did not
        answer in time): a connection here on an older lease closes without its will, which
        the other node published."""
        owned = self._served.get(client_id)
        if owned is not None and owned.lease.token < token:
            log.warning("client %s: session taken by force elsewhere; closing", client_id)
            owned.holder.lose_session()

    def abandon(self, lease: Lease, stored: StoredSession | None) -> None:
        """The connection went away while its session was acquired: let go, keeping ``stored``."""
        self.saver.keep(lease, stored)

    async def _acquire(self, client_id: str, clean: bool, identity: str) -> Taken:
        deadline = time.monotonic() + FORCE_AFTER
        asked: str | None = None
        """The owner asked to let go; a session that moved on meanwhile is asked for again."""
        force = busy = False
        pause = POLL_FIRST
        while True:
            ask = functools.partial(
                self.store.acquire, client_id, self.node_id, clean, force, identity
            )
            answer = await self._admitted(ask)
            if isinstance(answer, NotOwner):
                self.takeovers_refused += 1
                raise NotOwnerError("the session belongs to another identity")
            if not isinstance(answer, Busy):
                self.takeovers += busy
                if answer.orphaned_will is not None:
                    self.wills.publish_orphaned([answer.orphaned_will])
                if force and asked is not None and self.coordinator is not None:
                    self.takeovers_forced += 1
                    tell = self.coordinator.tell_taken(asked, client_id, answer.lease.token)
                    in_background(tell, client_id, "telling the old owner it lost the session")
                return answer.lease, answer.state
            busy = True
            if answer.owner == self.node_id:
                force = not await self._release_local(client_id)
            elif answer.owner != asked:
                assert self.coordinator is not None, "a session owned elsewhere needs a cluster"
                await self.coordinator.request_release(answer.owner, client_id)
                asked, deadline = answer.owner, time.monotonic() + FORCE_AFTER
            elif time.monotonic() > deadline:
                log.warning("node %s did not release %s: taking it", answer.owner, client_id)
                force = True
            else:
                await asyncio.sleep(pause)
                pause = min(pause * 2, POLL_MOST)

    async def _admitted(self, ask: Callable[[], Awaitable[T]]) -> T:
        """``ask`` the store once at most ``OPENING_AT_ONCE`` others do: a storm is absorbed,
        not refused.  A CONNECT waiting for another node to let go holds no turn."""
        if self._opening.locked():
            self.opening_waited += 1
            async with asyncio.timeout(OPENING_WAIT):  # TimeoutError is an OSError: a store error
                await self._opening.acquire()
        else:
            await self._opening.acquire()  # a turn is free: taken at once, nothing to time
        try:
            return await ask()
        finally:
            self._opening.release()

    async def _release_local(self, client_id: str) -> bool:
        """Close our own connection of ``client_id`` and wait until it let go; False if there
        was nothing to wait for (a stale lease).  A connection releases its session as it
        closes (:meth:`end`), so the release is under way once ``takeover`` returns."""
        owned = self._served.get(client_id)
        if owned is not None:
            owned.holder.takeover()
        releasing = self.saver.releasing.get(client_id)
        if releasing is None:
            return False
        await asyncio.gather(releasing, return_exceptions=True)
        return True

    async def resume(self, owned: Owned, stored: StoredSession) -> None:
        """Subscribe again and catch up from the log from the stored positions; the session
        goes live by itself once caught up (``router.backlog``), no gap and no duplicate at
        the switch.  A catch-up that fails closes the connection through its holder."""
        owned.replaying = stored
        try:
            await self.dispatcher.resume(
                owned.session, list(stored.subscriptions.items()), stored.positions
            )
        finally:
            owned.replaying = None

    # -- subscriptions ------------------------------------------------------------------------

    def admit(self, owned: Owned, granted: list[tuple[str, int]]) -> set[str]:
        """The shared and history filters of ``granted`` the node's bounds refuse (0x80)."""
        return self.dispatcher.admit(owned.session, granted)

    async def subscribe(
        self, owned: Owned, granted: list[tuple[str, int]]
    ) -> tuple[dict[int, int], list[str]]:
        """Register ``granted`` (pending until :meth:`subscribed`) and, for a persistent
        session, store it before the SUBACK: the subscription outlives this node.  Their start
        offsets and the new plain filters."""
        starts, new = await self.dispatcher.subscribe(owned.session, granted)
        await self.save(owned)
        return starts, new

    async def subscribed(
        self, owned: Owned, granted: list[tuple[str, int]], new: list[str], starts: dict[int, int]
    ) -> None:
        """After the SUBACK: the matching retained messages [MQTT-3.3.1-6], then live."""
        if granted:
            self.events.subscribed(owned.lease.client_id, owned.username, granted)
        try:
            filters = [f for f, _ in granted]
            scan = self.retained.scan
            await self.dispatcher.deliver_retained(owned.session, filters, new, starts, scan)
        finally:
            self.dispatcher.activate(owned.session, new)

    def unsubscribe(self, owned: Owned, filters: tuple[str, ...]) -> None:
        """Drop ``filters`` now; a persistent session is stored without them in the background."""
        self.dispatcher.unsubscribe(owned.session, filters)
        self.events.unsubscribed(owned.lease.client_id, owned.username, filters)
        in_background(self.save(owned), owned.lease.client_id, "saving the session")

    # -- save and release -----------------------------------------------------------------------

    async def save(self, owned: Owned) -> None:
        """Store a persistent session now (before a SUBACK or after an UNSUBSCRIBE)."""
        await self.saver.save(owned)

    def end(
        self,
        owned: Owned,
        will: Message | None,
        held_back: list[Outbound],
        reason: str = CONNECTION_LOST,
    ) -> None:
        """The connection serving ``owned`` is closing, for ``reason`` (one of
        ``frontend.events.REASONS``): publish its ``will`` [MQTT-3.1.2-8] (the channel decided
        there is one, under the rules of now), keep the messages it ``held_back`` for the stored
        session, and release it, in that order, then tell the event."""
        if will is not None:
            self.wills.publish(will)
        for out in held_back:
            owned.session.deliver(out, online=False)
        self.release(owned)
        self.events.disconnected(owned.lease.client_id, owned.username, reason)

    def release(self, owned: Owned) -> None:
        """The connection ended: store what lasts (in the background), forget the rest here."""
        if self._served.get(owned.lease.client_id) is owned:
            del self._served[owned.lease.client_id]
        self.live[owned.persistent] -= 1
        self.saver.release(owned)
        self.dispatcher.detach(owned.session, owned.holder)

    # -- inbound QoS 2 ----------------------------------------------------------------------

    async def mark_received(self, owned: Owned, packet_id: int) -> None:
        """Record an inbound QoS 2 packet id awaiting PUBREL, before PUBREC goes out."""
        if owned.persistent:
            await self.store.mark_received(owned.lease, packet_id)

    async def unmark_received(self, owned: Owned, packet_id: int) -> None:
        if owned.persistent:
            await self.store.unmark_received(owned.lease, packet_id)

    def forget_qos2(self, owned: Owned, packet_id: int) -> None:
        """The client released ``packet_id`` (PUBREL): a persistent session stops recording it
        as awaiting PUBREL, in the background (a clean session never recorded it)."""
        if owned.persistent:
            work = self.unmark_received(owned, packet_id)
            in_background(work, owned.lease.client_id, "forgetting a QoS 2 id")


def _report_failure(task: asyncio.Task[None], holder: Holder) -> None:
    if not task.cancelled() and (error := task.exception()) is not None:
        holder.stream_failed(error)


def _restore(stored: StoredOutbound) -> Outbound:
    message = record.decode(stored.record)
    template = PublishTemplate(message.topic, message.payload, stored.qos)
    return Outbound(
        message, stored.qos, stored.retain, template, stored.packet_id, stored.released,
        stored.partition, stored.offset,
    )  # fmt: skip
