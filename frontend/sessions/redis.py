"""Sessions in Redis (one server, or Redis Cluster): what lets any node serve any client.

Key layout (``P`` is the configurable prefix, default ``hw:``; ``{cid}`` and ``{node}`` are hash
tags, so all keys of one client, and all keys of one node, sit in one Redis Cluster slot, see
:func:`hash_tag`).  Every script touches the keys of one slot only, and names them in KEYS.

==============================  ======  ======================================================
``P{cid}:session``              hash    ``owner`` node id, ``token`` fencing token,
                                        ``connected`` 0/1, ``clean`` 0/1 (as acquired),
                                        ``present`` 1 once state is stored, ``subs`` JSON
                                        filter->QoS, ``pos`` JSON partition->offset,
                                        ``inflight`` JSON (record copies, base64), ``lastid``
                                        last packet id used, ``liveon``/``livesince`` where the
                                        session is live and from which checkpoint, ``will`` the
                                        open connection's will (a log record), if it has one,
                                        ``ident`` the identity the session belongs to
``P{cid}:rel``                  set     inbound QoS 2 packet ids awaiting PUBREL
``P{cid}:expiry``               string  the expiry marker of a parked session (TTL: the expiry)
``P{node}:alive``               string  set with a 5 s expiry while the node runs
``P{node}:inbox``               pubsub  takeover requests for sessions the node owns
``P{node}:owned``               hash    client id -> the entry of the acquisition that listed
                                        it last (a process tag and a number), for every session
                                        the node owns or is acquiring: what to sweep if it dies
``P{run}:ckpt``                 hash    ``seq`` and partition -> offset: one node process's
                                        delivery checkpoint (``Saver.checkpoint_id``; TTL:
                                        the expiry, its grace and a margin, from each write)
``Pnodes``                      set     node ids that may own sessions (swept when dead)
==============================  ======  ======================================================

Ownership: ``acquire`` is a script on the client's slot.  If a connection owns the session it
answers "owned by X, token t"; the caller reads X's ``alive`` key (X's slot) and, if X is dead,
runs the script again with t as the expected token: a compare-and-set that takes the session only
if nobody acquired it in between.  Reading the ``alive`` key in the script would touch two slots;
the split is safe because liveness only decides whether to take a session without asking, never
who may write it: the token does that.  An ``alive`` key that reappears between the read and the
take is the same as one that reappears just after the take, and the old owner's writes are
refused either way.

The script first checks the session's ``ident``: a session (connected or parked, not expired)
of another identity is answered "refused" and left as it is, before anything else is looked at,
so a stranger's CONNECT never takes over, wipes (cleanSession=1) or even delays the owner's
session.  ``ident`` is written by every acquire that succeeds and kept by everything else (saves,
release, the dead-node sweep, which parks a session with its ``ident``); it goes with the session's
keys.  A session stored before ``ident`` existed has none and becomes the next acquirer's (see
``frontend.sessions.store`` for why).

Every later write (save, release, QoS 2 marks, will) is a script that first checks the caller's
token and that the session is still connected, so a node that lost ownership, or let go, can
never write again.  A new token is the larger of the stored one plus one and Redis's clock in
microseconds, so tokens grow even across a key that expired or was deleted (unless that clock
steps back): a forgotten session leaves nothing behind, and no old lease matches a new session.

Sessions end (``expiry`` seconds, 0: never): a parked session (released, or left by a dead node)
gets its marker with the expiry as TTL, and its other keys the expiry plus a grace; ``acquire``
removes both (PERSIST).  When Redis expires a marker it publishes the event; every node listens
(``frontend.cluster``) and runs ``reap``, a script that deletes the session's keys if the marker
is gone and the session still parked, so exactly one node removes them and counts it.  A client
that comes back after the marker expired but before anyone reaped finds its session expired, and
that ``acquire`` counts it instead; a session nobody reaps (no node up) goes with its keys' TTL,
uncounted.  Nothing is ever found by scanning keys.

Dead nodes: a node records in ``P{node}:owned`` every session it is acquiring, before each try
to acquire it (so a crash leaves it findable; on one Redis in the same round trip, ahead of it on
the same connection, on a cluster a round trip earlier), under an entry of that acquisition's own
(``Lease.listed``), and removes it as it lets go, in the release's round trip (on a cluster, the
one after), only if the entry is still its own (so letting go of an old lease never hides a newer
one: a newer acquisition listed itself after, before its own try).  Entries may outlive their
sessions; never the reverse.  An acquire refused for another identity leaves its entry: listing
wrote over whatever was there, maybe the live owner's own entry on this node, which must stay
findable.  ``sweep_node`` takes a dead node's entries, a batch per round trip (the
cost falls on a node's death, in proportion to its sessions): per client, a script takes the
connection's will (for the caller to publish), parks a persistent session (expiring from now) or
deletes a clean one, and leaves alone a session acquired after the node was found dead (tokens are
times: the node came back).  The will of a dead owner's connection goes to whichever comes first,
the sweep or the node the client reconnects to (``acquire``); both delete it as they take it, so
it is published once.  A session taken by force hands over its will the same way; the old node,
when its next save is refused, closes that connection without publishing the will again.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import secrets
from collections.abc import Sequence
from typing import Any, cast

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

from frontend.redis_clients import Lane
from frontend.sessions.store import DEFAULT_EXPIRY, Acquired, Busy, Lease, NotOwner
from mqttcore.session import StoredOutbound, StoredSession
from router.batching import Batch

RedisClient = aioredis.Redis | RedisCluster
"""One Redis server (or a primary with replicas), or a Redis Cluster."""
DEFAULT_PREFIX = "hw:"
"""What every key of a cluster starts with when it sets no other (``--redis-prefix``)."""

ALIVE_SECONDS = 5
EXPIRY_GRACE = 60.0
"""Seconds at most that a parked session's keys outlive its marker, for a node to reap them."""
CHECKPOINT_MARGIN = 60.0
"""Seconds a process's checkpoint outlives, from its last write, the sessions that may need it
when their node is swept within that margin of its death; a session swept later (no node was
up) resumes from its stored positions: more is read again, nothing is lost."""
SWEEP_BATCH = 500
"""Clients of a dead node handled per round trip."""


