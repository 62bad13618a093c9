"""The SessionStore contract, run against every backend: in memory, Redis and Redis Cluster
(real servers).

One suite, parametrized over the backends by the ``store`` fixture, states what the session
manager may rely on whichever store it is given: ownership by lease, fencing by token, state kept
across connections, QoS 2 marks, batched saves, node checkpoints, and ownership by identity (a
session, connected or parked, is refused to another identity and left untouched).  Liveness is
the one input the backends take differently: a Redis owner is busy only while its node's
``alive`` key exists, which ``make_alive`` sets (a no-op in memory, where every owner is live).

What differs by design is tested apart, on Redis only, below the contract: an owner whose node
is dead does not hold its session, a will kept there is handed to the next owner, and a dead
node's sessions are swept.  The memory store has none of it: one process dies with its sessions
and their wills.  Expiry is in ``test_session_expiry``.

The QoS 2 marks (``mark_received``/``unmark_received``) are the record of which inbound packet
ids await PUBREL: ``acquire`` returns them as ``awaiting_rel``, whatever a save or release carried.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace

import pytest

from frontend.sessions.redis import RedisSessionStore
from frontend.sessions.store import (
    Acquired,
    Busy,
    Lease,
    MemorySessionStore,
    NotOwner,
    SessionStore,
)
from mqttcore.session import StoredOutbound, StoredSession
from tests.integration.conftest import REDIS_KINDS, OpenRedis, keys_under

MakeAlive = Callable[[str], Awaitable[None]]
CLIENT = "client-1"


def stored(awaiting_rel: tuple[int, ...] = (3, 7), last_id: int = 7) -> StoredSession:
    """A session with something in every field (a fresh object each call)."""
    return StoredSession(
        subscriptions={"sensors/+/temp": 1, "alerts/#": 2, "plain": 0},
        positions={0: 10, 3: 42},
        inflight=[
            StoredOutbound(b"\x00record-one\xff", 1, False, 5, False, 0, 9),
            StoredOutbound(b"record-two", 2, True, 6, True, 3, 41),
            StoredOutbound(b"record-three", 2, False, 7, False),
        ],
        awaiting_rel=list(awaiting_rel),
        last_id=last_id,
    )


async def acquired(
    store: SessionStore, node: str, clean: bool = False, force: bool = False
) -> Acquired:
    answer = await store.acquire(CLIENT, node, clean, force)
    assert isinstance(answer, Acquired), f"{node} expected the session, got {answer}"
    return answer


async def saved_with_marks(store: SessionStore, lease: Lease, state: StoredSession) -> None:
    """Save ``state`` and mark its QoS 2 ids, as a connection does."""
    assert await store.save(lease, state)
    for packet_id in state.awaiting_rel:
        await store.mark_received(lease, packet_id)


@pytest.fixture(params=["memory", *REDIS_KINDS])
def store(request: pytest.FixtureRequest, open_redis: OpenRedis, redis_prefix: str) -> SessionStore:
    """Each backend in turn (a Redis is started only for its own runs)."""
    if request.param == "memory":
        return MemorySessionStore()
    return RedisSessionStore(open_redis(request.param), redis_prefix)


@pytest.fixture(params=REDIS_KINDS)
def redis_store(
    request: pytest.FixtureRequest, open_redis: OpenRedis, redis_prefix: str
) -> RedisSessionStore:
    return RedisSessionStore(open_redis(request.param), redis_prefix)


@pytest.fixture
def make_alive(store: SessionStore) -> MakeAlive:
    """Mark a node live, so that a connection it owns holds its session."""

    async def alive(node_id: str) -> None:
        if isinstance(store, RedisSessionStore):
            await store.heartbeat(node_id)

    return alive


# -- the contract: both backends ----------------------------------------------------------------


async def test_a_new_client_id_is_acquired_without_state(store: SessionStore) -> None:
    answer = await acquired(store, "node-a")
    assert answer.state is None
    assert answer.orphaned_will is None
    assert (answer.lease.client_id, answer.lease.node_id) == (CLIENT, "node-a")


async def test_a_live_owner_makes_the_session_busy(
    store: SessionStore, make_alive: MakeAlive
) -> None:
    await make_alive("node-a")
    await acquired(store, "node-a")
    assert await store.acquire(CLIENT, "node-b", False) == Busy("node-a")
    assert await store.acquire(CLIENT, "node-b", True) == Busy("node-a")  # clean waits too


async def test_released_state_comes_back_to_the_next_owner(
    store: SessionStore, make_alive: MakeAlive
) -> None:
    await make_alive("node-a")
    first = await acquired(store, "node-a")
    await saved_with_marks(store, first.lease, stored())
    await store.release(first.lease, stored())
    again = await acquired(store, "node-b")  # released: free, though node-a lives
    assert again.state == stored()
    assert again.lease.token > first.lease.token


async def test_release_keeps_the_state_it_is_given(store: SessionStore) -> None:
    first = await acquired(store, "node-a")
    await saved_with_marks(store, first.lease, stored(awaiting_rel=()))
    await store.release(first.lease, stored(awaiting_rel=(), last_id=9))
    assert (await acquired(store, "node-a")).state == stored(awaiting_rel=(), last_id=9)


async def test_saved_state_outlives_an_owner_that_never_released(store: SessionStore) -> None:
    first = await acquired(store, "node-a")
    await saved_with_marks(store, first.lease, stored())
    taken = await acquired(store, "node-b", force=True)
    assert taken.state == stored()


async def test_a_clean_acquire_discards_the_stored_state(store: SessionStore) -> None:
    first = await acquired(store, "node-a")
    await saved_with_marks(store, first.lease, stored())
    await store.release(first.lease, stored())
    clean = await acquired(store, "node-a", clean=True)
    assert clean.state is None
    # The marks went with it: a state saved now has only its own.
    assert await store.save(clean.lease, stored(awaiting_rel=()))
    assert (await acquired(store, "node-b", force=True)).state == stored(awaiting_rel=())


async def test_release_without_state_forgets_the_session(store: SessionStore) -> None:
    first = await acquired(store, "node-a")
    await saved_with_marks(store, first.lease, stored())
    await store.release(first.lease, None)
    again = await acquired(store, "node-a")
    assert again.state is None
    assert again.lease.token > first.lease.token  # the token survives: old leases stay stale


async def test_marks_reach_the_next_owner(store: SessionStore) -> None:
    first = await acquired(store, "node-a")
    await saved_with_marks(store, first.lease, stored(awaiting_rel=()))
    await store.mark_received(first.lease, 5)
    await store.mark_received(first.lease, 9)
    await store.mark_received(first.lease, 9)  # a DUP resend marks nothing new
    await store.unmark_received(first.lease, 5)
    await store.unmark_received(first.lease, 11)  # never marked: nothing to undo
    taken = await acquired(store, "node-b", force=True)
    assert taken.state is not None
    assert taken.state.awaiting_rel == [9]


async def test_force_takes_a_busy_session_with_a_newer_token(
    store: SessionStore, make_alive: MakeAlive
) -> None:
    await make_alive("node-a")
    first = await acquired(store, "node-a")
    assert await store.acquire(CLIENT, "node-b", False) == Busy("node-a")
    taken = await acquired(store, "node-b", force=True)
    assert taken.lease == Lease(CLIENT, "node-b", taken.lease.token)
    assert taken.lease.token > first.lease.token
    await make_alive("node-b")
    assert await store.acquire(CLIENT, "node-c", False) == Busy("node-b")


async def test_a_stale_lease_writes_nothing(store: SessionStore, make_alive: MakeAlive) -> None:
    stale = (await acquired(store, "node-a")).lease
    await saved_with_marks(store, stale, stored())
    await acquired(store, "node-b", force=True)
    await make_alive("node-b")

    assert not await store.save(stale, stored(awaiting_rel=(), last_id=1))
    await store.mark_received(stale, 99)
    await store.unmark_received(stale, 3)
    await store.release(stale, stored(awaiting_rel=(), last_id=2))
    await store.release(stale, None)

    assert await store.acquire(CLIENT, "node-c", False) == Busy("node-b")  # still node-b's
    assert (await acquired(store, "node-c", force=True)).state == stored()


async def test_a_released_lease_writes_nothing(store: SessionStore) -> None:
    first = await acquired(store, "node-a")
    await store.release(first.lease, stored(awaiting_rel=()))
    assert not await store.save(first.lease, stored(awaiting_rel=(), last_id=1))
    await store.mark_received(first.lease, 99)
    await store.release(first.lease, None)  # let go already: forgets nothing
    assert (await acquired(store, "node-b")).state == stored(awaiting_rel=())


async def test_live_on_and_live_since_are_kept(store: SessionStore) -> None:
    live = replace(stored(), live_on="node-a", live_since=41)
    first = await acquired(store, "node-a")
    await saved_with_marks(store, first.lease, live)
    taken = await acquired(store, "node-b", force=True)
    assert taken.state == live
    settled = replace(live, live_on="", live_since=0)
    await store.release(taken.lease, settled)
    assert (await acquired(store, "node-c")).state == settled


async def test_save_many_stores_every_current_session_and_no_stale_one(
    store: SessionStore,
) -> None:
    one = await store.acquire("client-a", "node-a", False)
    stale = await store.acquire("client-b", "node-a", False)
    three = await store.acquire("client-c", "node-a", False)
    assert isinstance(one, Acquired) and isinstance(stale, Acquired) and isinstance(three, Acquired)
    assert isinstance(await store.acquire("client-b", "node-b", False, force=True), Acquired)
    saves = [
        (one.lease, stored(awaiting_rel=(), last_id=1)),
        (stale.lease, stored(awaiting_rel=(), last_id=2)),
        (three.lease, stored(awaiting_rel=(), last_id=3)),
    ]
    assert await store.save_many(saves) == [True, False, True]
    assert await store.save_many([]) == []
    for client_id, expected in [("client-a", 1), ("client-b", None), ("client-c", 3)]:
        taken = await store.acquire(client_id, "node-c", False, force=True)
        assert isinstance(taken, Acquired)
        assert (taken.state.last_id if taken.state else None) == expected


async def test_a_checkpoint_is_replaced_whole_by_a_later_one_only(store: SessionStore) -> None:
    assert await store.read_checkpoint("node-a") == (0, {})
    await store.checkpoint("node-a", 5, {0: 10, 3: 42})
    await store.checkpoint("node-a", 4, {0: 1})  # an older one, arriving late
    assert await store.read_checkpoint("node-a") == (5, {0: 10, 3: 42})
    await store.checkpoint("node-a", 6, {1: 7})
    assert await store.read_checkpoint("node-a") == (6, {1: 7})
    assert await store.read_checkpoint("node-b") == (0, {})


async def test_client_ids_are_independent(store: SessionStore, make_alive: MakeAlive) -> None:
    await make_alive("node-a")
    first = await acquired(store, "node-a")
    await saved_with_marks(store, first.lease, stored())
    other = await store.acquire("client-2", "node-b", False)
    assert isinstance(other, Acquired)
    assert other.state is None


# -- Redis only: liveness and wills, which one process has no use for ---------------------------


async def test_redis_an_owner_on_a_dead_node_does_not_hold_the_session(
    redis_store: RedisSessionStore,
) -> None:
    first = await acquired(redis_store, "node-a")  # node-a never heartbeats
    await saved_with_marks(redis_store, first.lease, stored())
    taken = await acquired(redis_store, "node-b")
    assert taken.state == stored()
    assert taken.lease.token > first.lease.token


async def test_redis_hands_a_dead_connections_will_to_the_next_owner(
    redis_store: RedisSessionStore,
) -> None:
    first = await acquired(redis_store, "node-a")
    await redis_store.keep_will(first.lease, b"\x00will record\xff")
    taken = await acquired(redis_store, "node-b")
    assert taken.orphaned_will == b"\x00will record\xff"
    await redis_store.release(taken.lease, None)
    assert (await acquired(redis_store, "node-c")).orphaned_will is None  # handed over once


async def test_redis_release_drops_the_will(redis_store: RedisSessionStore) -> None:
    first = await acquired(redis_store, "node-a")
    await redis_store.keep_will(first.lease, b"will")
    await redis_store.release(first.lease, stored())
    assert (await acquired(redis_store, "node-b")).orphaned_will is None
    assert await redis_store.sweep_node("node-a") == []


async def test_redis_a_stale_lease_keeps_no_will(redis_store: RedisSessionStore) -> None:
    stale = (await acquired(redis_store, "node-a")).lease
    await acquired(redis_store, "node-b", force=True)
    await redis_store.keep_will(stale, b"old will")
    assert (await acquired(redis_store, "node-c", force=True)).orphaned_will is None
    assert await redis_store.sweep_node("node-a") == []


async def test_redis_a_dead_nodes_sweep_takes_its_wills_and_parks_its_sessions(
    redis_store: RedisSessionStore,
) -> None:
    kept = await acquired(redis_store, "node-a")  # node-a never heartbeats: dead
    await saved_with_marks(redis_store, kept.lease, stored())
    await redis_store.keep_will(kept.lease, b"kept's will")
    ended = await redis_store.acquire("clean-1", "node-a", True)
    assert isinstance(ended, Acquired)
    await redis_store.keep_will(ended.lease, b"clean's will")

    wills = await redis_store.sweep_node("node-a")
    assert sorted(wills) == [b"clean's will", b"kept's will"]
    assert await redis_store.sweep_node("node-a") == []  # taken once
    assert not await redis_store.save(kept.lease, stored())  # the dead node's lease is spent
    assert not await redis_store.save(ended.lease, stored())
    again = await acquired(redis_store, "node-b")  # parked: free, its will already taken
    assert (again.state, again.orphaned_will) == (stored(), None)
    await redis_store.release(again.lease, None)
    assert await keys_under(redis_store.redis, redis_store.prefix) == []  # the clean one ended


async def test_redis_a_live_node_is_not_swept_but_its_own_restart_is(
    redis_store: RedisSessionStore,
) -> None:
    await redis_store.heartbeat("node-a")
    first = await acquired(redis_store, "node-a")
    await redis_store.keep_will(first.lease, b"will")
    assert await redis_store.nodes() == ["node-a"]
    assert await redis_store.sweep_node("node-a") == []  # alive
    # node-a restarted under its id: what its previous process left is swept, alive or not
    assert await redis_store.sweep_node("node-a", only_if_dead=False) == [b"will"]
    await redis_store.redis.delete(redis_store.alive_key("node-a"))
    assert await redis_store.sweep_node("node-a") == []
    assert await redis_store.nodes() == []  # nothing left to sweep: no longer listed


async def test_redis_letting_go_leaves_no_node_entry(redis_store: RedisSessionStore) -> None:
    first = await acquired(redis_store, "node-a")
    await redis_store.release(first.lease, None)
    taken = await acquired(redis_store, "node-a")
    await acquired(redis_store, "node-b", force=True)
    await redis_store.release(taken.lease, None)  # a lease lost to node-b: its entry goes too
    assert await keys_under(redis_store.redis, f"{redis_store.prefix}{{node-a}}") == []


async def test_redis_a_session_stays_listed_while_owned_whoever_let_go_before(
    redis_store: RedisSessionStore,
) -> None:
    """Two connections of one client on one node: the second lists itself, is told the session
    is busy, and takes it once the first let go; the first's unlisting must not take the
    second's entry with it, or the session would not be swept if the node died."""
    owned = redis_store._node_key("node-a", "owned")
    first = await acquired(redis_store, "node-a")
    assert await redis_store.acquire(CLIENT, "node-a", False) == Busy("node-a")
    await redis_store.release(first.lease, stored())
    second = await acquired(redis_store, "node-a")
    assert await redis_store.redis.hexists(owned, CLIENT)
    await redis_store.keep_will(second.lease, b"second's will")
    assert await redis_store.sweep_node("node-a") == [b"second's will"]  # found: node-a is dead
    assert not await redis_store.redis.hexists(owned, CLIENT)


