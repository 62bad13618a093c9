"""Waiting for a service to become ready, without waiting for a dead one.

`wait_until` polls a check until it passes. It gives up early, with the child's log tail, if the
process being waited for exits, and it raises `Cancelled` as soon as a stop is requested, so that a
Ctrl-C during start-up unwinds promptly instead of waiting out a timeout.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from headwater.errors import Cancelled, ServiceError
from headwater.services.process import ChildProcess


def wait_until(
    check: Callable[[], bool],
    *,
    what: str,
    timeout: float,
    child: ChildProcess | None = None,
    cancel: threading.Event | None = None,
    interval: float = 0.2,
) -> None:
    """Return once `check()` is true; raise ServiceError on timeout or if `child` exits."""
    deadline = time.monotonic() + timeout
    while True:
        if cancel is not None and cancel.is_set():
            raise Cancelled(what)
        if child is not None and child.poll() is not None:
            raise ServiceError(f"{what}: {child.describe_exit()}")
        if check():
            return
        if time.monotonic() >= deadline:
            raise ServiceError(_timeout_message(what, timeout, child))
        time.sleep(interval)


def _timeout_message(what: str, timeout: float, child: ChildProcess | None) -> str:
    message = f"{what}: not ready after {timeout:.0f}s"
    if child is None:
        return message
    return f"{message} (log: {child.log_path}); last lines:\n{child.log_tail()}"
