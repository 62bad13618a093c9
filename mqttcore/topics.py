"""Topic names, topic filters and how they match (MQTT 3.1.1 section 4.7).

A topic is a sequence of levels separated by ``/``; an empty level is a level too, so ``/a``
has the two levels ``""`` and ``"a"``.  Invariants this module enforces:

* a topic name (PUBLISH) is non-empty, has no ``+`` or ``#``, no U+0000, encodes to at most
  65535 UTF-8 bytes and has at most :data:`MAX_TOPIC_LEVELS` levels;
* a topic filter (SUBSCRIBE, UNSUBSCRIBE) obeys the same rules except that ``+`` may occupy a
  whole level and ``#`` may occupy only the last level;
* a filter whose first level is a wildcard never matches a topic starting with ``$``
  [MQTT-4.7.2-1].

Shared subscriptions (``$share/<group>/<filter>``) are not part of MQTT 3.1.1; Headwater accepts
them as MQTT 5.0 defines them (section 4.8.2).  Any filter starting with ``$share/`` is shared:
either it parses into a non-empty group free of ``+``, ``#`` and ``/`` followed by a valid
filter, or it is malformed.  :func:`matches` takes plain filters only; strip the prefix first.

History subscriptions (``$history/<since>/<filter>``, Headwater's own) read the log from a point in
time (``router.history``).  ``<since>`` is ``earliest``, a UTC time ``YYYY-MM-DDTHH:MM:SSZ`` or a
duration back from the SUBSCRIBE (a whole number and one of ``s``, ``m``, ``h``, ``d``); the
filter after it is a plain one.  Each message is delivered on ``$history/<since>/<its topic>``,
which no client may publish to, and which no plain filter matches (it starts with ``$``).

Well-formed UTF-8 (no surrogates) is the decoder's job [MQTT-1.5.3-1]; this module sees ``str``.
"""

from __future__ import annotations

from datetime import UTC, datetime

from mqttcore.errors import MalformedPacket

MAX_TOPIC_BYTES = 65535
MAX_TOPIC_LEVELS = 200
"""Levels a topic name or (plain, or the filter inside ``$share/<group>/``) filter may have.

Mosquitto's limit (``TOPIC_HIERARCHY_LIMIT``), and a constant like it, not a setting: it guards
the node, not a policy.  Each level of a filter is a node and a dict in the subscription trie
(``router.index``), so without it one SUBSCRIBE of 65535-byte filters holds megabytes; no real
hierarchy comes near (Sparkplug uses 5 levels, AWS IoT allows 8).  A level count is the number
of ``/`` plus one, counted without splitting, before any other work on the string."""
SHARE_PREFIX = "$share/"
HISTORY_PREFIX = "$history/"
EARLIEST = "earliest"
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_WILDCARDS = ("+", "#")
# A code point encodes to at most 4 UTF-8 bytes: shorter strings need no encoding to check.
_ALWAYS_SHORT = MAX_TOPIC_BYTES // 4


def validate_topic_name(name: str) -> None:
    """Raise :class:`MalformedPacket` unless ``name`` may be the topic of a PUBLISH."""
    _check_string(name)
    if "+" in name or "#" in name:
        raise MalformedPacket("MQTT-3.3.2-2", "topic name must not contain wildcards")
    _check_levels(name)


def is_valid_filter(filter: str) -> bool:
    """Whether ``filter`` may appear in a SUBSCRIBE or UNSUBSCRIBE (shared form included)."""
    try:
        validate_topic_filter(filter)
    except MalformedPacket:
        return False
    return True


def validate_topic_filter(filter: str) -> None:
    """Raise :class:`MalformedPacket`, citing the rule broken, unless ``filter`` is valid."""
    _check_string(filter)
    if filter.startswith(SHARE_PREFIX):
        _check_shared(filter)
    elif filter.startswith(HISTORY_PREFIX):
        _check_history(filter)
    else:
        _check_wildcards(filter)


def parse_shared(filter: str) -> tuple[str, str] | None:
    """``(group, real_filter)`` for a valid ``$share/<group>/<filter>``, otherwise ``None``."""
    if not filter.startswith(SHARE_PREFIX) or not is_valid_filter(filter):
        return None
    group, _, real = filter[len(SHARE_PREFIX) :].partition("/")
    return group, real


def parse_history(filter: str) -> tuple[str, str] | None:
    """``(since, real_filter)`` for a valid ``$history/<since>/<filter>``, otherwise ``None``."""
    if not filter.startswith(HISTORY_PREFIX) or not is_valid_filter(filter):
        return None
    since, _, real = filter[len(HISTORY_PREFIX) :].partition("/")
    return since, real


