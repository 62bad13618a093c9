"""Logins cost the attacker, not the node (``frontend.auth``): passwords are checked on a pool
thread, a bounded number at once; an address that fails too often is refused without a check;
a reload tells which logged-in clients no longer pass; a user name the node cannot check proves
nothing."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from frontend.auth import Auth, Credentials, Hashing, LoginThrottle, hash_password
from frontend.auth import passwords as passwords_module
from frontend.auth.throttle import address_key

ACCEPTED, UNAVAILABLE, BAD_CREDENTIALS, NOT_AUTHORIZED = 0, 3, 4, 5


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def password_file(tmp_path: Path, **users: str) -> str:
    path = tmp_path / "passwords"
    path.write_text("".join(f"{user}:{hash_password(pw)}\n" for user, pw in users.items()))
    return str(path)


def login(user: str | None, password: bytes | None, address: str = "192.0.2.1") -> Credentials:
    return Credentials(f"c-{user}", user, password, address=address)


# -- the throttle ----------------------------------------------------------------------------------


def test_an_address_gets_its_burst_of_failures_then_one_per_forgive_period() -> None:
    clock = Clock()
    throttle = LoginThrottle(burst=3, forgive=10.0, clock=clock)
    for _ in range(3):
        assert throttle.allows("a")
        throttle.failed("a")
    assert not throttle.allows("a")
    assert throttle.allows("b")  # another address is not concerned
    clock.now += 9.9
    assert not throttle.allows("a")
    clock.now += 0.2  # one failure forgiven: one more try
    assert throttle.allows("a")
    throttle.failed("a")
    assert not throttle.allows("a")
    assert throttle.throttled == 3
    clock.now += 31  # all forgiven: the address leaves the table
    assert throttle.allows("a") and len(throttle) == 0


def test_the_table_is_bounded_forgetting_the_least_recent_failure() -> None:
    throttle = LoginThrottle(burst=1, forgive=60.0, max_addresses=100, clock=Clock())
    for i in range(1000):
        throttle.failed(f"10.0.{i // 256}.{i % 256}")
    assert len(throttle) == 100
    assert not throttle.allows("10.0.3.231")  # the last one failed: remembered
    assert throttle.allows("10.0.0.0")  # the first: forgotten


def test_an_ipv6_host_counts_as_its_64() -> None:
    assert address_key("2001:db8:1:2::1") == address_key("2001:db8:1:2:ffff::9")
    assert address_key("2001:db8:1:2::1") != address_key("2001:db8:1:3::1")
    assert address_key("::ffff:192.0.2.1") == "192.0.2.1"
    assert address_key(None) is None


# -- logins ----------------------------------------------------------------------------------------


async def test_passwords_are_hashed_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    auth = Auth(password_file(tmp_path, alice="pw"))
    threads: list[int] = []
    real = passwords_module.PasswordHash.compute

    def recording(self: passwords_module.PasswordHash, password: bytes) -> bytes:
        threads.append(threading.get_ident())
        return real(self, password)

    monkeypatch.setattr(passwords_module.PasswordHash, "compute", recording)
    good = await auth.login(login("alice", b"pw"))
    assert (good.code, good.identity, good.access is not None) == (ACCEPTED, "alice", True)
    assert (await auth.login(login("mallory", b"pw"))).code == BAD_CREDENTIALS
    assert len(threads) == 2 and threading.get_ident() not in threads
    auth.close()


async def test_a_full_hashing_queue_answers_server_unavailable_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    auth = Auth(password_file(tmp_path, alice="pw"), hashing=Hashing(threads=1, waiting=1))
    release = threading.Event()
    real = passwords_module.PasswordHash.compute

    def slow(self: passwords_module.PasswordHash, password: bytes) -> bytes:
        release.wait(10)
        return real(self, password)

    monkeypatch.setattr(passwords_module.PasswordHash, "compute", slow)
    first = asyncio.ensure_future(auth.login(login("alice", b"pw")))
    second = asyncio.ensure_future(auth.login(login("alice", b"pw")))
    while auth.hashing.pending < 2:
        await asyncio.sleep(0)
    third = await auth.login(login("alice", b"pw"))  # a third waiting would pass the bound
    assert (third.code, auth.hashing.shed) == (UNAVAILABLE, 1)
    release.set()
    assert [(await first).code, (await second).code] == [ACCEPTED, ACCEPTED]
    auth.close()


async def test_an_address_that_failed_too_often_is_refused_without_a_hash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    auth = Auth(password_file(tmp_path, alice="pw"), throttle=LoginThrottle(burst=3))
    for _ in range(3):
        assert (await auth.login(login("alice", b"guess"))).code == BAD_CREDENTIALS
    hashed: list[bytes] = []

    def recording(self: passwords_module.PasswordHash, password: bytes) -> bytes:
        hashed.append(password)
        return b""

    monkeypatch.setattr(passwords_module.PasswordHash, "compute", recording)
    refused = await auth.login(login("alice", b"pw"))  # even the right password
    assert (refused.code, refused.access, hashed) == (NOT_AUTHORIZED, None, [])
    assert (auth.throttle.throttled, auth.denied_connects) == (1, 4)
    monkeypatch.undo()
    assert (await auth.login(login("alice", b"pw", address="192.0.2.2"))).code == ACCEPTED
    auth.close()


async def test_a_reload_tells_which_logins_no_longer_pass(tmp_path: Path) -> None:
    path = password_file(tmp_path, alice="a", bob="b", carol="c")
    auth = Auth(path)
    users = [("alice", b"a"), ("bob", b"b"), ("carol", b"c")]
    alice, bob, carol = [await auth.login(login(user, password)) for user, password in users]
    lines = Path(path).read_text().splitlines()
    Path(path).write_text(f"{lines[0]}\ncarol:{hash_password('new')}\n")  # bob gone, carol changed
    assert auth.reload() == []
    assert [auth.still_passes(x) for x in (alice, bob, carol)] == [True, False, False]
    auth.close()


async def test_with_a_password_file_and_anonymous_allowed_a_user_name_must_still_pass(
    tmp_path: Path,
) -> None:
    auth = Auth(password_file(tmp_path, alice="pw"), allow_anonymous=True)
    anonymous = await auth.login(login(None, None))
    assert (anonymous.code, anonymous.identity) == (ACCEPTED, "")
    assert (await auth.login(login("alice", b"wrong"))).code == BAD_CREDENTIALS
    assert (await auth.login(login("alice", b"pw"))).identity == "alice"
    assert (await Auth(password_file(tmp_path, alice="pw")).login(login(None, None))).code == 5
    auth.close()


async def test_without_a_way_to_authenticate_a_user_name_proves_nothing(tmp_path: Path) -> None:
    acl = tmp_path / "acl"
    acl.write_text("topic read public/#\nuser alice\ntopic readwrite alice/#\npattern read in/%u\n")
    claimed = await Auth(acl_file=str(acl)).login(login("alice", None))
    assert (claimed.code, claimed.identity) == (ACCEPTED, "")
    assert claimed.access is not None
    assert not claimed.access.may_subscribe("alice/#")  # not alice's rules
    assert not claimed.access.may_subscribe("in/alice")  # no %u for an anonymous client
    assert claimed.access.may_subscribe("public/#")  # the anonymous ones
    refused = await Auth(acl_file=str(acl), allow_anonymous=False).login(login("alice", None))
    assert refused.code == NOT_AUTHORIZED
