"""A raw-bytes MQTT client for tests that expect exact packets back, as mosquitto's test/broker
scripts do: it sends whatever it is given and decodes what the server answers with our codec."""

from __future__ import annotations

import asyncio
import contextlib

from mqttcore.codec import Decoder, encode
from mqttcore.packets import Connack, Connect, Packet, Suback, Subscribe


class RawClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.decoder = Decoder()
        self.received: list[Packet] = []

    @classmethod
    async def open(cls, port: int, host: str = "127.0.0.1") -> RawClient:
        reader, writer = await asyncio.open_connection(host, port)
        return cls(reader, writer)

    @classmethod
    async def connected(cls, port: int, client_id: str, **connect: object) -> RawClient:
        """A client past CONNECT/CONNACK 0."""
        client = await cls.open(port)
        await client.send(Connect(client_id, **connect))  # type: ignore[arg-type]
        connack = await client.recv()
        assert isinstance(connack, Connack) and connack.return_code == 0, connack
        return client

    async def send(self, packet: Packet | bytes) -> None:
        self.writer.write(packet if isinstance(packet, bytes) else encode(packet))
        await self.writer.drain()

    async def recv(self, timeout: float = 5.0) -> Packet:
        while not self.received:
            data = await asyncio.wait_for(self.reader.read(65536), timeout)
            if not data:
                raise ConnectionError("closed by the server")
            self.received.extend(self.decoder.feed(data))
        return self.received.pop(0)

    async def subscribe(self, *filters: tuple[str, int], packet_id: int = 1) -> Suback:
        await self.send(Subscribe(packet_id, tuple(filters)))
        suback = await self.recv()
        assert isinstance(suback, Suback), suback
        return suback

    async def expect_closed(self, timeout: float = 5.0) -> None:
        """The server closes the connection (possibly after sending what is already queued)."""

        async def closed() -> None:
            while True:
                try:
                    if not await self.reader.read(65536):
                        return
                except ConnectionResetError:
                    return

        await asyncio.wait_for(closed(), timeout)

    async def expect_silence(self, seconds: float = 0.5) -> None:
        try:
            packet = await self.recv(timeout=seconds)
        except TimeoutError:
            return
        raise AssertionError(f"unexpected {packet}")

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError, TimeoutError):
            await asyncio.wait_for(self.writer.wait_closed(), 5.0)