def hash_tag(name: str) -> str:
    """``{name}``: the hash tag that puts every key of one client, node or routing key in one
    Redis Cluster slot.  A name that cannot be a tag as it is (empty, or holding ``}``) is tagged
    by its hex form behind ``#``, which no plain name's keys can start with."""
    if name and "}" not in name:
        return f"{{{name}}}"
    return f"#{{x{name.encode().hex()}}}"


def untag(tag: str) -> str:
    """The name :func:`hash_tag` made ``tag`` of."""
    return bytes.fromhex(tag[3:-1]).decode() if tag.startswith("#{x") else tag[1:-1]


_FENCE = """
local lease = redis.call('HMGET', KEYS[1], 'token', 'connected')
if lease[1] ~= ARGV[1] or lease[2] ~= '1' then return 0 end
"""

_PARK = """
local function park(ttl, grace)
  if tonumber(ttl) > 0 then
    redis.call('PEXPIRE', KEYS[1], tonumber(ttl) + tonumber(grace))
    redis.call('PEXPIRE', KEYS[2], tonumber(ttl) + tonumber(grace))
    redis.call('SET', KEYS[3], '', 'PX', ttl)
  end
end
"""

# KEYS session, rel, marker.  Parked with the marker gone: expired, not yet reaped.
_EXPIRED = "redis.call('PTTL', KEYS[1]) >= 0 and redis.call('EXISTS', KEYS[3]) == 0"

