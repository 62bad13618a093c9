"""Mosquitto 2.0 password files: reading them, checking a CONNECT against them, writing them.

A line is ``user:$6$<salt>$<hash>`` (``sha512``: SHA-512 of the password bytes followed by the
salt) or ``user:$7$<iterations>$<salt>$<hash>`` (``sha512-pbkdf2``: PBKDF2-HMAC-SHA512 with a
64-byte key), salt and hash in padded standard base64 - exactly what ``mosquitto_passwd`` writes
(Mosquitto 2.0 ``src/password_mosq.c``: 12-byte salt, 101 iterations by default; the broker's
``unpwd__decode_passwords`` refuses a salt that is not 12 bytes or a hash that is not 64).
Blank lines and ``#`` comments are allowed; every other line, the old ``user:sha256-hex``
format and plain-text passwords included, refuses the whole file at load with an
:class:`AuthFileError` naming ``path:line`` (Mosquitto skips such a line with a log message,
which silently locks its user out).

Checking costs one hash whether or not the user exists: an unknown user is hashed against a
dummy entry of the file's dearest kind (:attr:`PasswordFile.dummy`: the method and iteration
count of its costliest entry, so an unknown name costs at least what any user's check costs) and
digests are compared with :func:`hmac.compare_digest`, so the answer never tells a client which
user names exist, and the time taken does not tell it that a name is unknown.  The password is
hashed as the raw bytes the client sent (Mosquitto stops at the first NUL byte; a password
containing one is refused here).  A ``$7$`` entry of more than :data:`MAX_ITERATIONS` iterations
refuses the file at load, so that no line can make every login (the unknown ones included) cost
seconds; a ``$6$`` entry is one SHA-512, whatever the file says.  Checking is synchronous: the
node runs it off its event loop (``frontend.auth.hashing``).

The file-editing helpers keep every other line, comments included, in order, and replace the
file atomically (temporary file in the same directory, then ``os.replace``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import secrets
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from mqttcore.packets import ConnackCode

Method = Literal["sha512", "sha512-pbkdf2"]
METHODS: tuple[Method, ...] = ("sha512-pbkdf2", "sha512")
DEFAULT_METHOD: Method = "sha512-pbkdf2"
DEFAULT_ITERATIONS = 101
MAX_ITERATIONS = 100_000
"""The most ``$7$`` iterations an entry may have: about 0.14 s of one core per check (1.2 us an
iteration, measured on the 2-core dev box), 1,000 times ``mosquitto_passwd``'s default of 101 in
Mosquitto 2.0 and 100 times the 1,000 of Mosquitto 2.1, which sets no ceiling of its own."""
SALT_BYTES = 12
DIGEST_BYTES = 64
_PREFIX: dict[Method, str] = {"sha512": "6", "sha512-pbkdf2": "7"}
ACCEPTED_FORMATS = (
    "expected user:$7$<iterations>$<salt>$<hash> or user:$6$<salt>$<hash> "
    "(as Mosquitto's mosquitto_passwd writes them); create or convert entries with "
    "`headwater passwd` or `mosquitto_passwd -U`"
)


class AuthFileError(ValueError):
    """A password or ACL file that cannot be used; the message is ``path:line: what is wrong``."""


@dataclass(frozen=True, slots=True)
class PasswordHash:
    """One user's stored hash, decoded."""

    method: Method
    iterations: int
    salt: bytes
    digest: bytes

    def encode(self) -> str:
        """The ``$6$...`` / ``$7$...`` text that follows ``user:`` in the file."""
        salt = base64.b64encode(self.salt).decode("ascii")
        digest = base64.b64encode(self.digest).decode("ascii")
        if self.method == "sha512":
            return f"$6${salt}${digest}"
        return f"$7${self.iterations}${salt}${digest}"

    def compute(self, password: bytes) -> bytes:
        """The digest ``password`` has under this entry's method, iterations and salt."""
        if self.method == "sha512":
            return hashlib.sha512(password + self.salt).digest()
        return hashlib.pbkdf2_hmac("sha512", password, self.salt, self.iterations, DIGEST_BYTES)

    def verify(self, password: bytes) -> bool:
        return hmac.compare_digest(self.compute(password), self.digest)


