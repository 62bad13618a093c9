"""``python -m bench hostile``: issue 20's table of hostile clients, rerun the same way.

Six probes (:data:`PROBES`; what each does is :data:`HOW`, printed under the table), each against
a fresh broker: mosquitto, then one Headwater node (``headwater dev up``, its own Kafka and
Redis), one probe at a time.  ``theft`` runs with a ``mosquitto_passwd`` file and an ACL
giving alice ``alice/#`` and bob ``bob/#``; the others with each broker's defaults.

Memory and threads are the broker process's ``VmRSS`` and ``Threads`` in ``/proc/<pid>/status``
(a Headwater node's own process), Redis's ``used_memory`` from ``INFO memory``.  Every wait is
bounded and every probe is cut off after :data:`PROBE_TIMEOUT`; a probe that fails fills its cell
with the error, not the run.  The clients are raw MQTT 3.1.1 over asyncio sockets
(:mod:`bench.mqtt`): nothing of Headwater's code is in the load.
"""

from __future__ import annotations

import asyncio
import datetime
import getpass
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import redis

from bench import brokers, mqtt, report
from bench.brokers import Headwater, mosquitto_version, start_mosquitto
from bench.measure import machine, rss_kib, threads
from bench.mqtt import DISCONNECT, Endpoint, Login, Stream, subscribe, varint
from bench.report import markers

BEGIN, END = markers("hostile")
BROKERS = ("mosquitto", "headwater")
PROBE_TIMEOUT = 240.0
"""Seconds one probe may take at most, on one broker: the retained probe waits up to
:data:`MARKERS_WAIT` for Headwater's clear markers to expire after its own minute at most."""
ALICE: Login = ("alice", "alice-secret")
BOB: Login = ("bob", "bob-secret")
ACL = "user alice\ntopic readwrite alice/#\n\nuser bob\ntopic readwrite bob/#\n"
QUEUED = 5
SOCKETS, ANNOUNCED, SENT, FLOOD_WAIT = 200, 16_000_000, 1 << 20, 3.0
FILTERS, LEVELS = 8, 30_000
SHARE_MESSAGES = 100
RETAINED, RETAINED_PAYLOAD = 5_000, 100
GROUPS = 300

PROBES = {
    "theft": "bob connects with the client id of alice's persistent session",
    "flood": f"{SOCKETS} sockets send a PUBLISH header announcing 16 MB and then 1 MB each, "
    "never a CONNECT",
    "deep": f"one SUBSCRIBE with {FILTERS} filters of {LEVELS:,} levels",
    "share": "`$share/q<id>/p.t/x` and `$share/q<id>.p/t/x` (two groups), "
    f"{SHARE_MESSAGES} QoS 1 each",
    "retained": f"{RETAINED:,} retained messages set, then cleared",
    "groups": f"one client subscribes to {GROUPS} distinct `$share` groups",
}
"""Probe -> its row's title, worded as the issue's table words it."""


# -- clients ---------------------------------------------------------------------------------


async def login(
    at: Endpoint, client_id: str, clean: bool = True, who: Login | None = None
) -> tuple[Stream, tuple[int, bool] | None]:
    """A connection and its CONNACK (return code, session present), None if closed first."""
    return await mqtt.login(at, client_id, clean, who)


def accepted(connack: tuple[int, bool] | None) -> bool:
    return connack is not None and connack[0] == 0


async def connected(at: Endpoint, client_id: str, who: Login | None = None) -> Stream:
    client, connack = await login(at, client_id, who=who)
    if not accepted(connack):
        raise RuntimeError(f"{client_id}: CONNACK {connack}")
    return client


async def publish_all(
    client: Stream, messages: Sequence[tuple[str, bytes]], retain: bool = False
) -> None:
    """Publish ``messages`` at QoS 1 and wait for every PUBACK."""
    await client.publish_all(messages, retain)


# -- what each probe found --------------------------------------------------------------------


def connack_text(connack: tuple[int, bool] | None) -> str:
    if connack is None:
        return "closed before a CONNACK"
    return f"CONNACK {connack[0]} (session present {int(connack[1])})"


def mib(kib: int) -> str:
    return f"{kib / 1024:,.1f} MiB"


