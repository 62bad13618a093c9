"""A node's front doors: MQTT over TCP, TLS, WebSocket and secure WebSocket, each behind a load
balancer's PROXY protocol header or not, and the bound on connections.

Every listener is a plain TCP server.  An accepted connection is an :class:`Arrival` until it
becomes the byte stream of an MQTT connection, in up to three steps on the same socket:

1. the PROXY header (``--proxy-protocol``), v1 or v2 (``frontend.proxy_protocol``): before a TLS
   handshake read exactly, ``get_buffer`` offering only the bytes the header may still need, so
   the ClientHello stays in the socket; else greedily, the bytes read past its end (a CONNECT,
   an HTTP upgrade) kept for the stream; the address it names becomes ``peer``.
   It is believed only from a load balancer: a peer outside ``--proxy-allow`` is closed at
   accept, before a byte is read;
2. the TLS handshake (``mqtts``, ``wss``): ``loop.start_tls`` on the socket's transport;
3. the WebSocket upgrade (``ws``, ``wss``): a :class:`WebSocket` is the protocol of the socket (or
   TLS) transport and the transport of the MQTT connection: binary frames carry its bytes.  With
   ``--ws-origins`` an upgrade whose ``Origin`` is not listed is answered 403 (one without an
   ``Origin``, from a client that is not a browser, is not refused).

Invariants:

* a connection is admitted once, at accept, before a byte is read: with ``--max-connections`` N,
  the N+1th (MQTT connections and arrivals together) is closed there;
* until its MQTT connection exists it is in ``Doors.arriving`` and on the node's deadline wheel:
  header, handshake and upgrade must be done within the connect timeout; no timer or task of its
  own, but a task while its TLS handshake runs (as asyncio's TLS servers make one per handshake);
* a refusal closes that connection only, is counted in ``Doors.refused``, and is logged at most
  once a second per reason (a peer outside ``--proxy-allow``: once per address, for the last
  :data:`LOGGED_PEERS` addresses);
* a stream gets its transport once (``set_protocol``, then ``connection_made``), then every byte
  after the PROXY header, in order.  What the arrival read before the hand-over it keeps and
  passes on after ``connection_made``: the bytes a greedy header read took past the header's end,
  and the first application data asyncio's TLS transport hands its protocol before ``start_tls``
  returns (uvloop's after), the arrival being that protocol until the hand-over.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol, cast

import h11
from wsproto import events
from wsproto.connection import Connection, ConnectionState, ConnectionType
from wsproto.frame_protocol import CloseReason
from wsproto.handshake import H11Handshake
from wsproto.utilities import RemoteProtocolError

from frontend.config import Listener, TlsFiles
from frontend.deadlines import Deadlines
from frontend.proxy_protocol import LOOPBACK, AllowList, ProxyHeaderError, ProxyHeaderReader

log = logging.getLogger("headwater.listeners")

SECURE = frozenset({"mqtts", "wss"})
WEBSOCKET = frozenset({"ws", "wss"})

WEBSOCKET_PATH = "/mqtt"
WEBSOCKET_SUBPROTOCOLS = ("mqtt", "mqttv3.1")
"""Subprotocols an upgrade may ask for: "mqtt" [MQTT-6.0.0-3], and "mqttv3.1" as Mosquitto
accepts it; the first the client offers is the one answered [MQTT-6.0.0-4]."""

BAD_REQUEST = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
FORBIDDEN = 403

WEBSOCKET_CLOSE_WAIT = 2.0
"""Seconds a WebSocket closed by its stream waits for the client's close frame before the socket
is closed anyway (closing at once would reset the client's answer [RFC 6455 7.1.1])."""

SSL_SHUTDOWN_TIMEOUT = 5.0
"""Seconds a closing TLS connection waits for the client's close_notify (asyncio's default, 30,
would keep a closed client counted against ``--max-connections`` that long)."""

REFUSALS = (
    "refused_max_connections",
    "proxy_not_allowed",
    "proxy_header_errors",
    "handshake_timeouts",
    "tls_handshake_failures",
    "websocket_upgrades_refused",
    "websocket_errors",
)
"""What ``Doors.refused`` counts (``/stats`` and ``/metrics`` keys)."""

LOG_EVERY = 1.0
"""Seconds between two log lines of one refusal reason: a storm is a count, not a flood."""

LOGGED_PEERS = 1024
"""Addresses outside ``--proxy-allow`` remembered as logged already (the oldest forgotten)."""


# -- TLS ------------------------------------------------------------------------------------------


def tls_context(files: TlsFiles) -> ssl.SSLContext:
    """The server side of the TLS listeners: TLS 1.2 or 1.3; with a CA file, client certificates
    are verified when presented, and required with ``require_certificate``."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.options |= ssl.OP_NO_RENEGOTIATION
    try:
        context.load_cert_chain(files.certfile, files.keyfile)
        if files.cafile:
            context.load_verify_locations(files.cafile)
            required = files.require_certificate or files.use_identity_as_username
            context.verify_mode = ssl.CERT_REQUIRED if required else ssl.CERT_OPTIONAL
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"TLS certificate {files.certfile} or key {files.keyfile}: {exc}") from exc
    return context


def certificate_identity(transport: asyncio.BaseTransport) -> str | None:
    """The identity of a client's verified certificate: its subject's first common name, as
    Mosquitto's ``use_identity_as_username`` takes it; None without a certificate or a CN."""
    certificate = transport.get_extra_info("peercert") or {}
    for relative_name in certificate.get("subject", ()):
        for key, value in relative_name:
            if key == "commonName":
                return str(value)
    return None


# -- what the doors share -------------------------------------------------------------------------


class Stream(Protocol):
    """What a connection's bytes go to once it has arrived (an MqttConnection)."""

    peer: tuple[str, int] | None

    def connection_made(self, transport: asyncio.BaseTransport) -> None: ...
    def data_received(self, data: bytes) -> None: ...
    def connection_lost(self, exc: Exception | None) -> None: ...
    def pause_writing(self) -> None: ...
    def resume_writing(self) -> None: ...


@dataclass(slots=True, eq=False)
class Doors:
    """What the front doors of one node share: how to make a stream, the bound on connections,
    the connections still arriving, and the count of every refusal."""

    make: Callable[[], Stream]
    in_use: Callable[[], int]
    """Streams open now (the node's MQTT connections)."""
    deadlines: Deadlines
    timeout: float
    """Seconds an arrival has for its header, handshake and upgrade (the connect timeout)."""
    tls: ssl.SSLContext | None = None
    proxy_protocol: bool = False
    proxy_allow: AllowList = field(default_factory=lambda: AllowList.parse(LOOPBACK))
    """The peers a PROXY header is believed from (the load balancers)."""
    ws_origins: frozenset[str] = frozenset()
    """The ``Origin`` values a WebSocket upgrade may carry (lower case); empty: any."""
    max_connections: int = 0
    arriving: set[Arrival | WebSocket] = field(default_factory=set)
    refused: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REFUSALS, 0))
    listening: dict[str, int] = field(default_factory=dict)
    """Kind -> the port each listener is bound to."""
    handshakes: set[asyncio.Task[None]] = field(default_factory=set)
    logged: dict[str, float] = field(default_factory=dict)
    """Reason -> when it was last logged."""
    peers_logged: dict[str, None] = field(default_factory=dict)
    """Addresses outside ``proxy_allow`` logged already, oldest first."""

    def admit(self, transport: asyncio.BaseTransport) -> bool:
        bound = self.max_connections
        if bound and self.in_use() + len(self.arriving) >= bound:
            who = _who(None, transport)
            self.refuse("refused_max_connections", who, f"{bound} connections open already")
            return False
        return True

    def believes(self, transport: asyncio.BaseTransport) -> bool:
        """Whether the peer of ``transport`` may send a PROXY header; if not, it is counted,
        and logged the first time (of the last :data:`LOGGED_PEERS`) it is seen."""
        peer = transport.get_extra_info("peername")
        host = str(peer[0]) if peer else ""
        if self.proxy_allow.allows(host):
            return True
        count = self.refused["proxy_not_allowed"] = self.refused["proxy_not_allowed"] + 1
        if host not in self.peers_logged:
            if len(self.peers_logged) >= LOGGED_PEERS:
                del self.peers_logged[next(iter(self.peers_logged))]
            self.peers_logged[host] = None
            log.warning(
                "connection from %s closed: a PROXY header is believed only from %s "
                "(--proxy-allow) (proxy_not_allowed: %d so far)",
                _who(None, transport), self.proxy_allow, count,
            )  # fmt: skip
        return False

    def refuse(self, reason: str, who: str, detail: str) -> None:
        """Count a refusal; log it unless one of its kind was logged less than a second ago."""
        count = self.refused[reason] = self.refused[reason] + 1
        now = time.monotonic()
        last = self.logged.get(reason)
        if last is None or now - last >= LOG_EVERY:
            self.logged[reason] = now
            log.warning("connection from %s closed: %s (%s: %d so far)", who, detail, reason, count)

    def leave(self, item: Arrival | WebSocket) -> None:
        """``item`` has arrived, or is gone: out of ``arriving`` and off the wheel."""
        self.arriving.discard(item)
        self.deadlines.forget(item)

    def close(self) -> None:
        """Close every connection still arriving (the node is stopping)."""
        for task in list(self.handshakes):
            task.cancel()
        for arrival in list(self.arriving):
            arrival.abort()


