"""The kinds of a setting's value and their checks: how a flag's, a variable's or the
configuration file's text becomes a value, or stops start-up with one line naming the flag, the
variable and, for a file's value, the key and the file (:class:`ConfigError`).  The table of
settings that uses them is ``frontend.config``."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

from frontend.proxy_protocol import AllowList
from router.log import security_settings


class ConfigError(ValueError):
    """A setting that stops start-up; the message names the flag and variable."""


class FileValue(str):
    """A setting's text read from the configuration file, with ``origin`` (``key in FILE``) for
    the messages of the checks below."""

    origin: str

    def __new__(cls, text: str, origin: str = "") -> FileValue:
        value = super().__new__(cls, text)
        value.origin = origin
        return value


# -- kinds of value --------------------------------------------------------------------------------

TEXT, INTEGER, SECONDS, SWITCH, LIST = "text", "integer", "seconds", "switch", "list"
KINDS: dict[str, tuple[tuple[type, ...], str]] = {
    SWITCH: ((bool,), "true or false"),
    INTEGER: ((int,), "an integer"),
    SECONDS: ((int, float), "a number of seconds"),
    TEXT: ((str,), "a string"),
    LIST: ((list,), "a list of strings"),
}
"""Each kind's TOML types (exact: a TOML boolean is no integer), and the words for them."""
METAVARS = {INTEGER: "N", SECONDS: "SECONDS"}

Parse = Callable[[Any, str], Any]
"""A text setting's check: (its text or None, its flag) -> its value; ConfigError if bad."""


def label(flag: str, value: object) -> str:
    """Where a bad ``value`` came from: ``--flag / HEADWATER_FLAG``, and the file key if there."""
    where = f"{flag} / {variable_of(flag)}"
    return f"{where} / {value.origin}" if isinstance(value, FileValue) else where


def variable_of(flag: str) -> str:
    """The variable beside ``flag``: ``--max-inflight`` -> ``HEADWATER_MAX_INFLIGHT``."""
    return "HEADWATER_" + flag.lstrip("-").replace("-", "_").upper()


def int_setting(value: str | None, flag: str, low: int, high: int) -> int:
    try:
        number = int(value or "")
    except ValueError:
        raise ConfigError(f"{label(flag, value)}: {value!r} is not an integer") from None
    if not low <= number <= high:
        raise ConfigError(f"{label(flag, value)}: {number} is outside {low}..{high}")
    return number


def seconds_setting(value: str | None, flag: str, high: float) -> float:
    where = label(flag, value)
    try:
        seconds = float(value or "")
    except ValueError:
        raise ConfigError(f"{where}: {value!r} is not a number of seconds") from None
    if not 0 <= seconds <= high:
        raise ConfigError(f"{where}: {value} is outside 0..{high:.0f} seconds")
    return seconds


def switch_setting(value: str, flag: str) -> bool:
    answer = {"yes": True, "true": True, "1": True, "no": False, "false": False, "0": False}
    if value.lower() not in answer:
        raise ConfigError(f"{label(flag, value)}: {value!r} is not yes or no")
    return answer[value.lower()]


def choice(choices: tuple[str, ...]) -> Parse:
    """The check of a text naming one of ``choices``, whatever its case."""

    def parse(value: str, flag: str) -> str:
        chosen = [choice for choice in choices if choice.lower() == str(value).lower()]
        if not chosen:
            raise ConfigError(f"{label(flag, value)}: {value!r} is not one of {', '.join(choices)}")
        return chosen[0]

    return parse


class Append(argparse.Action):
    """A list setting's flag: the first one given replaces the default (variable or file)."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        current = getattr(namespace, self.dest, None)
        setattr(namespace, self.dest, [*(current if isinstance(current, list) else []), values])


def checked(check: Callable[[str], Any], entries: bool = False) -> Parse:
    """The check of a text that ``check`` makes a value or refuses with a ValueError; with
    ``entries``, of a list setting's: repeated flags (which replace the variable and the file),
    else a variable's lines or a TOML array of strings (``frontend.config_file``)."""

    def one(value: str, flag: str) -> Any:
        try:
            return check(str(value))
        except ValueError as exc:
            raise ConfigError(f"{label(flag, value)}: {exc}") from None

    def parse(value: Any, flag: str) -> Any:
        if not entries:
            return one(value or "", flag)
        lines = value if isinstance(value, list) else (value or "").splitlines()
        origin = value.origin if isinstance(value, FileValue) else None
        texts = [FileValue(t.strip(), origin) if origin else t.strip() for t in lines]
        return [one(text, flag) for text in texts if text]

    return parse


def existing_file(path: str | None, flag: str) -> str | None:
    if path and not os.path.isfile(path):
        raise ConfigError(f"{label(flag, path)}: no file {path}")
    return path


def kafka_config(path: str | None, flag: str) -> dict[str, str]:
    if not path:
        return {}
    try:
        with open(path, encoding="utf-8") as file:
            return security_settings(file.read())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{label(flag, path)}: {exc}") from None


def allow_list(value: str, flag: str) -> AllowList:
    try:
        return AllowList.parse(str(value))
    except ValueError as exc:
        raise ConfigError(f"{label(flag, value)}: {exc}") from None


def origins(value: str | None, flag: str) -> frozenset[str]:
    """Origins as browsers send them (RFC 6454): scheme://host[:port], compared in lower case."""
    words = (word.strip().rstrip("/").lower() for word in (value or "").split(","))
    origins = frozenset(word for word in words if word)
    for origin in origins:
        scheme, sep, host = origin.partition("://")
        if not sep or not scheme or not host or "/" in host:
            raise ConfigError(f"{label(flag, value)}: {origin!r} is not scheme://host[:port]")
    return origins
