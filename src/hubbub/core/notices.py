"""Notices: short messages between the processes that serve one log, for state that is no event.

A node made of several processes (the workers of ``serve --workers N``, the nodes of a cluster) delivers
every committed event in each of them; a few things that happen in one process must be known in the others
without being events: MQTT's takeover of a client id, which closes the connection of that id wherever it
is. :class:`Notices` is that channel: a component :meth:`watches <Notices.watch>` a topic and
:meth:`sends <Notices.send>` on it; the node's relay (the Redis broker of a cluster, the worker's relay of a
multi-worker node) carries what is sent to every other process and hands what they send to
:meth:`Notices.received`. A single process has no relay: a notice goes nowhere (the sender handles its own
process itself).

Delivery is at most once and unordered between senders (Redis pub/sub, the owner's sockets): a notice is a
hint to act on now, never the record of anything; what must survive is kept in the log (its state maps).

Concurrency contract: every method is called on the event loop; watchers run on it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

__all__ = ["NoticeSender", "Notices"]

log = logging.getLogger("hubbub.node")

#: What a relay offers: send ``(topic, data)`` to every other process of the node or cluster.
NoticeSender = Callable[[str, bytes], None]


class Notices:
    """See the module docstring."""

    def __init__(self) -> None:
        self._watchers: dict[str, list[Callable[[bytes], None]]] = {}
        self._sender: NoticeSender | None = None
        self.sent = 0
        self.received_count = 0

    def connect(self, sender: NoticeSender | None) -> None:
        """The relay's sender from now on (None: the relay is gone)."""
        self._sender = sender

    @property
    def shared(self) -> bool:
        """Whether other processes serve this log (a relay carries notices to them)."""
        return self._sender is not None

    def watch(self, topic: str, fn: Callable[[bytes], None]) -> Callable[[], None]:
        """Call ``fn(data)`` for every notice on ``topic`` from another process; returns the unwatch."""
        fns = self._watchers.setdefault(topic, [])
        fns.append(fn)

        def unwatch() -> None:
            if fn in fns:
                fns.remove(fn)

        return unwatch

    def send(self, topic: str, data: bytes) -> None:
        """Send ``data`` on ``topic`` to every other process (nothing without a relay)."""
        if self._sender is not None:
            self.sent += 1
            self._sender(topic, data)

    def received(self, topic: str, data: bytes) -> None:
        """A notice from another process (the relay's, on the loop): to each watcher of ``topic``; one that
        fails is logged, the others still run."""
        self.received_count += 1
        for fn in list(self._watchers.get(topic, ())):
            try:
                fn(data)
            except Exception:
                log.exception("a notice watcher failed", extra={"topic": topic})
