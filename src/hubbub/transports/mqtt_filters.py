"""One MQTT connection's SUBSCRIBE and UNSUBSCRIBE (docs/dialects/mqtt.md "Auth", "Retained messages",
"Sessions"): which filters the token may have, live core subscriptions or a persistent session's consumers,
the SUBACK, and the retained messages after it.

Concurrency contract: everything runs on the event loop thread, one packet at a time per connection (its
wire's actions are carried out in order).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from hubbub.dialects import actions as a
from hubbub.dialects import mqtt as mq
from hubbub.errors import SubscriptionError

from .mqtt_retained import RetainedMessage, read_retained

if TYPE_CHECKING:
    from .mqtt import MqttWire

__all__ = ["MqttFilters"]


def _came_live(m: RetainedMessage, seen: dict[str, tuple[str, int]]) -> bool:
    """Whether ``m``'s event, or a later one of its channel, was rendered for the connection once its filters
    were registered (the retained index is written after the commit whose fan-out rendered it)."""
    live = seen.get(m.event.channel)
    return live is not None and live[0] == m.event.epoch and live[1] >= m.event.seq


class MqttFilters:
    """The subscriptions of one connection (``wire``)."""

    __slots__ = ("wire",)

    def __init__(self, wire: MqttWire) -> None:
        self.wire = wire

    async def subscribe(self, cmd: mq.MqttSubscribe) -> None:
        """A SUBSCRIBE: each filter the token may read whole, held live or by the persistent session; the
        SUBACK (0x80 for the others), then the retained messages."""
        conn, access, ident = self.wire.conn, self.wire.node.access, self.wire.session.identity
        # A filter is granted when the token may read every topic it matches (as MQTT brokers' ACLs check
        # the filter itself); hubbub's partial reads, with the rest skipped, are native's.
        allowed = [
            f for f in cmd.filters if f.pattern is not None and access.visibility(ident, f.pattern) is None
        ]
        # Read before the filters are registered, and again after (unchanged ones are not read twice): what
        # the first read found goes out right after the SUBACK, ahead of live messages, and what changed
        # meanwhile (on any node) is not missed.
        node, index = self.wire.node, self.wire.service.retained
        first = await read_retained(node, index, allowed)
        # From the registration on, the events rendered for this connection are noted: a retained message
        # the second read finds that came live meanwhile is not sent again.
        seen = conn.rendered = {}
        try:
            if self.wire.durable is not None:
                durable = dict(zip(allowed, await self.wire.durable.subscribe(allowed), strict=True))
                held = [durable.get(f, False) for f in cmd.filters]
            else:
                held = await self._live(cmd, allowed)
            self.wire.emit(conn.subscribed(cmd, held))
            granted = [f for f, ok in zip(cmd.filters, held, strict=True) if ok]
            if granted:
                # Queued with the SUBACK, in the same step: a live message published once the client has its
                # SUBACK comes after them (it did not while the second read was awaited first).
                self._send_retained(first.values(), granted)
                again = await read_retained(node, index, granted, first)
                changed = [m for ch, m in again.items() if first.get(ch) is not m and not _came_live(m, seen)]
                self._send_retained(changed, granted)
        finally:
            conn.rendered = None

    async def _live(self, cmd: mq.MqttSubscribe, allowed: list[mq.FilterRequest]) -> list[bool]:
        """A live core subscription per new filter, its id the filter; which of ``cmd``'s filters are held."""
        conn = self.wire.conn
        new = [f for f in allowed if f.topic_filter not in conn.subscriptions]
        # Held before the core registers them: an event committed in between is delivered, not dropped.
        for f in new:
            conn.subscriptions[f.topic_filter] = f.qos
        subs = [a.Subscribe(f.topic_filter, f.pattern) for f in new if f.pattern is not None]
        results = dict(zip((s.sub for s in subs), await self.wire.wire.subscribe(subs), strict=True))
        held: list[bool] = []
        for f in cmd.filters:
            exc = results.get(f.topic_filter)
            ok = f in allowed and (exc is None or isinstance(exc, SubscriptionError))
            if not ok:
                conn.subscriptions.pop(f.topic_filter, None)
            held.append(ok)
        return held

    def _send_retained(self, msgs: Iterable[RetainedMessage], granted: Sequence[mq.FilterRequest]) -> None:
        """Queue the retained messages read [MQTT-3.3.1-6] that a granted filter matches, with the retain
        flag, at the highest QoS granted."""
        for m in msgs:
            ev = m.event
            ch = ev.channel
            qos = [
                f.qos
                for f in granted
                if f.pattern is not None and f.pattern.matches(ch) and mq.filter_applies(f.topic_filter, ch)
            ]
            topic = mq.channel_topic(ev.channel)
            if not qos or topic is None or self.wire.done:
                continue
            head, q = mq.publish_head(topic), min(max(qos), mq.event_qos(ev.headers))
            packet = (
                mq.encode_publish(head, ev.payload, 0, True)
                if q == 0
                else self.wire.qos_packet(head, ev.payload, q, True)
            )
            if packet:
                self.wire.session.push(packet, is_event=True)

    async def unsubscribe(self, out: a.Unsubscribe) -> None:
        """A filter the connection held is gone (a persistent session's consumer is deleted)."""
        if self.wire.durable is not None:
            await self.wire.durable.unsubscribe(out.sub)
            return
        with contextlib.suppress(SubscriptionError):  # gone with a detach meanwhile
            self.wire.node.unsubscribe(self.wire.session, out.sub)
