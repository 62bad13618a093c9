"""The node's Redis clients pack commands with hiredis exactly as redis-py packs them."""

from __future__ import annotations

import pytest
from redis.asyncio.connection import Connection, SSLConnection, UnixDomainSocketConnection

from frontend.redis_clients import HiredisPacking, cluster_client, hiredis_packing, single_client

COMMANDS = [
    ("EVALSHA", "a" * 40, 3, "hw:{dev-1}:session", "hw:{dev-1}:rel", "hw:{dev-1}:expiry", "n1", 1),
    ("HSET", "hw:{n1}:owned", "dév-ü", "0"),
    ("SET", b"\x00\xff binary", 12345, "EX", 5),
    ("CLIENT SETNAME", "headwater"),  # a name with a space: two arguments on the wire
    ("SET", "k", memoryview(b"view")),  # not hiredis's: redis-py's own packing
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: str(c[0]))
def test_hiredis_packing_sends_the_bytes_redis_py_sends(command: tuple[object, ...]) -> None:
    plain, packing = Connection(), hiredis_packing(Connection)()
    assert b"".join(map(bytes, packing.pack_command(*command))) == b"".join(
        map(bytes, plain.pack_command(*command))
    )
    assert b"".join(packing.pack_commands([command, command])) == b"".join(
        plain.pack_commands([command, command])
    )


def test_every_kind_of_connection_packs_with_hiredis_and_one_class_each() -> None:
    for kind in (Connection, SSLConnection, UnixDomainSocketConnection):
        packing = hiredis_packing(kind)
        assert issubclass(packing, HiredisPacking) and issubclass(packing, kind)
        assert hiredis_packing(kind) is packing


async def test_the_clients_connections_pack_with_hiredis() -> None:
    single = single_client("redis://127.0.0.1:1/0", 4)
    assert issubclass(single.connection_pool.connection_class, HiredisPacking)
    tls = single_client("rediss://127.0.0.1:1/0", 4)
    assert issubclass(tls.connection_pool.connection_class, SSLConnection)
    assert issubclass(tls.connection_pool.connection_class, HiredisPacking)
    cluster = cluster_client("redis://127.0.0.1:1", 4)
    assert issubclass(cluster.nodes_manager.connection_kwargs["connection_class"], HiredisPacking)
    for node in cluster.nodes_manager.startup_nodes.values():
        assert issubclass(node.connection_class, HiredisPacking)
    for client in (single, tls):
        await client.aclose()