async def test_the_marks_not_the_saved_list_say_what_awaits_pubrel(store: SessionStore) -> None:
    first = await acquired(store, "node-a")
    await store.mark_received(first.lease, 5)  # before any save
    await store.release(first.lease, stored(awaiting_rel=(4,)))  # a list that disagrees
    again = await acquired(store, "node-b")
    assert again.state is not None and again.state.awaiting_rel == [5]
    await store.unmark_received(again.lease, 5)
    await store.release(again.lease, stored(awaiting_rel=(5,)))
    last = await acquired(store, "node-a")
    assert last.state is not None and last.state.awaiting_rel == []


# -- a session belongs to its identity: both backends, and Redis's sweep and old sessions ------


async def owns(store: SessionStore, node: str, identity: str, clean: bool = False) -> Acquired:
    answer = await store.acquire(CLIENT, node, clean, identity=identity)
    assert isinstance(answer, Acquired), f"{identity!r} expected the session, got {answer}"
    return answer


async def test_another_identity_is_refused_a_connected_session_untouched(
    store: SessionStore, make_alive: MakeAlive
) -> None:
    await make_alive("node-a")
    alice = await owns(store, "node-a", "alice")
    await saved_with_marks(store, alice.lease, stored())
    for clean, force in ((False, False), (True, False), (False, True), (True, True)):
        answer = await store.acquire(CLIENT, "node-b", clean, force, identity="bob")
        assert answer == NotOwner()
    assert await store.acquire(CLIENT, "node-b", False, identity="") == NotOwner()  # anonymous
    assert await store.save(alice.lease, stored())  # her lease is still current
    assert await store.acquire(CLIENT, "node-b", False, identity="alice") == Busy("node-a")


