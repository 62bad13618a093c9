"""Settings read from the environment, validated where they are read.

Each setting has one name, used both to read it and in every error about it, so a message can always
say which flag or variable to change. Values are parsed eagerly: a malformed value fails with a
`SettingError` before anything is started.

The settings the analytics share with the tooling (HEADWATER_KAFKA_BOOTSTRAP, HEADWATER_CACHE and
port numbers) are parsed in `spark_streaming.settings`, their one home: the product may not import
this package, so this one imports them from there and re-raises their `SettingError` as its own
(a `HeadwaterError`).

Kafka's replication settings default from the number of brokers (`Replication.for_brokers`): one
broker gives factor 1 and min ISR 1, three give 3 and 2. A factor above the broker count, or a min
ISR above the factor (no write could ever be acknowledged), is refused.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from headwater.errors import SettingError
from router.topics import Replication
from spark_streaming import settings as shared
from spark_streaming.settings import CACHE_ENV as CACHE_ENV
from spark_streaming.settings import KAFKA_BOOTSTRAP_ENV as KAFKA_BOOTSTRAP_ENV
from spark_streaming.settings import cache_root as cache_root

REDIS_URL_ENV = "HEADWATER_REDIS_URL"
PORT_ENV = "HEADWATER_PORT"
DEFAULT_MQTT_PORT = 1883
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")
KAFKA_BROKERS_ENV = "HEADWATER_KAFKA_BROKERS"
REPLICATION_FACTOR_ENV = "HEADWATER_REPLICATION_FACTOR"
MIN_INSYNC_REPLICAS_ENV = "HEADWATER_MIN_INSYNC_REPLICAS"
KAFKA_BROKERS_SETTING = f"--kafka-brokers / {KAFKA_BROKERS_ENV}"


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


def parse_count(value: str | int, setting: str) -> int:
    """A whole number of at least 1, naming `setting` if it is not one."""
    try:
        count = int(value)
    except ValueError:
        raise SettingError(f"{setting}: expected a whole number, got {value!r}") from None
    if count < 1:
        raise SettingError(f"{setting}: must be at least 1, got {count}")
    return count


def _count_setting(
    flag: int | None, flag_name: str, env: Mapping[str, str], env_name: str
) -> tuple[int | None, str]:
    """The flag if given, else the variable if set, else None; with the name to cite about it."""
    if flag is not None:
        return parse_count(flag, flag_name), flag_name
    value = env.get(env_name, "").strip()
    if value:
        return parse_count(value, env_name), env_name
    return None, f"{flag_name} / {env_name}"


def kafka_brokers(flag: int | None, env: Mapping[str, str] = os.environ) -> int | None:
    """How many local Kafka brokers were asked for: `--kafka-brokers`, else
    HEADWATER_KAFKA_BROKERS, else None (the caller's default)."""
    return _count_setting(flag, "--kafka-brokers", env, KAFKA_BROKERS_ENV)[0]


def replication(
    factor_flag: int | None,
    min_insync_flag: int | None,
    brokers: int,
    env: Mapping[str, str] = os.environ,
) -> Replication:
    """The project topics' replication on a Kafka of `brokers` brokers.

    Each value comes from its flag, else its variable, else `Replication.for_brokers(brokers)`;
    an unset min ISR follows the factor (`Replication.for_factor`).
    """
    factor, factor_setting = _count_setting(
        factor_flag, "--replication-factor", env, REPLICATION_FACTOR_ENV
    )
    min_insync, min_insync_setting = _count_setting(
        min_insync_flag, "--min-insync-replicas", env, MIN_INSYNC_REPLICAS_ENV
    )
    if factor is None:
        factor = Replication.for_brokers(brokers).factor
    if factor > brokers:
        raise SettingError(
            f"{factor_setting}: replication factor {factor} needs {factor} Kafka brokers, "
            f"the Kafka has {brokers} (a local Kafka's count is {KAFKA_BROKERS_SETTING})"
        )
    if min_insync is None:
        min_insync = Replication.for_factor(factor).min_insync
    if min_insync > factor:
        raise SettingError(
            f"{min_insync_setting}: {min_insync} in-sync replicas is more than the replication "
            f"factor, {factor} ({factor_setting}): no write could ever be acknowledged"
        )
    return Replication(factor, min_insync)
