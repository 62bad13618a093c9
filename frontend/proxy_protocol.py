"""The PROXY protocol, v1 and v2 (HAProxy's proxy-protocol.txt), sans-IO: the header a load
balancer sends before a connection's own bytes, naming the client's address.

:class:`ProxyHeaderReader` is offered the socket's bytes through :meth:`~ProxyHeaderReader.window`.
An exact reader's window is never larger than what the header may still need, so not one byte
past its end is read and what follows (a TLS ClientHello) stays in the socket for the TLS
handshake (``frontend.listeners``).  A greedy reader's window is :data:`GREEDY_WINDOW` bytes, so
the header and what follows it (a CONNECT, an HTTP upgrade) come in one read, not three; what it
read past the header's end is its ``rest``, for the connection's stream to take first.  Either
way, anything that cannot begin or complete a valid header raises :class:`ProxyHeaderError` as
soon as it is seen.  v2's TLVs are skipped; v1 ``UNKNOWN`` and v2 ``LOCAL`` (a health check)
name no client.

A header is believed only from a load balancer: :class:`AllowList` (``--proxy-allow``) says
whether a connection's peer is one; any other peer's connection is closed before a byte of it
is read.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass, field

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

LOOPBACK = "127.0.0.0/8,::1/128"
"""The default ``--proxy-allow``: a load balancer on the node's own host."""


ANSWERS_KEPT = 1024
"""Peer addresses an allow-list keeps its answer for (the oldest forgotten first)."""


@dataclass(frozen=True, slots=True)
class AllowList:
    """The networks whose peers may send a PROXY header: the load balancers."""

    networks: tuple[Network, ...]
    _answers: dict[str, bool] = field(default_factory=dict, compare=False, repr=False)
    """Peer address -> the answer: asked at every connection, from the few addresses of the
    load balancers (parsing one and testing it showed 2-3% of a connect storm's profile, and an
    ``lru_cache`` keyed by the networks hashed each ``ip_network`` at every call)."""

    @classmethod
    def parse(cls, text: str) -> AllowList:
        """``CIDR[,CIDR...]`` (a bare address is a /32 or /128); ValueError names a bad one."""
        words = [word.strip() for word in text.split(",") if word.strip()]
        if not words:
            raise ValueError("no network given")
        networks = []
        for word in words:
            try:
                networks.append(ipaddress.ip_network(word, strict=False))
            except ValueError:
                raise ValueError(f"{word!r} is not an address or CIDR network") from None
        return cls(tuple(networks))

    def allows(self, host: str) -> bool:
        """Whether ``host`` (a socket's peer address) is in one of the networks; an IPv4
        address mapped into IPv6 (a dual-stack socket's) counts as the IPv4 one."""
        answers = self._answers
        answer = answers.get(host)
        if answer is None:
            if len(answers) >= ANSWERS_KEPT:
                del answers[next(iter(answers))]
            answer = answers[host] = _allows(self.networks, host)
        return answer

    def __str__(self) -> str:
        return ",".join(str(network) for network in self.networks)


def _allows(networks: tuple[Network, ...], host: str) -> bool:
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return any(address in network for network in networks)


PROXY_V1_PREFIX = b"PROXY "
PROXY_V1_SHORTEST = len(b"PROXY UNKNOWN\r\n")
PROXY_V1_LONGEST = 107
"""Bytes of the longest v1 header, CRLF included (proxy-protocol.txt, 2.1)."""
PROXY_V1_SEPARATORS = 5
"""Spaces in "PROXY TCP4 <source> <destination> <source port> <destination port>"."""
PROXY_V2_SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
PROXY_V2_FIXED = 16
"""The signature, version and command, family and protocol, and the length of the rest."""
GREEDY_WINDOW = 1024
"""Bytes a greedy reader offers a read: a v2 header of HAProxy's (28 bytes for IPv4, 52 for
IPv6, more with TLVs) and a CONNECT behind it.  Three reads each time before (15 bytes, 1, then
the address block), each a system call and a turn of the loop."""

