"""A session belongs to the identity that made it, as the session manager enforces it over the
in-memory store: another identity's CONNECT is refused (:class:`NotOwnerError`, counted) and
neither the owner's connection nor its stored session is touched; the store's own rules are in
``tests/integration/test_session_store_contract.py``."""

from __future__ import annotations

import pytest

from frontend.retained import MemoryRetainedStore
from frontend.sessions.manager import NotOwnerError, Owned, SessionManager
from mqttcore.channel import Limits
from mqttcore.packets import Connect
from mqttcore.session import Session
from router.dispatch import Dispatcher
from tests.unit.fakes import STAMPS, FakeClient, FakeLog
from tests.unit.test_session_manager import ROUTER, manager, released


async def opened(
    sessions: SessionManager, client_id: str, identity: str, clean: bool = False
) -> tuple[Owned, bool]:
    """``client_id`` connects as ``identity`` (a CONNECT with ``clean``)."""
    holder = FakeClient(Session(client_id, clean))
    answer = await sessions.open(
        client_id, Connect(client_id, clean), holder, lambda: False, identity
    )
    assert answer is not None
    sessions.serve(answer)
    holder.session = answer.owned.session
    return answer.owned, answer.present


async def test_another_identity_is_refused_and_the_live_owner_keeps_its_session() -> None:
    sessions = manager()
    owned, _ = await opened(sessions, "alice-phone", "alice")
    await sessions.subscribe(owned, [("alice/#", 1)])
    for clean in (False, True):
        with pytest.raises(NotOwnerError):
            await opened(sessions, "alice-phone", "bob", clean)
    assert sessions.takeovers_refused == 2 and sessions.takeovers == 0
    assert isinstance(owned.holder, FakeClient) and owned.holder.taken_over == 0
    assert sessions.dispatcher.subscriber("alice-phone") is owned.holder
    assert await sessions.store.save(owned.lease, sessions.saver.snapshot(owned))  # still hers


async def test_a_parked_session_comes_back_to_its_owner_only() -> None:
    sessions = manager()
    owned, _ = await opened(sessions, "alice-phone", "alice")
    await sessions.subscribe(owned, [("alice/#", 1)])
    await released(sessions, owned)
    for identity, clean in (("bob", False), ("bob", True), ("", False)):  # anonymous is someone
        with pytest.raises(NotOwnerError):
            await opened(sessions, "alice-phone", identity, clean)
    _, stored = await sessions.acquire("alice-phone", False, None, "alice")
    assert stored is not None and stored.subscriptions == {"alice/#": 1}


async def test_the_manager_makes_sessions_with_the_byte_bound_of_its_limits() -> None:
    log = FakeLog()
    sessions = SessionManager(
        STAMPS,
        Limits(max_queued_bytes=4096),
        manager().store,
        MemoryRetainedStore(),
        Dispatcher(log, ROUTER),  # type: ignore[arg-type]
        log,  # type: ignore[arg-type]
    )
    owned, _ = await opened(sessions, "dev", "")
    assert owned.session.max_queued_bytes == 4096