async def test_another_identity_is_refused_a_parked_session_and_the_owner_gets_it_whole(
    store: SessionStore,
) -> None:
    alice = await owns(store, "node-a", "alice")
    await saved_with_marks(store, alice.lease, stored())
    await store.release(alice.lease, stored())
    assert await store.acquire(CLIENT, "node-b", True, identity="bob") == NotOwner()  # no wipe
    again = await owns(store, "node-b", "alice")
    assert again.state == stored()
    assert again.lease.token > alice.lease.token


async def test_a_session_that_ended_is_anyones(store: SessionStore) -> None:
    alice = await owns(store, "node-a", "alice", clean=True)
    assert await store.acquire(CLIENT, "node-b", True, identity="bob") == NotOwner()
    await store.release(alice.lease, None)  # a clean session ends with its connection
    bob = await owns(store, "node-b", "bob")
    assert await store.acquire(CLIENT, "node-a", False, identity="alice") == NotOwner()
    await store.release(bob.lease, stored())
    assert await store.acquire(CLIENT, "node-a", False, identity="alice") == NotOwner()


async def test_redis_a_swept_session_keeps_its_owner(redis_store: RedisSessionStore) -> None:
    alice = await owns(redis_store, "node-a", "alice")  # node-a never heartbeats: dead
    await saved_with_marks(redis_store, alice.lease, stored())
    await redis_store.sweep_node("node-a")
    assert await redis_store.acquire(CLIENT, "node-b", False, identity="bob") == NotOwner()
    assert (await owns(redis_store, "node-b", "alice")).state == stored()


