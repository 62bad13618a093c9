"""Keeping the sessions this node owns in the store: saves, releases and the node's checkpoint.

Cost follows activity.  An idle session is never written: every ``SAVE_INTERVAL`` the saver looks
only at the persistent sessions that were given a message since (``Dispatcher.touched``) or still
hold one, saves those whose in-flight window changed in one batch (``save_many``), and drops the
ones that have settled.  Subscriptions are stored before their SUBACK (``save``), QoS 2 marks
before their PUBREC (the session manager).

**Delivery positions are checkpointed per node process, not per session.**  A live session's
position in a partition is where the node's live stream is (``Subscriptions.dispatched``), unless
it holds a message from further back (queued, in flight, or still to be read from the log while
it is behind).  So each round the node writes one checkpoint: per partition, the lowest of its live
stream and of what its active persistent sessions (and sessions whose release is not stored yet)
still need.  That is one write per node per second whatever the number of sessions, and none
while nothing moves.  A session is stored with ``live_on`` (this process's ``checkpoint_id``) and
``live_since`` (the number of its last checkpoint when the session went live; the session is
counted in every later one).  Its stored positions are exact when released; if the node dies
first, the next node takes, per partition, the later of the stored position and the dead
process's checkpoint, if that was numbered after ``live_since``: both are at or below what the
session had been given, so nothing is lost and at most a second of messages comes twice (QoS 1/2
are at least once across a crash).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from dataclasses import dataclass
from typing import Protocol

from frontend.outages import every
from frontend.sessions.store import Lease, SessionStore
from mqttcore.session import Session, StoredSession
from router import record
from router.delivery import Subscriber, lower
from router.dispatch import Dispatcher

log = logging.getLogger("headwater.sessions")

SAVE_INTERVAL = 1.0
"""Seconds between two rounds of saving changed sessions and writing the node's checkpoint."""


class Holder(Subscriber, Protocol):
    """The connection serving a session, as the session manager sees it: what the router
    delivers to, and what the manager closes when the session's life says so."""

    def takeover(self) -> None:
        """Another connection is taking this client id [MQTT-3.1.4-2]: close, publishing the
        will (the connection then hands the session back, ``SessionManager.end``)."""

    def lose_session(self) -> None:
        """Another node took the session by force: close without publishing the will (the node
        that took the session published it)."""


@dataclass(slots=True)
class Owned:
    """A session this node owns, with the connection serving it."""

    lease: Lease
    session: Session
    holder: Holder
    """The connection serving it: the manager's to close when the session's life says so."""
    replaying: StoredSession | None = None
    """The stored state being resumed, until its subscriptions are registered again: its
    positions are what a save writes meanwhile."""
    closed: bool = False
    live_since: int = 0
    """The node's checkpoint number when the session went live here."""
    saved: int = -1
    """``session.changes`` when the session was last stored (-1: not since it went live)."""
    username: str | None = None
    """The user name of the CONNECT that opened it here (for its client events)."""

    @property
    def persistent(self) -> bool:
        return not self.session.clean


