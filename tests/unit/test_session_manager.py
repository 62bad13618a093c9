"""The session manager over the in-memory store and a dispatcher on a fake log: acquire,
takeover, abandon, save, release, resume and wills, as a client would see their effects."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from frontend.retained import MemoryRetainedStore
from frontend.sessions.manager import Owned, SessionManager
from frontend.sessions.store import Lease, MemorySessionStore
from mqttcore.channel import Limits
from mqttcore.codec import PublishTemplate
from mqttcore.packets import Connect
from mqttcore.session import Outbound, Session, StoredSession
from router import record
from router.dispatch import Dispatcher
from router.partitioner import Router
from router.record import Record, wall_clock_stamps
from tests.unit.fakes import STAMPS, FakeClient, FakeLog, message, pump

ROUTER = Router(4, 1)


class NoAnswer:
    """A cluster whose other nodes never answer a takeover request (dead or stuck); it records
    whom it told that their session was taken."""

    def __init__(self) -> None:
        self.told: list[tuple[str, str, int]] = []

    async def request_release(self, owner: str, client_id: str) -> None:
        pass

    async def tell_taken(self, owner: str, client_id: str, token: int) -> None:
        self.told.append((owner, client_id, token))


def manager(log: FakeLog | None = None, store: MemorySessionStore | None = None) -> SessionManager:
    log = log or FakeLog()
    dispatcher = Dispatcher(log, ROUTER)  # type: ignore[arg-type]
    return SessionManager(
        STAMPS,
        Limits(),
        store or MemorySessionStore(),
        MemoryRetainedStore(),
        dispatcher,
        log,  # type: ignore[arg-type]
    )


async def connect(sessions: SessionManager, client_id: str, clean: bool = False) -> Owned:
    lease, stored = await sessions.acquire(client_id, clean, None)
    holder = FakeClient(Session(client_id, clean))
    owned = sessions.attach(lease, stored, clean, holder)
    holder.session = owned.session
    return owned


async def released(sessions: SessionManager, owned: Owned) -> None:
    sessions.release(owned)
    await sessions.stop()  # waits for the store writes in flight


async def test_a_released_persistent_session_comes_back_with_its_subscriptions() -> None:
    sessions = manager()
    owned = await connect(sessions, "dev")
    await sessions.dispatcher.subscribe(owned.session, [("a/#", 1), ("b/c", 2)])
    await released(sessions, owned)
    _, stored = await sessions.acquire("dev", False, None)
    assert stored is not None and stored.subscriptions == {"a/#": 1, "b/c": 2}


async def test_a_clean_session_leaves_nothing_behind() -> None:
    sessions = manager()
    owned = await connect(sessions, "dev", clean=True)
    await sessions.dispatcher.subscribe(owned.session, [("a/#", 1)])
    await released(sessions, owned)
    _, stored = await sessions.acquire("dev", False, None)
    assert stored is None


async def test_a_second_connection_takes_the_session_over_from_the_first() -> None:
    sessions = manager()
    first = await connect(sessions, "dev")
    await sessions.dispatcher.subscribe(first.session, [("a/#", 1)])
    holder = first.holder
    assert isinstance(holder, FakeClient)
    holder.on_takeover = lambda: sessions.release(first)  # it closes, storing the session
    lease, stored = await asyncio.wait_for(sessions.acquire("dev", False, None), 5)
    assert holder.taken_over == 1 and first.closed
    assert lease.token == first.lease.token + 1
    assert stored is not None and stored.subscriptions == {"a/#": 1}  # stored as it closed
    assert sessions.dispatcher.client_count == 0


async def test_a_connection_gone_while_acquiring_keeps_the_stored_session() -> None:
    sessions = manager()
    owned = await connect(sessions, "dev")
    await sessions.dispatcher.subscribe(owned.session, [("a/#", 1)])
    await released(sessions, owned)
    lease, stored = await sessions.acquire("dev", False, None)
    sessions.abandon(lease, stored)
    await sessions.stop()
    _, again = await sessions.acquire("dev", False, None)
    assert again is not None and again.subscriptions == {"a/#": 1}


async def test_a_save_refused_by_the_store_closes_the_connection_without_its_will() -> None:
    store = MemorySessionStore()
    sessions = manager(store=store)
    owned = await connect(sessions, "dev")
    await store.acquire("dev", "other-node", False, force=True)  # taken by force elsewhere
    await sessions.save(owned)
    assert isinstance(owned.holder, FakeClient) and owned.holder.lost == 1


async def test_resume_replays_what_was_missed_then_goes_live() -> None:
    p = ROUTER.route("a/1")[0]
    log = FakeLog({p: [message("a/1", payload=b"%d" % i) for i in range(5)]})
    sessions = manager(log)
    owned = await connect(sessions, "dev")
    await sessions.dispatcher.subscribe(owned.session, [("a/#", 1)])
    stored = sessions.saver.snapshot(owned)
    stored.positions = {p: 2}  # it had seen offsets 0 and 1 before it went away
    await released(sessions, owned)
    owned = await connect(sessions, "dev")
    client = owned.holder
    assert isinstance(client, FakeClient)
    await sessions.resume(owned, stored)
    assert owned.replaying is None
    dispatcher = sessions.dispatcher
    await pump(log, lambda: not dispatcher.is_behind(owned.session), client.ack_all)
    assert [x.payload for x in client.received()] == [b"2", b"3", b"4"]


async def test_orphaned_wills_are_published_through_the_log_and_counted() -> None:
    log = FakeLog()
    sessions = manager(log)
    will = message("wills/dev", qos=1, payload=b"gone")
    sessions.wills.publish_orphaned([record.encode(will), b"not a record"])
    (published,) = log.produced
    assert (published.topic, published.payload, published.qos) == ("wills/dev", b"gone", 1)
    assert sessions.wills.orphaned == 1 and sessions.wills.published == 1


async def test_a_failed_catch_up_is_reported_and_keeps_the_positions_it_resumed_from() -> None:
    p = ROUTER.route("a/1")[0]
    log = FakeLog({p: [message("a/1") for _ in range(5)]})
    sessions = manager(log)
    owned = await connect(sessions, "dev")
    await sessions.dispatcher.subscribe(owned.session, [("a/#", 1)])
    stored = sessions.saver.snapshot(owned)
    stored.positions = {p: 1}
    await released(sessions, owned)
    owned = await connect(sessions, "dev")
    client = owned.holder
    assert isinstance(client, FakeClient)

    async def unreadable(*_: object) -> None:
        raise TimeoutError("catch-up made no progress")

    log.reader.replay = unreadable  # type: ignore[method-assign]
    await sessions.resume(owned, stored)
    await pump(log, lambda: bool(client.stream_errors), lambda: None)
    assert isinstance(client.stream_errors[0], TimeoutError)
    assert sessions.saver.snapshot(owned).positions == {p: 1}  # what the close will store


class CountingStore(MemorySessionStore):
    """The memory store, counting the sessions written and the checkpoints taken."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0
        self.checkpoints: list[tuple[str, int, dict[int, int]]] = []

    async def save(self, lease: Lease, state: StoredSession) -> bool:
        self.writes += 1
        return await super().save(lease, state)

    async def save_many(self, saves: Sequence[tuple[Lease, StoredSession]]) -> list[bool]:
        self.writes += len(saves)
        return await super().save_many(saves)

    async def checkpoint(self, node_id: str, seq: int, positions: dict[int, int]) -> None:
        self.checkpoints.append((node_id, seq, dict(positions)))
        await super().checkpoint(node_id, seq, positions)


