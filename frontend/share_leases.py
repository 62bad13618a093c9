"""Share groups' leases in Redis: which node reads which partition for a ``$share`` group.

``router.shared`` says what a step of a group's leases is and why; this is its Redis form.  Keys
(``P`` the ``--redis-prefix``, ``g`` the hex SHA-1 of the group's id,
``router.shared.group_id``; one hash tag, so one Redis Cluster slot and one script per step):

==========================  ======  ==========================================================
``P{share:g}:members``      zset    node id -> when its membership expires (ms, Redis's clock)
``P{share:g}:leases``       hash    partition -> ``<expiry ms> <node id>``
``P{share:g}:points``       hash    partition -> the group's commit point (next offset to take)
==========================  ======  ==========================================================

Every time is Redis's (``TIME``), so nodes' clocks never judge a lease.  The members and the
leases expire with ``2 * LEASE_SECONDS`` of quiet (a group nobody holds leaves nothing behind);
the points with ``RETENTION_SECONDS`` after their last move.  A step is one script: commit the
given points of the partitions the node holds a live lease of (others are refused: fencing),
renew the node's membership and drop expired members, deal the wanted partitions round-robin
over the sorted member ids, release the node's leases of partitions dealt to others, take the
free ones dealt to it, and answer each held partition with its point (the given start where
the group has none, stored).  Leaving is the same step without the membership.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

from redis.exceptions import RedisError

from frontend.sessions.redis import RedisClient, hash_tag
from router.shared import LEASE_SECONDS, RETENTION_SECONDS, LeaseError

_STEP = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local node, lease, keep = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local holding = ARGV[4] == '1'
local nw = tonumber(ARGV[5])
local wanted, starts = {}, {}
for k = 1, nw do
  wanted[k] = ARGV[5 + k]
  starts[k] = ARGV[5 + nw + k]
end
local i = 6 + 2 * nw
local function holder(p)
  local v = redis.call('HGET', KEYS[2], p)
  if not v then return nil end
  local sep = string.find(v, ' ', 1, true)
  if tonumber(string.sub(v, 1, sep - 1)) <= now then return nil end
  return string.sub(v, sep + 1)
end
local nc = tonumber(ARGV[i])
for k = 1, nc do
  local p, o = ARGV[i + 2 * k - 1], ARGV[i + 2 * k]
  if holder(p) == node then redis.call('HSET', KEYS[3], p, o) end
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%d', now))
if holding then
  redis.call('ZADD', KEYS[1], string.format('%d', now + lease), node)
else
  redis.call('ZREM', KEYS[1], node)
end
local members = redis.call('ZRANGE', KEYS[1], 0, -1)
table.sort(members)
local me = nil
for k, m in ipairs(members) do
  if m == node then me = k - 1 end
end
local held = {}
for k = 1, nw do
  local p = wanted[k]
  local who = holder(p)
  if me ~= nil and (k - 1) % #members == me and (who == nil or who == node) then
    redis.call('HSET', KEYS[2], p, string.format('%d', now + lease) .. ' ' .. node)
    local at = redis.call('HGET', KEYS[3], p)
    if not at then
      at = starts[k]
      redis.call('HSET', KEYS[3], p, at)
    end
    held[#held + 1] = p
    held[#held + 1] = at
  elseif who == node then
    redis.call('HDEL', KEYS[2], p)
  end
end
redis.call('PEXPIRE', KEYS[1], 2 * lease)
redis.call('PEXPIRE', KEYS[2], 2 * lease)
redis.call('PEXPIRE', KEYS[3], keep)
return held
"""


class RedisShareLeases:
    """``router.shared.Leases`` in Redis (one server or a cluster), for one node."""

    def __init__(
        self, client: RedisClient, prefix: str, node_id: str, lease_seconds: float = LEASE_SECONDS
    ) -> None:
        self._prefix = prefix
        self._node = node_id
        self._lease_ms = int(lease_seconds * 1000)
        self._step = client.register_script(_STEP)

    def keys(self, gid: str) -> list[str]:
        """The group's members, leases and points keys."""
        base = self._prefix + hash_tag("share:" + hashlib.sha1(gid.encode()).hexdigest())
        return [f"{base}:members", f"{base}:leases", f"{base}:points"]

    async def hold(
        self,
        gid: str,
        wanted: Sequence[int],
        commits: Mapping[int, int],
        starts: Mapping[int, int],
    ) -> dict[int, int]:
        held = await self._run(gid, True, wanted, commits, [starts[p] for p in wanted])
        return {int(held[k]): int(held[k + 1]) for k in range(0, len(held), 2)}

    async def leave(self, gid: str, wanted: Sequence[int], commits: Mapping[int, int]) -> None:
        await self._run(gid, False, wanted, commits, [0] * len(wanted))

    async def _run(
        self,
        gid: str,
        holding: bool,
        wanted: Sequence[int],
        commits: Mapping[int, int],
        starts: Sequence[int],
    ) -> list[bytes]:
        args: list[int | str] = [
            self._node,
            self._lease_ms,
            int(RETENTION_SECONDS * 1000),
            int(holding),
            len(wanted),
            *wanted,
            *starts,
            len(commits),
        ]
        for partition, offset in commits.items():
            args += [partition, offset]
        try:
            return list(await self._step(keys=self.keys(gid), args=args))
        except (RedisError, OSError) as exc:
            raise LeaseError(str(exc)) from exc