def growth(before: int, after: int) -> str:
    """A growth of KiB in MiB, signed."""
    return f"{(after - before) / 1024:+,.0f} MiB"


def given_back(base: int, full: int, cleared: int) -> str:
    if full <= base:
        return "nothing was taken"
    return f"{(full - cleared) / (full - base):.0%} given back"


@dataclass(frozen=True, slots=True)
class Theft:
    bob: tuple[int, bool] | None
    bob_got: int
    alice: tuple[int, bool] | None
    alice_got: int

    def cell(self) -> str:
        bob = connack_text(self.bob)
        if accepted(self.bob):
            bob += f", got {self.bob_got} of alice's messages"
        alice = connack_text(self.alice)
        return f"bob: {bob}; alice back: {alice}, got {self.alice_got} of her {QUEUED}"


@dataclass(frozen=True, slots=True)
class Flood:
    still_open: int
    rss: tuple[int, int]
    """KiB: before the sockets, and at most during the wait."""

    def cell(self) -> str:
        return (
            f"{self.still_open} of {SOCKETS} still open after {FLOOD_WAIT:g} s; "
            f"RSS {growth(*self.rss)} (at most)"
        )


@dataclass(frozen=True, slots=True)
class Deep:
    codes: tuple[int, ...] | None
    """The SUBACK's return codes; None: the connection was closed instead."""
    rss: tuple[int, int]

    def cell(self) -> str:
        if self.codes is None:
            answer = "connection closed"
        else:
            counts = Counter(self.codes)
            answer = "SUBACK " + ", ".join(f"0x{c:02x} x{n}" for c, n in sorted(counts.items()))
        return f"{answer}; RSS {growth(*self.rss)}"


@dataclass(frozen=True, slots=True)
class Share:
    received: tuple[tuple[str, int], ...]
    """Per group (its subscription), the messages its member received."""

    def cell(self) -> str:
        return ", ".join(f"`{f}` {n} of {SHARE_MESSAGES}" for f, n in self.received)


