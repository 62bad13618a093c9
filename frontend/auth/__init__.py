"""Who may connect and what they may do: a node's Mosquitto password file and acl_file.

:class:`Auth` holds both, loaded at start (a bad file stops the node with an
:class:`AuthFileError` naming ``path:line``) and re-read by :meth:`Auth.reload` on SIGHUP.  A
reload replaces each file's rules only if that file loads completely: a broken edit keeps the old
rules in force and is reported, never half applied.  Every reload of the acl_file bumps
``generation``, which each client's :class:`Access` compares with its own before answering, so
connected clients follow the new rules at their next message without being visited.

Without a password file every client is accepted (Mosquitto 1.x, or ``allow_anonymous true``);
with one, a client without a user name gets CONNACK 5 and a wrong or unknown one CONNACK 4.
Without an acl_file :meth:`Auth.access` returns one shared :class:`Access` for every client
(nothing allocated per connection) that refuses only publishing to ``$SYS`` (and to
``$share``, as Mosquitto does).

Refusals are counted on the Auth (``denied_connects``, ``denied_publishes``,
``denied_subscriptions``, ``denied_reads``) for /metrics, not logged per client.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from frontend.auth.acl import Access, AclFile
from frontend.auth.passwords import AuthFileError, PasswordFile, hash_password
from frontend.mqtt.packets import ConnackCode

__all__ = [
    "Access",
    "AclFile",
    "Auth",
    "AuthFileError",
    "Authenticator",
    "PasswordFile",
    "hash_password",
    "load_authenticator",
]

log = logging.getLogger("headwater.auth")
_Loaded = TypeVar("_Loaded")


class Auth:
    """The node's password file and ACL file; reloadable (SIGHUP)."""

    def __init__(self, password_file: str | None = None, acl_file: str | None = None) -> None:
        self.password_file = password_file
        self.acl_file = acl_file
        self.passwords = PasswordFile.load(password_file) if password_file else None
        self.acl = AclFile.load(acl_file) if acl_file else None
        self.generation = 0
        self.denied_connects = 0
        self.denied_publishes = 0
        self.denied_subscriptions = 0
        self.denied_reads = 0
        self._shared = Access(self, "", None)

    def reload(self) -> list[str]:
        """Re-read both files; one that fails keeps its old rules.  The problems, ``path:line``."""
        problems: list[str] = []
        if self.password_file:
            passwords = _load(PasswordFile.load, self.password_file, problems)
            if passwords is not None:
                self.passwords = passwords
        if self.acl_file:
            acl = _load(AclFile.load, self.acl_file, problems)
            if acl is not None:
                self.acl = acl
                self.generation += 1
        for problem in problems:
            log.error("auth reload: %s (keeping the rules loaded before)", problem)
        if not problems:
            log.info("auth reload: %s", self._describe())
        return problems

    def check(self, username: str | None, password: bytes | None) -> int:
        """The CONNACK return code for a CONNECT: 0 accept, 4 bad credentials, 5 no user name."""
        if self.passwords is None:
            return ConnackCode.ACCEPTED
        code = self.passwords.check(username, password)
        if code != ConnackCode.ACCEPTED:
            self.denied_connects += 1
        return code

    def access(self, client_id: str, username: str | None) -> Access:
        """The permissions of a client that has just connected."""
        if self.acl is None:
            return self._shared
        return Access(self, client_id, username)

    def _describe(self) -> str:
        users = f"{len(self.passwords)} users from {self.password_file}" if self.passwords else ""
        rules = f"ACL from {self.acl_file}" if self.acl_file else ""
        return ", ".join(part for part in (users, rules) if part) or "nothing to reload"


def _load(load: Callable[[str], _Loaded], path: str, problems: list[str]) -> _Loaded | None:
    """``load(path)``, or None with the problem appended to ``problems``."""
    try:
        return load(path)
    except AuthFileError as exc:
        problems.append(str(exc))
        return None


Authenticator = Auth
"""Temporary alias while frontend.node and frontend.connection move to :class:`Auth`."""


def load_authenticator(password_file: str | None, acl_file: str | None = None) -> Auth:
    """Temporary: ``Auth(password_file, acl_file)``."""
    return Auth(password_file, acl_file)
