"""Fleets of raw MQTT connections: thousands of devices from one load-generator process.

A :class:`Device` is an ``asyncio.Protocol`` with no task or timer of its own: it writes packets
encoded with Headwater's codec (``mqttcore.codec``) and decodes what comes back.  It PUBACKs
every QoS 1 PUBLISH at once and keeps the distinct payloads it received, so that a reconnect storm
can check that every owed message arrived, and arrived once.

The jobs (run by :mod:`bench.jobs` workers, each on its worker's one :class:`Fleet`):

* :class:`ConnectFleet` opens a connection per :class:`Member`, at most ``in_flight`` of them
  between the TCP connect and the CONNACK (0: all at once), then SUBSCRIBEs the member to its
  topic at QoS 1 unless the CONNACK says its session is present.  Every attempt ends as
  *connected* (CONNACK 0, timed from the start of the TCP connect), *refused* (another CONNACK
  code), *closed* (the socket could not be opened, or was closed or reset before the CONNACK) or
  *timed out*.
* Keep-alive: one pinger per process sends each connection a PINGREQ every ``keep_alive``
  seconds, the first at a random point of its first period, so that a fleet pings at a steady
  N / keep_alive per second, as a real one does; PINGRESPs are counted.
* :class:`FleetStatus` counts what the fleet holds; :class:`DisconnectFleet` sends every
  connection DISCONNECT and closes it.

:func:`publish_owed` (run in the parent) publishes QoS 1 messages with a window of packets in
flight, for the sessions that are away.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import random
import time
from collections import Counter, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, TypeVar, cast

from bench.jobs import State
from bench.load import PUBACKS, ClientPlan, open_client
from mqttcore.codec import Decoder, encode
from mqttcore.errors import ProtocolError
from mqttcore.packets import (
    SUBACK_FAILURE,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Pingreq,
    Pingresp,
    Puback,
    Publish,
    Suback,
    Subscribe,
)

P = TypeVar("P", bound=Packet)
Endpoint = tuple[str, int]

PINGREQ = encode(Pingreq())
DISCONNECT = encode(Disconnect())
PING_TICK = 0.25
"""Seconds between the pinger's looks at what is due."""


class Member(NamedTuple):
    """One device of a fleet."""

    client_id: str
    endpoint: Endpoint
    clean: bool
    topic: str | None = None
    """Subscribed at QoS 1 after the CONNACK, unless the session is present."""
    owed: int = 0
    """Messages it expects; the time it has that many distinct ones is recorded."""


class UnexpectedPacket(ConnectionError):
    """The broker answered with a packet other than the one awaited."""