@dataclass(frozen=True, slots=True)
class Retained:
    stored: int
    """Retained messages a new subscriber to all of them received after the set."""
    left: int
    """... and after the clear."""
    rss: tuple[int, int, int]
    """KiB: before, set, cleared."""
    redis: tuple[int, int, int] | None = None
    """Redis used_memory in bytes (Headwater only): before, set, cleared."""
    markers_gone: tuple[float, int] | None = None
    """Headwater only: seconds after the clear until Redis memory was back within 5% of the
    set's growth (the clears' markers expired), and that reading in bytes."""

    def cell(self) -> str:
        head = f"{self.stored:,} of {RETAINED:,} stored, {self.left:,} left after the clear"
        if self.redis is not None:
            base, full, cleared = (b // 1024 for b in self.redis)
            later = ""
            if self.markers_gone is not None:
                seconds, used = self.markers_gone
                later = (
                    f"; {mib(used // 1024)} {seconds:.0f} s later, once the clears' markers "
                    f"expired ({given_back(base, full, used // 1024)})"
                )
            return (
                f"{head}; Redis {mib(base)} -> {mib(full)} set -> {mib(cleared)} cleared "
                f"({given_back(base, full, cleared)}){later}"
            )
        base, full, cleared = self.rss
        return (
            f"{head}; RSS {mib(base)} -> {mib(full)} -> {mib(cleared)} "
            f"({given_back(base, full, cleared)})"
        )


@dataclass(frozen=True, slots=True)
class Groups:
    granted: int
    threads: tuple[int, int]
    """Before the SUBSCRIBEs, and at most after them."""

    def cell(self) -> str:
        before, after = self.threads
        return f"threads {before:,} -> {after:,} ({self.granted} of {GROUPS} granted)"


Figures = Theft | Flood | Deep | Share | Retained | Groups


@dataclass(slots=True)
class Outcome:
    probe: str
    broker: str
    label: str
    figures: Figures | None = None
    error: str = ""
    seconds: float = 0.0
    redis: str = ""

    def cell(self) -> str:
        if self.figures is None:
            return f"failed: {self.error.splitlines()[0][:100] if self.error else '?'}"
        return self.figures.cell()


@dataclass(slots=True)
class HostileRun:
    command: str
    started: datetime.datetime
    headwater: str = ""
    mosquitto: str = ""
    redis: str = "not used"
    seconds: float = 0.0
    outcomes: list[Outcome] = field(default_factory=list)


# -- the probes -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Target:
    """One fresh broker: where clients connect, its process, the Redis it uses."""

    at: Endpoint
    pid: int
    redis: redis.Redis | None = None

    def rss(self) -> int:
        return rss_kib([self.pid])

    def threads(self) -> int:
        return threads(self.pid)

    def used_memory(self) -> int | None:
        return int(self.redis.info("memory")["used_memory"]) if self.redis is not None else None


async def theft(t: Target) -> Theft:
    alice, _ = await login(t.at, "alice-1", clean=False, who=ALICE)
    alice.send(subscribe(1, ["alice/#"]))
    await alice.expect(9)
    alice.send(DISCONNECT)
    await alice.writer.drain()
    alice.close()
    publisher = await connected(t.at, "alice-pub", ALICE)
    await publish_all(publisher, [("alice/x", b"for alice")] * QUEUED)
    publisher.close()
    bob, bob_connack = await login(t.at, "alice-1", clean=False, who=BOB)
    bob_got = len(await bob.receive(QUEUED, idle=2.0, most=2.0)) if accepted(bob_connack) else 0
    bob.send(DISCONNECT)
    bob.close()
    await asyncio.sleep(0.2)  # the broker sees bob's DISCONNECT before alice's CONNECT
    alice, alice_connack = await login(t.at, "alice-1", clean=False, who=ALICE)
    back = accepted(alice_connack)
    alice_got = len(await alice.receive(QUEUED, idle=3.0, most=8.0)) if back else 0
    alice.close()
    return Theft(bob_connack, bob_got, alice_connack, alice_got)


async def watch_closed(reader: asyncio.StreamReader) -> None:
    """Return when the broker closes the connection."""
    try:
        while await reader.read(1 << 16):
            pass
    except (ConnectionError, OSError):
        pass


async def flood(t: Target) -> Flood:
    before = t.rss()
    opened = await asyncio.gather(
        *(asyncio.open_connection(t.at.host, t.at.port) for _ in range(SOCKETS)),
        return_exceptions=True,
    )
    streams = [s for s in opened if not isinstance(s, BaseException)]
    data = t.at.hello() + bytes((0x30,)) + varint(ANNOUNCED) + bytes(SENT)
    for _, writer in streams:
        writer.write(data)
    watchers = [asyncio.create_task(watch_closed(reader)) for reader, _ in streams]
    most, deadline = before, time.monotonic() + FLOOD_WAIT
    while time.monotonic() < deadline:
        most = max(most, t.rss())
        await asyncio.sleep(0.1)
    still_open = sum(not w.done() for w in watchers)
    for w in watchers:
        w.cancel()
    for _, writer in streams:
        writer.transport.abort()
    return Flood(still_open, (before, max(most, t.rss())))


async def peak_rss(t: Target, seconds: float) -> int:
    most, deadline = t.rss(), time.monotonic() + seconds
    while time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        most = max(most, t.rss())
    return most


async def deep(t: Target) -> Deep:
    client = await connected(t.at, "deep")
    before = t.rss()
    filters = [f"deep{k}" + "/l" * (LEVELS - 1) for k in range(FILTERS)]
    client.send(subscribe(1, filters, qos=0))
    body = await client.expect(9, timeout=30.0)
    most = await peak_rss(t, 1.0)
    client.close()
    return Deep(tuple(body[2:]) if body is not None else None, (before, most))


async def share(t: Target) -> Share:
    tag = uuid.uuid4().hex[:6]
    groups = {f"$share/q{tag}/p.t/x": "p.t/x", f"$share/q{tag}.p/t/x": "t/x"}
    members = []
    for i, group in enumerate(groups):
        member = await connected(t.at, f"member-{i}")
        member.send(subscribe(1, [group]))
        await member.expect(9)
        members.append(member)
    publisher = await connected(t.at, "share-pub")
    messages = [(topic, b"m") for topic in groups.values() for _ in range(SHARE_MESSAGES)]
    await publish_all(publisher, messages)
    got = await asyncio.gather(*(m.receive(SHARE_MESSAGES, idle=5.0, most=15.0) for m in members))
    for client in [*members, publisher]:
        client.close()
    return Share(tuple((g, len(r)) for g, r in zip(groups, got, strict=True)))


RETAINED_TOPICS = [f"ret/{i}" for i in range(RETAINED)]
CHUNK = 100
"""Retained messages are counted by subscribers of this many topics each: a broker's queue
(1,000 messages per client for both) would drop most of 5,000 sent to one subscriber at once."""


async def count_retained(at: Endpoint, filters: Sequence[str], each: int, deadline: float) -> int:
    """Retained messages new subscribers to ``filters`` receive, one subscriber after another,
    each of ``each`` topics (the last part of a second early if ``deadline`` is near)."""
    count = 0
    for i in range(0, len(filters), each):
        client = await connected(at, f"ret-count-{uuid.uuid4().hex[:8]}")
        client.send(subscribe(1, filters[i : i + each]))
        most = max(1.0, deadline - time.monotonic())
        count += sum(p.retain for p in await client.receive(each, idle=2.0, most=most))
        client.close()
    return count


async def poll_retained(at: Endpoint, full: bool, most: float = 30.0) -> int:
    """Count the retained messages again until all (``full``) or none are there, or ``most``
    seconds passed: a broker may store them after its PUBACK."""
    deadline = time.monotonic() + most
    while True:
        if full:
            count = await count_retained(at, RETAINED_TOPICS, CHUNK, deadline)
        else:
            count = await count_retained(at, ["#"], RETAINED, deadline)
        if count == (RETAINED if full else 0) or time.monotonic() > deadline:
            return count
        await asyncio.sleep(0.5)


async def settled(read: Callable[[], int | None], most: float = 3.0) -> int | None:
    """A reading of Redis memory once two in a row, 0.25 s apart, differ by less than 64 KiB
    (the node may still be writing), ``most`` seconds at most."""
    last, deadline = read(), time.monotonic() + most
    while last is not None and time.monotonic() < deadline:
        await asyncio.sleep(0.25)
        now = read()
        if now is None or abs(now - last) < 64 * 1024:
            return now
        last = now
    return last


async def retained(t: Target) -> Retained:
    publisher = await connected(t.at, "ret-pub")
    rss, used = [t.rss()], [await settled(t.used_memory)]
    payloads = (bytes(RETAINED_PAYLOAD), b"")
    found = []
    for payload, full in zip(payloads, (True, False), strict=True):
        await publish_all(publisher, [(topic, payload) for topic in RETAINED_TOPICS], True)
        found.append(await poll_retained(t.at, full))
        rss.append(t.rss())
        used.append(await settled(t.used_memory))
    publisher.close()
    redis_used = None
    if used[0] is not None and used[1] is not None and used[2] is not None:
        redis_used = (used[0], used[1], used[2])
    gone = await markers_expired(t, used[0], used[1]) if redis_used is not None else None
    return Retained(found[0], found[1], (rss[0], rss[1], rss[2]), redis_used, gone)


MARKERS_WAIT = 130.0
"""Seconds to wait for Headwater's clear markers to expire (they live 120 s: a late older write
must not bring a cleared topic back)."""


async def markers_expired(
    t: Target, base: int | None, full: int | None
) -> tuple[float, int] | None:
    """Seconds until Redis memory is back within 5% of the set's growth, and that reading."""
    if base is None or full is None:
        return None
    start = time.monotonic()
    while time.monotonic() - start < MARKERS_WAIT:
        used = t.used_memory()
        if used is None:
            return None
        if used - base <= (full - base) * 0.05:
            return time.monotonic() - start, used
        await asyncio.sleep(1.0)
    used = t.used_memory()
    return (time.monotonic() - start, used) if used is not None else None


async def groups(t: Target) -> Groups:
    client = await connected(t.at, "groups")
    before = most = t.threads()
    tag = uuid.uuid4().hex[:6]
    for i in range(GROUPS):
        client.send(subscribe(i + 1, [f"$share/g{tag}-{i}/s/x"]))
    granted = 0
    for _ in range(GROUPS):
        body = await client.expect(9, timeout=60.0)
        if body is None:
            break
        granted += body[2] < 0x80
        most = max(most, t.threads())
    stable, deadline = 0, time.monotonic() + 10.0
    while stable < 5 and time.monotonic() < deadline:  # until unchanged for 1 s
        await asyncio.sleep(0.2)
        now = t.threads()
        stable = stable + 1 if now <= most else 0
        most = max(most, now)
    client.close()
    return Groups(granted, (before, most))


RUNS: dict[str, Callable[[Target], Awaitable[Figures]]] = {
    "theft": theft, "flood": flood, "deep": deep, "share": share, "retained": retained,
    "groups": groups,
}  # fmt: skip


# -- brokers and the run ----------------------------------------------------------------------


def write_auth(work: Path) -> tuple[Path, Path]:
    """The password file (written by ``mosquitto_passwd``) and the ACL file of ``theft``."""
    passwords, acl = work / "passwords", work / "acl"
    passwords.unlink(missing_ok=True)
    for user, password in (ALICE, BOB):
        create = ["-c"] if not passwords.exists() else []
        argv = [brokers.program("mosquitto_passwd"), "-b", *create, str(passwords), user, password]
        subprocess.run(argv, check=True, capture_output=True, timeout=30)
    acl.write_text(ACL)
    return passwords, acl


def start(broker: str, probe: str, work: Path, hw: Headwater, stack: ExitStack) -> Target:
    """A fresh broker for one probe (``theft``: with the password and ACL files)."""
    auth = write_auth(work) if probe == "theft" else None
    if broker == "mosquitto":
        extra = [f"password_file {auth[0]}", f"acl_file {auth[1]}"] if auth else []
        # as root, mosquitto reads these files after dropping to its own user, which may not
        # enter the run's private work directory: it stays the user that runs the benchmark
        extra += [f"user {getpass.getuser()}"] if auth else []
        running = start_mosquitto(work, stack, extra)
        return Target(running.endpoints[0], running.pids[0])
    up = ["--password-file", str(auth[0]), "--acl-file", str(auth[1])] if auth else []
    running = hw.start(work, stack, up_args=up)
    store = redis.Redis.from_url(running.state["redis"])
    stack.callback(store.close)
    return Target(running.endpoints[0], running.pids[0], store)


def run_probe(probe: str, broker: str, work: Path, hw: Headwater) -> Outcome:
    label = mosquitto_version() if broker == "mosquitto" else "Headwater (1 node)"
    outcome = Outcome(probe, broker, f"mosquitto {label}" if broker == "mosquitto" else label)
    started = time.monotonic()
    with ExitStack() as stack:
        try:
            target = start(broker, probe, work, hw, stack)
            outcome.figures = asyncio.run(asyncio.wait_for(RUNS[probe](target), PROBE_TIMEOUT))
            if target.redis is not None:
                outcome.redis = redis_version(target.redis)
        except (RuntimeError, OSError, TimeoutError, redis.RedisError) as exc:
            outcome.error = str(exc).strip() or type(exc).__name__
    outcome.seconds = time.monotonic() - started
    return outcome


def run(
    work: Path,
    names: Sequence[str],
    command: str,
    progress: Callable[[str], None],
    hw: Headwater,
) -> HostileRun:
    """Every probe against every chosen broker (mosquitto first), each on a fresh broker."""
    result = HostileRun(command, datetime.datetime.now(datetime.UTC), hw.version)
    result.mosquitto = mosquitto_version()
    started = time.monotonic()
    for probe in PROBES:
        for broker in (b for b in BROKERS if b in names):
            outcome = run_probe(probe, broker, work, hw)
            result.outcomes.append(outcome)
            result.redis = outcome.redis or result.redis
            progress(
                f"hostile {probe}, {outcome.label} ({outcome.seconds:.1f} s): {outcome.cell()}"
            )
    result.seconds = time.monotonic() - started
    return result


def redis_version(client: redis.Redis) -> str:
    return f"Redis {client.info('server')['redis_version']} (of `headwater dev up`)"


# -- the report -------------------------------------------------------------------------------


def table(run: HostileRun) -> list[str]:
    """The issue's table: one row per probe, mosquitto's cell then Headwater's."""
    found = {(o.probe, o.broker): o for o in run.outcomes}
    labels = {o.broker: o.label for o in run.outcomes if o.figures is not None}
    names = [b for b in BROKERS if any(o.broker == b for o in run.outcomes)]
    rows = [
        [title, *(found[p, b].cell() if (p, b) in found else "not run" for b in names)]
        for p, title in PROBES.items()
    ]
    return report.table(["probe", *(labels.get(b, b) for b in names)], rows)


HOW = [
    "Each probe ran against a fresh broker, mosquitto first, then one Headwater node of "
    "`headwater dev up` (its own Kafka and Redis; clients on the node's own port with the PROXY "
    "header HAProxy would send); clients are raw MQTT 3.1.1 on asyncio sockets, on 127.0.0.1.",
    "theft: password file by `mosquitto_passwd -b`, ACL `user alice / topic readwrite alice/#`, "
    "`user bob / topic readwrite bob/#` (mosquitto: `password_file`, `acl_file`, and the "
    "generated config's `allow_anonymous true` kept for the start-up check; Headwater: "
    "`dev up --password-file --acl-file`). alice "
    f"(`alice-1`, cleanSession=0) subscribes `alice/#` QoS 1 and disconnects; {QUEUED} QoS 1 "
    "messages to `alice/x` are PUBACKed to another client of alice's; bob connects as "
    "`alice-1` (cleanSession=0) and waits 2 s, disconnects; alice reconnects and waits for "
    "her messages (3 s idle, 8 s at most).",
    f"flood: {SOCKETS} connections each write a PUBLISH fixed header announcing {ANNOUNCED:,} "
    "bytes (16 MB, under Headwater's maximum packet size of 16 MiB - 128 KiB, which refuses a "
    f"header announcing more), then {SENT:,} bytes of it; {FLOOD_WAIT:g} s later, the "
    "connections the broker has not closed are counted. RSS = the broker process's VmRSS "
    "(/proc/<pid>/status), at most during the wait, less before.",
    f"deep: after CONNACK, one SUBSCRIBE of {FILTERS} filters `deep<k>/l/l/...` of {LEVELS:,} "
    "levels each; the answer, and VmRSS at most over 1 s after it, less before.",
    f"share: the two filters parse as group `q<id>`, filter `p.t/x` and group `q<id>.p`, filter "
    f"`t/x`; one member each; {SHARE_MESSAGES} QoS 1 messages to `p.t/x` and {SHARE_MESSAGES} to "
    "`t/x`, every one PUBACKed; each member counts what it receives (5 s idle, 15 s at most).",
    f"retained: {RETAINED:,} QoS 1 retained messages of {RETAINED_PAYLOAD} bytes to `ret/<i>`, "
    "then the same topics with empty payloads, every one PUBACKed. After the set, subscribers "
    f"of {CHUNK} of the topics each (one after another: a queue of 1,000 per client would drop "
    "the rest) count the retained messages they get; after the clear, a new subscriber to `#`; "
    "again until all are there (after the set) or none (after the clear), 30 s at most. "
    "Headwater: Redis `used_memory` (INFO memory) before, set, cleared, and once back within 5% "
    "of the set's growth (the clears' 120 s markers expired; 130 s at most); mosquitto: its VmRSS.",
    f"groups: one client sends {GROUPS} SUBSCRIBEs, each `$share/g<id>-<i>/s/x`; threads = "
    "`Threads:` of /proc/<pid>/status before, and at most until unchanged for 1 s after the last "
    "SUBACK.",
]


def render(run: HostileRun) -> str:
    setup = [
        "| | |",
        "|---|---|",
        f"| Date | {run.started:%Y-%m-%d %H:%M %Z} |",
        f"| Machine | {machine()} |",
        f"| Headwater | {run.headwater} |",
        f"| mosquitto | {run.mosquitto} |",
        f"| Redis | {run.redis} |",
        f"| Command | `{run.command}` |",
        f"| Took | {run.seconds / 60:.1f} min |",
    ]
    lines = [
        BEGIN,
        "## Hostile clients (issue 20's probes)",
        "",
        "Generated by `bench/hostile.py`: issue 20's table of hostile clients, rerun the same way.",
        "",
        *setup,
        "",
        *table(run),
        "",
        "How it ran:",
        "",
        *[f"- {line}" for line in HOW],
        END,
        "",
    ]
    return "\n".join(lines)
