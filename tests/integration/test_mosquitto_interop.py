"""The same files in Debian's Mosquitto 2.0 broker and in Headwater give the same answers.

Each test starts ``/usr/sbin/mosquitto`` (package ``mosquitto``) on a free loopback port with a
config naming a password_file written by ``headwater passwd`` (and, for the ACL test, the acl_file
of tests/unit/test_acl.py), waits until it listens, and stops it at the end.

The ACL test is differential: for each row of the unit table, a real client with that client id
and user name reads (or publishes) through Mosquitto, and what Mosquitto delivered is compared with
Headwater's :class:`Access` answer.  "Not delivered" is observed without a timeout: a sentinel
message that the client may read (or write) is sent after the one under test on the same
connection, and messages of one QoS 1 sender arrive in order, so once the sentinel is in, the
message under test either arrived before it or was refused.
"""

from __future__ import annotations

import getpass
import queue
import shutil
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from frontend.auth import Access, Auth
from headwater import cli
from headwater.services.ports import LOOPBACK, free_port, port_accepts
from headwater.services.readiness import wait_until
from tests.unit.test_acl import ACL, READ, ROWS

MOSQUITTO = "/usr/sbin/mosquitto"
TIMEOUT = 10.0
PASSWORD = "pw"
USERS = sorted({row[1] for row in ROWS if row[1] is not None})
SENTINEL_RULES = "\npattern readwrite sync/%c\n"


@contextmanager
def mosquitto(tmp_path: Path, *settings: str) -> Iterator[int]:
    """A running Mosquitto broker with ``settings``; yields its port."""
    assert Path(MOSQUITTO).exists(), "mosquitto missing: `make install` (Debian: mosquitto)"
    port = free_port()
    config = tmp_path / "mosquitto.conf"
    lines = [f"listener {port} {LOOPBACK}", f"user {getpass.getuser()}", *settings]
    config.write_text("\n".join(lines) + "\n")
    log = tmp_path / "mosquitto.log"
    with log.open("wb") as out:
        process = subprocess.Popen([MOSQUITTO, "-c", str(config)], stdout=out, stderr=out)
    try:

        def listening() -> bool:
            assert process.poll() is None, f"mosquitto exited: {log.read_text()}"
            return port_accepts(port)

        wait_until(listening, what="mosquitto listening", timeout=TIMEOUT, interval=0.02)
        yield port
    finally:
        process.terminate()
        process.wait(timeout=TIMEOUT)


def mosquitto_pub(port: int, *args: str) -> subprocess.CompletedProcess[str]:
    command = ["mosquitto_pub", "-h", LOOPBACK, "-p", str(port), "-t", "t", "-m", "x", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT)


def test_mosquitto_accepts_passwords_written_by_headwater_passwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "passwords"
    assert cli.main(["passwd", "-c", "-b", str(path), "alice", "a-pw"]) == 0
    assert cli.main(["passwd", "-H", "sha512", "-b", str(path), "bob", "b-pw"]) == 0
    monkeypatch.setattr("getpass.getpass", lambda prompt="": "c-pw")
    assert cli.main(["passwd", str(path), "carol"]) == 0
    auth = Auth(password_file=str(path))
    attempts = [
        (["-u", "alice", "-P", "a-pw"], True),
        (["-u", "bob", "-P", "b-pw"], True),
        (["-u", "carol", "-P", "c-pw"], True),
        (["-u", "alice", "-P", "b-pw"], False),
        (["-u", "bob", "-P", "b-pw!"], False),
        (["-u", "mallory", "-P", "a-pw"], False),
        ([], False),
    ]
    with mosquitto(tmp_path, "allow_anonymous false", f"password_file {path}") as port:
        for args, accepted in attempts:
            result = mosquitto_pub(port, *args)
            assert (result.returncode == 0) is accepted, (args, result.stderr)
            if not accepted:
                assert "not authorised" in result.stderr, result.stderr
            username = args[1] if args else None
            password = args[3].encode() if args else None
            assert (auth.check(username, password) == 0) is accepted, args


# -- the ACL, differentially --------------------------------------------------------------------


