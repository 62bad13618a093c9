"""The session manager over the in-memory store and a dispatcher on a fake log: acquire,
takeover, abandon, save, release, resume and wills, as a client would see their effects."""

from __future__ import annotations

import asyncio

from frontend.mqtt.channel import Limits
from frontend.mqtt.session import Session
from frontend.retained import MemoryRetainedStore
from frontend.sessions.manager import Owned, SessionManager
from frontend.sessions.store import MemorySessionStore
from router import record
from router.dispatch import Dispatcher
from router.partitioner import Router
from tests.unit.fakes import STAMPS, FakeClient, FakeLog, message, pump

ROUTER = Router(4, 1)


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
    stored = sessions.snapshot(owned)
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
    stored = sessions.snapshot(owned)
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
    assert sessions.snapshot(owned).positions == {p: 1}  # what the close will store