class Device(asyncio.Protocol):
    """One connection of a fleet."""

    __slots__ = (
        "closing", "complete_at", "connected_at", "decoder", "duplicates", "lost", "member",
        "payloads", "pings", "pongs", "transport", "waiter",
    )  # fmt: skip

    def __init__(self, member: Member) -> None:
        self.member = member
        self.transport: asyncio.Transport | None = None
        self.connected_at = 0.0
        """``time.monotonic()`` when the TCP connection came up."""
        self.decoder = Decoder()
        self.waiter: asyncio.Future[Packet] | None = None
        self.payloads: set[bytes] = set()
        self.duplicates = 0
        self.pings = 0
        self.pongs = 0
        self.complete_at = 0.0
        self.closing = False
        """We closed it."""
        self.lost = False
        """It was closed by the broker (or reset) while we meant to keep it."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport: no isinstance check here.
        self.transport = cast(asyncio.Transport, transport)
        self.connected_at = time.monotonic()

    def data_received(self, data: bytes) -> None:
        try:
            packets = self.decoder.feed(data)
        except ProtocolError as exc:
            self.fail(UnexpectedPacket(f"malformed packet from the broker: {exc}"))
            return
        acks: list[bytes] = []
        for packet in packets:
            kind = type(packet)
            if kind is Publish:
                acks.append(self.receive(packet))  # type: ignore[arg-type]
            elif kind is Pingresp:
                self.pongs += 1
            elif self.waiter is not None and not self.waiter.done():
                self.waiter.set_result(packet)
        if acks and self.transport is not None:
            self.transport.write(b"".join(acks))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closing:
            self.lost = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc or ConnectionError("closed by the broker"))

    def receive(self, publish: Publish) -> bytes:
        """Record a delivery; the PUBACK to send for it (b"" for QoS 0)."""
        if publish.payload in self.payloads:
            self.duplicates += 1
        else:
            self.payloads.add(publish.payload)
            if self.member.owed and len(self.payloads) == self.member.owed:
                self.complete_at = time.monotonic()
        return PUBACKS[publish.packet_id or 0] if publish.qos else b""

    @property
    def is_open(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    def write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    async def request(self, packet: Packet, kind: type[P]) -> P:
        """Send ``packet`` and wait for the answer of type ``kind``."""
        self.waiter = asyncio.get_running_loop().create_future()
        self.write(encode(packet))
        answer = await self.waiter
        self.waiter = None
        if not isinstance(answer, kind):
            raise UnexpectedPacket(f"expected {kind.__name__}, got {type(answer).__name__}")
        return answer

    def fail(self, exc: Exception) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)
        self.close()

    def close(self, disconnect: bool = False) -> None:
        self.closing = True
        if self.transport is not None and not self.transport.is_closing():
            if disconnect:
                self.transport.write(DISCONNECT)
            self.transport.close()


class Fleet:
    """The devices of one worker process, and their keep-alive pinger."""

    def __init__(self) -> None:
        self.devices: dict[str, Device] = {}
        self._due: list[tuple[float, int, int, Device]] = []
        self._order = itertools.count()
        self._pinger: asyncio.Task[None] | None = None

    @classmethod
    def of(cls, state: State) -> Fleet:
        fleet = state.get("fleet")
        if fleet is None:
            fleet = state["fleet"] = cls()
        return cast(Fleet, fleet)

    def add(self, device: Device, keep_alive: int) -> None:
        self.devices[device.member.client_id] = device
        if keep_alive <= 0:
            return
        first = time.monotonic() + random.uniform(0, keep_alive)
        heapq.heappush(self._due, (first, next(self._order), keep_alive, device))
        if self._pinger is None:
            self._pinger = asyncio.create_task(self._ping())

    async def _ping(self) -> None:
        while True:
            await asyncio.sleep(PING_TICK)
            now = time.monotonic()
            while self._due and self._due[0][0] <= now:
                due, _, keep_alive, device = heapq.heappop(self._due)
                if device.is_open:
                    device.write(PINGREQ)
                    device.pings += 1
                    heapq.heappush(
                        self._due, (due + keep_alive, next(self._order), keep_alive, device)
                    )

    def disconnect(self) -> int:
        """DISCONNECT and close every open device; forget them all."""
        closed = 0
        for device in self.devices.values():
            if device.is_open:
                device.close(disconnect=True)
                closed += 1
        self.devices.clear()
        self._due.clear()
        return closed


# -- connecting -------------------------------------------------------------------------------


@dataclass(slots=True)
class ConnectReport:
    """How the connects of one job (or of several, merged) went."""

    attempted: int = 0
    connected: int = 0
    refused: dict[int, int] = field(default_factory=dict)
    """CONNACK return code -> count."""
    closed: int = 0
    timed_out: int = 0
    session_present: int = 0
    subscribed: int = 0
    subscribe_failed: int = 0
    latencies: list[float] = field(default_factory=list)
    """Seconds from the start of the TCP connect to the CONNACK, of the connected ones."""
    handshakes: list[float] = field(default_factory=list)
    """Of those, seconds from the TCP connection up (the CONNECT sent) to the CONNACK."""
    started: float = 0.0
    last_connack: float = 0.0
    """``time.monotonic()`` (system-wide on Linux, so comparable between processes)."""
    errors: dict[str, int] = field(default_factory=dict)
    """Distinct failure messages, counted."""

    @property
    def failed(self) -> int:
        """Refused, closed and timed out: every attempt that did not end in CONNACK 0."""
        return sum(self.refused.values()) + self.closed + self.timed_out

    @property
    def seconds(self) -> float:
        """From the start to the last CONNACK."""
        return max(0.0, self.last_connack - self.started) if self.connected else 0.0

    def note(self, error: str) -> None:
        self.errors[error] = self.errors.get(error, 0) + 1

    @classmethod
    def merged(cls, reports: Sequence[ConnectReport]) -> ConnectReport:
        out = cls()
        for r in reports:
            out.attempted += r.attempted
            out.connected += r.connected
            out.closed += r.closed
            out.timed_out += r.timed_out
            out.session_present += r.session_present
            out.subscribed += r.subscribed
            out.subscribe_failed += r.subscribe_failed
            out.latencies.extend(r.latencies)
            out.handshakes.extend(r.handshakes)
            out.refused = dict(Counter(out.refused) + Counter(r.refused))
            out.errors = dict(Counter(out.errors) + Counter(r.errors))
        out.started = min((r.started for r in reports), default=0.0)
        out.last_connack = max((r.last_connack for r in reports), default=0.0)
        return out


@dataclass(frozen=True, slots=True)
class ConnectFleet:
    """Connect ``members`` (and subscribe them), at most ``in_flight`` awaiting CONNACK."""

    members: tuple[Member, ...]
    in_flight: int
    """0: every connect at once."""
    keep_alive: int = 60
    timeout: float = 60.0
    """Per member: from the TCP connect to the CONNACK, and again for the SUBACK."""
    start_at: float = 0.0
    """``time.monotonic()`` to start at, so that several workers start together."""

    async def run(self, state: State) -> ConnectReport:
        fleet = Fleet.of(state)
        report = ConnectReport(attempted=len(self.members))
        delay = self.start_at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        report.started = time.monotonic()
        members = iter(self.members)
        width = min(self.in_flight or len(self.members), len(self.members))
        await asyncio.gather(*(self._connect_each(members, fleet, report) for _ in range(width)))
        return report

    async def _connect_each(
        self, members: Iterator[Member], fleet: Fleet, r: ConnectReport
    ) -> None:
        for member in members:
            connected = await self._connect(member, r)
            if connected is None:
                continue
            device, session_present = connected
            fleet.add(device, self.keep_alive)
            if member.topic is not None and not session_present:
                await self._subscribe(device, member.topic, r)

    async def _connect(self, member: Member, r: ConnectReport) -> tuple[Device, bool] | None:
        """The device and its CONNACK's session-present flag, or None (counted in ``r``)."""
        loop = asyncio.get_running_loop()
        device = Device(member)
        started = time.monotonic()
        connect = Connect(member.client_id, clean_session=member.clean, keep_alive=self.keep_alive)
        try:
            async with asyncio.timeout(self.timeout):
                await loop.create_connection(lambda: device, *member.endpoint)
                connack = await device.request(connect, Connack)
        except TimeoutError:
            device.close()
            r.timed_out += 1
            r.note(f"no CONNACK within {self.timeout:g} s")
            return None
        except OSError as exc:  # ConnectionError and UnexpectedPacket among them
            device.close()
            r.closed += 1
            r.note(f"{type(exc).__name__}: {exc}"[:160])
            return None
        if connack.return_code != 0:
            device.close()
            r.refused[connack.return_code] = r.refused.get(connack.return_code, 0) + 1
            return None
        now = time.monotonic()
        r.latencies.append(now - started)
        r.handshakes.append(now - device.connected_at)
        r.last_connack = max(r.last_connack, now)
        r.connected += 1
        r.session_present += connack.session_present
        return device, connack.session_present

    async def _subscribe(self, device: Device, topic: str, r: ConnectReport) -> None:
        try:
            async with asyncio.timeout(self.timeout):
                suback = await device.request(Subscribe(1, ((topic, 1),)), Suback)
        except (TimeoutError, OSError) as exc:
            r.subscribe_failed += 1
            r.note(f"SUBSCRIBE: {type(exc).__name__}: {exc}"[:160])
            return
        if SUBACK_FAILURE in suback.return_codes:
            r.subscribe_failed += 1
            r.note("SUBACK 0x80")
        else:
            r.subscribed += 1


