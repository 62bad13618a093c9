"""The coordinator's judgement of other nodes, against a store of our own (no Redis): a node is
swept only once this node's own heartbeats have reached the store without a miss for a liveness
key's whole lifetime, so a Redis that has just come back, whose keys all expired while it was
away, never makes a live node look dead."""

from __future__ import annotations

from typing import Any, cast

import pytest

from frontend.cluster import Coordinator
from frontend.sessions.redis import ALIVE_SECONDS


class Store:
    """Heartbeats that fail while ``down``; one other node, whose key has expired."""

    def __init__(self) -> None:
        self.down = False
        self.swept: list[str] = []

    async def heartbeat(self, node_id: str) -> None:
        if self.down:
            raise ConnectionError("Redis is away")

    async def nodes(self) -> list[str]:
        return ["me", "other"]

    async def sweep_node(self, node_id: str, only_if_dead: bool = True) -> list[bytes]:
        self.swept.append(node_id)
        return [b"other's will"]


def coordinator(store: Store, wills: list[bytes]) -> Coordinator:
    return Coordinator(cast(Any, store), "me", print, wills.extend, lambda *_: None)


async def test_no_node_is_judged_from_a_store_that_has_just_come_back() -> None:
    store, wills = Store(), []
    me = coordinator(store, wills)
    await me._beat()
    await me._sweep_once()
    assert (store.swept, wills) == ([], [])  # our own heartbeats have not held long enough

    store.down = True
    with pytest.raises(ConnectionError):
        await me._beat()
    assert me._reachable_since is None
    store.down = False
    await me._beat()  # back: the clock of steady heartbeats starts again
    assert me._reachable_since is not None
    me._reachable_since -= ALIVE_SECONDS - 0.5
    await me._sweep_once()
    assert wills == []

    me._reachable_since -= 1.0  # a whole key lifetime of heartbeats that reached it
    await me._sweep_once()
    assert (store.swept, wills) == (["other"], [b"other's will"])
