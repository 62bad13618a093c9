"""The session manager: one owner for a session's whole life on this node.

A session's life: **acquire** (own the client id's session in the store, taking it over from its
current connection on this node or another [MQTT-3.1.4-2]; a previous connection that died with
its node has its will published first [MQTT-3.1.2-8]), **restore** (the stored in-flight window
and QoS 2 state), **resume** (subscribe again, replay from the log what the session missed, go
live where the replay ended), **save** (persistent sessions, every ``SAVE_INTERVAL``), and
**release** (store what lasts, or forget a clean session) when the connection ends.

Invariants: a session is owned by at most one connection in the cluster, fenced by its lease;
every write to the store carries the lease; while a session replays, what is saved for it is the
stored positions it resumed from, so a crash mid-replay loses nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Protocol

from frontend.cluster import FORCE_AFTER, Coordinator
from frontend.mqtt.channel import Limits
from frontend.mqtt.codec import PublishTemplate
from frontend.mqtt.message import Message, MessageStamps
from frontend.mqtt.session import Outbound, Session, StoredOutbound, StoredSession
from frontend.retained import RetainedStore
from frontend.sessions.store import Busy, Lease, SessionStore
from router import record
from router.dispatch import Dispatcher, Subscriber
from router.log import KafkaLog

log = logging.getLogger("headwater.sessions")

SAVE_INTERVAL = 1.0


class Holder(Subscriber, Protocol):
    """The connection serving a session, as the session manager sees it."""

    def lose_session(self) -> None:
        """Another node took the session by force: close without publishing the will (the node
        that took the session published it)."""


@dataclass(slots=True)
class Owned:
    """A session this node owns, with the connection serving it."""

    lease: Lease
    session: Session
    holder: Holder
    replaying: StoredSession | None = None
    """The stored state being replayed; its positions are what a save writes meanwhile."""
    closed: bool = False

    @property
    def persistent(self) -> bool:
        return not self.session.clean


class SessionManager:
    """Acquire, restore, resume, save and release the sessions of this node's connections."""

    def __init__(
        self,
        stamps: MessageStamps,
        limits: Limits,
        store: SessionStore,
        retained: RetainedStore,
        dispatcher: Dispatcher,
        log_: KafkaLog,
    ) -> None:
        self.node_id = stamps.origin_node
        self.stamps = stamps
        self.limits = limits
        self.store = store
        self.retained = retained
        self.dispatcher = dispatcher
        self.log = log_
        self.coordinator: Coordinator | None = None
        self.wills_published = 0
        self.orphaned_wills_published = 0
        self.wills_lost = 0
        self._owned: dict[str, Owned] = {}
        self._releasing: dict[str, asyncio.Task[None]] = {}
        self._saver: asyncio.Task[None] | None = None

    def join_cluster(
        self, store: SessionStore, retained: RetainedStore, coordinator: Coordinator
    ) -> None:
        """Keep sessions and retained messages in the cluster's stores from now on (called
        before the node serves anyone), and take sessions over through ``coordinator``."""
        self.store, self.retained, self.coordinator = store, retained, coordinator

    def start(self) -> None:
        self._saver = asyncio.get_running_loop().create_task(self._save_periodically())

    async def stop(self) -> None:
        if self._saver is not None:
            self._saver.cancel()
        if self._releasing:
            await asyncio.gather(*self._releasing.values(), return_exceptions=True)

    # -- acquire and restore --------------------------------------------------------------------

    async def acquire(
        self, client_id: str, clean: bool, will: Message | None
    ) -> tuple[Lease, StoredSession | None]:
        """Own ``client_id``'s session and read what was stored of it; store errors raise.
        ``will`` is kept with the session, in case this node dies with the connection open."""
        lease, stored = await self._acquire(client_id, clean)
        if will is not None:
            await self.store.keep_will(lease, record.encode(will))
        return lease, stored

    def attach(
        self, lease: Lease, stored: StoredSession | None, clean: bool, holder: Holder
    ) -> Owned:
        """The acquired session, restored, served by ``holder`` from now on; call
        :meth:`resume` next if ``stored`` has subscriptions."""
        limits = self.limits
        session = Session(lease.client_id, clean, limits.max_inflight, limits.max_queued)
        if stored is not None:
            session.restore_inflight(stored, [_restore(o) for o in stored.inflight])
        owned = Owned(lease, session, holder)
        self._owned[lease.client_id] = owned
        self.dispatcher.attach(session, holder)
        return owned

    def abandon(self, lease: Lease, stored: StoredSession | None) -> None:
        """The connection went away while its session was acquired: let go, keeping ``stored``."""
        self._release(lease, stored)

    async def _acquire(self, client_id: str, clean: bool) -> tuple[Lease, StoredSession | None]:
        deadline = time.monotonic() + FORCE_AFTER
        asked, force = False, False
        while True:
            answer = await self.store.acquire(client_id, self.node_id, clean, force)
            if not isinstance(answer, Busy):
                if answer.orphaned_will is not None:
                    self.publish_orphaned_wills([answer.orphaned_will])
                return answer.lease, answer.state
            if answer.owner == self.node_id:
                force = not await self._release_local(client_id)
            elif not asked:
                assert self.coordinator is not None, "a session owned elsewhere needs a cluster"
                await self.coordinator.request_release(answer.owner, client_id)
                asked = True
            elif time.monotonic() > deadline:
                log.warning("node %s did not release %s: taking it", answer.owner, client_id)
                force = True
            else:
                await asyncio.sleep(0.01)

    async def _release_local(self, client_id: str) -> bool:
        """Close our own connection of ``client_id`` and wait until it let go; False if there
        was nothing to wait for (a stale lease)."""
        self.dispatcher.take_over(client_id)
        await asyncio.sleep(0)
        releasing = self._releasing.get(client_id)
        if releasing is None:
            return False
        await asyncio.gather(releasing, return_exceptions=True)
        return True

    async def resume(self, owned: Owned, stored: StoredSession) -> None:
        """Subscribe again, replay what was missed from the log, then go live at the offsets
        where the replay ended: no gap and no duplicate at the switch.  Raises if the catch-up
        fails (the log unreadable): the caller closes the connection."""
        owned.replaying = stored
        dispatcher = self.dispatcher
        session = owned.session
        starts, new = await dispatcher.subscribe(session, list(stored.subscriptions.items()))
        await dispatcher.replay(session, stored.positions, starts)
        # Only now: if the catch-up failed, what is saved is still where the session resumed
        # from, so the connection's close loses nothing and the next one catches up again.
        dispatcher.activate(session, new)
        owned.replaying = None

    # -- subscriptions ------------------------------------------------------------------------

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
        try:
            found = {f: await self.retained.match(f) for f, _ in granted}
            self.dispatcher.deliver_retained(owned.session, found, new, starts)
        finally:
            self.dispatcher.activate(owned.session, new)

    # -- save and release -----------------------------------------------------------------------

    def snapshot(self, owned: Owned) -> StoredSession:
        if owned.replaying is not None:
            positions = dict(owned.replaying.positions)
        else:
            positions = self.dispatcher.subscriptions.positions_for(owned.session)
        return owned.session.snapshot(positions, lambda out: record.encode(out.message))

    async def save(self, owned: Owned) -> None:
        """Store a persistent session now.  If the store says another node took it by force,
        close its connection without the will (the node that took the session published it)."""
        if not owned.persistent or owned.closed:
            return
        if not await self.store.save(owned.lease, self.snapshot(owned)):
            log.warning("client %s: session owned elsewhere now; closing", owned.lease.client_id)
            owned.holder.lose_session()

    def release(self, owned: Owned) -> None:
        """The connection ended: store what lasts (in the background), forget the rest here."""
        owned.closed = True
        state = self.snapshot(owned) if owned.persistent else None
        self.dispatcher.detach(owned.session, owned.holder)
        if self._owned.get(owned.lease.client_id) is owned:
            del self._owned[owned.lease.client_id]
        self._release(owned.lease, state)

    def _release(self, lease: Lease, state: StoredSession | None) -> None:
        client_id = lease.client_id
        task = asyncio.get_running_loop().create_task(self.store.release(lease, state))
        self._releasing[client_id] = task
        task.add_done_callback(lambda _: self._forget_release(client_id, task))

    def _forget_release(self, client_id: str, task: asyncio.Task[None]) -> None:
        if self._releasing.get(client_id) is task:
            del self._releasing[client_id]
        if not task.cancelled() and task.exception() is not None:
            log.error("storing the session of %s failed: %s", client_id, task.exception())

    async def _save_periodically(self) -> None:
        """Persistent sessions are saved every second, so a node crash loses at most that."""
        while True:
            await asyncio.sleep(SAVE_INTERVAL)
            for owned in list(self._owned.values()):
                try:
                    await self.save(owned)
                except Exception as exc:  # Redis down: keep serving, keep trying
                    log.warning("saving sessions failed: %s", exc)
                    break

    # -- inbound QoS 2 ----------------------------------------------------------------------

    async def mark_received(self, owned: Owned, packet_id: int) -> None:
        """Record an inbound QoS 2 packet id awaiting PUBREL, before PUBREC goes out."""
        if owned.persistent:
            await self.store.mark_received(owned.lease, packet_id)

    async def unmark_received(self, owned: Owned, packet_id: int) -> None:
        if owned.persistent:
            await self.store.unmark_received(owned.lease, packet_id)

    # -- wills --------------------------------------------------------------------------------

    def publish_will(self, message: Message) -> None:
        """Publish a will: through the log like any message; retained wills update the store."""
        self.wills_published += 1
        retained = self.retained

        def stored(partition: int, offset: int, error: str | None) -> None:
            if error is None and message.retain:
                asyncio.get_running_loop().create_task(retained.apply(message, partition, offset))

        if not self.log.produce(message, stored):
            self.wills_lost += 1
            log.error("will of %s lost: the producer queue is full", message.client_id)

    def publish_orphaned_wills(self, wills: list[bytes]) -> None:
        """Publish the stored wills of connections that died with their node, from here."""
        for raw in wills:
            try:
                will = record.decode(raw)
            except record.RecordError as exc:
                log.error("a stored will is unreadable, not published: %s", exc)
                continue
            log.info("publishing the will of %s, whose node died", will.client_id)
            self.orphaned_wills_published += 1
            self.publish_will(
                self.stamps.message(will.topic, will.payload, will.qos, will.retain, will.client_id)
            )


def _restore(stored: StoredOutbound) -> Outbound:
    message = record.decode(stored.record)
    template = PublishTemplate(message.topic, message.payload, stored.qos)
    return Outbound(
        message, stored.qos, stored.retain, template, stored.packet_id, stored.released,
        stored.partition, stored.offset,
    )  # fmt: skip