_ACQUIRE = f"""
-- ARGV node, clean, force, the token of an owner found dead ('' if none), identity
local expired = 0
if {_EXPIRED} then
  expired = 1
end
local ident = redis.call('HGET', KEYS[1], 'ident')
if ident and ident ~= ARGV[5] and expired == 0 then
  return {{'refused'}}
end
local connected = redis.call('HGET', KEYS[1], 'connected') == '1'
local token = redis.call('HGET', KEYS[1], 'token')
if connected and ARGV[3] ~= '1' and token ~= ARGV[4] then
  return {{'owned', redis.call('HGET', KEYS[1], 'owner'), token}}
end
if expired == 1 then
  redis.call('DEL', KEYS[1], KEYS[2])
end
local orphaned = false
if connected then
  -- its node is dead, or did not answer a takeover: that connection's will is ours to publish
  orphaned = redis.call('HGET', KEYS[1], 'will')
end
local now = redis.call('TIME')
token = string.format('%.0f', math.max(tonumber(token or 0) + 1, now[1] * 1000000 + now[2]))
redis.call('HDEL', KEYS[1], 'will')
redis.call('HSET', KEYS[1], 'token', token, 'owner', ARGV[1], 'connected', '1', 'clean', ARGV[2],
           'ident', ARGV[5])
redis.call('PERSIST', KEYS[1])
redis.call('PERSIST', KEYS[2])
redis.call('DEL', KEYS[3])
if ARGV[2] == '1' then
  redis.call('HDEL', KEYS[1], 'present', 'subs', 'pos', 'inflight', 'lastid', 'liveon',
             'livesince')
  redis.call('DEL', KEYS[2])
end
return {{'ok', token, redis.call('HGETALL', KEYS[1]), redis.call('SMEMBERS', KEYS[2]), orphaned,
        expired}}
"""

_STATE_FIELDS = """
local function store_state(first)
  redis.call('HSET', KEYS[1], 'present', '1', 'subs', ARGV[first], 'pos', ARGV[first + 1],
             'inflight', ARGV[first + 2], 'lastid', ARGV[first + 3], 'liveon', ARGV[first + 4],
             'livesince', ARGV[first + 5])
end
"""

_SAVE = _STATE_FIELDS + _FENCE + "store_state(2)\nreturn 1\n"

_RELEASE = (
    _STATE_FIELDS
    + _PARK
    + _FENCE
    + """
-- ARGV token, expiry ms, grace ms, keep (0/1), the state
if ARGV[4] ~= '1' then
  redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
  return 1
end
redis.call('HDEL', KEYS[1], 'will')
store_state(5)
redis.call('HSET', KEYS[1], 'connected', '0', 'owner', '')
park(ARGV[2], ARGV[3])
return 1
"""
)

_KEEP_WILL = _FENCE + "redis.call('HSET', KEYS[1], 'will', ARGV[2])\nreturn 1\n"
_MARK = _FENCE + "redis.call('SADD', KEYS[2], ARGV[2])\nreturn 1\n"
_UNMARK = _FENCE + "redis.call('SREM', KEYS[2], ARGV[2])\nreturn 1\n"

_ORPHAN = (
    _PARK
    + """
-- ARGV the dead node, the time it was found dead (us), expiry ms, grace ms
local s = redis.call('HMGET', KEYS[1], 'owner', 'connected', 'token', 'clean', 'will')
if s[1] ~= ARGV[1] or s[2] ~= '1' then
  return {'gone', false}
end
if tonumber(s[3]) >= tonumber(ARGV[2]) then
  return {'live', false}  -- acquired after the node was found dead: it is back
end
if s[4] == '1' then
  redis.call('DEL', KEYS[1], KEYS[2])
  return {'ended', s[5]}
end
redis.call('HDEL', KEYS[1], 'will')
redis.call('HSET', KEYS[1], 'connected', '0', 'owner', '')
park(ARGV[3], ARGV[4])
return {'parked', s[5]}
"""
)

_REAP = f"""
if {_EXPIRED} then
  redis.call('DEL', KEYS[1], KEYS[2])
  return 1
end
return 0
"""

# KEYS a node's owned hash; ARGV client id, the entry that listed the lease.
_DISOWN = """
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  redis.call('HDEL', KEYS[1], ARGV[1])
end
return 1
"""