class Saver:
    """What the store holds of this node's sessions, kept up to date at the cost of activity."""

    def __init__(self, node_id: str, store: SessionStore, dispatcher: Dispatcher) -> None:
        self.checkpoint_id = f"{node_id}.{secrets.token_hex(4)}"
        """Whose checkpoints this process writes: a node restarted under the same id starts a
        series of its own, since the sessions it served before were counted in the old one
        only (and are resolved against it)."""
        self.store = store
        self.dispatcher = dispatcher
        self._persistent: dict[str, Owned] = {}
        """The persistent sessions served here."""
        self._active: dict[str, Owned] = {}
        """Of those, the ones given a message since the last round, or still holding one."""
        self.releasing: dict[str, asyncio.Task[None]] = {}
        self._unreleased: dict[str, tuple[Lease, StoredSession | None]] = {}
        """Released sessions not let go of yet, with the state to store (retried each round)."""
        self._task: asyncio.Task[None] | None = None
        self._seq = 0
        """The number of this node's last checkpoint."""
        self._checkpointed: dict[int, int] = {}
        self.checkpoints_written = 0
        self.sessions_saved = 0

    @property
    def active(self) -> int:
        """Persistent sessions looked at each round now (the rest cost nothing)."""
        return len(self._active)

    def start(self) -> None:
        """Save and checkpoint every ``SAVE_INTERVAL`` from now on."""
        saving = every(SAVE_INTERVAL, self.save_round, "saving sessions")
        self._task = asyncio.get_running_loop().create_task(saving)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self.releasing:
            await asyncio.gather(*self.releasing.values(), return_exceptions=True)

    def went_live(self, owned: Owned) -> None:
        """``owned`` is served here from now on: counted in every checkpoint after this."""
        owned.live_since = self._seq
        if owned.persistent:
            self._persistent[owned.lease.client_id] = owned
            self._active[owned.lease.client_id] = owned

    async def catch_up_with_checkpoint(self, stored: StoredSession) -> None:
        """``stored`` was live in a node process that did not store its release (it died, or
        the session was taken by force): move its positions up to that process's checkpoint,
        if the checkpoint was taken while the session was live there (module docstring)."""
        seq, checkpoint = await self.store.read_checkpoint(stored.live_on)
        if seq > stored.live_since:
            stored.positions = {
                p: max(at, checkpoint.get(p, at)) for p, at in stored.positions.items()
            }

    def positions(self, owned: Owned) -> dict[int, int]:
        """Where ``owned``'s stream resumes if it went away now: the stored positions while it
        is being resumed, else what the dispatcher says."""
        if owned.replaying is not None:
            return dict(owned.replaying.positions)
        return self.dispatcher.positions_for(owned.session)

    def snapshot(
        self, owned: Owned, live: bool = True, positions: dict[int, int] | None = None
    ) -> StoredSession:
        if positions is None:
            positions = self.positions(owned)
        state = owned.session.snapshot(positions, lambda out: record.encode(out.message))
        if live:
            state.live_on, state.live_since = self.checkpoint_id, owned.live_since
        return state

    async def save(self, owned: Owned) -> None:
        """Store a persistent session now.  If the store says another node took it by force,
        close its connection without the will (the node that took the session published it)."""
        if not owned.persistent or owned.closed:
            return
        changes = owned.session.changes
        self._saved(owned, changes, await self.store.save(owned.lease, self.snapshot(owned)))

    def _saved(self, owned: Owned, changes: int, current: bool) -> None:
        if current:
            owned.saved = max(owned.saved, changes)
            self.sessions_saved += 1
        elif not owned.closed:
            log.warning("client %s: session owned elsewhere now; closing", owned.lease.client_id)
            owned.holder.lose_session()

    def release(self, owned: Owned) -> None:
        """The connection ended: store what lasts, in the background."""
        owned.closed = True
        state = self.snapshot(owned, live=False) if owned.persistent else None
        client_id = owned.lease.client_id
        for served in (self._persistent, self._active):
            if served.get(client_id) is owned:
                del served[client_id]
        self.keep(owned.lease, state)

    def keep(self, lease: Lease, state: StoredSession | None) -> None:
        """Let go of ``lease``'s session, storing ``state`` (None: forget it, and its will), in
        the background; a failure is retried each round, so a will a clean DISCONNECT dropped
        while Redis was away is never published later by whoever sweeps this node."""
        client_id = lease.client_id
        self._unreleased[client_id] = (lease, state)
        task = asyncio.get_running_loop().create_task(self.store.release(lease, state))
        self.releasing[client_id] = task
        task.add_done_callback(lambda _: self._kept(lease, task))

    def _kept(self, lease: Lease, task: asyncio.Task[None]) -> None:
        client_id = lease.client_id
        if self.releasing.get(client_id) is task:
            del self.releasing[client_id]
        if not task.cancelled() and task.exception() is not None:
            log.error("storing the session of %s failed: %s", client_id, task.exception())
            return  # kept in _unreleased: the next round tries again
        unreleased = self._unreleased.get(client_id)
        if unreleased is not None and unreleased[0] == lease:
            del self._unreleased[client_id]

    async def save_round(self) -> None:
        """Save the active sessions that changed, write the node's checkpoint if it moved,
        retry releases that were not stored, and forget the sessions that settled."""
        for client_id in self.dispatcher.touched:
            owned = self._persistent.get(client_id)
            if owned is not None:
                self._active[client_id] = owned
        self.dispatcher.touched.clear()
        lowest = dict(self.dispatcher.subscriptions.dispatched)
        saves: list[tuple[Owned, int, StoredSession]] = []
        for client_id, owned in list(self._active.items()):
            session = owned.session
            positions = self.positions(owned)
            lower(lowest, positions)
            for out in session.inflight.values():
                if 0 <= out.offset < lowest.get(out.partition, out.offset + 1):
                    lowest[out.partition] = out.offset
            if session.changes != owned.saved:
                saves.append((owned, session.changes, self.snapshot(owned, positions=positions)))
            elif session.settled() and not self.dispatcher.is_behind(session):
                del self._active[client_id]
        for _, state in self._unreleased.values():
            if state is not None:
                lower(lowest, state.positions)
        await self._checkpoint(lowest)
        if saves:
            answers = await self.store.save_many([(o.lease, state) for o, _, state in saves])
            for (owned, changes, _), current in zip(saves, answers, strict=True):
                self._saved(owned, changes, current)
        for client_id, (lease, state) in list(self._unreleased.items()):
            if client_id not in self.releasing:
                self.keep(lease, state)

    async def _checkpoint(self, positions: dict[int, int]) -> None:
        if positions == self._checkpointed:
            return
        self._seq += 1
        await self.store.checkpoint(self.checkpoint_id, self._seq, positions)
        self._checkpointed = positions
        self.checkpoints_written += 1
