"""ACLs in Mosquitto's acl_file format, judged as Mosquitto 2.0 does (SUBSCRIBE as EMQX does).

The table is what each client may publish and read under one file; the expectations follow
``mosquitto_acl_check_default`` (src/security_default.c): a user's own section first (deny lines
before grants), then the patterns, anything else refused.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from frontend.auth import Access, Auth, AuthFileError
from frontend.auth.acl import CACHE_SIZE, covers

ACL = """\
# anonymous clients
topic read public/#
topic write public/anon/+

user alice
topic readwrite alice/#
topic deny alice/secret/#
topic read sensors/+/temp
topic write cmd/alice
topic write devices/+/locked

user bob
topic sensors/#
topic deny sensors/3/#

user admin
topic readwrite #
topic readwrite $SYS/#

user alice
topic read extra/alice

user root
topic read #

pattern readwrite devices/%c/#
pattern read users/%u/inbox
pattern deny devices/%c/locked
"""

PUB, READ = "publish", "read"
ROWS = [
    # client id, user name, action, topic, allowed
    ("c1", None, READ, "public/news", True),
    ("c1", None, PUB, "public/news", False),  # read only
    ("c1", None, PUB, "public/anon/x", True),
    ("c1", None, READ, "public/anon/x", True),
    ("c1", None, READ, "alice/x", False),  # not granted: denied
    ("c1", None, READ, "users//inbox", False),  # %u pattern skipped without user name
    ("c2", "alice", READ, "alice/x", True),
    ("c2", "alice", PUB, "alice/x", True),
    ("c2", "alice", READ, "alice/secret/x", False),  # deny beats the readwrite grant
    ("c2", "alice", PUB, "alice/secret", False),  # '#' matches the parent level too
    ("c2", "alice", READ, "sensors/1/temp", True),
    ("c2", "alice", PUB, "sensors/1/temp", False),
    ("c2", "alice", READ, "sensors/1/humidity", False),
    ("c2", "alice", PUB, "cmd/alice", True),
    ("c2", "alice", READ, "cmd/alice", False),  # write only
    ("c2", "alice", READ, "extra/alice", True),  # second `user alice` section adds
    ("c2", "alice", READ, "public/news", False),  # the anonymous section is not hers
    ("c2", "alice", READ, "users/alice/inbox", True),  # pattern %u
    ("c2", "alice", PUB, "users/alice/inbox", False),
    ("c2", "alice", READ, "users/bob/inbox", False),
    ("c2", "alice", PUB, "devices/c2/x", True),  # pattern %c
    ("c2", "alice", PUB, "devices/c2/locked", True),  # her own grant beats the pattern deny
    ("c2", "alice", READ, "devices/c2/locked", False),  # her grant is write only: pattern deny
    ("d1", None, PUB, "devices/d1/x", True),
    ("d1", None, READ, "devices/d1/x/y", True),
    ("d1", None, PUB, "devices/d2/x", False),
    ("d1", None, PUB, "devices/d1/locked", False),  # pattern deny beats pattern grant
    ("d1/sub", None, PUB, "devices/d1/sub/x", True),  # Mosquitto substitutes '/' as it is
    ("+", None, PUB, "devices/anything/x", False),  # wildcard client id: patterns refused
    ("+", "alice", PUB, "alice/x", True),  # ... but the user's own rules still apply
    ("#", None, READ, "public/news", True),  # wildcard client id: its own section still applies
    ("%u", "alice", PUB, "devices/%u/x", True),  # substituted once: no %u inside %c
    ("%u", "alice", PUB, "devices/alice/x", False),
    ("c3", "+", READ, "users/alice/inbox", False),  # wildcard user name: patterns refused
    ("c4", "bob", READ, "sensors/2/temp", True),  # no access word: readwrite
    ("c4", "bob", PUB, "sensors/2/temp", True),
    ("c4", "bob", READ, "sensors/3/temp", False),
    ("c5", "admin", READ, "any/thing", True),
    ("c5", "admin", READ, "$SYS/broker/uptime", True),  # needs its own $SYS rule
    ("c5", "admin", PUB, "$SYS/broker/uptime", False),  # never, whatever the file says
    ("c5", "admin", PUB, "$SYS", False),
    ("c6", "carol", READ, "public/news", False),  # a user without a section: nothing
    ("c7", "root", READ, "a/b", True),
    ("c7", "root", READ, "$SYS/broker/uptime", False),  # '#' does not match '$' topics
]


@pytest.fixture
def acl_path(tmp_path: Path) -> Path:
    path = tmp_path / "acl"
    path.write_text(ACL)
    return path


def ask(access: Access, action: str, topic: str) -> bool:
    return access.may_publish(topic) if action == PUB else access.may_read(topic)


@pytest.mark.parametrize(("client_id", "username", "action", "topic", "allowed"), ROWS)
def test_table(
    acl_path: Path, client_id: str, username: str | None, action: str, topic: str, allowed: bool
) -> None:
    auth = Auth(acl_file=str(acl_path))
    access = auth.access(client_id, username)
    assert ask(access, action, topic) is allowed
    assert ask(access, action, topic) is allowed  # the cached answer is the same
    denied = (auth.denied_publishes, auth.denied_reads)
    expected = 0 if allowed else 2
    assert denied == ((expected, 0) if action == PUB else (0, expected))


@pytest.mark.parametrize(
    ("topic_filter", "granted"),
    [
        ("sensors/+/temp", True),  # the read rule itself
        ("sensors/7/temp", True),  # inside it
        ("sensors/#", False),  # wider than any read rule: 0x80, not every partition read
        ("#", False),
        ("alice/#", True),
        ("alice/secret/#", False),  # a deny rule covers it whole
        ("alice/secret/x", False),
        ("alice/+/x", True),  # partly denied: granted, alice/secret/x filtered at delivery
        ("cmd/alice", False),  # write only
        ("devices/c2/#", True),  # the %c pattern
        ("devices/c3/#", False),
        ("$SYS/#", False),
    ],
)
def test_a_subscription_is_granted_only_inside_a_read_rule(
    acl_path: Path, topic_filter: str, granted: bool
) -> None:
    """A filter is granted when a read rule covers it whole and no deny rule does; what a
    granted filter matches is still checked at delivery, so nothing denied leaks."""
    auth = Auth(acl_file=str(acl_path))
    alice = auth.access("c2", "alice")
    assert alice.may_subscribe(topic_filter) is granted
    assert auth.denied_subscriptions == (0 if granted else 1)


def test_a_granted_wildcard_never_delivers_a_denied_topic(acl_path: Path) -> None:
    alice = Auth(acl_file=str(acl_path)).access("c2", "alice")
    assert alice.may_subscribe("alice/+/x")
    assert [alice.may_read(t) for t in ("alice/a/x", "alice/secret/x")] == [True, False]


@pytest.mark.parametrize(
    ("rule", "topic_filter", "covered"),
    [
        ("a/b", "a/b", True),
        ("a/+", "a/b", True),
        ("a/+", "a/+", True),
        ("a/+", "a/#", False),
        ("a/#", "a", True),  # a/# matches its parent level
        ("a/#", "a/+/b/#", True),
        ("a/+/#", "a/#", False),  # a/# matches "a", a/+/# does not
        ("a/b", "a/+", False),
        ("a/b", "a/b/c", False),
        ("#", "$SYS/x", False),  # [MQTT-4.7.2-1]
        ("+/x", "$SYS/x", False),
        ("$SYS/#", "$SYS/broker/+", True),
        ("#", "+/x", True),
    ],
)
def test_covers(rule: str, topic_filter: str, covered: bool) -> None:
    assert covers(rule, topic_filter) is covered


def test_read_and_publish_answers_are_kept_apart(acl_path: Path) -> None:
    alice = Auth(acl_file=str(acl_path)).access("c2", "alice")
    assert not alice.may_publish("sensors/1/temp") and alice.may_read("sensors/1/temp")
    assert not alice.may_read("cmd/alice") and alice.may_publish("cmd/alice")
    assert alice.may_read("sensors/1/temp") and not alice.may_publish("sensors/1/temp")


def test_without_acl_file_one_shared_access_allows_all_but_sys_publish() -> None:
    auth = Auth()
    access = auth.access("c1", None)
    assert auth.access("c2", "alice") is access
    assert access.may_publish("any/topic") and access.may_read("any/topic")
    assert access.may_subscribe("#") and access.may_read("$SYS/broker/uptime")  # no ACL
    assert not access.may_publish("$SYS/broker/uptime")
    assert not access.may_publish("$SYS")
    assert not access.may_publish("$share/group/t")  # Mosquitto's acl__check_dollar too
    assert auth.denied_publishes == 3


def test_with_acl_file_each_client_has_its_own_access(acl_path: Path) -> None:
    auth = Auth(acl_file=str(acl_path))
    assert auth.access("c1", None) is not auth.access("c2", None)


def test_an_empty_acl_file_denies_everything(tmp_path: Path) -> None:
    path = tmp_path / "acl"
    path.write_text("# nothing granted yet\n\n")
    access = Auth(acl_file=str(path)).access("c1", None)
    assert not access.may_publish("a") and not access.may_read("a")


def test_mosquitto_parsing_quirks(tmp_path: Path) -> None:
    path = tmp_path / "acl"
    path.write_text("topic read\ntopic read  with space/x  \n   topic\twrite\ttabbed\n")
    access = Auth(acl_file=str(path)).access("c1", None)
    assert access.may_publish("read")  # `topic read` alone: readwrite on the topic "read"
    assert access.may_read("with space/x") and not access.may_publish("with space/x")
    assert access.may_publish("tabbed") and not access.may_read("tabbed")


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("topik read a/b", "unknown keyword 'topik'"),
        ("topic reed a/b", "unknown access 'reed'"),
        ("topic a b", "unknown access 'a'"),
        ("topic", "`topic` needs a topic filter"),
        ("pattern   ", "`pattern` needs a topic filter"),
        ("user", "`user` needs a user name"),
        ("topic read a/b#", "invalid topic filter 'a/b#'"),
        ("topic read a/#/b", "invalid topic filter"),
        ("pattern write a+/%c", "invalid topic filter"),
        ("Topic read a", "unknown keyword 'Topic'"),
    ],
)
def test_malformed_lines_name_path_and_line(tmp_path: Path, line: str, says: str) -> None:
    path = tmp_path / "acl"
    path.write_text(f"# acl\ntopic read ok/#\n{line}\n")
    with pytest.raises(AuthFileError) as caught:
        Auth(acl_file=str(path))
    assert str(caught.value).startswith(f"{path}:3: ") and says in str(caught.value)


def test_failed_reload_keeps_old_rules_and_reports_the_line(
    acl_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    auth = Auth(acl_file=str(acl_path))
    access = auth.access("c2", "alice")
    assert access.may_read("alice/x")
    acl_path.write_text("user alice\ntopic read other/#\ntopic sometimes alice/#\n")
    with caplog.at_level(logging.INFO, logger="headwater.auth"):
        problems = auth.reload()
    assert len(problems) == 1 and problems[0].startswith(f"{acl_path}:3: unknown access")
    assert [(r.levelno, r.name) for r in caplog.records] == [(logging.ERROR, "headwater.auth")]
    assert problems[0] in caplog.records[0].getMessage()
    assert access.may_read("alice/x") and not access.may_read("other/x")
    assert auth.access("c9", "alice").may_read("alice/x")


def test_reload_applies_to_connected_clients(
    acl_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    auth = Auth(acl_file=str(acl_path))
    access = auth.access("c2", "alice")
    assert access.may_read("alice/x") and not access.may_read("other/x")  # both now cached
    acl_path.write_text("user alice\ntopic read other/#\n")
    with caplog.at_level(logging.INFO, logger="headwater.auth"):
        assert auth.reload() == []
    assert [r.levelno for r in caplog.records] == [logging.INFO]
    assert access.may_read("other/x") and not access.may_read("alice/x")


def test_many_topics_keep_right_answers(acl_path: Path) -> None:
    access = Auth(acl_file=str(acl_path)).access("c2", "alice")
    for round_ in range(2):
        for i in range(1000):
            assert access.may_read(f"alice/{i}"), round_
            assert not access.may_read(f"bob/{i}"), round_
    assert len(access._cache or {}) <= CACHE_SIZE  # memory per client stays bounded