# -- the header --------------------------------------------------------------------


class ProxyHeaderError(ValueError):
    """A PROXY header that is malformed, truncated or missing: the connection is closed."""


@dataclass(frozen=True, slots=True)
class ProxyHeader:
    source: tuple[str, int] | None
    """The client's address as the load balancer saw it; None (v1 ``UNKNOWN``, v2 ``LOCAL``,
    an unspecified or Unix family): the socket's peer is the client."""


class ProxyHeaderReader:
    """One PROXY header, v1 or v2, read incrementally: exactly (never a byte past its end) or
    greedily (see the module's docstring).

    An exact reader's :meth:`window` is sized to what the header may still need: 15 bytes first
    (no header is shorter); for v2 the fixed 16, then the length they give; for v1, no more than
    the shortest completion of what was read (two bytes a field, one after a CR), since only its
    CRLF ends it.  A greedy reader's is the rest of a buffer of :data:`GREEDY_WINDOW` bytes (of
    a v2 header's length once it is known, if that is more)."""

    __slots__ = ("_buffer", "_exact", "have", "rest")

    def __init__(self, exact: bool = True) -> None:
        self._exact = exact
        self._buffer = bytearray(PROXY_V1_LONGEST if exact else GREEDY_WINDOW)
        self.have = 0
        """Bytes read so far (a greedy reader's may go past the header's end)."""
        self.rest = b""
        """Once the header is complete: the bytes read after its end (a greedy reader's)."""

    def window(self) -> memoryview:
        if self._exact:
            return memoryview(self._buffer)[self.have : self.have + self._wanted()]
        return memoryview(self._buffer)[self.have :]

    def received(self, count: int) -> ProxyHeader | None:
        """``count`` bytes were written into the last window: the header once it is complete.
        Raises :class:`ProxyHeaderError` as soon as the bytes cannot begin a valid header."""
        self.have += count
        head = bytes(self._buffer[: min(self.have, len(PROXY_V2_SIGNATURE))])
        if PROXY_V2_SIGNATURE.startswith(head):
            return self._v2() if self.have >= len(PROXY_V2_SIGNATURE) else None
        if PROXY_V1_PREFIX.startswith(head[: len(PROXY_V1_PREFIX)]):
            return self._v1() if self.have >= len(PROXY_V1_PREFIX) else None
        raise ProxyHeaderError(f"not a PROXY protocol header: {head!r}")

    def _wanted(self) -> int:
        have = self.have
        if have < PROXY_V1_SHORTEST:
            return PROXY_V1_SHORTEST - have
        if self._buffer[0] == PROXY_V2_SIGNATURE[0]:
            return max(PROXY_V2_FIXED, self._v2_length()) - have
        line = self._buffer[:have]
        if line.endswith(b"\r"):
            wanted = 1
        elif line.startswith(b"PROXY UNKNOWN"):
            wanted = 2
        else:  # each separator still to come, a byte after it, CRLF, and a byte for a new field
            later = PROXY_V1_SEPARATORS - line.count(b" ")
            wanted = 2 * later + 2 + line.endswith(b" ")
        return max(1, min(wanted, PROXY_V1_LONGEST - have))

    def _v2_length(self) -> int:
        if self.have < PROXY_V2_FIXED:
            return PROXY_V2_FIXED
        return PROXY_V2_FIXED + int.from_bytes(self._buffer[14:16], "big")

    def _v2(self) -> ProxyHeader | None:
        total = self._v2_length()
        if len(self._buffer) < total:  # a new buffer: the window on this one may be exported
            self._buffer = self._buffer[: self.have] + bytes(total - self.have)
        if self.have < total:
            return None
        return self._done(parse_v2(bytes(self._buffer[:total])), total)

    def _v1(self) -> ProxyHeader | None:
        line = bytes(self._buffer[: min(self.have, PROXY_V1_LONGEST)])
        end = line.find(b"\r\n")
        # before its CRLF (none yet: before a last CR that may begin it) no CR or LF
        inside = line[:end] if end >= 0 else line.removesuffix(b"\r")
        if b"\r" in inside or b"\n" in inside:
            raise ProxyHeaderError(f"[PROXY v1] CR or LF inside the header: {line!r}")
        if end >= 0:
            return self._done(parse_v1(line[: end + 2]), end + 2)
        if len(line) >= PROXY_V1_LONGEST:
            raise ProxyHeaderError(f"[PROXY v1] no CRLF within {PROXY_V1_LONGEST} bytes")
        return None

    def _done(self, header: ProxyHeader, length: int) -> ProxyHeader:
        """The header of ``length`` bytes is complete; what was read after it is the rest."""
        self.rest = bytes(self._buffer[length : self.have])
        return header


