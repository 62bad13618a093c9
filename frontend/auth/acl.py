"""Mosquitto 2.0 ``acl_file``: the file format, and one client's answers under it.

The file (``mosquitto.conf(5)``, parsed as ``aclfile__parse`` in ``src/security_default.c``)::

    topic [read|write|readwrite|deny] FILTER    # before any `user` line: anonymous clients
    user NAME                                   # the following topic lines are NAME's
    pattern [read|write|readwrite|deny] FILTER  # every client; %c client id, %u user name

No access word means readwrite, so ``topic read`` alone grants readwrite on the topic ``read``,
as in Mosquitto; a filter containing spaces needs the access word.  A repeated ``user`` section
adds to the first.  Anything else (unknown keyword or access word, missing user name or filter,
misplaced ``+``/``#``) refuses the file with :class:`AuthFileError` naming ``path:line``.

How a client's topic is judged (``mosquitto_acl_check_default``), first answer wins:

1. its own section (the user's, or the anonymous one for a client without a user name):
   a matching ``deny`` refuses; a matching rule with the access asked for allows;
2. if the file has patterns and the client id or user name contains ``+`` or ``#``: refused
   (``/`` is not refused: Mosquitto substitutes it as it is);
3. the patterns, ``%c``/``%u`` substituted in one pass (a pattern with ``%u`` is skipped for a
   client without a user name): a matching ``deny`` refuses, a matching grant allows;
4. anything else is refused.

So a ``deny`` beats every grant of its own stage, and a user's own grant beats a pattern deny.
A filter not starting with ``$`` never matches a topic that does, so reading ``$SYS`` needs a
rule such as ``topic read $SYS/#``.  Publishing to a topic starting with ``$SYS`` or ``$share``
is refused whatever the file says (``acl__check_dollar`` in ``src/security.c``), and to
``$events`` (the nodes' client events, ``frontend.events``) and ``$history`` (the topics history
is delivered on, ``router.history``).

A SUBSCRIBE filter is granted only if a rule the client may read by covers it whole (every topic
the filter can match, the rule matches) and no deny rule covers it whole; otherwise its SUBACK
code is 0x80 (EMQX's rule, and the issue's: Mosquitto 2.0 grants every SUBSCRIBE and only filters
at delivery, so a client subscribed to ``#`` would make a node read every partition for nothing).
A granted filter may still match topics a narrower deny rule refuses: every message is checked
against READ when it is delivered, :meth:`Access.may_read`, whose answers are cached per topic in
a small dict made on first use and dropped whenever the holder's ``generation`` changes (a
reload), so a wildcard subscription never leaks a denied topic and a reload applies to clients
already connected.  This module runs compiled (setup.py): that question is asked for every
message a client is sent, with or without an acl_file.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from frontend.auth.passwords import AuthFileError, read_text
from mqttcore.topics import matches

log = logging.getLogger("headwater.auth")

DENY, READ, WRITE = 0, 1, 2
ACCESS_WORDS = {"read": READ, "write": WRITE, "readwrite": READ | WRITE, "deny": DENY}
MAX_LEVELS = 201  # Mosquitto's TOPIC_HIERARCHY_LIMIT: at most 200 '/'
MAX_FILTER_LENGTH = 65535
CACHE_SIZE = 256
_KNOWN = 2  # cache value: the answer bit (READ/WRITE) | the same bit << _KNOWN once computed
_PLACEHOLDER = re.compile("%[cu]")
_NEVER_PUBLISHED = ("$SYS", "$share", "$events", "$history")

Rules = tuple[tuple[str, int], ...]
"""(filter, access) pairs in the order they are tried; access DENY refuses on a match."""


@dataclass(frozen=True, slots=True)
class AclLine:
    """One ``topic`` or ``pattern`` line."""

    filter: str
    access: int


class AclFile:
    """The rules of one acl_file, by user name (None: the anonymous section), and patterns."""

    __slots__ = ("_patterns", "_users", "path")

    def __init__(
        self, path: str, users: dict[str | None, list[AclLine]], patterns: list[AclLine]
    ) -> None:
        self.path = path
        self._users = {user: _denies_first(lines) for user, lines in users.items()}
        self._patterns = _denies_first(patterns)

    @classmethod
    def load(cls, path: str) -> AclFile:
        return cls.parse(read_text(path), path)

    @classmethod
    def parse(cls, text: str, path: str) -> AclFile:
        users: dict[str | None, list[AclLine]] = {}
        patterns: list[AclLine] = []
        user: str | None = None
        for number, keyword, argument in _statements(text, path):
            where = f"{path}:{number}"
            if keyword == "user":
                user = argument
            elif keyword == "topic":
                users.setdefault(user, []).append(_parse_rule(argument, where))
            else:
                patterns.append(_parse_rule(argument, where))
                if "%c" not in patterns[-1].filter and "%u" not in patterns[-1].filter:
                    log.warning("%s: pattern %r contains neither %%c nor %%u", where, argument)
        return cls(path, users, patterns)

    def rules_for(self, client_id: str, username: str | None) -> Rules:
        """Everything that decides for this client, in the order it is tried."""
        own = self._users.get(username, ())
        if not self._patterns:
            return own
        if _dangerous(client_id) or (username is not None and _dangerous(username)):
            return own  # Mosquitto refuses every pattern to such a client
        return own + tuple(_substitute(self._patterns, client_id, username))


def _dangerous(name: str) -> bool:
    """A client id or user name that would put a wildcard into a pattern."""
    return "+" in name or "#" in name


def _statements(text: str, path: str) -> Iterator[tuple[int, str, str]]:
    """``(line number, keyword, rest of line)`` of every line that is not blank or a comment."""
    for number, line in enumerate(text.splitlines(), 1):
        words = line.strip().split(None, 1)
        if not words or words[0].startswith("#"):
            continue
        keyword, argument = words[0], words[1].strip() if len(words) > 1 else ""
        if keyword not in ("user", "topic", "pattern"):
            raise AuthFileError(
                f"{path}:{number}: unknown keyword {keyword!r}: expected user, topic or pattern"
            )
        if not argument:
            what = "a user name" if keyword == "user" else "a topic filter"
            raise AuthFileError(f"{path}:{number}: `{keyword}` needs {what}")
        yield number, keyword, argument


def _parse_rule(argument: str, where: str) -> AclLine:
    words = argument.split(None, 1)
    if len(words) == 1:
        access, topic_filter = READ | WRITE, words[0]
    elif words[0] in ACCESS_WORDS:
        access, topic_filter = ACCESS_WORDS[words[0]], words[1].strip()
    else:
        raise AuthFileError(
            f"{where}: unknown access {words[0]!r}: expected read, write, readwrite or deny "
            "before the filter (a filter containing spaces needs one)"
        )
    problem = _filter_problem(topic_filter)
    if problem:
        raise AuthFileError(f"{where}: invalid topic filter {topic_filter!r}: {problem}")
    return AclLine(topic_filter, access)


def _filter_problem(topic_filter: str) -> str | None:
    """What ``mosquitto_sub_topic_check`` would refuse in ``topic_filter``, or None."""
    levels = topic_filter.split("/")
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != len(levels) - 1):
            return "'#' must be a whole level and the last one"
        if "+" in level and level != "+":
            return "'+' must be a whole level"
    if len(levels) > MAX_LEVELS:
        return f"more than {MAX_LEVELS - 1} '/'"
    if len(topic_filter.encode()) > MAX_FILTER_LENGTH:
        return f"longer than {MAX_FILTER_LENGTH} bytes"
    return None


def _denies_first(lines: list[AclLine]) -> Rules:
    """Mosquitto puts deny lines at the front of a list, the others in file order."""
    denies = [(line.filter, line.access) for line in lines if line.access == DENY]
    grants = [(line.filter, line.access) for line in lines if line.access != DENY]
    return tuple(denies + grants)


def _substitute(patterns: Rules, client_id: str, username: str | None) -> Iterator[tuple[str, int]]:
    values = {"%c": client_id, "%u": username or ""}
    for topic_filter, access in patterns:
        if username is None and "%u" in topic_filter:
            continue
        yield _PLACEHOLDER.sub(lambda m: values[m.group()], topic_filter), access


def decide(
    rules: Rules, topic: str, wanted: int, applies: Callable[[str, str], bool] = matches
) -> bool:
    """Whether ``rules`` give the ``wanted`` access (READ or WRITE) to ``topic``: the first rule
    that ``applies`` denies or grants.  A SUBSCRIBE filter is judged with ``applies=covers``."""
    for rule_filter, access in rules:
        if applies(rule_filter, topic):
            if access == DENY:
                return False
            if access & wanted:
                return True
    return False


def covers(rule_filter: str, topic_filter: str) -> bool:
    """Whether every topic ``topic_filter`` matches is matched by ``rule_filter`` (a filter
    covers itself; ``a/#`` covers ``a/+/b`` and ``a``; ``a/+`` does not cover ``a/#``)."""
    rule, wanted = rule_filter.split("/"), topic_filter.split("/")
    dollar = wanted[0].startswith("$")  # a wildcard first level never matches it [MQTT-4.7.2-1]
    for i, level in enumerate(rule):
        if level == "#":
            return not (i == 0 and dollar)
        if i >= len(wanted) or wanted[i] == "#":
            return False
        if level == "+":
            if i == 0 and dollar:
                return False
        elif wanted[i] != level:
            return False
    return len(wanted) == len(rule)


class RuleHolder(Protocol):
    """What an :class:`Access` reads from its node's ``Auth``, and the counters it bumps."""

    generation: int
    acl: AclFile | None
    denied_publishes: int
    denied_subscriptions: int
    denied_reads: int


class Access:
    """One connected client's permissions under the holder's current rules.

    With no acl_file everything is allowed except publishing to ``$SYS``, ``$share``,
    ``$events`` and ``$history``.
    """

    __slots__ = ("_cache", "_client_id", "_generation", "_holder", "_rules", "_username")

    def __init__(self, holder: RuleHolder, client_id: str, username: str | None) -> None:
        self._holder = holder
        self._client_id = client_id
        self._username = username
        self._generation = -1
        self._rules: Rules | None = None
        self._cache: dict[str, int] | None = None

    def may_publish(self, topic: str) -> bool:
        allowed = not topic.startswith(_NEVER_PUBLISHED) and self._decide(topic, WRITE)
        if not allowed:
            self._holder.denied_publishes += 1
        return allowed

    def may_subscribe(self, topic_filter: str) -> bool:
        if self._generation != self._holder.generation:
            self._refresh()
        rules = self._rules
        allowed = rules is None or decide(rules, topic_filter, READ, covers)
        if not allowed:
            self._holder.denied_subscriptions += 1
        return allowed

    def may_read(self, topic: str) -> bool:
        allowed = self._decide(topic, READ)
        if not allowed:
            self._holder.denied_reads += 1
        return allowed

    def _decide(self, topic: str, wanted: int) -> bool:
        if self._generation != self._holder.generation:
            self._refresh()
        rules = self._rules
        if rules is None:
            return True
        cache = self._cache
        if cache is None:
            cache = self._cache = {}
        known = cache.get(topic, 0)
        if known & (wanted << _KNOWN):
            return bool(known & wanted)
        allowed = decide(rules, topic, wanted)
        if not known and len(cache) >= CACHE_SIZE:
            cache.clear()
        cache[topic] = known | (wanted << _KNOWN) | (wanted if allowed else 0)
        return allowed

    def _refresh(self) -> None:
        acl = self._holder.acl
        self._rules = None if acl is None else acl.rules_for(self._client_id, self._username)
        self._cache = None
        self._generation = self._holder.generation
