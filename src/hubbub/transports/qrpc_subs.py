"""Durable qpubs subscriptions over one qrpc connection (protocols/qpubs.md §4, §6): the calls
``createSubscription``, ``openSubscription``, ``closeSubscription``, ``deleteSubscription`` and ``ack`` on
the core's :class:`~hubbub.core.ConsumerService`.

Every call gives the connection's identity to the service, which checks the permission and the ownership
(``Access.check_consumer``, the rule every dialect's consumers follow) and answers a refusal with
``AuthError`` 4102, ``EPERM`` here. Each open ``openSubscription`` call is one
:class:`~hubbub.core.Opener`: its batches go out as stream items
``{"subId","batch","items":[{"pos","topic","value"},…]}`` of that call, and the call ends without data when
it is closed, deleted (from any connection) or the server shuts down. Batches and results are queued as
replies, never as events: a slow reader is not let to lose a batch (it is closed instead, and the batch goes
back to pending).

Concurrency contract: everything runs on the event loop thread, one call at a time per connection.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hubbub.auth import Identity
from hubbub.core.api import Batch, ConsumerService, Opener
from hubbub.dialects import qpubs as qpd
from hubbub.log.consumers import ConsumerSpec

from .qpubs_common import DIALECT

if TYPE_CHECKING:
    from .qrpc import QrpcWire

__all__ = ["QrpcSubscriptions", "render_batch"]


def render_batch(call_id: str, batch: Batch, separator: str) -> bytes:
    """One batch as a stream item of the ``openSubscription`` call ``call_id``: every item (opening the
    subscription took the read permission over all it journals)."""
    items = [{"pos": it.pos, **qpd.render_item(it.event, separator)} for it in batch.items]
    return qpd.render_stream_item(call_id, {"subId": batch.consumer, "batch": batch.number, "items": items})


def _bad_topic() -> qpd.QpubsError:
    return qpd.QpubsError("bad topic, expected string", "EBADTOPIC")


class QrpcSubscriptions:
    """One connection's durable-subscription calls and its open ones (call id → opener)."""

    def __init__(self, wire: QrpcWire) -> None:
        self.wire = wire
        self.openers: dict[str, Opener] = {}

    @property
    def _consumers(self) -> ConsumerService:
        c = self.wire.service.consumers
        assert c is not None
        return c

    def _spec(self, sub_id: str, topic: qpd.Topic) -> ConsumerSpec:
        s = self.wire.service.settings
        return ConsumerSpec(
            name=sub_id,
            pattern=topic.text,
            syntax=qpd.TOPIC_SYNTAX,
            separator=s.separator,
            batch_wait_ms=s.batch_wait_ms,
            batch_bytes=s.batch_bytes,
        )

    @property
    def _identity(self) -> Identity | None:
        return self.wire.session.identity

    async def create(self, out: qpd.CreateSubscription) -> None:
        spec = self._spec(out.sub_id, out.topic)
        _, created = await self._consumers.create(spec, identity=self._identity, dialect=DIALECT)
        self.wire.reply(out.call_id, {"ok": True, "subId": out.sub_id, "created": created})

    async def open(self, out: qpd.OpenSubscription) -> None:
        consumers = self._consumers
        sub_id, cid = out.sub_id, out.call_id
        if out.delete:
            found = await consumers.delete(sub_id, identity=self._identity, dialect=DIALECT)
            self.wire.reply(cid, {"ok": True, "subId": sub_id, "deleted": found})
            return
        # (On a cluster it may be another node's, created since this node last read the consumers.)
        exists = await consumers.find(sub_id) is not None
        if not exists and not out.create:
            raise qpd.QpubsError(f"{sub_id}: not found, may not create", "ENOENT", 404)
        if not exists and out.topic is None:
            raise _bad_topic()
        spec = None if out.topic is None else self._spec(sub_id, out.topic)
        wire = self.wire
        sep = wire.service.settings.separator

        def on_batch(batch: Batch) -> None:
            wire.session.push(render_batch(cid, batch, sep))

        def on_close(reason: str) -> None:
            if self.openers.pop(cid, None) is not None:
                wire.end_call(cid)

        opener = await consumers.open(
            sub_id,
            on_batch,
            on_close,
            spec=spec,
            create=out.create,
            reuse=out.reuse,
            shared=out.shared,
            identity=self._identity,
            session=wire.session,
            dialect=DIALECT,
        )
        if wire.done:  # the connection went while the open was under way
            opener.close()
            return
        self.openers[cid] = opener

    async def close(self, out: qpd.CloseSubscription) -> None:
        consumers = self._consumers
        if not out.closes and consumers.info(out.sub_id) is None:
            raise qpd.QpubsError(f"{out.sub_id}: not found", "ENOENT", 404)
        for cid in out.closes:
            opener = self.openers.pop(cid, None)
            if opener is not None:
                opener.close()
            self.wire.end_call(cid)
        if out.delete:
            await consumers.delete(out.sub_id, identity=self._identity, dialect=DIALECT)
        self.wire.reply(out.call_id, {"ok": True, "subId": out.sub_id})

    async def delete(self, out: qpd.DeleteSubscription) -> None:
        found = await self._consumers.delete(out.sub_id, identity=self._identity, dialect=DIALECT)
        self.wire.reply(out.call_id, {"ok": True, "subId": out.sub_id, "deleted": found})

    async def ack(self, out: qpd.Ack) -> None:
        sub_id = out.sub_id
        opener = next((o for o in self.openers.values() if o.name == sub_id and o.batch == out.batch), None)
        if opener is None:
            if self._consumers.info(sub_id) is None:
                raise qpd.QpubsError(f"{sub_id}: not found", "ENOENT", 404)
            raise qpd.QpubsError(f"{sub_id}: unknown batch {out.batch}", "EBATCH")
        if out.nack:
            await opener.nack(out.batch)
        else:
            await opener.ack(out.batch)
        self.wire.reply(out.call_id, {"ok": True})

    def close_all(self) -> None:
        """The connection ended: every opener's outstanding batch goes back to pending."""
        openers, self.openers = self.openers, {}
        for o in openers.values():
            o.close()
