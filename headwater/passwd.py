"""`headwater passwd`: manage a Mosquitto password file, with mosquitto_passwd's usage.

    headwater passwd [-H sha512|sha512-pbkdf2] [-c | -D] FILE USER        (prompts twice)
    headwater passwd [-H sha512|sha512-pbkdf2] [-c] -b FILE USER PASSWORD
    headwater passwd -U FILE                                              (hash plain text)

The file is read whole, changed as a list of lines (the user's entry replaced where it stands,
or appended; every other line, comments included, kept in order) and replaced atomically, so
a running broker reloading it sees the old file or the new one, never half of either.  A file
created here has mode 0600; an existing file keeps its mode.  Entries are written exactly as
Mosquitto 2.0's mosquitto_passwd writes them (``frontend.auth.passwords``), so the file serves
Headwater and Mosquitto alike.  Anything the user can fix is a `HeadwaterError` (exit 1).
"""

from __future__ import annotations

import argparse
import getpass
from pathlib import Path
from typing import cast

from frontend.auth.passwords import (
    DEFAULT_ITERATIONS,
    DEFAULT_METHOD,
    MAX_ITERATIONS,
    METHODS,
    Method,
    convert_plain_text,
    delete_user,
    hash_password,
    set_password,
    write_atomically,
)
from headwater.errors import HeadwaterError

MAX_NAME = 65535


class PasswdError(HeadwaterError):
    """A password file that cannot be changed as asked."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="headwater passwd",
        description="Manage a Mosquitto 2.0 password file (same usage as mosquitto_passwd).",
    )
    parser.add_argument(
        "-H",
        dest="method",
        choices=METHODS,
        default=DEFAULT_METHOD,
        help=f"hashing algorithm (default {DEFAULT_METHOD}; Mosquitto 1.6 used sha512)",
    )
    parser.add_argument(
        "-I",
        dest="iterations",
        type=int,
        default=DEFAULT_ITERATIONS,
        help=f"PBKDF2 iterations (default {DEFAULT_ITERATIONS})",
    )
    parser.add_argument(
        "-b",
        dest="batch",
        action="store_true",
        help="batch mode: the password is the last argument",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "-c",
        dest="create",
        action="store_true",
        help="create the file, overwriting an existing one",
    )
    mode.add_argument("-D", dest="delete", action="store_true", help="delete the user")
    mode.add_argument(
        "-U",
        dest="upgrade",
        action="store_true",
        help="hash the plain-text passwords of a user:password file",
    )
    parser.add_argument("file", metavar="FILE")
    parser.add_argument("username", metavar="USER", nargs="?")
    parser.add_argument("password", metavar="PASSWORD", nargs="?")
    return parser


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _check_arguments(parser, args)
    method = cast(Method, args.method)  # one of METHODS: argparse checked the choice
    if args.upgrade:
        _upgrade(args.file, method, args.iterations)
        return 0
    user: str = args.username
    _check_username(user)
    if args.delete:
        _delete(args.file, user)
        return 0
    lines = [] if args.create else _existing_lines(args.file)
    password = args.password if args.batch else _ask_password()
    _write(args.file, set_password(lines, user, hash_password(password, method, args.iterations)))
    return 0


def _upgrade(path: str, method: Method, iterations: int) -> None:
    try:
        converted = convert_plain_text(_existing_lines(path), method, iterations)
    except ValueError as exc:
        raise PasswdError(f"{path}:{exc}") from None
    _write(path, converted)


def _delete(path: str, user: str) -> None:
    remaining = delete_user(_existing_lines(path), user)
    if remaining is None:
        raise PasswdError(f"user {user!r} is not in {path}")
    _write(path, remaining)


def _check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if not 1 <= args.iterations <= MAX_ITERATIONS:
        parser.error(f"-I: the number of iterations must be 1..{MAX_ITERATIONS}")
    if args.upgrade:
        if args.username is not None or args.batch:
            parser.error("-U takes only the password file")
        return
    if args.batch and args.delete:
        parser.error("-b and -D cannot be used together")
    if args.username is None:
        parser.error("the password file and a user name are required")
    if args.batch != (args.password is not None):
        parser.error("a password argument goes with -b, and -b needs one")


def _check_username(user: str) -> None:
    if ":" in user:
        raise PasswdError(f"user name {user!r} must not contain ':'")
    if not user or any(ord(c) < 32 or ord(c) == 127 for c in user):
        raise PasswdError(f"user name {user!r} must be non-empty, without control characters")
    if len(user.encode()) > MAX_NAME:
        raise PasswdError(f"user name must be at most {MAX_NAME} bytes")


def _existing_lines(path: str) -> list[str]:
    if not Path(path).exists():
        raise PasswdError(f"password file {path} does not exist: use -c to create it")
    try:
        return Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise PasswdError(f"cannot read password file {path}: {exc}") from None


def _write(path: str, lines: list[str]) -> None:
    try:
        write_atomically(path, lines)
    except OSError as exc:
        raise PasswdError(f"cannot write password file {path}: {exc.strerror or exc}") from None


def _ask_password() -> str:
    first = getpass.getpass("Password: ")
    if not first:
        raise PasswdError("empty password")
    if getpass.getpass("Reenter password: ") != first:
        raise PasswdError("passwords do not match")
    return first
