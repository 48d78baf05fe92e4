"""The durable consumers a node knows, and who may define and delete them: a part of
:class:`~hubbub.core.ConsumerService` (docs/consumers.md "Definition", "Permissions").

:class:`Catalog` keeps the service's maps of consumers (by name and by the store's id), creates consumers in
the store and deletes them, and takes up or drops those another node created or deleted (for
:mod:`.consumer_shared`). Creating and deleting go through the access rule every dialect shares
(``Access.check_consumer``) with the caller's identity: a dialect hands the identity over and never checks
for itself. The creator's user is recorded as the consumer's owner; with auth on, only an identity with a
user (or an admin) creates one, so two tokens without a user never share a consumer as its owners.

Concurrency contract: loop thread only; store writes go through the node's write batcher (``control``).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import replace
from typing import Any

from hubbub.auth import Identity
from hubbub.errors import ConsumerExists, ConsumerNotFound, TooManyConsumers
from hubbub.log.consumers import ConsumerInfo, ConsumerSpec, check_spec

from .consumer_delivery import Delivery
from .consumer_shared import SharedJournal
from .consumer_state import ConsumerState, Opener
from .node import Node

__all__ = ["Catalog"]


def _admit(
    spec: ConsumerSpec, node: Node, cap: int, known: dict[str, Any], creating: int, dialect: str
) -> None:
    """Check ``spec``; refuse a new consumer when ``limits.max_consumers`` (``cap``; 0: no limit) are
    ``known`` or being created already, counting the refusal for ``dialect``. Raises ``BadRequest``,
    ``BadChannel``, ``TooManyConsumers``."""
    check_spec(spec)
    if cap and spec.name not in known and len(known) + creating >= cap:
        node.limiter.refused("max_consumers", dialect)
        raise TooManyConsumers(
            f"too many durable consumers (limits.max_consumers = {cap}); delete unused ones"
        )


class Catalog:
    """See the module docstring. ``by_name``/``by_id`` are the service's maps, which the other parts read
    (shared, not copied); ``close_opener(opener, reason)`` closes an opener and tells its holder. It makes the
    service's :class:`~.consumer_shared.SharedJournal` (``shared``), which takes up and drops consumers
    through it."""

    def __init__(
        self,
        node: Node,
        by_name: dict[str, ConsumerState],
        by_id: dict[int, ConsumerState],
        delivery: Delivery,
        spawn: Callable[[Coroutine[Any, Any, None], str], None],
        close_opener: Callable[[Opener, str], None],
        max_consumers: int,
        poll_s: float,
    ) -> None:
        self._node = node
        self.by_name = by_name
        self.by_id = by_id
        self._delivery = delivery
        self._close_opener = close_opener
        self._max_consumers = max_consumers  # checked against the consumers this node knows of
        #: How this node learns of the consumers other nodes create and delete (on a shared log).
        self.shared = self._shared = SharedJournal(
            node, by_name, by_id, delivery, spawn, self.add, self.forget, poll_s
        )

    def add(self, info: ConsumerInfo, *, new: bool = False) -> ConsumerState:
        """Take up a consumer the store has (``new``: just created, nothing journaled yet)."""
        c = ConsumerState(info)
        self.by_name[info.spec.name] = self.by_id[info.id] = c
        self._shared.index.add(c.id, c.spec)
        self._delivery.adopt(c, new=new)
        return c

    def forget(self, c: ConsumerState, reason: str) -> None:
        """Drop a consumer the store no longer has; its openers are closed with ``reason``."""
        c.deleted = True
        self._delivery.held.forget(c)
        self._shared.index.remove(c.id)
        for o in list(c.openers):
            self._close_opener(o, reason)
        if c.timer is not None:
            c.timer.cancel()
        if self.by_name.get(c.spec.name) is c:
            del self.by_name[c.spec.name]
        self.by_id.pop(c.id, None)

    async def create(
        self, spec: ConsumerSpec, identity: Identity | None, dialect: str
    ) -> tuple[ConsumerInfo, bool]:
        """:meth:`ConsumerService.create`: ``identity`` must be allowed to create ``spec`` (use it, with a
        user to own it) and, when the consumer exists, to use the one that exists (whose definition the
        caller then learns and may open). Nothing is created for a refused one."""
        access = self._node.access
        if identity is not None:
            spec = replace(spec, owner=identity.user)
        _admit(spec, self._node, self._max_consumers, self.by_name, self._delivery.creating, dialect)
        access.check_consumer(identity, spec, dialect, create=True)
        self._delivery.creating += 1
        try:
            info, created = await self._node._batcher.control(lambda st: st.consumer_create(spec))
        finally:
            self._delivery.creating -= 1
        c = self.by_name.get(info.spec.name)
        if c is None or c.id != info.id:
            if c is not None:  # deleted and created again meanwhile
                self.forget(c, "deleted")
            c = self.add(info, new=created)
        if not created:
            access.check_consumer(identity, info.spec, dialect)
        return c.info, created

    async def delete(self, name: str, identity: Identity | None, dialect: str) -> bool:
        """:meth:`ConsumerService.delete`: ``identity`` must be allowed to manage the consumer (use it, and
        own it, or be admin); nothing is deleted for a refused one.

        The check is made here, on the loop, against the consumer as this node knows it, and the delete is
        applied later on the writer thread: it deletes that consumer only, by its id (never reused), so a
        consumer deleted and created again under the name meanwhile (another owner's, perhaps) is kept and
        the answer is False, as for a name nobody has; a name this node does not know deletes nothing."""
        c = self.by_name.get(name) or await self._shared.find(name)
        if c is None:
            return False
        self._node.access.check_consumer(identity, c.spec, dialect, manage=True)
        cid = c.id
        found: bool = await self._node._batcher.control(lambda st: st.consumer_delete(name, cid))
        # Deleted now, or before by another caller: either way the store no longer has it.
        if self.by_id.get(cid) is c:
            self.forget(c, "deleted")
        return found

    async def to_open(
        self, name: str, spec: ConsumerSpec | None, reuse: bool, identity: Identity | None, dialect: str
    ) -> ConsumerState:
        """The consumer :meth:`ConsumerService.open` opens: ``name``, or one created from ``spec`` (None: may
        not create, :class:`ConsumerNotFound`); :class:`ConsumerExists` for one that exists unless
        ``reuse``. ``identity`` must be allowed to use it, as for :meth:`create`."""
        c = self.by_name.get(name) or await self._shared.find(name)
        if c is None:
            if spec is None:
                raise ConsumerNotFound(f"{name}: not found")
            if spec.name != name:
                raise ValueError("spec.name differs from name")
            _, created = await self.create(spec, identity, dialect)
            if not created and not reuse:
                raise ConsumerExists(f"{name}: exists, may not reuse")
            c = self.by_name.get(name)
            if c is None:
                raise ConsumerNotFound(f"{name}: not found")
            return c
        self._node.access.check_consumer(identity, c.spec, dialect)
        if not reuse:
            raise ConsumerExists(f"{name}: exists, may not reuse")
        return c
