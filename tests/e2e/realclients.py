"""Real MQTT client libraries, driven from the test's event loop, where the node also runs.

Nothing here may block the loop: paho-mqtt runs its network loop in its own thread and hands
every callback to the event loop with ``call_soon_threadsafe``; ``mosquitto_pub``/``mosquitto_sub``
are subprocesses (``mosquitto_sub`` line-buffered through ``stdbuf`` and run with ``-d``, so its
SUBACK is visible and a test publishes only once the subscription exists); aiomqtt and the amqtt
client are asyncio-native.

Every client, whatever its library, reports messages as :class:`Received`, so tests compare what
users observe the same way for all of them.  :class:`Clients` opens clients and closes whatever a
test left open; every wait has a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiomqtt
import paho.mqtt.client as paho
from amqtt.client import MQTTClient
from paho.mqtt.enums import CallbackAPIVersion

if TYPE_CHECKING:
    pass

HOST = "127.0.0.1"
TIMEOUT = 10.0
"""Upper bound of any single wait on a client; tests normally finish far sooner."""

SUB_FORMAT = "MSG %r %q %t %x"
"""mosquitto_sub -F: retain flag, QoS, topic, payload in hex (topics here have no spaces)."""

LINE_LIMIT = 16 << 20
"""Longest mosquitto_sub output line read: a hex payload takes two characters a byte."""


@dataclass(frozen=True, slots=True)
class Received:
    topic: str
    payload: bytes
    qos: int
    retain: bool = False


# -- paho-mqtt ------------------------------------------------------------------------------


class PahoClient:
    """paho-mqtt 2.x with ``loop_start``; connect/subscribe/publish are awaited acknowledgements."""

    def __init__(
        self,
        port: int,
        client_id: str = "",
        *,
        clean_session: bool = True,
        keepalive: int = 60,
        will: tuple[str, bytes, int, bool] | None = None,
    ) -> None:
        self.port = port
        self.keepalive = keepalive
        self._loop = asyncio.get_running_loop()
        self.client = paho.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            clean_session=clean_session,
            protocol=paho.MQTTv311,
            reconnect_on_failure=False,
        )
        if will is not None:
            topic, payload, qos, retain = will
            self.client.will_set(topic, payload, qos, retain)
        self.messages: asyncio.Queue[Received] = asyncio.Queue()
        self.disconnected = asyncio.Event()
        self._connack: asyncio.Future[tuple[bool, int]] = self._loop.create_future()
        self._acks: dict[int, asyncio.Future[Any]] = {}
        self.client.on_connect = self._on_connect
        self.client.on_message = self._on_message
        self.client.on_subscribe = self._on_ack
        self.client.on_unsubscribe = self._on_ack
        self.client.on_publish = self._on_publish
        self.client.on_disconnect = self._on_disconnect

    # callbacks: paho's thread -> the event loop

    def _on_connect(self, _c: Any, _u: Any, flags: Any, reason: Any, _p: Any) -> None:
        result = (bool(flags.session_present), int(reason.value))
        self._loop.call_soon_threadsafe(_resolve, self._connack, result)

    def _on_message(self, _c: Any, _u: Any, msg: paho.MQTTMessage) -> None:
        got = Received(msg.topic, bytes(msg.payload), msg.qos, bool(msg.retain))
        self._loop.call_soon_threadsafe(self.messages.put_nowait, got)

    def _on_ack(self, _c: Any, _u: Any, mid: int, codes: Any, _p: Any) -> None:
        values = [int(code.value) for code in codes] if isinstance(codes, list) else []
        self._loop.call_soon_threadsafe(self._acked, mid, values)

    def _on_publish(self, _c: Any, _u: Any, mid: int, _reason: Any, _p: Any) -> None:
        self._loop.call_soon_threadsafe(self._acked, mid, None)

    def _on_disconnect(self, *_args: Any) -> None:
        self._loop.call_soon_threadsafe(self.disconnected.set)

    def _acked(self, mid: int, value: Any) -> None:
        future = self._acks.pop(mid, None)
        if future is not None:
            _resolve(future, value)

    def _expect_ack(self, mid: int) -> asyncio.Future[Any]:
        # Registered before this coroutine yields, hence before _acked can run for ``mid``.
        future = self._acks[mid] = self._loop.create_future()
        return future

    # the awaited API

    async def connect(self) -> bool:
        """Connect and start the network thread; True if the server had a session."""
        await asyncio.to_thread(self.client.connect, HOST, self.port, self.keepalive)
        self.client.loop_start()
        present, code = await asyncio.wait_for(self._connack, TIMEOUT)
        assert code == 0, f"CONNACK {code}"
        return present

    async def subscribe(self, *filters: tuple[str, int]) -> list[int]:
        """SUBSCRIBE; the SUBACK's return codes."""
        result, mid = self.client.subscribe(list(filters))
        assert result == paho.MQTT_ERR_SUCCESS and mid is not None, result
        return list(await asyncio.wait_for(self._expect_ack(mid), TIMEOUT))

    async def unsubscribe(self, *filters: str) -> None:
        result, mid = self.client.unsubscribe(list(filters))
        assert result == paho.MQTT_ERR_SUCCESS and mid is not None, result
        await asyncio.wait_for(self._expect_ack(mid), TIMEOUT)

    def publish_nowait(
        self, topic: str, payload: bytes, qos: int = 0, retain: bool = False
    ) -> asyncio.Future[Any]:
        """Queue a PUBLISH; the future resolves when paho reports it done (PUBACK/PUBCOMP)."""
        info = self.client.publish(topic, payload, qos, retain)
        assert info.rc == paho.MQTT_ERR_SUCCESS, info.rc
        return self._expect_ack(info.mid)

    async def publish(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False) -> None:
        await asyncio.wait_for(self.publish_nowait(topic, payload, qos, retain), TIMEOUT)

    async def next_message(self, timeout: float = TIMEOUT) -> Received:
        return await asyncio.wait_for(self.messages.get(), timeout)

    def drop_connection(self) -> None:
        """Cut the TCP connection without DISCONNECT, as a crash or a lost network would."""
        sock = self.client.socket()
        assert isinstance(sock, socket.socket)
        sock.shutdown(socket.SHUT_RDWR)

    async def close(self) -> None:
        if not self.disconnected.is_set():
            self.client.disconnect()
        await asyncio.to_thread(self.client.loop_stop)


