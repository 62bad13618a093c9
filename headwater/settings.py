"""Settings read from the environment, validated where they are read.

Each setting has one name, used both to read it and in every error about it, so a message can always
say which flag or variable to change. Values are parsed eagerly: a malformed value fails with a
`SettingError` before anything is started.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from headwater.errors import SettingError

KAFKA_BOOTSTRAP_ENV = "HEADWATER_KAFKA_BOOTSTRAP"
REDIS_URL_ENV = "HEADWATER_REDIS_URL"
PORT_ENV = "HEADWATER_PORT"
CACHE_ENV = "HEADWATER_CACHE"
DEFAULT_MQTT_PORT = 1883
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


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
    """The external Kafka's bootstrap list, or None to start a local Kafka."""
    value = env.get(KAFKA_BOOTSTRAP_ENV, "").strip()
    if not value:
        return None
    for server in value.split(","):
        parse_host_port(server, KAFKA_BOOTSTRAP_ENV)
    return value


def external_redis_url(env: Mapping[str, str] = os.environ) -> str | None:
    """The external Redis URL, or None to start a local Redis."""
    value = env.get(REDIS_URL_ENV, "").strip()
    if not value:
        return None
    if not value.startswith(REDIS_SCHEMES):
        raise SettingError(f"{REDIS_URL_ENV}: expected a redis:// URL, got {value!r}")
    return value


def mqtt_port(flag: int | None, env: Mapping[str, str] = os.environ) -> int:
    """The public MQTT port: `--port`, else HEADWATER_PORT, else 1883."""
    if flag is not None:
        return parse_port(flag, "--port")
    value = env.get(PORT_ENV, "").strip()
    return parse_port(value, PORT_ENV) if value else DEFAULT_MQTT_PORT


def cache_root(env: Mapping[str, str] = os.environ) -> Path:
    """Where downloaded artifacts live: HEADWATER_CACHE, else ~/.cache/headwater."""
    value = env.get(CACHE_ENV, "").strip()
    return Path(value).expanduser() if value else Path.home() / ".cache" / "headwater"
