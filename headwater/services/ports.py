"""Loopback TCP ports: picking free ones, refusing taken ones, probing listeners.

Everything Headwater starts locally binds 127.0.0.1 only. A free port is found by binding port 0 and
releasing it, which leaves a short window for another process to take it; callers that cannot afford
that window check the port again where they bind it.
"""

from __future__ import annotations

import contextlib
import errno
import socket

from headwater.errors import SettingError

LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port on `host` that nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


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