def _resolve(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


# -- aiomqtt and amqtt ----------------------------------------------------------------------


async def aiomqtt_next(client: aiomqtt.Client, timeout: float = TIMEOUT) -> Received:
    message = await asyncio.wait_for(anext(client.messages), timeout)
    payload = message.payload
    assert isinstance(payload, bytes | bytearray), payload
    return Received(message.topic.value, bytes(payload), message.qos, bool(message.retain))


async def amqtt_next(client: MQTTClient, timeout: float = TIMEOUT) -> Received:
    message = await client.deliver_message(timeout_duration=timeout)
    assert message is not None
    packet = message.publish_packet
    assert packet is not None
    return Received(
        message.topic, bytes(message.data), int(message.qos or 0), bool(packet.retain_flag)
    )


# -- mosquitto_sub / mosquitto_pub ----------------------------------------------------------


class MosquittoSub:
    """A running ``mosquitto_sub``; :meth:`start` returns once its SUBACK has arrived."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.log: list[str] = []

    @classmethod
    async def start(
        cls, port: int, *filters: str, qos: int = 1, extra: Sequence[str] = ()
    ) -> MosquittoSub:
        args = ["-h", HOST, "-p", str(port), "-q", str(qos), "-d", "-F", SUB_FORMAT]
        for topic_filter in filters:
            args += ["-t", topic_filter]
        process = await asyncio.create_subprocess_exec(
            "stdbuf",
            "-oL",
            "mosquitto_sub",
            *args,
            *extra,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            limit=LINE_LIMIT,
        )
        sub = cls(process)
        try:
            await sub._read_until(lambda line: "received SUBACK" in line)
        except BaseException:
            await sub.close()  # never leave a subscriber running behind a failed start
            raise
        return sub

    async def _read_until(self, done: Any, timeout: float = TIMEOUT) -> str:
        assert self.process.stdout is not None
        async with asyncio.timeout(timeout):
            while True:
                raw = await self.process.stdout.readline()
                if not raw:
                    raise ConnectionError(f"mosquitto_sub exited: {self.log}")
                line = raw.decode(errors="replace").rstrip("\n")
                self.log.append(line)
                if done(line):
                    return line

    async def next_message(self, timeout: float = TIMEOUT) -> Received:
        line = await self._read_until(lambda text: text.startswith("MSG "), timeout)
        _, retain, qos, topic, hex_payload = line.split(" ")
        return Received(topic, bytes.fromhex(hex_payload), int(qos), retain == "1")

    async def messages(self, count: int, timeout: float = TIMEOUT) -> list[Received]:
        async with asyncio.timeout(timeout):
            return [await self.next_message(timeout) for _ in range(count)]

    def kill(self) -> None:
        """SIGKILL: the socket is closed by the kernel, with no DISCONNECT."""
        if self.process.returncode is None:
            self.process.kill()

    async def close(self) -> None:
        self.kill()
        await self.process.wait()


async def mosquitto_pub(port: int, *args: str, timeout: float = TIMEOUT) -> tuple[int, str]:
    """Run ``mosquitto_pub`` to completion: (exit status, its output)."""
    process = await asyncio.create_subprocess_exec(
        "mosquitto_pub",
        "-h",
        HOST,
        "-p",
        str(port),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(process.communicate(), timeout)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    assert process.returncode is not None
    return process.returncode, out.decode(errors="replace")


# -- the node ---------------------------------------------------------------------------------


# -- bookkeeping ----------------------------------------------------------------------------


class Clients:
    """Opens connected clients of every library and closes what a test leaves open."""

    def __init__(self) -> None:
        self._stack = contextlib.AsyncExitStack()

    async def paho(self, port: int, client_id: str = "", **options: Any) -> PahoClient:
        client = PahoClient(port, client_id, **options)
        self._stack.push_async_callback(client.close)
        await client.connect()
        return client

    async def aiomqtt(
        self, port: int, client_id: str | None = None, **options: Any
    ) -> aiomqtt.Client:
        client = aiomqtt.Client(HOST, port, identifier=client_id, timeout=TIMEOUT, **options)
        return await self._stack.enter_async_context(client)

    async def amqtt(
        self, port: int, client_id: str | None = None, *, clean_session: bool = True
    ) -> MQTTClient:
        client = MQTTClient(client_id, {"auto_reconnect": False, "keep_alive": 60})
        await asyncio.wait_for(client.connect(f"mqtt://{HOST}:{port}/", clean_session), TIMEOUT)
        self._stack.push_async_callback(_quietly, client.disconnect)
        return client

    async def mosquitto_sub(self, port: int, *filters: str, **options: Any) -> MosquittoSub:
        sub = await MosquittoSub.start(port, *filters, **options)
        self._stack.push_async_callback(sub.close)
        return sub

    async def aclose(self) -> None:
        await self._stack.aclose()


async def _quietly(close: Any) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(close(), 5)