def parse_v1(line: bytes) -> ProxyHeader:
    """A whole v1 header, CRLF included: "PROXY TCP4|TCP6 src dst sport dport" or "PROXY
    UNKNOWN" (anything after it ignored)."""
    words = line[:-2].split(b" ")
    if words[:2] == [b"PROXY", b"UNKNOWN"]:
        return ProxyHeader(None)
    address = {b"TCP4": ipaddress.IPv4Address, b"TCP6": ipaddress.IPv6Address}
    if len(words) != 6 or words[0] != b"PROXY" or words[1] not in address:
        raise ProxyHeaderError(f"[PROXY v1] malformed header: {line!r}")
    family = address[words[1]]
    try:
        source, _ = (family(word.decode("ascii")) for word in words[2:4])
    except ValueError:
        raise ProxyHeaderError(f"[PROXY v1] bad address in {line!r}") from None
    port, _ = (_port(word, line) for word in words[4:6])
    return ProxyHeader((str(source), port))


def _port(word: bytes, line: bytes) -> int:
    if not word.isdigit() or (len(word) > 1 and word.startswith(b"0")) or int(word) > 65535:
        raise ProxyHeaderError(f"[PROXY v1] bad port {word!r} in {line!r}")
    return int(word)


def parse_v2(header: bytes) -> ProxyHeader:
    """A whole v2 header: the fixed 16 bytes and the address block (TLVs after it ignored)."""
    if not header.startswith(PROXY_V2_SIGNATURE) or len(header) < PROXY_V2_FIXED:
        raise ProxyHeaderError("[PROXY v2] no signature")
    version, command = header[12] >> 4, header[12] & 0x0F
    if version != 2:
        raise ProxyHeaderError(f"[PROXY v2] version {version}, not 2")
    if command == 0:  # LOCAL: the proxy's own connection (a health check)
        return ProxyHeader(None)
    if command != 1:
        raise ProxyHeaderError(f"[PROXY v2] unknown command {command}")
    family, protocol = header[13] >> 4, header[13] & 0x0F
    if family in (0, 3):  # unspecified, or Unix sockets: no address of use here
        return ProxyHeader(None)
    if family not in (1, 2):
        raise ProxyHeaderError(f"[PROXY v2] unknown address family {family}")
    if protocol != 1:
        raise ProxyHeaderError(f"[PROXY v2] protocol {protocol} is not a stream (TCP)")
    size = 4 if family == 1 else 16
    block = header[PROXY_V2_FIXED:]
    if len(block) < 2 * size + 4:
        raise ProxyHeaderError(f"[PROXY v2] address block of {len(block)} bytes is too short")
    port = int.from_bytes(block[2 * size : 2 * size + 2], "big")
    if size == 4:  # the C formatter: ipaddress's, in Python, was 1-2% of a CONNECT cycle
        return ProxyHeader((socket.inet_ntop(socket.AF_INET, block[:4]), port))
    return ProxyHeader((str(ipaddress.IPv6Address(block[:16])), port))