def hash_password(
    password: str | bytes,
    method: Method = DEFAULT_METHOD,
    iterations: int = DEFAULT_ITERATIONS,
    salt: bytes | None = None,
) -> str:
    """A new ``$7$...`` (or ``$6$...``) entry for ``password``, with a random 12-byte salt."""
    if method not in _PREFIX:
        raise ValueError(f"unknown hash method {method!r}: use one of {', '.join(METHODS)}")
    if not 1 <= iterations <= MAX_ITERATIONS:
        raise ValueError(f"iterations must be 1..{MAX_ITERATIONS}, got {iterations}")
    salt = secrets.token_bytes(SALT_BYTES) if salt is None else salt
    if len(salt) != SALT_BYTES:
        raise ValueError(f"the salt must be {SALT_BYTES} bytes (Mosquitto refuses others)")
    secret = password.encode() if isinstance(password, str) else password
    entry = PasswordHash(method, iterations, salt, b"")
    return PasswordHash(method, iterations, salt, entry.compute(secret)).encode()


def parse_hash(text: str) -> PasswordHash:
    """Decode the part of a line after ``user:``; ValueError says what is wrong."""
    fields = text.split("$")
    if fields[0] or len(fields) < 2 or fields[1] not in ("6", "7"):
        raise ValueError(f"not a Mosquitto password hash; {ACCEPTED_FORMATS}")
    method: Method = "sha512" if fields[1] == "6" else "sha512-pbkdf2"
    iterations = DEFAULT_ITERATIONS
    if method == "sha512-pbkdf2":
        if len(fields) != 5:
            raise ValueError("a $7$ hash has the form $7$<iterations>$<salt>$<hash>")
        if not fields[2].isdigit() or int(fields[2]) < 1:
            raise ValueError(f"iterations must be a positive number, got {fields[2]!r}")
        iterations = int(fields[2])
        if iterations > MAX_ITERATIONS:
            raise ValueError(
                f"{iterations} iterations are more than the {MAX_ITERATIONS} allowed (each login, "
                "an unknown user's included, would cost that many); hash it again with fewer "
                "(`headwater passwd -I`)"
            )
    elif len(fields) != 4:
        raise ValueError("a $6$ hash has the form $6$<salt>$<hash>")
    salt = _decode(fields[-2], "salt", SALT_BYTES)
    digest = _decode(fields[-1], "hash", DIGEST_BYTES)
    return PasswordHash(method, iterations, salt, digest)


def _decode(text: str, what: str, size: int) -> bytes:
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"the {what} is not valid base64") from None
    if len(raw) != size:
        raise ValueError(f"the {what} must decode to {size} bytes, not {len(raw)}")
    return raw


def is_content(line: str) -> bool:
    """Whether a line of a password file is an entry (not blank, not a ``#`` comment)."""
    stripped = line.strip()
    return bool(stripped) and not stripped.startswith("#")


def split_entry(line: str) -> tuple[str, str]:
    """``(user, hash text)`` of an entry line; ValueError if there is no ``user:``."""
    user, sep, rest = line.strip().partition(":")
    user = user.strip()
    if not sep or not user:
        raise ValueError(f"expected user:hash; {ACCEPTED_FORMATS}")
    return user, rest.strip()


