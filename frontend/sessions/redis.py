"""Sessions in Redis: what lets any node serve any client.

Key layout (``P`` is the configurable prefix, default ``hw:``; braces mark where a client or
node id goes).  One Redis (a primary with replicas) is assumed: the scripts touch keys of
different clients' or nodes' names, so they are not Redis Cluster safe.

==============================  ======  ======================================================
``P{cid}:session``              hash    ``owner`` node id, ``token`` fencing counter,
                                        ``connected`` 0/1, ``present`` 1 once state is stored,
                                        ``subs`` JSON filter->QoS, ``pos`` JSON partition->
                                        offset, ``inflight`` JSON (record copies, base64),
                                        ``lastid`` last packet id used, ``will`` the open
                                        connection's will (a log record), if it has one
``P{cid}:rel``                  set     inbound QoS 2 packet ids awaiting PUBREL
``P{node}:alive``               string  set with a 5 s expiry while the node runs
``P{node}:inbox``               pubsub  takeover requests for sessions the node owns
``P{node}:wills``               set     client ids of the node's connections that have a will
``Pwill-nodes``                 set     node ids that have such connections
==============================  ======  ======================================================

Ownership: ``acquire`` is one Lua script: if a live connection on a live node owns the session
it answers "busy" (the caller asks that node to let go, see ``frontend.cluster``); otherwise it
increments the token, records the new owner and returns the stored state.  Every later write
(save, release, QoS 2 marks) is a script that first compares the caller's token with the stored
one, so a node that lost ownership can never write again.

Wills of a dead node: a connection's will is stored with its session until the connection ends
(its node publishes the will itself, or drops it on DISCONNECT).  If the node dies first, the
will is published by whichever node comes first: ``acquire`` hands it to the node the client
reconnects to (published before the new CONNACK), and every node's ``claim_wills`` sweep takes
the wills of nodes whose ``alive`` key has expired.  Both delete the will as they take it, so it
is published once, at most a few seconds after the crash.  A session taken by force (its node did
not answer the takeover request) hands over its will the same way; the old node, when its next
save is refused, closes that connection without publishing the will again.
"""

from __future__ import annotations

import base64
import json

import redis.asyncio as aioredis

from frontend.mqtt.session import StoredOutbound, StoredSession
from frontend.sessions.store import Acquired, Busy, Lease

ALIVE_SECONDS = 5

_ACQUIRE = """
local owner = redis.call('HGET', KEYS[1], 'owner')
if owner and owner ~= '' and ARGV[3] ~= '1'
   and redis.call('HGET', KEYS[1], 'connected') == '1'
   and redis.call('EXISTS', ARGV[4] .. owner .. '}:alive') == 1 then
  return {'busy', owner}
end
local orphaned = false
if owner and owner ~= '' and redis.call('HGET', KEYS[1], 'connected') == '1' then
  -- still connected, yet not busy: its node is dead, or taken by force from a node that did not
  -- answer; either way that connection's will is ours to publish
  orphaned = redis.call('HGET', KEYS[1], 'will')
  redis.call('SREM', ARGV[4] .. owner .. '}:wills', ARGV[5])
end
redis.call('HDEL', KEYS[1], 'will')
local token = redis.call('HINCRBY', KEYS[1], 'token', 1)
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'connected', '1')
if ARGV[2] == '1' then
  redis.call('HDEL', KEYS[1], 'present', 'subs', 'pos', 'inflight', 'lastid')
  redis.call('DEL', KEYS[2])
end
return {'ok', tostring(token), redis.call('HGETALL', KEYS[1]), redis.call('SMEMBERS', KEYS[2]),
        orphaned}
"""

_FENCE = "if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return 0 end\n"

_SAVE = (
    _FENCE
    + """
redis.call('HSET', KEYS[1], 'present', '1', 'subs', ARGV[2], 'pos', ARGV[3],
           'inflight', ARGV[4], 'lastid', ARGV[5])
return 1
"""
)

_RELEASE = (
    _FENCE
    + """
redis.call('SREM', KEYS[3], ARGV[6])
redis.call('HDEL', KEYS[1], 'will')
if ARGV[2] == '' then
  redis.call('DEL', KEYS[1], KEYS[2])
  redis.call('HSET', KEYS[1], 'token', ARGV[1])
  return 1
end
redis.call('HSET', KEYS[1], 'present', '1', 'subs', ARGV[2], 'pos', ARGV[3],
           'inflight', ARGV[4], 'lastid', ARGV[5], 'connected', '0', 'owner', '')
return 1
"""
)

_KEEP_WILL = (
    _FENCE
    + """
redis.call('HSET', KEYS[1], 'will', ARGV[2])
redis.call('SADD', KEYS[3], ARGV[3])
redis.call('SADD', KEYS[4], ARGV[4])
return 1
"""
)

_CLAIM_WILLS = """
if ARGV[3] == '1' and redis.call('EXISTS', ARGV[2] .. ARGV[1] .. '}:alive') == 1 then
  return {}
end
local wills = {}
for _, cid in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local key = ARGV[2] .. cid .. '}:session'
  local owned = redis.call('HGET', key, 'owner') == ARGV[1]
  if owned and redis.call('HGET', key, 'connected') == '1' then
    local will = redis.call('HGET', key, 'will')
    if will then
      wills[#wills + 1] = will
      redis.call('HDEL', key, 'will')
    end
  end
end
redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[2], ARGV[1])
return wills
"""

