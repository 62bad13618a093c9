"""``python -m bench history``: the reader's tally over a scripted MQTT peer, and the table."""

from __future__ import annotations

import asyncio

from bench import history
from bench.__main__ import ALL, COMMANDS
from bench.mqtt import Endpoint, packet, publish


async def test_the_reader_counts_and_acknowledges_until_the_history_stops() -> None:
    acked: list[bytes] = []

    async def peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1 << 16)  # CONNECT
        writer.write(bytes((0x20, 2, 0, 0)))
        await reader.read(1 << 16)  # SUBSCRIBE
        writer.write(packet(0x90, b"\x00\x01\x01"))
        sent = (publish(f"$history/earliest/hist/{i}", b"x", i + 1) for i in range(5))
        writer.write(b"".join(sent))
        while len(acked) < 5 and (data := await reader.read(1 << 16)):
            acked.extend(data[k : k + 4] for k in range(0, len(data), 4))

    server = await asyncio.start_server(peer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        read = await history._read(Endpoint("127.0.0.1", port), history.HISTORY, 100, 0.3)
    assert (read.got, read.error) == (5, "")
    assert read.seconds >= 0 and read.suback_s >= 0
    assert acked == [bytes((0x40, 2, 0, i + 1)) for i in range(5)]


def test_history_is_its_own_subcommand_and_renders_every_row() -> None:
    assert "history" in COMMANDS and "history" not in ALL
    run = history.Run("python -m bench history", "abc1234", filled=1000, fill_rate=500.0)
    run.alone = history.Read(0.01, 0.02, 1000, 2.0)
    run.subscribe_all, run.subscribe_one = [0.004, 0.006, 0.005], [0.002]
    text = history.render(run)
    assert "1,000 in 2.0 s: 500 msg/s" in text
    assert "5.0 ms" in text and "2.0 ms" in text
    assert text.count("\n|") >= 10