def _who(peer: tuple[str, int] | None, transport: asyncio.BaseTransport | None) -> str:
    address = peer or (transport.get_extra_info("peername") if transport else None)
    return f"{address[0]}:{address[1]}" if address else "?"


# -- one connection until it is a stream ----------------------------------------------------------


class Arrival:
    """An accepted connection until its stream has it: admission, the PROXY header, the TLS
    handshake, the hand-over.  The transport's first protocol: :class:`ProxiedArrival` behind a
    PROXY header, else :class:`DirectArrival` (uvloop keeps its first protocol's methods, so the
    arrival itself, for the connection's life: a buffered one only where the header needs it)."""

    __slots__ = (
        "doors",
        "early",
        "header",
        "kind",
        "opened",
        "peer",
        "slot",
        "spare",
        "stream",
        "transport",
    )

    def __init__(self, doors: Doors, kind: str) -> None:
        self.doors = doors
        self.kind = kind
        self.transport: asyncio.Transport | None = None
        self.header: ProxyHeaderReader | None = None
        self.peer: tuple[str, int] | None = None
        self.stream: Stream | None = None
        self.early: list[bytes] | None = None
        """Bytes read before the hand-over: past a PROXY header, or TLS data (asyncio only)."""
        self.spare: bytearray | None = None
        self.slot: int | None = None
        self.opened = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = raw = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        doors = self.doors
        if not doors.admit(raw) or (doors.proxy_protocol and not doors.believes(raw)):
            raw.abort()
            return
        doors.arriving.add(self)
        self.opened = asyncio.get_running_loop().time()
        if doors.proxy_protocol:  # exactly where a TLS handshake follows (the module's step 1)
            self.header = ProxyHeaderReader(exact=self.kind in SECURE)
            doors.deadlines.watch(self)
        else:
            self._proceed(raw)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.stream is not None:  # announced by the TLS transport before the hand-over
            self.stream.connection_lost(exc)
            return
        if self.header is not None and self.header.have:
            self._refuse("proxy_header_errors", "closed inside its PROXY header")
        self.doors.leave(self)

    def due(self) -> float | None:
        return self.opened + self.doors.timeout if self in self.doors.arriving else None

    def expire(self) -> None:
        step = "PROXY header" if self.header is not None else "TLS handshake"
        self._refuse("handshake_timeouts", f"no {step} within {self.doors.timeout:g} s")

    def abort(self) -> None:
        self.doors.leave(self)
        if self.transport is not None:
            self.transport.abort()

    def _proceed(self, transport: asyncio.Transport) -> None:
        """The header, if any, is read: the TLS handshake, or the hand-over."""
        if self.kind not in SECURE:
            self._hand_over(transport)
            return
        transport.pause_reading()  # the ClientHello is for the TLS protocol, not for get_buffer
        self.doors.deadlines.watch(self)
        task = asyncio.get_running_loop().create_task(self._handshake(transport))
        self.doors.handshakes.add(task)
        task.add_done_callback(self.doors.handshakes.discard)

    async def _handshake(self, raw: asyncio.Transport) -> None:
        tls, loop = self.doors.tls, asyncio.get_running_loop()
        assert tls is not None
        try:
            protocol = cast(asyncio.BaseProtocol, self)  # a subclass's, with asyncio's base
            secure = await loop.start_tls(
                raw, protocol, tls, server_side=True, ssl_shutdown_timeout=SSL_SHUTDOWN_TIMEOUT
            )
        except OSError as exc:  # ssl.SSLError among them
            self._refuse("tls_handshake_failures", f"TLS handshake failed: {exc}")
            return
        if secure is None or secure.is_closing() or self not in self.doors.arriving:
            self.doors.leave(self)  # lost or timed out during the handshake
            return
        self._hand_over(secure)

    def _hand_over(self, transport: asyncio.Transport) -> None:
        self.doors.leave(self)
        stream: Stream
        if self.kind in WEBSOCKET:
            stream = WebSocket(self.doors, self.peer, self.opened)
        else:
            stream = self.doors.make()
            stream.peer = self.peer
        self.stream = stream
        transport.set_protocol(cast(asyncio.BaseProtocol, stream))
        stream.connection_made(transport)
        early, self.early, self.spare = self.early, None, None
        for data in early or ():
            stream.data_received(data)

    def _refuse(self, reason: str, detail: str) -> None:
        if self not in self.doors.arriving:
            return  # refused already, or handed over
        self.doors.refuse(reason, _who(self.peer, self.transport), detail)
        self.abort()


