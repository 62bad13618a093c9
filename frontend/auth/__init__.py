"""Who may connect and what they may do: a node's Mosquitto password file and acl_file.

:class:`Auth` holds both, loaded at start (a bad file stops the node with an
:class:`AuthFileError` naming ``path:line``) and re-read by :meth:`Auth.reload` on SIGHUP.  A
reload replaces each file's rules only if that file loads completely: a broken edit keeps the old
rules in force and is reported, never half applied.  Every reload of the acl_file bumps
``generation``, which each client's :class:`Access` compares with its own before answering, so
connected clients follow the new rules at their next message without being visited.

Who is anonymous (Mosquitto 2.0's ``allow_anonymous``): a client that proves no identity, either
sending no user name, or sending one the node cannot check (it has no password file and takes no
certificate identity: a name it cannot check proves nothing, and never selects an ACL ``user``
section; the client gets the anonymous section, and no ``%u`` pattern).  ``allow_anonymous``
None, the default, allows anonymous clients exactly when the node has no way to authenticate;
with a password file and anonymous clients allowed, a client without a user name is anonymous
and one with a user name must pass its password (as Mosquitto).  A refused anonymous client gets
CONNACK 5, a wrong password or unknown user CONNACK 4.  Without an acl_file :meth:`Auth.access`
returns one shared :class:`Access` for every client (nothing allocated per connection) that
refuses only publishing to ``$SYS`` (and to ``$share``, as Mosquitto does, and to ``$events``
and ``$history``, the nodes' own).

:meth:`Auth.login` is the one decision for a CONNECT: throttled addresses are refused at once
(``frontend.auth.throttle``), passwords are checked off the event loop
(``frontend.auth.hashing``), the will must be a message the client may publish.  A login keeps
the password entry it matched, so after a reload :meth:`Auth.still_passes` tells the node which
clients to disconnect (a removed user, a changed password), as Mosquitto 2 does on SIGHUP.

Refusals are counted on the Auth (``denied_connects``, ``denied_publishes``,
``denied_subscriptions``, ``denied_reads``; ``throttle.throttled``, ``hashing.shed``) for
/metrics, not logged per client.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import TypeVar

from frontend.auth.acl import Access, AclFile
from frontend.auth.hashing import Hashing
from frontend.auth.login import ANONYMOUS, Credentials, Login
from frontend.auth.passwords import AuthFileError, PasswordFile, PasswordHash, hash_password
from frontend.auth.throttle import LoginThrottle, address_key
from mqttcore.packets import ConnackCode

__all__ = [
    "ANONYMOUS",
    "Access",
    "AclFile",
    "Auth",
    "AuthFileError",
    "Credentials",
    "Hashing",
    "Login",
    "LoginThrottle",
    "PasswordFile",
    "anonymous_allowed",
    "hash_password",
]

log = logging.getLogger("headwater.auth")
_Loaded = TypeVar("_Loaded")


def anonymous_allowed(setting: bool | None, authenticates: bool) -> bool:
    """``--allow-anonymous``: as set, or when unset, whether the node has no way to
    authenticate (no password file, no certificate identity)."""
    return not authenticates if setting is None else setting


class Auth:
    """The node's password file and ACL file; reloadable (SIGHUP)."""

    def __init__(
        self,
        password_file: str | None = None,
        acl_file: str | None = None,
        *,
        allow_anonymous: bool | None = None,
        certificates: bool = False,
        hashing: Hashing | None = None,
        throttle: LoginThrottle | None = None,
    ) -> None:
        self.password_file = password_file
        self.acl_file = acl_file
        self.passwords = PasswordFile.load(password_file) if password_file else None
        self.acl = AclFile.load(acl_file) if acl_file else None
        self.certificates = certificates
        """A client's identity is its TLS certificate's (``--use-identity-as-username``)."""
        self.allow_anonymous = anonymous_allowed(
            allow_anonymous, password_file is not None or certificates
        )
        self.hashing = Hashing() if hashing is None else hashing
        self.throttle = LoginThrottle() if throttle is None else throttle
        self.generation = 0
        self.denied_connects = 0
        self.denied_publishes = 0
        self.denied_subscriptions = 0
        self.denied_reads = 0
        self.revoked = 0
        """Clients disconnected by a reload: their password entry gone or changed."""
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

    async def login(self, credentials: Credentials) -> Login:
        """The one decision for a CONNECT (see the module's docstring)."""
        key = address_key(credentials.address)
        if not self.throttle.allows(key):
            return self._refused(ConnackCode.NOT_AUTHORIZED, "too many failed logins")
        code, identity, proof = await self._authenticate(credentials)
        if code == ConnackCode.BAD_USERNAME_OR_PASSWORD:
            self.throttle.failed(key)
        if code == ConnackCode.SERVER_UNAVAILABLE:
            return Login(None, ANONYMOUS, code, "too many logins waiting for a password check")
        if code != ConnackCode.ACCEPTED:
            return self._refused(code, _REASONS[code])
        access = self.access(credentials.client_id, identity or None)
        will = credentials.will_topic
        if will is not None and not access.may_publish(will):
            return self._refused(ConnackCode.NOT_AUTHORIZED, f"may not publish a will to {will}")
        return Login(access, identity, proof=proof)

    async def _authenticate(self, credentials: Credentials) -> tuple[int, str, PasswordHash | None]:
        """``(CONNACK code, identity, password entry matched)``; the hash off the loop."""
        if self.certificates and credentials.certificate:
            return ConnackCode.ACCEPTED, credentials.certificate, None
        passwords, username = self.passwords, credentials.username
        if self.certificates or passwords is None or username is None:
            return self._anonymous()
        check = partial(passwords.verify, username, credentials.password)
        ran, entry = await self.hashing.run(check)
        if not ran:
            return ConnackCode.SERVER_UNAVAILABLE, ANONYMOUS, None
        if entry is None or not self._current(username, entry):
            return ConnackCode.BAD_USERNAME_OR_PASSWORD, ANONYMOUS, None
        return ConnackCode.ACCEPTED, username, entry

    def _anonymous(self) -> tuple[int, str, PasswordHash | None]:
        code = ConnackCode.ACCEPTED if self.allow_anonymous else ConnackCode.NOT_AUTHORIZED
        return code, ANONYMOUS, None

    def _refused(self, code: int, reason: str) -> Login:
        self.denied_connects += 1
        return Login(None, ANONYMOUS, code, reason)

    def check(self, username: str | None, password: bytes | None) -> int:
        """The CONNACK return code :meth:`login` gives these credentials (no certificate, no
        will), the hash computed here, on the caller's thread: for tools and tests."""
        if self.passwords is None or username is None:
            code = self._anonymous()[0]
        else:
            code = self.passwords.check(username, password)
        if code != ConnackCode.ACCEPTED:
            self.denied_connects += 1
        return code

    def still_passes(self, login: Login) -> bool:
        """Whether a client logged in as ``login`` would get in again under the files as loaded
        now: its password entry is unchanged (an anonymous or certificate login always is)."""
        return login.proof is None or self._current(login.identity, login.proof)

    def _current(self, username: str, entry: PasswordHash) -> bool:
        """Whether ``entry`` is ``username``'s in the password file as loaded now (a password
        checked against the file before a reload must hold in the new one too)."""
        return self.passwords is not None and self.passwords.entry(username) == entry

    def access(self, client_id: str, username: str | None) -> Access:
        """The permissions of a client that has just connected."""
        if self.acl is None:
            return self._shared
        return Access(self, client_id, username)

    def describe_anonymous(self) -> str:
        """One line: whether anonymous clients get in, and why."""
        return anonymous_rule(self.allow_anonymous, self.password_file, self.certificates)

    def close(self) -> None:
        self.hashing.close()

    def _describe(self) -> str:
        users = f"{len(self.passwords)} users from {self.password_file}" if self.passwords else ""
        rules = f"ACL from {self.acl_file}" if self.acl_file else ""
        return ", ".join(part for part in (users, rules) if part) or "nothing to reload"


_REASONS: dict[int, str] = {
    ConnackCode.BAD_USERNAME_OR_PASSWORD: "authentication failed",
    ConnackCode.NOT_AUTHORIZED: "no identity proven, and anonymous clients are not allowed",
}


def anonymous_rule(allowed: bool, password_file: str | None, certificates: bool) -> str:
    """``anonymous clients allowed: no password file`` and the like, for start-up lines."""
    ways = [f"password file {password_file}"] if password_file else []
    ways += ["certificate identities"] if certificates else []
    if allowed:
        why = "beside " + " and ".join(ways) if ways else "no password file"
        return f"anonymous clients allowed: {why}"
    why = "only " + " and ".join(ways) if ways else "and no way to log in: every client refused"
    return f"anonymous clients refused: {why}"


def _load(load: Callable[[str], _Loaded], path: str, problems: list[str]) -> _Loaded | None:
    """``load(path)``, or None with the problem appended to ``problems``."""
    try:
        return load(path)
    except AuthFileError as exc:
        problems.append(str(exc))
        return None