_MARK = _FENCE + "redis.call('SADD', KEYS[2], ARGV[2])\nreturn 1\n"
_UNMARK = _FENCE + "redis.call('SREM', KEYS[2], ARGV[2])\nreturn 1\n"


def _encode_inflight(items: list[StoredOutbound]) -> str:
    return json.dumps([
        [base64.b64encode(o.record).decode(), o.qos, int(o.retain), o.packet_id, int(o.released),
         o.partition, o.offset]
        for o in items
    ])  # fmt: skip


def _decode_inflight(text: str) -> list[StoredOutbound]:
    return [
        StoredOutbound(base64.b64decode(rec), qos, bool(retain), pid, bool(released), p, o)
        for rec, qos, retain, pid, released, p, o in json.loads(text)
    ]


def _session_args(state: StoredSession) -> list[str | int]:
    return [
        json.dumps(state.subscriptions),
        json.dumps({str(p): o for p, o in state.positions.items()}),
        _encode_inflight(state.inflight),
        state.last_id,
    ]


def _decode_session(fields: dict[str, str], rel: list[str]) -> StoredSession | None:
    if fields.get("present") != "1":
        return None
    return StoredSession(
        subscriptions={k: int(v) for k, v in json.loads(fields.get("subs", "{}")).items()},
        positions={int(p): int(o) for p, o in json.loads(fields.get("pos", "{}")).items()},
        inflight=_decode_inflight(fields.get("inflight", "[]")),
        awaiting_rel=sorted(int(r) for r in rel),
        last_id=int(fields.get("lastid", "0")),
    )


class RedisSessionStore:
    """The cluster-wide session store."""

    def __init__(self, client: aioredis.Redis, prefix: str = "hw:") -> None:
        self.redis = client
        self.prefix = prefix
        self._acquire = client.register_script(_ACQUIRE)
        self._save = client.register_script(_SAVE)
        self._release = client.register_script(_RELEASE)
        self._keep_will = client.register_script(_KEEP_WILL)
        self._claim_wills = client.register_script(_CLAIM_WILLS)
        self._mark = client.register_script(_MARK)
        self._unmark = client.register_script(_UNMARK)

    def _keys(self, client_id: str) -> list[str]:
        return [f"{self.prefix}{{{client_id}}}:session", f"{self.prefix}{{{client_id}}}:rel"]

    def alive_key(self, node_id: str) -> str:
        return f"{self.prefix}{{{node_id}}}:alive"

    def _wills(self, node_id: str) -> str:
        return f"{self.prefix}{{{node_id}}}:wills"

    @property
    def _will_nodes(self) -> str:
        return f"{self.prefix}will-nodes"

    def inbox(self, node_id: str) -> str:
        return f"{self.prefix}{{{node_id}}}:inbox"

    async def heartbeat(self, node_id: str) -> None:
        await self.redis.set(self.alive_key(node_id), "1", ex=ALIVE_SECONDS)

    async def acquire(
        self, client_id: str, node_id: str, clean: bool, force: bool = False
    ) -> Acquired | Busy:
        args: list[str | int] = [node_id, int(clean), int(force), f"{self.prefix}{{", client_id]
        answer = await self._acquire(keys=self._keys(client_id), args=args)
        if _text(answer[0]) == "busy":
            return Busy(_text(answer[1]))
        flat = [_text(x) for x in answer[2]]  # read after the will was taken out: all text
        fields = dict(zip(flat[::2], flat[1::2], strict=True))
        lease = Lease(client_id, node_id, int(_text(answer[1])))
        state = _decode_session(fields, [_text(x) for x in answer[3]])
        return Acquired(lease, state, answer[4] or None)

    async def keep_will(self, lease: Lease, will: bytes) -> None:
        keys = [*self._keys(lease.client_id), self._wills(lease.node_id), self._will_nodes]
        await self._keep_will(keys=keys, args=[lease.token, will, lease.client_id, lease.node_id])

    async def claim_wills(self, node_id: str, only_if_dead: bool) -> list[bytes]:
        """Take the wills of ``node_id``'s connections, if it is dead (or unconditionally: a node
        restarting under the id of one that crashed), for the caller to publish."""
        keys = [self._wills(node_id), self._will_nodes]
        args: list[str | int] = [node_id, f"{self.prefix}{{", int(only_if_dead)]
        return list(await self._claim_wills(keys=keys, args=args))

    async def nodes_with_wills(self) -> list[str]:
        return [_text(n) for n in await self.redis.smembers(self._will_nodes)]

    async def save(self, lease: Lease, state: StoredSession) -> bool:
        keys = self._keys(lease.client_id)
        return bool(await self._save(keys=keys, args=[lease.token, *_session_args(state)]))

    async def release(self, lease: Lease, state: StoredSession | None) -> None:
        args = [lease.token, *(_session_args(state) if state else ["", "", "", ""])]
        args.append(lease.client_id)
        keys = [*self._keys(lease.client_id), self._wills(lease.node_id)]
        await self._release(keys=keys, args=args)

    async def mark_received(self, lease: Lease, packet_id: int) -> None:
        await self._mark(keys=self._keys(lease.client_id), args=[lease.token, packet_id])

    async def unmark_received(self, lease: Lease, packet_id: int) -> None:
        await self._unmark(keys=self._keys(lease.client_id), args=[lease.token, packet_id])


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