class ProxiedArrival(Arrival, asyncio.BufferedProtocol):
    """An arrival that reads a PROXY header exactly (``get_buffer`` offers only what the header
    may still need)."""

    __slots__ = ()

    def get_buffer(self, sizehint: int) -> memoryview | bytearray:
        if self.header is not None:
            return self.header.window()
        self.spare = bytearray(max(sizehint, 4096))
        return self.spare

    def buffer_updated(self, nbytes: int) -> None:
        if self.header is None:
            assert self.spare is not None
            self.early = [*(self.early or ()), bytes(self.spare[:nbytes])]
            return
        reader = self.header
        try:
            header = reader.received(nbytes)
        except ProxyHeaderError as exc:
            self._refuse("proxy_header_errors", str(exc))
            return
        if header is not None:
            self.header = None
            self.peer = header.source
            if reader.rest:  # read with the header: the stream's first bytes
                self.early = [reader.rest]
            assert self.transport is not None
            self._proceed(self.transport)


class DirectArrival(Arrival, asyncio.Protocol):
    """An arrival with no header to read: it reads nothing itself, but keeps what asyncio's TLS
    transport hands it before the hand-over."""

    __slots__ = ()

    def data_received(self, data: bytes) -> None:
        self.early = [*(self.early or ()), data]


