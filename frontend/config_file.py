"""The configuration file: ``--config FILE`` or ``HEADWATER_CONFIG``, TOML read with ``tomllib``.

The keys are the names of ``frontend.config``'s flags without ``--`` (``max-inflight = 32``), so
its parser stays the one list of settings: a key it lacks, or a value of the wrong TOML type (a
flag's ``metavar`` says which, see ``frontend.config``), stops start-up naming the key and the file.

Precedence is flag > ``HEADWATER_*`` variable > file > default.  The parser's defaults already
hold the variables, so a file value becomes its flag's default only where the variable is unset,
and a flag given on the command line overrides it as any default.  Values go on as text
(:class:`frontend.config.FileValue`, remembering ``key in FILE``), so the checks and their
messages are those of flags and variables.

``python -m frontend.config_file`` writes the commented example (``docs/headwater.example.toml``)
from the parser: every key, its default and what it does.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import tomllib
from typing import Any

from frontend.config import (
    INTEGER,
    SECONDS,
    ConfigError,
    FileValue,
    _env_name,
    build_parser,
)

NOT_KEYS = ("help", "config")
"""Flags without a key: a file names no other file."""

TOML_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "switch": ((bool,), "true or false"),
    INTEGER: ((int,), "an integer"),
    SECONDS: ((int, float), "a number of seconds"),
    "text": ((str,), "a string"),
}
"""What a key of each kind takes (exact types: a TOML boolean is no integer)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line over the variables over the file of ``--config`` / HEADWATER_CONFIG."""
    parser = build_parser()
    path = _config_path(argv)
    if path:
        parser.set_defaults(**file_defaults(parser, path))
    return parser.parse_args(argv)


def _config_path(argv: list[str] | None) -> str | None:
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--config", default=os.environ.get("HEADWATER_CONFIG"))
    path: str | None = early.parse_known_args(argv)[0].config
    return path


def keys(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Every key a file may set -> its flag's action, in the order of ``--help``."""
    return {
        action.option_strings[-1].removeprefix("--"): action
        for action in parser._actions
        if action.option_strings and action.dest not in NOT_KEYS
    }


def kind(action: argparse.Action) -> str:
    """``switch``, ``INTEGER``, ``SECONDS`` or ``text``: the key of :data:`TOML_TYPES`."""
    if action.const == "yes":
        return "switch"
    return next((name for name in (INTEGER, SECONDS) if action.metavar == name), "text")


def file_defaults(parser: argparse.ArgumentParser, path: str) -> dict[str, FileValue]:
    """The parser defaults the file at ``path`` sets: one per key whose variable is unset."""
    known = keys(parser)
    defaults: dict[str, FileValue] = {}
    for key, value in _read(path).items():
        action = known.get(key)
        if action is None:
            raise ConfigError(_unknown(key, path, list(known)))
        origin = f"{key} in {path}"
        text = FileValue(_text(value, kind(action), origin), origin)
        if _env_name(action.option_strings[-1]) not in os.environ:
            defaults[action.dest] = text
    return defaults


def _read(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as file:
            return tomllib.load(file)
    except OSError as exc:
        raise ConfigError(
            f"--config / HEADWATER_CONFIG: cannot read {path}: {exc.strerror}"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"--config / HEADWATER_CONFIG: {path} is not TOML: {exc}") from None


def _unknown(key: str, path: str, known: list[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"{path}: unknown key {key!r}{hint}; the keys are the flags without --"


def _text(value: object, key_kind: str, origin: str) -> str:
    """``value`` as the text a flag would give, if it has the type ``key_kind`` takes."""
    types, expected = TOML_TYPES[key_kind]
    if type(value) not in types:
        raise ConfigError(f"{origin}: {value!r} is not {expected}")
    if key_kind == "switch":
        return "yes" if value else "no"
    return str(value)


# -- the example file ------------------------------------------------------------------------------

EXAMPLE_HEADER = """\
# Headwater front-end settings: `headwater frontend --config FILE` (or HEADWATER_CONFIG=FILE).
# Each key is a flag's name without "--"; the flag, then its HEADWATER_* variable, overrides it.
# The values are the defaults; a key commented out is unset by default.
# Generated from the flags: python -m frontend.config_file > docs/headwater.example.toml
"""
_VARIABLE_NOTE = re.compile(r"\s*\[HEADWATER_[A-Z_]+(=yes)?\]$")


def render_example(parser: argparse.ArgumentParser) -> str:
    """The example file: per key, what it does and its default (commented out when unset)."""
    lines = [EXAMPLE_HEADER]
    for key, action in keys(parser).items():
        what = _VARIABLE_NOTE.sub("", action.help or "")
        lines += [f"# {what}", _example_setting(key, action), ""]
    return "\n".join(lines)


def _example_setting(key: str, action: argparse.Action) -> str:
    default, key_kind = action.default, kind(action)
    if default is None:
        unset = "true" if key_kind == "switch" else '""'  # a TOML value of the key's type
        return f"# {key} = {unset}"
    if key_kind == "switch":
        return f"{key} = {'true' if str(default).lower() in ('yes', 'true', '1') else 'false'}"
    if key_kind in (INTEGER, SECONDS):
        number = float(default)
        return f"{key} = {int(number) if number.is_integer() else number}"
    return f"{key} = {json.dumps(default)}"


if __name__ == "__main__":
    for name in [name for name in os.environ if name.startswith("HEADWATER_")]:
        del os.environ[name]  # the defaults, not this shell's settings
    print(render_example(build_parser()), end="")
