"""The seed corpus: valid client sessions, each a harness input (see ``harness``), written as one
file per seed by ``python -m tests.fuzz.seeds DIR``.

Seeds are built from packet values with the codec's encoder, so they stay valid as the codec
changes; they cover every client-to-server packet, every option of the harness, and a few
streams a client must not send (server-to-client packets, a second CONNECT), so the fuzzer
starts from inputs that get past CONNECT and reach every state of the channel.
"""

from __future__ import annotations

import sys
from pathlib import Path

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
    Suback,
    Subscribe,
    Unsubscribe,
    Will,
)

from .harness import (
    BACKED_UP,
    HOLD_TICKETS,
    NEVER_CONFIRM,
    REFUSED,
    RESTRICTED,
    RESUMED,
    SMALL_LIMITS,
    make_input,
)

CONNECTS = {
    "plain": Connect("c"),
    "will": Connect("c", keep_alive=60, will=Will("w/t", b"bye", qos=1, retain=True)),
    "login": Connect("dev-1", clean_session=False, username="u", password=b"p"),
    "empty-id": Connect(""),
    "mqtt31": Connect("old", protocol_name="MQIsdp", protocol_level=3),
}

SESSIONS: dict[str, list[Packet]] = {
    "ping": [Pingreq(), Disconnect()],
    "publish": [
        Publish("a/b", b"0"),
        Publish("a/b", b"1", 1, packet_id=1),
        Publish("a/b", b"2", 2, packet_id=2),
        Pubrel(2),
        Disconnect(),
    ],
    "loopback": [
        Subscribe(1, (("a/+", 2), ("#", 0), ("$share/g/a/b", 1), ("a/#/b", 1))),
        Publish("a/b", b"m", 1, retain=True, packet_id=3),
        Publish("a/b", b"m", 2, packet_id=4),
        Puback(1),
        Pubrec(2),
        Pubcomp(2),
        Subscribe(6, (("b/#", 1), ("a/c", 0), ("x", 2))),
        Publish("b/x", b"denied", 1, packet_id=5),
        Publish("a/c", b"unread", 2, packet_id=6),
        Unsubscribe(5, ("a/+", "#")),
        Publish("a/b", b"m", 2, dup=True, packet_id=4),
        Pubrel(4),
    ],
    "qos2-resend": [
        Publish("t", b"x", 2, packet_id=7),
        Publish("t", b"x", 2, dup=True, packet_id=7),
        Pubrel(7),
        Pubrel(7),
    ],
    "acks": [Puback(1), Pubrec(2), Pubcomp(2), Puback(3)],
    "second-connect": [Connect("c")],
    "server-packet": [Connack(False, 0), Suback(1, (0,))],
}

OPTIONS = {
    "": (0, (), 0),
    "-chunked": (0x10, (1, 3, 0), 0),
    "-held": (HOLD_TICKETS | 0x20, (7,), 0),
    "-backed-up": (BACKED_UP | SMALL_LIMITS, (), 0),
    "-resumed": (RESUMED | 0x30, (2, 0), 0),
    "-unconfirmed": (0x01, (), NEVER_CONFIRM),
    "-small-packets": (0x03, (5,), 0),
    "-restricted": (SMALL_LIMITS | HOLD_TICKETS, (), RESTRICTED),
}


def seed_inputs() -> dict[str, bytes]:
    """Seed name -> harness input."""
    seeds: dict[str, bytes] = {}
    for connect_name, connect in CONNECTS.items():
        for session_name, packets in SESSIONS.items():
            stream = b"".join(encode(p) for p in [connect, *packets])
            for option_name, (options, chunks, control) in OPTIONS.items():
                name = f"{connect_name}-{session_name}{option_name}"
                seeds[name] = make_input(stream, options, chunks, control)
    seeds["refused"] = make_input(encode(Connect("c")) + encode(Pingreq()), control=REFUSED)
    seeds["no-connect"] = make_input(encode(Pingreq()))
    for name, connect, options in [
        ("mqtt31-empty-id", Connect("", protocol_name="MQIsdp", protocol_level=3), 0),
        ("mqtt31-long-id", Connect("x" * 24, protocol_name="MQIsdp", protocol_level=3), 0),
        ("long-id-small-limits", Connect("x" * 24), SMALL_LIMITS),
        ("empty-id-persistent", Connect("", clean_session=False), 0),
    ]:
        seeds[name] = make_input(encode(connect) + encode(Pingreq()), options)
    return seeds


def write_seeds(directory: Path) -> int:
    directory.mkdir(parents=True, exist_ok=True)
    seeds = seed_inputs()
    for name, data in seeds.items():
        (directory / name).write_bytes(data)
    return len(seeds)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m tests.fuzz.seeds DIR")
    print(f"{write_seeds(Path(sys.argv[1]))} seeds written to {sys.argv[1]}")