# -- what the fleet holds ---------------------------------------------------------------------


@dataclass(slots=True)
class StatusReport:
    devices: int = 0
    open: int = 0
    lost: int = 0
    """Closed by the broker (or reset) while we kept them."""
    pings: int = 0
    pongs: int = 0
    payloads: int = 0
    """Distinct payloads received, over all devices."""
    duplicates: int = 0
    owed: int = 0
    """Messages the devices expect (their ``Member.owed``), in all."""
    owed_received: int = 0
    """Of those, distinct ones received (at most ``owed`` per device)."""
    complete: int = 0
    """Devices owed messages that have all of them."""
    last_complete: float = 0.0
    """``time.monotonic()`` when the last of those got its last one."""
    incomplete: list[str] = field(default_factory=list)
    """A few client ids still missing messages."""

    @classmethod
    def merged(cls, reports: Sequence[StatusReport]) -> StatusReport:
        out = cls()
        for r in reports:
            for name in ("devices", "open", "lost", "pings", "pongs", "payloads", "duplicates",
                         "owed", "owed_received", "complete"):  # fmt: skip
                setattr(out, name, getattr(out, name) + getattr(r, name))
            out.last_complete = max(out.last_complete, r.last_complete)
            out.incomplete += r.incomplete[: 5 - len(out.incomplete)]
        return out