def publish_live(log: FakeLog, dispatcher: Dispatcher, topic: str, count: int) -> int:
    """``count`` records on ``topic``'s partition, dispatched live; the partition."""
    p = ROUTER.route(topic)[0]
    records = log.partitions.setdefault(p, [])
    first = len(records)
    records.extend(message(topic, payload=b"%d" % i) for i in range(first, first + count))
    dispatcher.dispatch([Record(p, o, 1, records[o]) for o in range(first, len(records))])
    return p


async def test_an_idle_session_is_written_once_when_it_goes_live_then_never() -> None:
    store = CountingStore()
    sessions = manager(store=store)
    owned = await connect(sessions, "dev")
    await sessions.subscribe(owned, [("a/x", 1)])  # stored before its SUBACK
    assert store.writes == 1
    await sessions.saver.save_round()  # the first round stores it as live here
    written = store.writes
    publish_live(sessions.dispatcher.log, sessions.dispatcher, "a/y", 5)  # traffic, not for it
    for _ in range(3):
        await sessions.saver.save_round()
    assert store.writes == written and sessions.saver.active == 0
    # Its position moved with the traffic all the same: in the node's one checkpoint.
    node, _, positions = store.checkpoints[-1]
    assert node == sessions.saver.checkpoint_id and positions[ROUTER.route("a/y")[0]] == 5


async def test_the_session_of_a_dead_node_resumes_from_that_nodes_checkpoint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("frontend.sessions.manager.FORCE_AFTER", 0.0)
    store, log = CountingStore(), FakeLog()
    dead = manager(log, store)
    owned = await connect(dead, "dev")
    await dead.subscribe(owned, [("a/x", 1)])  # stored once, as live on that node
    p = publish_live(log, dead.dispatcher, "a/y", 7)  # its stream moves on; it is not written
    await dead.saver.save_round()  # the node's checkpoint takes the move
    assert store.writes == 1
    # The node dies; the client comes back to another node, which takes the session by force.
    other = SessionManager(
        wall_clock_stamps("other"), Limits(), store, MemoryRetainedStore(),
        Dispatcher(log, ROUTER), log,  # type: ignore[arg-type]
    )  # fmt: skip
    other.coordinator = cluster = NoAnswer()  # type: ignore[assignment]
    lease, stored = await other.acquire("dev", False, None)
    assert stored is not None and stored.positions == {p: 7}  # not 0: nothing read twice
    await until(lambda: bool(cluster.told))  # the old owner is told in the background
    assert cluster.told == [(STAMPS.origin_node, "dev", lease.token)]


