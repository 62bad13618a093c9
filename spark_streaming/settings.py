"""The ``HEADWATER_*`` environment settings the analytics read: the Kafka bootstrap list and the
download cache.

This is the one place they are parsed.  The tooling (``headwater.settings``) imports them from
here, since the product never imports the tooling; it turns a `SettingError` into its own
``headwater.errors.SettingError``.  Values are checked where they are read, and a bad one fails
with a message naming the flag or variable to change.  No Spark here: importing this module is
cheap for the tooling.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

KAFKA_BOOTSTRAP_ENV = "HEADWATER_KAFKA_BOOTSTRAP"
CACHE_ENV = "HEADWATER_CACHE"


class SettingError(ValueError):
    """A flag or environment variable has a value that cannot be used; the message names it."""


def parse_host_port(value: str, setting: str) -> tuple[str, int]:
    """Split `host:port`, naming `setting` if the value is not one."""
    host, sep, port_text = value.strip().rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise SettingError(f"{setting}: expected host:port, got {value!r}")
    return host, parse_port(port_text, setting)


def parse_port(value: str | int, setting: str) -> int:
    """A TCP port number in 1..65535, naming `setting` if it is not one."""
    try:
        port = int(value)
    except ValueError:
        raise SettingError(f"{setting}: expected a port number, got {value!r}") from None
    if not 1 <= port <= 65535:
        raise SettingError(f"{setting}: port must be in 1..65535, got {port}")
    return port


def external_kafka_bootstrap(env: Mapping[str, str] = os.environ) -> str | None:
    """The external Kafka's bootstrap list (HEADWATER_KAFKA_BOOTSTRAP), or None if unset."""
    value = env.get(KAFKA_BOOTSTRAP_ENV, "").strip()
    if not value:
        return None
    for server in value.split(","):
        parse_host_port(server, KAFKA_BOOTSTRAP_ENV)
    return value


def cache_root(env: Mapping[str, str] = os.environ) -> Path:
    """Where downloaded artifacts live: HEADWATER_CACHE, else ~/.cache/headwater."""
    value = env.get(CACHE_ENV, "").strip()
    return Path(value).expanduser() if value else Path.home() / ".cache" / "headwater"
