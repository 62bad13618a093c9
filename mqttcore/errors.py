"""The protocol error family.

Every violation of MQTT 3.1.1 that the decoder or the channel detects is raised as a subclass of
:class:`ProtocolError`.  The exception carries what the server answers on the wire, so exactly
one place (the channel's error handler) turns errors into replies:

* ``connack_code`` set and the connection still awaiting CONNECT: send CONNACK with that code,
  then close (3.2.2.3);
* otherwise: close the network connection without a reply, which is the only reaction MQTT 3.1.1
  allows for a malformed packet or a protocol violation [MQTT-4.8.0-1].

Messages cite the normative statement, e.g. ``"[MQTT-3.3.2-2] topic name must not contain
wildcards"``.
"""

from __future__ import annotations


class ProtocolError(Exception):
    """A violation of MQTT 3.1.1 by the client: the connection is closed."""

    connack_code: int | None = None

    def __init__(self, spec_id: str, detail: str) -> None:
        super().__init__(f"[{spec_id}] {detail}")
        self.spec_id = spec_id
        self.detail = detail


class MalformedPacket(ProtocolError):
    """Bytes that do not form a valid MQTT 3.1.1 control packet."""


class PacketTooLarge(MalformedPacket):
    """A remaining length above the configured maximum packet size; the body is never buffered."""


class ConnectRefused(ProtocolError):
    """A CONNECT the server answers with a non-zero CONNACK return code, then closes."""

    def __init__(self, connack_code: int, spec_id: str, detail: str) -> None:
        super().__init__(spec_id, detail)
        self.connack_code = connack_code