@dataclass(frozen=True, slots=True)
class FleetStatus:
    """Count the fleet's devices, their pings and what they received."""

    async def run(self, state: State) -> StatusReport:
        fleet = Fleet.of(state)
        r = StatusReport(devices=len(fleet.devices))
        for device in fleet.devices.values():
            r.pings += device.pings
            r.open += device.is_open
            r.lost += device.lost
            r.pongs += device.pongs
            r.payloads += len(device.payloads)
            r.duplicates += device.duplicates
            owed = device.member.owed
            if owed:
                r.owed += owed
                r.owed_received += min(owed, len(device.payloads))
                if device.complete_at:
                    r.complete += 1
                    r.last_complete = max(r.last_complete, device.complete_at)
                elif len(r.incomplete) < 5:
                    r.incomplete.append(device.member.client_id)
        return r


@dataclass(frozen=True, slots=True)
class DisconnectFleet:
    """DISCONNECT every device and close it; the number closed."""

    async def run(self, state: State) -> int:
        closed = Fleet.of(state).disconnect()
        await asyncio.sleep(0.2)  # let the closes go out
        return closed


# -- publishing to sessions that are away -----------------------------------------------------


async def publish_owed(
    endpoint: Endpoint,
    client_id: str,
    messages: Sequence[tuple[str, bytes]],
    window: int = 500,
    timeout: float = 120.0,
) -> int:
    """Publish each (topic, payload) at QoS 1, ``window`` packets in flight; how many the broker
    acknowledged (it PUBACKs a QoS 1 message once it is durable) within ``timeout``."""
    client = await open_client(ClientPlan(client_id, endpoint, (), 1))
    await client.handshake(subscribe=False)
    free = deque(range(1, window + 1))
    acked = 0
    wake = asyncio.Event()

    def on_acks(acks: list[Puback]) -> None:
        nonlocal acked
        acked += len(acks)
        free.extend(a.packet_id for a in acks)
        wake.set()

    client.on_acks = on_acks
    sent, deadline = 0, time.monotonic() + timeout
    while acked < len(messages) and client.is_open and time.monotonic() < deadline:
        out = []
        while free and sent < len(messages):
            topic, payload = messages[sent]
            out.append(encode(Publish(topic, payload, 1, packet_id=free.popleft())))
            sent += 1
        if out:
            client.write(b"".join(out))
        wake.clear()
        try:
            await asyncio.wait_for(wake.wait(), max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            break
    client.disconnect()
    return acked
