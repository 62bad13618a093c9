"""The short version of the fuzzing in docs/fuzzing.md, and the inputs it has pinned.

``tests.fuzz.harness.run`` drives a decoder and a channel with one input and raises only on a bug.
Here it runs over the seed corpus, over a few thousand Hypothesis inputs (client sessions built
from packet values, then mutated), and, where atheris is installed, over a short deterministic
libFuzzer run from the seeds.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqttcore.codec import encode
from mqttcore.packets import (
    Connack,
    Connect,
    Disconnect,
    Packet,
    Pingreq,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Subscribe,
    Unsubscribe,
    Will,
)
from tests.fuzz import harness, minimize
from tests.fuzz.harness import (
    HOLD_TICKETS,
    NEVER_CONFIRM,
    REFUSED,
    RESUMED,
    SMALL_LIMITS,
    make_input,
    run,
)
from tests.fuzz.seeds import seed_inputs, write_seeds

ROOT = Path(__file__).resolve().parents[2]
SEEDS = seed_inputs()
CONNECT = encode(Connect("c"))

# -- the seed corpus ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SEEDS))
def test_seed(name: str) -> None:
    run(SEEDS[name])


def test_seeds_cover_every_client_to_server_packet() -> None:
    types = set()
    for data in SEEDS.values():
        for batch in harness.decode_chunked(harness.Plan.parse(data))[0]:
            types |= {type(packet) for packet in batch}
    client_to_server = {Connect, Publish, Puback, Pubrec, Pubrel, Pubcomp, Subscribe, Unsubscribe}
    assert types >= client_to_server | {Pingreq, Disconnect}


# -- Hypothesis: client sessions, valid and mutated --------------------------------------------

topic_names = st.sampled_from(["a", "a/b", "a/c", "b/b", "$SYS/x"])
topic_filters = st.sampled_from(
    ["a/+", "#", "a/#", "+/b", "a/b", "$share/g/a/b", "$share//a", "a/#/b", "a+", "", "$share/g"]
)
packet_ids = st.integers(1, 4)


@st.composite
def publishes(draw: st.DrawFn) -> Publish:
    qos = draw(st.integers(0, 2))
    return Publish(
        draw(topic_names),
        draw(st.binary(max_size=8)),
        qos,
        retain=draw(st.booleans()),
        dup=bool(qos) and draw(st.booleans()),
        packet_id=draw(packet_ids) if qos else None,
    )


wills = st.none() | st.builds(Will, topic_names, st.binary(max_size=4), st.integers(0, 2))
accepted_connects = st.builds(
    Connect,
    client_id=st.sampled_from(["c", "d"]),
    clean_session=st.booleans(),
    username=st.none() | st.just("u"),
    will=wills,
)
any_connects = st.builds(
    Connect,
    client_id=st.sampled_from(["c", "", "x" * 24]),
    clean_session=st.booleans(),
    keep_alive=st.integers(0, 0xFFFF),
    username=st.none() | st.just("u"),
    password=st.none() | st.just(b"p"),
    will=wills,
    protocol_name=st.sampled_from(["MQTT", "MQIsdp"]),
    protocol_level=st.sampled_from([4, 3, 5]),
)

requests = st.tuples(topic_filters, st.integers(0, 2))
client_packets: st.SearchStrategy[Packet] = st.one_of(
    publishes(),
    st.builds(Puback, packet_ids),
    st.builds(Pubrec, packet_ids),
    st.builds(Pubrel, packet_ids),
    st.builds(Pubcomp, packet_ids),
    st.builds(Subscribe, packet_ids, st.lists(requests, min_size=1, max_size=3).map(tuple)),
    st.builds(Unsubscribe, packet_ids, st.lists(topic_filters, min_size=1, max_size=3).map(tuple)),
    st.just(Pingreq()),
)
endings = st.sampled_from([Disconnect(), Connack(False, 0)]) | any_connects
"""Packets after which the connection is closed."""


@st.composite
def mutated(draw: st.DrawFn, stream: bytes) -> bytes:
    """``stream`` with a few bytes set, inserted or deleted, or cut short (or left alone)."""
    data = bytearray(stream)
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2, 3]))):
        op = draw(st.sampled_from(["set", "insert", "delete", "truncate"]))
        at = draw(st.integers(0, len(data)))
        if op == "set" and at < len(data):
            data[at] = draw(st.integers(0, 255))
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=3))
        elif op == "delete":
            del data[at : at + draw(st.integers(1, 3))]
        elif op == "truncate":
            del data[at:]
    return bytes(data)


@st.composite
def fuzz_inputs(draw: st.DrawFn) -> bytes:
    connect = draw(any_connects if draw(st.integers(0, 3)) == 0 else accepted_connects)
    packets = [connect, *(draw(client_packets) for _ in range(draw(st.integers(0, 16))))]
    if draw(st.integers(0, 3)) == 0:
        packets.append(draw(endings))
    stream = draw(mutated(b"".join(encode(p) for p in packets)))
    chunks = tuple(draw(st.lists(st.integers(0, 40), max_size=4)))
    control = draw(st.sampled_from([0, NEVER_CONFIRM]) | st.integers(0, 255)) & ~REFUSED
    if draw(st.integers(0, 9)) == 0:
        control |= REFUSED
    return make_input(stream, draw(st.integers(0, 255)), chunks, control)


@settings(
    max_examples=1500,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(fuzz_inputs())
def test_client_sessions(data: bytes) -> None:
    run(data)


@settings(max_examples=500, derandomize=True, database=None, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes(data: bytes) -> None:
    run(data)


# -- atheris: a short libFuzzer run from the seeds --------------------------------------------


@pytest.mark.skipif(
    platform.machine() != "x86_64" or sys.version_info >= (3, 13),
    reason="atheris has no wheel here (the test extra's marker); Hypothesis still runs",
)
def test_libfuzzer_short_run(tmp_path: Path) -> None:
    import atheris  # noqa: F401  the test extra installs it where it has a wheel

    write_seeds(tmp_path / "seeds")
    (tmp_path / "found").mkdir()
    command = [
        sys.executable, str(ROOT / "tests" / "fuzz" / "fuzz_mqtt.py"),
        "-runs=20000", "-seed=1", "-max_len=4096", "-timeout=10", "-rss_limit_mb=1024",
        f"-artifact_prefix={tmp_path}/", str(tmp_path / "found"), str(tmp_path / "seeds"),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "Done 20000 runs" in result.stderr
    assert not list(tmp_path.glob("crash-*"))


def test_minimize_keeps_the_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    def planted(data: bytes) -> None:
        if encode(Pubrel(9)) in data and data[0] & SMALL_LIMITS:
            raise IndexError("planted")

    monkeypatch.setattr(minimize, "run", planted)
    stream = CONNECT + encode(Pingreq()) + encode(Pubrel(9)) + encode(Disconnect())
    crashing = make_input(stream, SMALL_LIMITS | HOLD_TICKETS, (3, 1), NEVER_CONFIRM)
    small = minimize.minimize(crashing)
    assert minimize.crash_of(small) == minimize.crash_of(crashing) is not None
    assert len(small) == 1 + len(encode(Pubrel(9)))  # the options byte and the PUBREL


# -- pinned inputs: crashes found by fuzzing, and edge cases worth keeping -------------------------

PINNED: dict[str, bytes] = {
    # A QoS 2 resend while an earlier write is unconfirmed: its PUBREC queues behind the PUBACK.
    "qos2-resend-behind-held-write": make_input(
        CONNECT
        + encode(Publish("a", b"", 1, packet_id=1))
        + encode(Publish("b", b"", 2, packet_id=2))
        + encode(Publish("b", b"", 2, dup=True, packet_id=2))
        + encode(Pubrel(2)),
        HOLD_TICKETS,
    ),
    # Acknowledging a resumed session's messages, with room for one message in flight at a time.
    "resumed-acks-small-window": make_input(
        CONNECT + encode(Pubcomp(2)) + encode(Puback(1)) + encode(Puback(3)),
        RESUMED | SMALL_LIMITS,
    ),
    # A remaining length of five bytes, fed one byte at a time.
    "five-byte-length": make_input(CONNECT + b"\x30\xff\xff\xff\xff\x01", 0, (1,)),
    # A packet over the maximum size (64 bytes) is refused from its header alone.
    "too-large": make_input(CONNECT + encode(Publish("a", bytes(80))), 0x03, (2,)),
    # Malformed input before CONNECT, and a CONNECT that is refused with CONNACK 1.
    "garbage-first": make_input(b"\x00\x00"),
    "mqtt5-connect": make_input(encode(Connect("c", protocol_level=5))),
    # A will published on a protocol error after CONNECT.
    "will-on-error": make_input(
        encode(Connect("c", will=Will("w", b"x", 1))) + encode(Connack(False, 0))
    ),
}


@pytest.mark.parametrize("name", sorted(PINNED))
def test_pinned(name: str) -> None:
    run(PINNED[name])