def read_text(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise AuthFileError(f"{path}: cannot read the file: {reason}") from None


def cost(entry: PasswordHash) -> tuple[bool, int]:
    """What checking ``entry`` costs, for comparing entries: any ``$7$`` (two SHA-512 per
    iteration) costs more than a ``$6$`` (one), and more iterations cost more."""
    return entry.method == "sha512-pbkdf2", entry.iterations


def dummy_for(entries: Iterable[PasswordHash]) -> PasswordHash:
    """An entry no password matches, as dear as the dearest of ``entries`` (a default ``$7$``
    entry when there are none)."""
    dearest = max(entries, key=cost, default=None)
    method, iterations = (
        (dearest.method, dearest.iterations) if dearest else (DEFAULT_METHOD, DEFAULT_ITERATIONS)
    )
    return PasswordHash(method, iterations, bytes(SALT_BYTES), bytes(DIGEST_BYTES))


class PasswordFile:
    """The users of one password file and their hashes."""

    __slots__ = ("_hashes", "dummy", "path")

    def __init__(self, path: str, hashes: dict[str, PasswordHash]) -> None:
        self.path = path
        self._hashes = hashes
        self.dummy = dummy_for(hashes.values())
        """What an unknown user's password is hashed against (see the module's docstring)."""

    @classmethod
    def load(cls, path: str) -> PasswordFile:
        """Read and decode the whole file; AuthFileError on the first bad line."""
        hashes: dict[str, PasswordHash] = {}
        lines: dict[str, int] = {}
        for number, line in enumerate(read_text(path).splitlines(), 1):
            if not is_content(line):
                continue
            try:
                user, text = split_entry(line)
                if user in lines:
                    raise ValueError(f"user {user!r} is already defined on line {lines[user]}")
                hashes[user] = parse_hash(text)
            except ValueError as exc:
                raise AuthFileError(f"{path}:{number}: {exc}") from None
            lines[user] = number
        return cls(path, hashes)

    def __contains__(self, user: str) -> bool:
        return user in self._hashes

    def __len__(self) -> int:
        return len(self._hashes)

    def entry(self, username: str) -> PasswordHash | None:
        return self._hashes.get(username)

    def verify(self, username: str, password: bytes | None) -> PasswordHash | None:
        """The entry ``password`` matches, or None (unknown user, wrong or missing password).
        Costs one hash, the dummy's for an unknown user; slow by design: run it off the loop."""
        entry = self._hashes.get(username)
        good = (entry or self.dummy).verify(password or b"")
        if entry is None or password is None or b"\x00" in password or not good:
            return None
        return entry

    def check(self, username: str | None, password: bytes | None) -> int:
        """CONNACK code: 0, 4 for an unknown user or a wrong/missing password, 5 without user."""
        if username is None:
            return ConnackCode.NOT_AUTHORIZED
        if self.verify(username, password) is None:
            return ConnackCode.BAD_USERNAME_OR_PASSWORD
        return ConnackCode.ACCEPTED


# -- editing a file, for `headwater passwd` -----------------------------------------------------


def set_password(lines: list[str], user: str, hashed: str) -> list[str]:
    """``lines`` with ``user``'s entry replaced in place (or appended): other lines untouched."""
    entry = f"{user}:{hashed}"
    if any(_owner(line) == user for line in lines):
        return [entry if _owner(line) == user else line for line in lines]
    return [*lines, entry]


def delete_user(lines: list[str], user: str) -> list[str] | None:
    """``lines`` without ``user``'s entry, or None if there was none."""
    kept = [line for line in lines if _owner(line) != user]
    return kept if len(kept) < len(lines) else None


def convert_plain_text(lines: list[str], method: Method, iterations: int) -> list[str]:
    """Plain ``user:password`` entries hashed (``mosquitto_passwd -U``).

    Comments and entries that already hold a hash are kept as they are (``mosquitto_passwd -U``
    would hash them a second time, locking their users out).
    """
    converted = []
    for number, line in enumerate(lines, 1):
        if is_content(line):
            try:
                user, password = split_entry(line)
            except ValueError:
                raise ValueError(f"{number}: expected user:password") from None
            if not _is_hash(password):
                line = f"{user}:{hash_password(password, method, iterations)}"
        converted.append(line)
    return converted


def _is_hash(text: str) -> bool:
    try:
        parse_hash(text)
    except ValueError:
        return False
    return True


def _owner(line: str) -> str | None:
    if not is_content(line) or ":" not in line:
        return None
    return line.partition(":")[0].strip()


def write_atomically(path: str, lines: list[str]) -> None:
    """Replace ``path`` by ``lines``; a new file gets mode 0600, an existing one keeps its own."""
    target = Path(path)
    try:
        mode = target.stat().st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o600
    text = "".join(f"{line}\n" for line in lines)
    fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
