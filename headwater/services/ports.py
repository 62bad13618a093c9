"""Loopback TCP ports: picking free ones, refusing taken ones, probing listeners.

Everything Headwater starts locally binds 127.0.0.1 only. A free port is one that binds now,
picked at random below the kernel's ephemeral range (Linux: 32768 up), so no outgoing connection
of a busy machine takes it between the pick and the listener's bind (a 3-broker Kafka failed so in
CI: "Address already in use"); another process picking at the same time is the short window left,
and callers that cannot afford it check the port again where they bind it.
"""

from __future__ import annotations

import contextlib
import errno
import random
import socket

from headwater.errors import SettingError

LOOPBACK = "127.0.0.1"


PICKED_FROM = range(20000, 32768)
"""Where :func:`free_port` looks: below Linux's default ephemeral range, above the well-known."""


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port on `host` that nobody listens on right now (see the module's docstring)."""
    for port in random.sample(PICKED_FROM, 64):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))  # all 64 tried were taken: whatever the kernel gives
        found: int = sock.getsockname()[1]
        return found


def ensure_port_free(port: int, setting: str, host: str = LOOPBACK) -> None:
    """Raise a SettingError naming `setting` if `host:port` cannot be bound."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                reason = "is already in use"
            else:
                reason = f"cannot be bound ({exc.strerror})"
            raise SettingError(f"port {host}:{port} {reason} (setting {setting})") from None


def port_accepts(port: int, host: str = LOOPBACK, timeout: float = 0.5) -> bool:
    """True if something accepts TCP connections on `host:port`."""
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=timeout):
        return True
    return False
