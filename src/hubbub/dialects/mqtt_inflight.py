"""The packet identifiers of an MQTT connection's QoS 1 and 2 deliveries (§4.3, §4.4): the outbound window.

:class:`Outbound` gives each QoS 1 or 2 PUBLISH the server sends a free packet identifier and keeps the
packet until the client's acknowledgement: PUBACK ends a QoS 1 delivery; PUBREC moves a QoS 2 delivery to
its release (the server answers PUBREL and keeps only the identifier), PUBCOMP ends it.
:meth:`Outbound.resend` gives what a reconnecting session's client must get again: every unacknowledged
PUBLISH with DUP set, and every PUBREL not yet completed [MQTT-4.4.0-1].

Invariants: at most ``max_inflight`` deliveries are unacknowledged (:meth:`Outbound.add` returns None when
the window is full: the caller ends the connection as a slow consumer, or keeps the event for later); an
identifier is in use by one delivery at a time; acknowledgements of identifiers not in use are ignored.

Concurrency contract: an :class:`Outbound` belongs to one MQTT session and is called from one thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from .mqtt_codec import PUBACK, PUBCOMP, PUBREC, PUBREL, encode_ack, encode_publish

__all__ = ["DEFAULT_MAX_INFLIGHT", "Outbound"]

#: The default bound of unacknowledged deliveries per connection.
DEFAULT_MAX_INFLIGHT: Final = 1024


@dataclass(slots=True)
class _Delivery:
    qos: int
    #: The PUBLISH as first sent (None once PUBREC came: only the PUBREL is owed).
    packet: bytes | None


class Outbound:
    """See the module docstring."""

    __slots__ = ("_inflight", "_next", "max_inflight")

    def __init__(self, max_inflight: int = DEFAULT_MAX_INFLIGHT) -> None:
        self.max_inflight = min(max_inflight, 65_535)
        self._next = 1
        self._inflight: dict[int, _Delivery] = {}

    def __len__(self) -> int:
        return len(self._inflight)

    @property
    def full(self) -> bool:
        return len(self._inflight) >= self.max_inflight

    def add(
        self, head: bytes, payload: bytes, qos: int, retain: bool = False, dup: bool = False
    ) -> bytes | None:
        """The PUBLISH of a QoS 1 or 2 delivery (``head`` the topic field; ``dup`` for a message delivered
        before, by an earlier connection of the session), with a fresh identifier; None when the window is
        full."""
        if self.full:
            return None
        pid = self._next
        while pid in self._inflight:
            pid = pid % 65_535 + 1
        self._next = pid % 65_535 + 1
        packet = encode_publish(head, payload, qos, retain, dup, pid)
        self._inflight[pid] = _Delivery(qos, packet)
        return packet

    @property
    def next_id(self) -> int:
        """The identifier the next delivery gets, if free (a caller may key its own records by it)."""
        pid = self._next
        while pid in self._inflight:
            pid = pid % 65_535 + 1
        return pid

    def acked(self, kind: int, packet_id: int) -> tuple[bytes | None, bool]:
        """The client's PUBACK, PUBREC or PUBCOMP of ``packet_id``: the PUBREL to send for a PUBREC (else
        None), and whether the delivery is complete (its identifier free again)."""
        d = self._inflight.get(packet_id)
        if d is None:
            return (encode_ack(PUBREL, packet_id) if kind == PUBREC else None), False
        if (kind == PUBACK and d.qos == 1) or (kind == PUBCOMP and d.qos == 2 and d.packet is None):
            del self._inflight[packet_id]
            return None, True
        if kind == PUBREC and d.qos == 2:
            d.packet = None
            return encode_ack(PUBREL, packet_id), False
        return None, False

    def resend(self) -> list[bytes]:
        """Every unacknowledged delivery again, in the order first sent: a PUBLISH with DUP set, or a
        PUBREL."""
        out: list[bytes] = []
        for pid, d in self._inflight.items():
            if d.packet is None:
                out.append(encode_ack(PUBREL, pid))
            else:
                out.append(bytes((d.packet[0] | 0x08,)) + d.packet[1:])
        return out
