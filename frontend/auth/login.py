"""A CONNECT's login: what it presents (:class:`Credentials`) and what it proves (:class:`Login`).

The identity of a :class:`Login` is a name the node checked: a user name whose password matched
the password file, or the client certificate's identity with ``--use-identity-as-username``.
Anything else, a user name included when the node has no way to check it, is anonymous: the
identity "" (the ACL's anonymous section, and the owner of the anonymous sessions).  ``proof``
is the password file entry the password matched (never the password), so that a reload can tell
whether the client would still get in (:meth:`frontend.auth.Auth.still_passes`).
"""

from __future__ import annotations

from dataclasses import dataclass

from frontend.auth.acl import Access
from frontend.auth.passwords import PasswordHash
from mqttcore.packets import ConnackCode

ANONYMOUS = ""
"""The identity of a client that proved none."""


@dataclass(slots=True, frozen=True)
class Credentials:
    """What a CONNECT presents, and where it comes from."""

    client_id: str
    username: str | None
    password: bytes | None
    address: str | None = None
    """The client's host (the PROXY header's when there is one): failed logins are counted by
    it."""
    certificate: str | None = None
    """The identity of the client's TLS certificate, when it has one and the node takes it as
    the user name (``--use-identity-as-username``)."""
    will_topic: str | None = None


@dataclass(slots=True, frozen=True)
class Login:
    """A CONNECT's outcome: what the client may do and who it proved to be, or the CONNACK code
    refusing it and why."""

    access: Access | None
    identity: str
    """The proven user name (password file or certificate), "" for an anonymous client: the
    owner of the sessions it makes."""
    code: int = ConnackCode.ACCEPTED
    reason: str = ""
    proof: PasswordHash | None = None
    """The password file entry the client's password matched; None for an anonymous client or
    a certificate's identity."""
