"""The configuration file (``--config FILE`` or ``HEADWATER_CONFIG``, TOML read with ``tomllib``),
and the documents generated from ``frontend.config.SETTINGS``.

A key is a setting's name (``max-inflight = 32``), of the TOML type its kind takes
(``frontend.config.KINDS``): a key the table lacks, or a value of another type, stops start-up
naming the key and the file.

Precedence is flag > ``HEADWATER_*`` variable > file > default.  The parser's defaults already
hold the variables, so a file value becomes its flag's default only where the variable is unset,
and a flag given on the command line overrides it as any default.  Values go on as text
(:class:`frontend.config.FileValue`, remembering ``key in FILE``), so the checks and their
messages are those of flags and variables.

:func:`reread` reads them again for a SIGHUP (``frontend.node.Node.reload``).

``python -m frontend.config_file`` prints the commented example (``docs/headwater.example.toml``:
every key, its default and what it does); ``--readme`` prints the README's table of settings;
``--write`` rewrites both files.  A unit test keeps each equal to what is rendered here.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
import tomllib
from pathlib import Path
from typing import Any

from frontend.config import SETTINGS, NodeConfig, Setting, build_parser, config_from_args
from frontend.values import INTEGER, KINDS, LIST, SECONDS, SWITCH, ConfigError, FileValue

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "docs" / "headwater.example.toml"
README = ROOT / "README.md"
TABLE_START = "<!-- settings table: python -m frontend.config_file --write -->"
TABLE_END = "<!-- end of settings table -->"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line over the variables over the file of ``--config`` / HEADWATER_CONFIG."""
    parser = build_parser()
    path = _config_path(argv)
    if path:
        parser.set_defaults(**file_defaults(path))
    return parser.parse_args(argv)


def reread(
    argv: list[str] | None, before: argparse.Namespace
) -> tuple[argparse.Namespace, NodeConfig, list[str]]:
    """The settings read again as at start-up (the file may have changed; flags and variables
    have not), their configuration, and the names of the settings whose values changed that only
    a restart applies (``Setting.reloads``).  A bad value raises ``ConfigError`` as at start."""
    args = parse_args(argv)
    config = config_from_args(args)
    waiting = [
        s.name for s in SETTINGS.values()
        if not s.reloads and getattr(args, s.dest) != getattr(before, s.dest)
    ]  # fmt: skip
    return args, config, waiting


def _config_path(argv: list[str] | None) -> str | None:
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--config", default=os.environ.get(SETTINGS["config"].variable))
    path: str | None = early.parse_known_args(argv)[0].config
    return path


def keys() -> dict[str, Setting]:
    """Every key a file may set, in the order of ``--help`` (a file names no other file)."""
    return {name: setting for name, setting in SETTINGS.items() if setting.in_file}


def file_defaults(path: str) -> dict[str, FileValue]:
    """The parser defaults the file at ``path`` sets: one per key whose variable is unset."""
    known = keys()
    defaults: dict[str, FileValue] = {}
    for key, value in _read(path).items():
        setting = known.get(key)
        if setting is None:
            raise ConfigError(_unknown(key, path, list(known)))
        origin = f"{key} in {path}"
        text = FileValue(_text(value, setting.kind, origin), origin)
        if setting.variable not in os.environ:
            defaults[setting.dest] = text
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


def _text(value: object, kind: str, origin: str) -> str:
    """``value`` as the text a flag would give, if it has the type ``kind`` takes."""
    types, expected = KINDS[kind]
    if type(value) not in types:
        raise ConfigError(f"{origin}: {value!r} is not {expected}")
    if kind == SWITCH:
        return "yes" if value else "no"
    if kind == LIST:
        if not all(isinstance(entry, str) for entry in value):  # type: ignore[attr-defined]
            raise ConfigError(f"{origin}: {value!r} is not {expected}")
        return "\n".join(value)  # type: ignore[arg-type]
    return str(value)


# -- the example file ------------------------------------------------------------------------------

EXAMPLE_HEADER = """\
# Headwater front-end settings: `headwater frontend --config FILE` (or HEADWATER_CONFIG=FILE).
# Each key is a flag's name without "--"; the flag, then its HEADWATER_* variable, overrides it.
# The values are the defaults; a key commented out is unset by default.
# Generated from the flags: python -m frontend.config_file > docs/headwater.example.toml
"""


def render_example() -> str:
    """The example file: per key, what it does and its default (commented out when unset)."""
    lines = [EXAMPLE_HEADER]
    for setting in keys().values():
        lines += [f"# {setting.help}", _example_line(setting), ""]
    return "\n".join(lines)


def _example_line(setting: Setting) -> str:
    key, default = setting.name, setting.default
    if default is None:
        unset = {SWITCH: "true", LIST: "[]"}.get(setting.kind, '""')  # a TOML value of its type
        return f"# {key} = {unset}"
    if isinstance(default, bool):
        return f"{key} = {'true' if default else 'false'}"
    if isinstance(default, float) and default.is_integer():
        return f"{key} = {int(default)}"
    return f"{key} = {json.dumps(default)}"


# -- the README's table ----------------------------------------------------------------------------

_UNITS = ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"))


def render_table() -> str:
    """The README's table of settings: flag, variable, default, what it does."""
    rows = ["| Flag | Variable | Default | |", "| --- | --- | --- | --- |"]
    for s in SETTINGS.values():
        what = f"{s.help}; {s.more}" if s.more else s.help
        cells = (f"`{s.flag}`", f"`{s.variable}`", _shown(s), what.replace("|", "\\|"))
        rows.append(f"| {' | '.join(cells)} |")
    return "\n".join(rows) + "\n"


def _shown(setting: Setting) -> str:
    """A default as the README shows it: sizes in binary units too."""
    default = setting.default
    if setting.required:
        return "(required)"
    if default is None:
        return "unset"
    text = f"`{setting.text}`"
    if setting.kind in (INTEGER, SECONDS) and ("size" in setting.name or "bytes" in setting.name):
        unit = next(((size, name) for size, name in _UNITS if int(default) >= size), None)
        return f"{text} ({int(default) / unit[0]:g} {unit[1]})" if unit else text
    return text


def with_table(readme: str) -> str:
    """``readme`` with the text between its table markers rendered anew."""
    head, start, rest = readme.partition(TABLE_START)
    _, end, tail = rest.partition(TABLE_END)
    if not start or not end:
        raise ValueError(f"README.md lacks {TABLE_START} ... {TABLE_END}")
    return f"{head}{start}\n{render_table()}{end}{tail}"


def _main(argv: list[str]) -> None:
    if "--write" in argv:
        EXAMPLE.write_text(render_example())
        README.write_text(with_table(README.read_text()))
    else:
        sys.stdout.write(render_table() if "--readme" in argv else render_example())


if __name__ == "__main__":
    _main(sys.argv[1:])
