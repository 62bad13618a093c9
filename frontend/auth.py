"""Client authentication at CONNECT: the CONNACK return code for a username and password.

Without a password file every client is accepted, as Mosquitto 1.x did.  With one (lines of
``username:sha256-hex-of-password``, ``#`` comments allowed) anonymous clients get CONNACK 5
(not authorized) and a wrong or unknown user CONNACK 4 (bad user name or password).
Comparisons are constant-time.
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path
from typing import Protocol

from frontend.mqtt.packets import ConnackCode


class Authenticator(Protocol):
    def check(self, username: str | None, password: bytes | None) -> int:
        """The CONNACK return code: 0 to accept."""


class AllowAll:
    def check(self, username: str | None, password: bytes | None) -> int:
        return ConnackCode.ACCEPTED


class PasswordFile:
    def __init__(self, entries: dict[str, str]) -> None:
        self._digests = entries

    @classmethod
    def load(cls, path: str) -> PasswordFile:
        entries: dict[str, str] = {}
        for number, line in enumerate(Path(path).read_text().splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            user, sep, digest = line.partition(":")
            if not sep or len(digest) != 64:
                raise ValueError(f"{path}:{number}: expected username:sha256-hex")
            entries[user] = digest.lower()
        return cls(entries)

    def check(self, username: str | None, password: bytes | None) -> int:
        if username is None:
            return ConnackCode.NOT_AUTHORIZED
        expected = self._digests.get(username, "")
        given = hashlib.sha256(password or b"").hexdigest()
        if not hmac.compare_digest(expected, given) or not expected:
            return ConnackCode.BAD_USERNAME_OR_PASSWORD
        return ConnackCode.ACCEPTED


def load_authenticator(password_file: str | None) -> Authenticator:
    return PasswordFile.load(password_file) if password_file else AllowAll()
