"""Failures a person can fix, as opposed to bugs.

Every problem in Headwater's tooling that the user can act on (a missing program, a taken port,
an unreachable service, a bad setting) is raised as a `HeadwaterError` whose message starts with
one line that names what to change. The CLI prints that message and exits non-zero without a
traceback; any other exception is a bug and keeps its traceback.

`Cancelled` is not an error: it unwinds a start-up that a signal (Ctrl-C, SIGTERM) asked to stop.
"""

from __future__ import annotations


class HeadwaterError(Exception):
    """A problem the user can fix; the message says how."""


class SettingError(HeadwaterError):
    """A flag or environment variable has a value that cannot be used."""


class MissingProgramError(HeadwaterError):
    """A program Headwater needs (java, redis-server, haproxy, mvn) is not installed."""


class ServiceError(HeadwaterError):
    """A service could not be started, reached or configured."""


class Cancelled(Exception):
    """A stop was requested while waiting for something to become ready."""