_CHECKPOINT = """
-- ARGV seq, TTL ms (0: none), then partition, offset pairs
local stored = redis.call('HGET', KEYS[1], 'seq')
if stored and tonumber(stored) > tonumber(ARGV[1]) then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'seq', ARGV[1])
for i = 3, #ARGV, 1000 do
  redis.call('HSET', KEYS[1], unpack(ARGV, i, math.min(i + 999, #ARGV)))
end
if tonumber(ARGV[2]) > 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 1
"""


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
        state.live_on,
        state.live_since,
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
        live_on=fields.get("liveon", ""),
        live_since=int(fields.get("livesince", "0")),
    )


Call = tuple[list[str], Sequence[str | int | bytes]]
"""One script run: its keys and arguments."""
Command = tuple[Any, ...]
"""One command's arguments, as ``execute_command`` takes them."""


class RedisSessionStore:
    """The cluster-wide session store."""

    def __init__(
        self, client: RedisClient, prefix: str = DEFAULT_PREFIX, expiry: float = DEFAULT_EXPIRY
    ) -> None:
        self.redis = client
        self.prefix = prefix
        self.expired = 0
        self._expiry_ms = round(expiry * 1000)
        self._grace_ms = round(min(expiry, EXPIRY_GRACE) * 1000)
        self._checkpoint_ms = (
            self._expiry_ms + self._grace_ms + round(CHECKPOINT_MARGIN * 1000) if expiry else 0
        )
        self._sources: dict[str, str] = {}
        """Each script's source by its SHA1: loaded again into a server that lost it."""
        self._acquire = self._script(_ACQUIRE)
        self._save = self._script(_SAVE)
        self._release = self._script(_RELEASE)
        self._keep_will = self._script(_KEEP_WILL)
        self._mark = self._script(_MARK)
        self._unmark = self._script(_UNMARK)
        self._orphan = self._script(_ORPHAN)
        self._reap = self._script(_REAP)
        self._disown = self._script(_DISOWN)
        self._checkpoint = self._script(_CHECKPOINT)
        self._cluster = isinstance(client, RedisCluster)
        self._lane = Lane(client)
        self._turn: Batch[Command, Any] = Batch(self._send)
        """What the CONNECTs and DISCONNECTs of one loop turn ask (list, acquire, keep the will,
        save, release, unlist): one round trip for them all, whatever they ask."""
        self._listing_tag = secrets.token_hex(4)
        self._listings = itertools.count(1)
        """Each acquisition's entry in the node's list of its sessions: this process's tag and a
        number, unique to the acquisition (``Lease.listed``)."""

    def _script(self, source: str) -> AsyncScript:
        script = self.redis.register_script(source)
        self._sources[script.sha] = source
        return script

    # -- key names ----------------------------------------------------------------------------

    def _keys(self, client_id: str) -> list[str]:
        """A client's session, QoS 2 marks and expiry marker, the KEYS of its scripts."""
        base = self.prefix + hash_tag(client_id)
        return [f"{base}:session", f"{base}:rel", f"{base}:expiry"]

    def _node_key(self, node_id: str, name: str) -> str:
        return f"{self.prefix}{hash_tag(node_id)}:{name}"

    def alive_key(self, node_id: str) -> str:
        return self._node_key(node_id, "alive")

    def inbox(self, node_id: str) -> str:
        return self._node_key(node_id, "inbox")

    @property
    def _nodes(self) -> str:
        return f"{self.prefix}nodes"

    # -- liveness and dead nodes --------------------------------------------------------------

    async def heartbeat(self, node_id: str) -> None:
        """Mark ``node_id`` alive for ``ALIVE_SECONDS``, and listed among the nodes to sweep
        (again, if it was swept while it could not reach Redis)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.set(self.alive_key(node_id), "1", ex=ALIVE_SECONDS)
        pipe.sadd(self._nodes, node_id)
        await pipe.execute()

    async def nodes(self) -> list[str]:
        """Node ids that may have sessions to sweep."""
        return [_text(n) for n in await self.redis.smembers(self._nodes)]

    async def sweep_node(self, node_id: str, only_if_dead: bool = True) -> list[bytes]:
        """Take over what ``node_id`` left, if it is dead (or unconditionally: a node restarting
        under the id of one that crashed): its persistent sessions expire from now, its clean
        ones end, and its connections' wills come back for the caller to publish."""
        if only_if_dead and await self.redis.exists(self.alive_key(node_id)):
            return []
        found_dead = await self._now()
        owned = self._node_key(node_id, "owned")
        args: list[str | int] = [node_id, found_dead, self._expiry_ms, self._grace_ms]
        wills: list[bytes] = []
        cursor = 0
        while True:
            cursor, batch = await self.redis.hscan(owned, cursor, count=SWEEP_BATCH)
            entries = [(_text(c), _text(t)) for c, t in cast(dict[Any, Any], batch).items()]
            calls: list[Call] = [(self._keys(client_id), args) for client_id, _ in entries]
            answers = await self._run_many(self._orphan, calls)
            wills += [answer[1] for answer in answers if answer[1]]
            done: list[Call] = [
                ([owned], [client_id, token])
                for (client_id, token), answer in zip(entries, answers, strict=True)
                if _text(answer[0]) != "live"
            ]
            await self._run_many(self._disown, done)
            if cursor == 0:
                break
        if only_if_dead and not await self.redis.exists(owned):
            await self._unlist(node_id)
        return wills

    async def _unlist(self, node_id: str) -> None:
        """Stop sweeping a dead node that left nothing.  Another slot than its ``alive`` key:
        if the node came back meanwhile, its heartbeat may have listed it before the removal,
        so it is listed again (a later heartbeat would, but it may own sessions by then)."""
        await self.redis.srem(self._nodes, node_id)
        if await self.redis.exists(self.alive_key(node_id)):
            await self.redis.sadd(self._nodes, node_id)

    async def reap(self, key: str) -> str | None:
        """Redis expired ``key``: if it is one of our sessions' expiry markers, delete that
        session's keys unless it was resumed since, and count it if this call did; the client
        id if this call removed a session."""
        suffix = ":expiry"
        ours = key.startswith(self.prefix) and key[len(self.prefix) :].startswith(("{", "#{"))
        if not (ours and key.endswith(suffix)):
            return None
        base = key[: -len(suffix)]
        if not await self._reap(keys=[f"{base}:session", f"{base}:rel", key]):
            return None
        self.expired += 1
        return untag(base[len(self.prefix) :])

    async def _now(self) -> int:
        """Redis's clock, in microseconds: what tokens are made of."""
        seconds, micros = await self.redis.time()
        return int(seconds) * 1_000_000 + int(micros)

    # -- the SessionStore interface -----------------------------------------------------------

    async def acquire(
        self, client_id: str, node_id: str, clean: bool, force: bool = False, identity: str = ""
    ) -> Acquired | Busy | NotOwner:
        keys = self._keys(client_id)
        owned = self._node_key(node_id, "owned")
        entry = f"{self._listing_tag}.{next(self._listings)}"
        dead_owners_token = ""
        while True:
            # findable before it is ours, listed again at each try: meanwhile another acquisition
            # of the client here may have listed itself, and unlisted as it let go
            listed = self._turn.submit(("HSET", owned, client_id, entry))
            listed.add_done_callback(_seen)  # an acquire that fails with it raises its own error
            if self._cluster:  # its pipeline sends each node's commands apart: no order there
                await listed
            args: list[str | int] = [node_id, int(clean), int(force), dead_owners_token, identity]
            answer = await self._turn(_evalsha(self._acquire, keys, args))
            await listed  # one Redis: sent before the acquire on the same connection, so run first
            if _text(answer[0]) == "ok":
                break
            if _text(answer[0]) == "refused":
                return NotOwner()  # the listing stays: it may be the owner's own (see above)
            owner = _text(answer[1])
            if owner == node_id or await self.redis.exists(self.alive_key(owner)):
                return Busy(owner)
            dead_owners_token = _text(answer[2])  # take it only if it is still that owner's
        token = _text(answer[1])
        if answer[5]:
            self.expired += 1
        flat = [_text(x) for x in answer[2]]  # read after the will was taken out: all text
        fields = dict(zip(flat[::2], flat[1::2], strict=True))
        state = _decode_session(fields, [_text(x) for x in answer[3]])
        lease = Lease(client_id, node_id, int(token), entry)
        return Acquired(lease, state, answer[4] or None)

    async def keep_will(self, lease: Lease, will: bytes) -> None:
        await self._turn(
            _evalsha(self._keep_will, self._keys(lease.client_id), [lease.token, will])
        )

    async def holds(self, lease: Lease) -> bool:
        token = await self.redis.hget(self._keys(lease.client_id)[0], "token")
        return token is not None and int(token) == lease.token

    async def save(self, lease: Lease, state: StoredSession) -> bool:
        keys = self._keys(lease.client_id)
        return bool(
            await self._turn(_evalsha(self._save, keys, [lease.token, *_session_args(state)]))
        )

    async def save_many(self, saves: Sequence[tuple[Lease, StoredSession]]) -> list[bool]:
        calls = [
            (self._keys(lease.client_id), [lease.token, *_session_args(state)])
            for lease, state in saves
        ]
        return [bool(result) for result in await self._run_many(self._save, calls)]

    async def release(self, lease: Lease, state: StoredSession | None) -> None:
        keep = state is not None
        args: list[str | int] = [lease.token, self._expiry_ms, self._grace_ms, int(keep)]
        if state is not None:
            args += _session_args(state)
        released = self._turn.submit(_evalsha(self._release, self._keys(lease.client_id), args))
        if self._cluster:  # its pipeline sends each node's commands apart: no order between them
            await released
        unlist = [self._node_key(lease.node_id, "owned")], [lease.client_id, lease.listed]
        unlisted = self._turn.submit(_evalsha(self._disown, *unlist))
        unlisted.add_done_callback(_seen)  # a release that fails with it raises its own error
        await released  # one Redis: sent before the unlisting on the same connection, so run first
        await unlisted

    async def checkpoint(self, node_id: str, seq: int, positions: dict[int, int]) -> None:
        args: list[str | int] = [seq, self._checkpoint_ms]
        for partition, offset in positions.items():
            args += [partition, offset]
        await self._checkpoint(keys=[self._node_key(node_id, "ckpt")], args=args)

    async def read_checkpoint(self, node_id: str) -> tuple[int, dict[int, int]]:
        stored = await self.redis.hgetall(self._node_key(node_id, "ckpt"))
        fields = {_text(name): int(value) for name, value in stored.items()}
        seq = fields.pop("seq", 0)
        return seq, {int(p): o for p, o in fields.items()}

    async def mark_received(self, lease: Lease, packet_id: int) -> None:
        await self._mark(keys=self._keys(lease.client_id), args=[lease.token, packet_id])

    async def unmark_received(self, lease: Lease, packet_id: int) -> None:
        await self._unmark(keys=self._keys(lease.client_id), args=[lease.token, packet_id])

    # -- pipelines ----------------------------------------------------------------------------

    async def _run_many(self, script: AsyncScript, calls: Sequence[Call]) -> list[Any]:
        """Run ``script`` once per call, in one round trip; raises the first error."""
        results = await self._send([_evalsha(script, keys, args) for keys, args in calls])
        for result in results:
            if isinstance(result, Exception):
                raise result
        return results

    async def _send(self, commands: Sequence[Command]) -> list[Any]:
        """``commands`` in one round trip (one per Redis server); per command, its answer or its
        error.  EVALSHA does not load a missing script, so one that a server lost (a restart)
        is loaded and the commands that missed it sent again."""
        answers = await self._lane.send(commands)
        missed = [i for i, answer in enumerate(answers) if isinstance(answer, NoScriptError)]
        if missed:
            for sha in {commands[i][1] for i in missed}:
                await self.redis.script_load(self._sources[sha])
            again = await self._lane.send([commands[i] for i in missed])
            for i, answer in zip(missed, again, strict=True):
                answers[i] = answer
        return answers


def _seen(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _evalsha(script: AsyncScript, keys: list[str], args: Sequence[str | int | bytes]) -> Command:
    return ("EVALSHA", script.sha, len(keys), *keys, *args)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
