"""Settings read from the environment, validated where they are read.

Each setting has one name, used both to read it and in every error about it, so a message can always
say which flag or variable to change. Values are parsed eagerly: a malformed value fails with a
`SettingError` before anything is started.

The settings the analytics share with the tooling (HEADWATER_KAFKA_BOOTSTRAP, HEADWATER_CACHE and
port numbers) are parsed in `spark_streaming.settings`, their one home: the product may not import
this package, so this one imports them from there and re-raises their `SettingError` as its own
(a `HeadwaterError`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from headwater.errors import SettingError
from spark_streaming import settings as shared
from spark_streaming.settings import CACHE_ENV as CACHE_ENV
from spark_streaming.settings import KAFKA_BOOTSTRAP_ENV as KAFKA_BOOTSTRAP_ENV
from spark_streaming.settings import cache_root as cache_root

REDIS_URL_ENV = "HEADWATER_REDIS_URL"
PORT_ENV = "HEADWATER_PORT"
DEFAULT_MQTT_PORT = 1883
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def parse_port(value: str | int, setting: str) -> int:
    """A TCP port number in 1..65535, naming `setting` if it is not one."""
    try:
        return shared.parse_port(value, setting)
    except shared.SettingError as exc:
        raise SettingError(str(exc)) from None


def external_kafka_bootstrap(env: Mapping[str, str] = os.environ) -> str | None:
    """The external Kafka's bootstrap list, or None to start a local Kafka."""
    try:
        return shared.external_kafka_bootstrap(env)
    except shared.SettingError as exc:
        raise SettingError(str(exc)) from None


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