class Client:
    """A paho-mqtt 3.1.1 client whose every step waits for its acknowledgement."""

    def __init__(self, port: int, client_id: str, username: str | None) -> None:
        self.received: queue.Queue[str] = queue.Queue()
        self._acked = threading.Event()
        self.paho = paho.Client(
            CallbackAPIVersion.VERSION2, client_id=client_id, protocol=paho.MQTTv311
        )
        if username is not None:
            self.paho.username_pw_set(username, PASSWORD)
        self.paho.on_connect = self._on_ack
        self.paho.on_subscribe = self._on_ack
        self.paho.on_message = lambda _c, _u, msg: self.received.put(msg.topic)
        self.paho.connect(LOOPBACK, port)
        self.paho.loop_start()
        self._wait()

    def _on_ack(self, *args: Any) -> None:
        self._acked.set()

    def _wait(self) -> None:
        assert self._acked.wait(TIMEOUT), "no acknowledgement from mosquitto"
        self._acked.clear()

    def subscribe(self, topic_filter: str) -> None:
        self.paho.subscribe(topic_filter, qos=1)
        self._wait()

    def publish(self, topic: str) -> None:
        self.paho.publish(topic, b"x", qos=1).wait_for_publish(TIMEOUT)

    def topics_until(self, sentinel: str) -> list[str]:
        topics = []
        try:
            while (topic := self.received.get(timeout=TIMEOUT)) != sentinel:
                topics.append(topic)
        except queue.Empty:
            message = f"mosquitto did not deliver {sentinel}, which Headwater allows"
            raise AssertionError(message) from None
        return topics

    def close(self) -> None:
        self.paho.disconnect()
        self.paho.loop_stop()


def sentinel_for(access: Access, client_id: str, username: str | None) -> str | None:
    """A topic this identity may both read and write, if it has one."""
    candidates = [f"sync/{client_id}", f"{username}/sync", "public/anon/sync"]
    valid = [t for t in candidates if "+" not in t and "#" not in t]
    usable = [t for t in valid if access.may_read(t) and access.may_publish(t)]
    return usable[0] if usable else None


def mosquitto_decides(
    port: int, client_id: str, username: str | None, action: str, topic: str, sentinel: str
) -> bool:
    """Whether Mosquitto delivered ``topic`` read (or published) by this identity."""
    witness = Client(port, "witness", "admin")
    actor = Client(port, client_id, username)
    try:
        if action == READ:
            actor.subscribe("#")
            witness.publish(topic)
            witness.publish(sentinel)
            return topic in actor.topics_until(sentinel)
        witness.subscribe("#")
        actor.publish(topic)
        actor.publish(sentinel)
        return topic in witness.topics_until(sentinel)
    finally:
        actor.close()
        witness.close()


def test_acl_decisions_match_mosquitto(tmp_path: Path) -> None:
    passwords = tmp_path / "passwords"
    assert cli.main(["passwd", "-c", "-b", str(passwords), "admin", PASSWORD]) == 0
    for user in USERS:
        assert cli.main(["passwd", "-b", str(passwords), user, PASSWORD]) == 0
    acl = tmp_path / "acl"
    acl.write_text(ACL + SENTINEL_RULES)
    auth = Auth(str(passwords), str(acl))
    compared, skipped = [], []
    settings = ("allow_anonymous true", f"password_file {passwords}", f"acl_file {acl}")
    with mosquitto(tmp_path, *settings) as port:
        for client_id, username, action, topic, _ in ROWS:
            access = auth.access(client_id, username)
            sentinel = sentinel_for(access, client_id, username)
            if topic.startswith("$") or sentinel is None:
                skipped.append((client_id, username, topic))  # not observable from a client
                continue
            ours = access.may_read(topic) if action == READ else access.may_publish(topic)
            theirs = mosquitto_decides(port, client_id, username, action, topic, sentinel)
            compared.append((client_id, username, action, topic, ours, theirs))
    differences = [row for row in compared if row[-2] != row[-1]]
    assert not differences, f"(client id, user, action, topic, headwater, mosquitto): {differences}"
    # Only $SYS (clients cannot publish there) and the user who may read nothing are skipped.
    assert all(topic.startswith("$") or user == "+" for _, user, topic in skipped), skipped


def test_mosquitto_is_installed_where_the_tests_expect_it() -> None:
    assert shutil.which("mosquitto_pub"), "mosquitto_pub missing: `make install`"