def history_start_ms(since: str, now_ms: int) -> int | None:
    """The time (ms since the epoch) a valid ``<since>`` reads from, asked at ``now_ms``;
    ``None`` for ``earliest`` (all the log holds)."""
    if since == EARLIEST:
        return None
    if since.endswith("Z"):
        moment = datetime.strptime(since, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        return max(0, int(moment.timestamp() * 1000))
    return max(0, now_ms - int(since[:-1]) * _UNIT_SECONDS[since[-1]] * 1000)


def judged_filter(filter: str) -> str:
    """The filter an ACL judges a SUBSCRIBE by: the one inside ``$share/<name>/`` (as
    Mosquitto does) or ``$history/<since>/``."""
    inner = parse_shared(filter) or parse_history(filter)
    return filter if inner is None else inner[1]


def original_topic(topic: str) -> str:
    """The topic a delivered message was published on: ``$history/<since>/`` taken off."""
    if not topic.startswith(HISTORY_PREFIX):
        return topic
    return topic.split("/", 2)[2]


def matches(filter: str, topic: str) -> bool:
    """Whether the plain (non-shared) ``filter`` matches the topic name ``topic``.

    The reference matcher, level by level: ``+`` matches exactly one level (possibly empty),
    ``#`` matches the parent level and any number of levels below it.
    """
    levels = filter.split("/")
    names = topic.split("/")
    if topic.startswith("$") and levels[0] in _WILDCARDS:
        return False  # [MQTT-4.7.2-1]
    for i, level in enumerate(levels):
        if level == "#":
            return True
        if i >= len(names) or (level != "+" and level != names[i]):
            return False
    return len(levels) == len(names)


def _check_string(text: str) -> None:
    if not text:
        raise MalformedPacket("MQTT-4.7.3-1", "topic names and filters must not be empty")
    if "\x00" in text:
        raise MalformedPacket("MQTT-4.7.3-2", "topic names and filters must not contain U+0000")
    if len(text) > _ALWAYS_SHORT and _utf8_length(text) > MAX_TOPIC_BYTES:
        raise MalformedPacket("MQTT-4.7.3-3", "topic names and filters must fit in 65535 bytes")


def _utf8_length(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _check_levels(text: str) -> None:
    if text.count("/") >= MAX_TOPIC_LEVELS:
        raise MalformedPacket(
            "MQTT-4.7.1", f"more than {MAX_TOPIC_LEVELS} topic levels (Mosquitto's limit too)"
        )


def _check_wildcards(filter: str) -> None:
    _check_levels(filter)  # before the split: a 65535-byte filter can have 32768 levels
    levels = filter.split("/")
    last = len(levels) - 1
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != last):
            raise MalformedPacket("MQTT-4.7.1-2", "'#' must be a whole level and the last one")
        if "+" in level and level != "+":
            raise MalformedPacket("MQTT-4.7.1-3", "'+' must occupy a whole level")


def _check_shared(filter: str) -> None:
    group, _, real = filter[len(SHARE_PREFIX) :].partition("/")
    if not group:
        raise MalformedPacket("MQTT-4.8.2-1", "a shared subscription needs a share name (MQTT 5)")
    if "+" in group or "#" in group:
        raise MalformedPacket("MQTT-4.8.2-2", "share name must not contain '+' or '#' (MQTT 5)")
    if not real:
        raise MalformedPacket("MQTT-4.8.2-2", "share name must be followed by '/' and a filter")
    _check_wildcards(real)


def _check_history(filter: str) -> None:
    since, _, real = filter[len(HISTORY_PREFIX) :].partition("/")
    if not _valid_since(since):
        raise MalformedPacket(
            "Headwater", "$history/<since>/ takes earliest, YYYY-MM-DDTHH:MM:SSZ or 90s/10m/2h/7d"
        )
    if not real or real.startswith(("$share/", HISTORY_PREFIX)):
        raise MalformedPacket("Headwater", "$history/<since>/ must be followed by a plain filter")
    _check_wildcards(real)


def _valid_since(since: str) -> bool:
    if since == EARLIEST:
        return True
    if since.endswith("Z"):
        try:
            datetime.strptime(since, "%Y-%m-%dT%H:%M:%SZ")
        except ValueError:
            return False
        return True
    count, unit = since[:-1], since[-1:]
    return 0 < len(count) <= 12 and count.isascii() and count.isdigit() and unit in _UNIT_SECONDS
