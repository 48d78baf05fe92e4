"""Durable consumers over a native connection (docs/native.md "Durable consumers"): the consumer ops become
:class:`~hubbub.core.ConsumerService` calls, and each batch the service hands out becomes a ``deliver`` push
on the connection's session.

The protocol decisions (which ops a connection may give for which consumer, the frames) are the dialect's
(:class:`hubbub.dialects.native.ConsumerTable`, ``NativeCodec.encode_deliver``); this is the wiring. The
permission and ownership checks are the core's, made by the consumer service with the connection's
identity (``Access.check_consumer``), as for every dialect.

Concurrency contract: one object per connection, created with the connection's first consumer op, called
from the event loop thread only.
"""

from __future__ import annotations

from hubbub.channels import Pattern
from hubbub.core.api import Batch, Core, Opener, Session
from hubbub.dialects import native as nc
from hubbub.errors import ShuttingDown, UnknownBatch
from hubbub.log.consumers import DEFAULT_BATCH_BYTES, DEFAULT_BATCH_WAIT_MS, ConsumerInfo, ConsumerSpec

__all__ = ["CONSUMER_COMMANDS", "NativeConsumers"]

#: The commands :meth:`NativeConsumers.handle` takes.
CONSUMER_COMMANDS = (nc.ConsumerCreate, nc.Consume, nc.Unconsume, nc.ConsumerDelete, nc.Ack, nc.Nack)

_DIALECT = "native"


class NativeConsumers:
    """The consumers one native connection holds."""

    __slots__ = ("_ended", "codec", "node", "session", "table")

    def __init__(self, node: Core, session: Session, codec: nc.NativeCodec, max_consumers: int) -> None:
        self.node = node
        self.session = session
        self.codec = codec
        self.table: nc.ConsumerTable[Opener] = nc.ConsumerTable(max_consumers)
        self._ended = False

    async def handle(self, cmd: nc.Command) -> None:
        """One consumer op; raises ``HubbubError`` for the connection to answer (consumer errors 4204-4207,
        permission 4102, bad pattern 4004, storage 4301)."""
        svc = self.node.consumers
        if svc is None or self._ended:
            raise ShuttingDown()
        codec, push = self.codec, self.session.push
        if isinstance(cmd, nc.Ack | nc.Nack):
            opener = self.table.get(cmd.consumer)
            if opener is None:
                raise UnknownBatch(f"{cmd.consumer}: not consumed on this connection")
            if isinstance(cmd, nc.Ack):
                await opener.ack(cmd.batch)
            else:
                await opener.nack(cmd.batch)
            push(codec.encode_reply(cmd.id, {}))
        elif isinstance(cmd, nc.Consume):
            await self._consume(cmd)
        elif isinstance(cmd, nc.Unconsume):
            held = self.table.drop(cmd.consumer)
            if held is not None:
                held.close()
            push(codec.encode_reply(cmd.id, {}))
        elif isinstance(cmd, nc.ConsumerCreate):
            spec = self._spec(cmd, cmd.pattern)
            made, created = await svc.create(spec, identity=self.session.identity, dialect=_DIALECT)
            push(codec.encode_reply(cmd.id, self._described(made, created)))
        elif isinstance(cmd, nc.ConsumerDelete):
            found = await svc.delete(cmd.consumer, identity=self.session.identity, dialect=_DIALECT)
            push(codec.encode_reply(cmd.id, {"consumer": cmd.consumer, "deleted": found}))

    async def _consume(self, cmd: nc.Consume) -> None:
        svc = self.node.consumers
        assert svc is not None
        name = cmd.consumer
        self.table.check_open(name)
        existing = await svc.find(name)  # on a cluster, maybe another node's, created since it last looked
        spec = None
        if cmd.create and cmd.pattern is not None:
            spec = self._spec(cmd, cmd.pattern)
        codec, session = self.codec, self.session
        holder: list[Opener] = []

        def on_batch(batch: Batch) -> None:
            session.push(codec.encode_deliver(name, batch.number, batch.items))

        def on_close(reason: str) -> None:
            if holder and self.table.drop(name, holder[0]) is not None:
                session.push(codec.encode_push("consumer_closed", consumer=name, reason=reason))

        before = existing is None
        # The store's counts (the service's copy of a definition keeps those of its creation), read before
        # the open: once open, batches may go out, and the reply must come first.
        current = None if before else next((i for i in await svc.consumers() if i.spec.name == name), None)
        opener = await svc.open(
            name,
            on_batch,
            on_close,
            spec=spec,
            create=cmd.create,
            reuse=cmd.reuse,
            shared=cmd.shared,
            batch_max=cmd.max,
            # A deliver frame must fit the connection's send queue, whatever batch_bytes the consumer has
            # (a frame far over it would close the connection as a slow consumer, again at every retry).
            bytes_max=max(session.max_bytes // 3, 1),
            identity=session.identity,
            session=session,
            dialect=_DIALECT,
        )
        if self._ended or session.closed:
            opener.close()  # the connection ended while the consumer was being created
            return
        holder.append(opener)
        self.table.opened(name, opener)
        info = current or svc.info(name)
        fields = self._described(info, before and info is not None) if info is not None else {}
        fields["shared"] = opener.shared
        session.push(codec.encode_reply(cmd.id, fields))

    def close(self) -> None:
        """The connection ended: every consumer it holds is closed; their batches are redelivered."""
        self._ended = True
        for opener in self.table.drain():
            opener.close()

    # -- helpers ----------------------------------------------------------------------------------------

    def _spec(self, cmd: nc.ConsumerCreate | nc.Consume, pattern: Pattern) -> ConsumerSpec:
        wait, size = cmd.batch_wait_ms, cmd.batch_bytes
        return ConsumerSpec(
            cmd.consumer,
            pattern.text,
            tags=cmd.tags,
            shared=bool(cmd.shared),
            batch_wait_ms=DEFAULT_BATCH_WAIT_MS if wait is None else wait,
            batch_bytes=DEFAULT_BATCH_BYTES if size is None else size,
        )

    @staticmethod
    def _described(info: ConsumerInfo, created: bool) -> dict[str, object]:
        s = info.spec
        return {
            "consumer": s.name,
            "created": created,
            "pattern": s.pattern,
            "syntax": s.syntax,
            "tags": list(s.tags),
            "shared": s.shared,
            "batch_wait_ms": s.batch_wait_ms,
            "batch_bytes": s.batch_bytes,
            "pending": info.pending,
        }