async def test_redis_a_session_stored_before_identities_is_the_next_acquirers(
    redis_store: RedisSessionStore,
) -> None:
    old = await owns(redis_store, "node-a", "alice")
    await redis_store.release(old.lease, stored(awaiting_rel=()))
    await redis_store.redis.hdel(f"{redis_store.prefix}{{{CLIENT}}}:session", "ident")
    claimed = await owns(redis_store, "node-b", "bob")  # no owner recorded: bob's now
    assert claimed.state == stored(awaiting_rel=())
    await redis_store.release(claimed.lease, stored(awaiting_rel=()))
    assert await redis_store.acquire(CLIENT, "node-a", False, identity="alice") == NotOwner()


async def test_redis_a_server_that_lost_its_scripts_loads_them_again(
    redis_store: RedisSessionStore,
) -> None:
    """A Redis restarted empty has no scripts: the store's EVALSHAs find none and load them."""
    await redis_store.redis.script_flush()
    lease = (await acquired(redis_store, "n1")).lease
    await redis_store.redis.script_flush()
    await saved_with_marks(redis_store, lease, stored())
    await redis_store.redis.script_flush()
    await redis_store.release(lease, stored())
    await redis_store.redis.script_flush()
    again = await acquired(redis_store, "n2")
    assert again.state == stored()