# -- WebSocket ------------------------------------------------------------------------------------


class WebSocket(asyncio.Protocol):
    """One WebSocket connection carrying one MQTT stream: the protocol of the socket (or TLS)
    transport, and the transport of its stream.

    Until the upgrade it reads an HTTP request (h11): ``GET /mqtt`` with the ``mqtt`` (or
    ``mqttv3.1``) subprotocol is answered 101, anything else 404 or 400 and closed.  Then frames
    (wsproto): binary payloads are the stream's bytes, however packets fall across frames; each
    write of the stream is one binary frame; a ping is answered; the client's close is answered
    and ends the connection; a text frame or a malformed one closes it [MQTT-6.0.0-1].  When the
    stream closes, a close frame goes out and the socket is closed once the client's comes back
    (or after ``WEBSOCKET_CLOSE_WAIT``, on the deadline wheel)."""

    __slots__ = (
        "_closing",
        "_closing_since",
        "_http",
        "_ws",
        "doors",
        "opened",
        "peer",
        "slot",
        "stream",
        "transport",
    )

    transport: asyncio.Transport
    """Set by ``connection_made``, which comes first."""

    def __init__(self, doors: Doors, peer: tuple[str, int] | None, opened: float) -> None:
        self.doors = doors
        self.peer = peer
        self.opened = opened
        self.slot: int | None = None
        self.stream: Stream | None = None
        self._http: h11.Connection | None = None
        self._ws: Connection | None = None
        self._closing = False
        self._closing_since: float | None = None
        """When the stream closed, while the client's close frame is awaited."""

    # -- the socket's protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._http = h11.Connection(h11.SERVER)
        self.doors.arriving.add(self)
        self.doors.deadlines.watch(self)

    def data_received(self, data: bytes) -> None:
        ws = self._ws
        if ws is None:
            if not self._closing:
                self._upgrade(data)
        elif ws.state in (ConnectionState.OPEN, ConnectionState.LOCAL_CLOSING):
            self._frames(ws, data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self.doors.leave(self)
        if self.stream is not None:
            self.stream.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.stream is not None:
            self.stream.pause_writing()

    def resume_writing(self) -> None:
        if self.stream is not None:
            self.stream.resume_writing()

    # -- the stream's transport

    def write(self, data: bytes) -> None:
        if self._ws is not None and not self._closing:
            self.transport.write(self._ws.send(events.BytesMessage(data=data)))

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        ws = self._ws
        if ws is None or ws.state is not ConnectionState.OPEN:
            self.transport.close()
            return
        self.transport.write(ws.send(events.CloseConnection(code=CloseReason.NORMAL_CLOSURE)))
        self._closing_since = asyncio.get_running_loop().time()
        self.transport.resume_reading()  # for the client's close frame
        self.doors.deadlines.watch(self)

    def abort(self) -> None:
        self._closing = True
        self.transport.abort()

    def is_closing(self) -> bool:
        return self._closing or self.transport.is_closing()

    def pause_reading(self) -> None:
        self.transport.pause_reading()

    def resume_reading(self) -> None:
        self.transport.resume_reading()

    def get_extra_info(self, name: str, default: object = None) -> object:
        return self.transport.get_extra_info(name, default)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.transport.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        return self.transport.get_write_buffer_size()

    def due(self) -> float | None:
        if self._closing_since is not None:
            return self._closing_since + WEBSOCKET_CLOSE_WAIT
        waiting = self._ws is None and not self._closing
        return self.opened + self.doors.timeout if waiting else None

    def expire(self) -> None:
        if self._closing_since is not None:  # no close frame back from the client
            self.transport.close()
            return
        detail = f"no WebSocket upgrade within {self.doors.timeout:g} s"
        self.doors.refuse("handshake_timeouts", _who(self.peer, self.transport), detail)
        self.abort()

    def _upgrade(self, data: bytes) -> None:
        http = self._http
        assert http is not None
        http.receive_data(data)
        try:
            event = http.next_event()
        except h11.RemoteProtocolError as exc:
            self._refuse(BAD_REQUEST, f"not an HTTP request: {exc}")
            return
        if event is h11.NEED_DATA:
            return
        if not isinstance(event, h11.Request):
            self._refuse(BAD_REQUEST, f"not an HTTP request: {event!r}")
            return
        handshake = H11Handshake(ConnectionType.SERVER)
        try:
            handshake.initiate_upgrade_connection(list(event.headers), event.target)
        except RemoteProtocolError as exc:
            hint = exc.event_hint if isinstance(exc.event_hint, events.RejectConnection) else None
            self._refuse(handshake.send(hint) if hint else BAD_REQUEST, f"upgrade refused: {exc}")
            return
        request = next(handshake.events())
        assert isinstance(request, events.Request)  # the one event a server's handshake gives
        if request.target.split("?", 1)[0] != WEBSOCKET_PATH:
            reply = handshake.send(events.RejectConnection(status_code=404))
            self._refuse(reply, f"WebSocket path {request.target!r} is not {WEBSOCKET_PATH}")
            return
        origin = _origin(event.headers)
        if self.doors.ws_origins and origin is not None and origin not in self.doors.ws_origins:
            reply = handshake.send(events.RejectConnection(status_code=FORBIDDEN))
            self._refuse(reply, f"Origin {origin!r} is not one of --ws-origins")
            return
        offered = [p for p in request.subprotocols if p in WEBSOCKET_SUBPROTOCOLS]
        if not offered:
            reply = handshake.send(events.RejectConnection(status_code=400))
            wanted = " or ".join(WEBSOCKET_SUBPROTOCOLS)
            self._refuse(reply, f"[MQTT-6.0.0-3] subprotocols {request.subprotocols}, not {wanted}")
            return
        self.transport.write(handshake.send(events.AcceptConnection(subprotocol=offered[0])))
        self._ws = handshake.connection
        trailing, _ = http.trailing_data
        self._http = None
        self._open()
        if trailing and self._ws is not None:
            self._frames(self._ws, trailing)

    def _open(self) -> None:
        """Upgraded: the stream starts, with this as its transport."""
        stream = self.doors.make()
        stream.peer = self.peer
        self.stream = stream
        self.doors.leave(self)
        stream.connection_made(cast(asyncio.Transport, self))

    def _refuse(self, reply: bytes, detail: str) -> None:
        self.doors.refuse("websocket_upgrades_refused", _who(self.peer, self.transport), detail)
        self.doors.leave(self)
        self._closing = True
        self.transport.write(reply)
        self.transport.close()

    def _frames(self, ws: Connection, data: bytes) -> None:
        ws.receive_data(data)
        for event in ws.events():
            if isinstance(event, events.CloseConnection):
                self._closed(ws, event)
                return
            if self._closing:
                continue  # the stream has closed: only the client's close frame matters
            if isinstance(event, events.BytesMessage):
                assert self.stream is not None
                self.stream.data_received(bytes(event.data))
            elif isinstance(event, events.Ping):
                self.transport.write(ws.send(event.response()))
            elif isinstance(event, events.TextMessage):
                self._fail(CloseReason.UNSUPPORTED_DATA, "[MQTT-6.0.0-1] a text frame")

    def _closed(self, ws: Connection, event: events.CloseConnection) -> None:
        """The client's close frame (answered), the answer to ours, or wsproto's verdict on a
        malformed frame (the state still open)."""
        if ws.state is ConnectionState.OPEN:
            self._fail(event.code, event.reason or "malformed frame")
            return
        if ws.state is ConnectionState.REMOTE_CLOSING:
            self.transport.write(ws.send(event.response()))
        self._closing = True
        self.transport.close()

    def _fail(self, code: int, reason: str) -> None:
        who = _who(self.peer, self.transport)
        self.doors.refuse("websocket_errors", who, f"WebSocket error: {reason}")
        self._closing = True
        ws = self._ws
        if ws is not None and ws.state is ConnectionState.OPEN:
            self.transport.write(ws.send(events.CloseConnection(code=code, reason=reason)))
        self.transport.close()


def _origin(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The request's ``Origin`` (RFC 6454), lower case, no trailing slash; None without one."""
    for name, value in headers:
        if name.lower() == b"origin":
            return value.decode("latin-1").strip().rstrip("/").lower()
    return None


# -- the listeners --------------------------------------------------------------------------------


def arrival(doors: Doors, kind: str) -> ProxiedArrival | DirectArrival:
    """The first protocol of a connection accepted by a listener of ``kind``."""
    return (ProxiedArrival if doors.proxy_protocol else DirectArrival)(doors, kind)


async def serve(
    listener: Listener, doors: Doors, backlog: int, reuse_port: bool = False
) -> asyncio.Server:
    """Start ``listener``; the port it is bound to (chosen by the system for port 0) is written
    back to it and recorded in ``doors.listening``.  With ``reuse_port`` the socket is bound with
    ``SO_REUSEPORT``, so the workers of a node (``frontend.workers``) share the port, the kernel
    spreading new connections over them; without it a port in use is an error, as it should be
    for a node started twice by mistake."""
    if listener.kind in SECURE and doors.tls is None:
        raise ValueError(f"the {listener.kind} listener needs --certfile and --keyfile")
    server = await asyncio.get_running_loop().create_server(
        lambda: arrival(doors, listener.kind),
        listener.host,
        listener.port,
        reuse_address=True,
        reuse_port=reuse_port,
        backlog=backlog,
    )
    listener.port = server.sockets[0].getsockname()[1]
    doors.listening[listener.kind] = listener.port
    return server