async def test_a_connection_on_an_older_lease_closes_without_its_will_when_told() -> None:
    sessions = manager()
    owned = await connect(sessions, "dev")
    holder = owned.holder
    assert isinstance(holder, FakeClient)
    sessions.taken_elsewhere("dev", owned.lease.token)  # not newer: a stale notice
    assert holder.lost == 0
    sessions.taken_elsewhere("dev", owned.lease.token + 1)
    assert holder.lost == 1


async def until(condition: Callable[[], bool]) -> None:
    """Wait for ``condition``, a few loop turns at most (work the manager left in the
    background: a store read, a message to another node)."""
    for _ in range(100):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


async def answered(holder: FakeClient) -> None:
    """Until the connection was closed, one way or the other."""
    await until(lambda: bool(holder.lost or holder.taken_over))


async def test_a_request_to_let_go_of_a_session_taken_meanwhile_closes_without_the_will() -> None:
    # A stuck node wakes to the request before the news that the session was taken: the store
    # says the lease is no longer its, so the connection goes without a second will.
    store = MemorySessionStore()
    sessions = manager(store=store)
    owned = await connect(sessions, "dev")
    holder = owned.holder
    assert isinstance(holder, FakeClient)
    await store.acquire("dev", "other-node", clean=False, force=True)  # taken by force
    sessions.release_requested("dev")
    await answered(holder)  # the check is one store read away
    assert holder.lost == 1 and holder.taken_over == 0


async def test_a_request_to_let_go_of_a_session_still_held_closes_it_with_its_will() -> None:
    sessions = manager()
    owned = await connect(sessions, "dev")
    holder = owned.holder
    assert isinstance(holder, FakeClient)
    sessions.release_requested("dev")
    await answered(holder)
    assert holder.taken_over == 1 and holder.lost == 0


# -- one owner, steps in the order of the code -------------------------------------------------


class AskedWhileAcquiring(MemorySessionStore):
    """A store during whose acquire another node asks this node for the session."""

    def __init__(self) -> None:
        super().__init__()
        self.sessions: SessionManager | None = None

    async def acquire(self, client_id: str, *args: Any, **kwargs: Any) -> Any:
        answer = await super().acquire(client_id, *args, **kwargs)
        if self.sessions is not None:
            self.sessions.release_requested(client_id)
        return answer


async def test_a_session_asked_for_while_opening_is_let_go_when_served_and_not_resumed() -> None:
    store = AskedWhileAcquiring()
    sessions = manager(store=store)
    first = await connect(sessions, "dev")
    await sessions.subscribe(first, [("a/#", 1)])
    await released(sessions, first)
    store.sessions = sessions
    holder = FakeClient(Session("dev", False))
    opened = await sessions.open("dev", Connect("dev", False), holder, lambda: False, "")
    assert opened is not None and opened.present
    assert holder.taken_over == 0  # nothing before the CONNACK goes out
    sessions.serve(opened)
    assert holder.taken_over == 1  # at once, not a loop turn later
    await asyncio.sleep(0.01)  # a resume, had one started, would have registered by now
    assert opened.owned.session.subscriptions == {}  # not resumed: it is being let go


async def test_a_takeover_here_closes_the_connection_the_manager_serves_the_session_with() -> None:
    sessions = manager()
    first = await connect(sessions, "dev")
    holder = first.holder
    assert isinstance(holder, FakeClient)
    holder.on_takeover = lambda: sessions.end(first, None, [])
    sessions.dispatcher.detach(first.session, holder)  # the router no longer knows it
    lease, _ = await asyncio.wait_for(sessions.acquire("dev", False, None), 5)
    assert holder.taken_over == 1 and first.closed and lease.token == first.lease.token + 1


async def test_ending_a_connection_publishes_its_will_then_stores_what_it_held_back() -> None:
    log = FakeLog()
    sessions = manager(log)
    owned = await connect(sessions, "dev")
    will = message("wills/dev", payload=b"gone")
    mine = message("a/b", payload=b"own")
    held = Outbound(mine, 1, False, PublishTemplate("a/b", b"own", 1))
    sessions.end(owned, will, [held])
    assert [m.payload for m in log.produced] == [b"gone"] and sessions.wills.published == 1
    assert [out.message.payload for out in owned.session.queue] == [b"own"]  # kept for later
    assert owned.closed and sessions.live == [0, 0]
    await sessions.stop()
    _, stored = await sessions.acquire("dev", False, None)
    assert stored is not None  # released, not forgotten
