"""WearScript's hub across the processes of one node (``serve --workers N``): one hub to every device.

Each worker holds its own connections; what a device sees of the hub must not depend on the worker the
kernel gave it (protocols/wearscript.md §3). :class:`HubPeers` tells the other workers, through the node's
notices (``core/notices.py``, carried by the parent), what the hub of this worker learns, and keeps what they
tell in the hub (:meth:`~hubbub.dialects.wearscript.WearscriptHub.remote_announce`):

* a device list announced here (after the connection's core subscriptions exist, as for this worker's own
  connections) and a connection's departure: every other worker forwards the ``subscriptions`` frames to its
  connections, and its greetings and ``channelsExternal`` list them;
* the names this worker advertises for other dialects' subscriptions (the hub list, §3): every worker's
  hub list is the union;
* a test-handler reply (§5) to connections of other workers that listen to its channel.

When a worker joins (a new or restarted process) every worker sends it its devices and advertised names;
when one is gone (killed, crashed: the parent tells, ``notices.gone``) its connections' departures go out
as when a connection closes, and its names leave the hub list. All of it is eventually consistent: a notice
takes one hop through the parent (tens of microseconds), so a device that connects to another worker in the
instant after a list was announced may miss it in its greeting (it gets the forwarded frame instead, as a
device already connected does). A cluster of nodes (Redis) is not served by this: its notices carry no
membership (``Notices.me`` is empty), so each node's hub keeps its own connections (docs/cluster.md).

Messages (msgpack, topic :data:`TOPIC`), each with the sending process's id: ``["a", p, cid, since, gd,
names]`` (announce, with the time the connection arrived, which orders greetings across processes; names
empty: the device is removed), ``["d", p, cid]`` (departure), ``["f", p, names]`` (advertised names, all of
them), ``["r", p, frame, channel]`` (a reply), ``["s", p]`` (a process's service has started: tell it your
state, which it missed if you told it when it said hello).

A new connection's greeting waits for every other process's current devices and names (:meth:`HubPeers.sync`,
a question to each: ``Notices.ask``, one round trip through the parent), so that it lists what any device
or subscription anywhere on the node announced before the connection came; until it is greeted, a
connection is sent nothing else (its greeting, computed after, holds every change made meanwhile). A
process that answers after the greeting's wait is still heard: its devices then go out as forwarded frames
(the hub converges; it never keeps missing that process's devices until they change).

Concurrency contract: everything runs on the event loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgpack

from hubbub.dialects import wearscript as wsd

if TYPE_CHECKING:
    from .wearscript import WearscriptService

__all__ = ["TOPIC", "HubPeers"]

log = logging.getLogger("hubbub.wearscript")

#: The notice topic of the hub's state between the processes of a node.
TOPIC = "wearscript.hub"
#: The question for a process's devices and names (answer: ``[p, [[cid, since, gd, names], ...], names]``).
STATE = "wearscript.state"
#: How long a greeting waits for the other processes' state (``Notices.ask``'s default; an answer that
#: comes later still counts).
SYNC_WAIT_S = 1.0


class HubPeers:
    """See the module docstring. ``service``: this process's WearScript service (its hub and connections)."""

    def __init__(self, service: WearscriptService) -> None:
        self.service = service
        self.hub = service.hub
        self.notices = service.node.notices
        #: Lists announced by a connection and not yet told (waiting for its core subscriptions).
        self._pending: dict[int, list[tuple[str, list[str]]]] = {}
        self._names_sent: frozenset[str] = frozenset()
        self.hub.observer = self._local_changed
        self._unwatch: list[Callable[[], None]] = [
            self.notices.watch(TOPIC, self._received),
            self.notices.watch_peers(self._peer),
            self.notices.answer(STATE, self._state),
        ]
        if self._me:  # the others' state, which they told when this process said hello, before this service
            self._send(["s", self._me])

    def close(self) -> None:
        for unwatch in self._unwatch:
            unwatch()
        self.hub.observer = None

    @property
    def _me(self) -> str:
        """This process's id among the node's processes ("" without peers: nothing is sent)."""
        return self.notices.me

    def _send(self, msg: list[Any]) -> None:
        self.notices.send(TOPIC, msgpack.packb(msg))

    # -- this process's changes -----------------------------------------------------------------------

    def _local_changed(self, cid: int, gd: str, names: list[str] | None) -> None:
        me = self._me
        if not me:
            return
        if names is None:
            self._pending.pop(cid, None)
            self._send(["d", me, cid])
        else:
            self._pending.setdefault(cid, []).append((gd, names))

    def subscribed(self, cid: int) -> None:
        """Connection ``cid``'s core subscriptions follow its lists now: tell its announcements."""
        me = self._me
        for gd, names in self._pending.pop(cid, ()):
            self._send(["a", me, cid, self.hub.since(cid), gd, names])

    def names_changed(self) -> None:
        """This process's advertised names may have changed: tell them when they did."""
        me = self._me
        names = self.hub.local_foreign()
        if me and names != self._names_sent:
            self._names_sent = names
            self._send(["f", me, sorted(names)])

    def reply(self, out: wsd.Forward) -> None:
        """A test-handler reply that also matches other processes' connections."""
        me = self._me
        if me and out.reply is not None:
            self._send(["r", me, out.data, out.reply])

    # -- the other processes' -------------------------------------------------------------------------

    def _peer(self, peer: str, joined: bool) -> None:
        me = self._me
        if joined:  # a new process: everything this one knows of its own (the others ignore repeats)
            if not me:
                return
            for cid, gd, names in self.hub.local_devices():
                if cid not in self._pending:
                    self._send(["a", me, cid, self.hub.since(cid), gd, names])
            self._names_sent = self.hub.local_foreign()
            self._send(["f", me, sorted(self._names_sent)])
            return
        self._to_all(self.hub.remote_gone(peer))
        if self.hub.remote_foreign(peer, None):
            self.service.hub_list_changed()

    def _received(self, data: bytes) -> None:
        try:
            msg = msgpack.unpackb(data)
            kind, peer = str(msg[0]), str(msg[1])
            if kind == "a":
                gd, names = str(msg[4]), [str(n) for n in msg[5]]
                if self.hub.remote_announce(peer, int(msg[2]), int(msg[3]), gd, names):
                    self._to_all([wsd.pack([wsd.SUBSCRIPTIONS, gd, names])])
            elif kind == "d":
                self._to_all(self.hub.remote_detach(peer, int(msg[2])))
            elif kind == "f":
                if self.hub.remote_foreign(peer, frozenset(str(n) for n in msg[2])):
                    self.service.hub_list_changed()
            elif kind == "r":
                self._reply(bytes(msg[2]), str(msg[3]))
            elif kind == "s":
                self._peer(peer, True)
        except (ValueError, TypeError, IndexError, KeyError, msgpack.UnpackException) as exc:
            log.warning("wearscript: a hub notice from another process was not understood: %s", exc)

    def _to_all(self, frames: list[bytes]) -> None:
        """Frames for every greeted connection of this process (the others' lists are news to all)."""
        for frame in frames:
            for wire in list(self.service.wires.values()):
                if wire.greeted:
                    wire.session.push(frame, is_event=True)

    # -- a greeting -----------------------------------------------------------------------------------

    def _state(self, _: bytes) -> bytes:
        devices = [[cid, self.hub.since(cid), gd, names] for cid, gd, names in self.hub.local_devices()]
        return bytes(msgpack.packb([self._me, devices, sorted(self.hub.local_foreign())]))

    async def sync(self) -> None:
        """Learn every other process's devices and names as they stand now (before a greeting); what is new
        here goes to this process's greeted connections as when it is told. A process that answers after
        :data:`SYNC_WAIT_S` is still heard (``Notices.ask``'s ``late``): its devices then reach the
        connection as forwarded frames, as a device announced after the greeting does."""
        if not self._me or not self.notices.peers:
            return
        for answer in await self.notices.ask(STATE, wait_s=SYNC_WAIT_S, late=self._learn):
            self._learn(answer)

    def _learn(self, answer: bytes) -> None:
        """Keep one process's state (its answer to :data:`STATE`) in the hub."""
        try:
            peer, devices, names = msgpack.unpackb(answer)
            peer = str(peer)
            for cid, since, gd, raw in devices:
                ns = [str(n) for n in raw]
                if self.hub.remote_announce(peer, int(cid), int(since), str(gd), ns):
                    self._to_all([wsd.pack([wsd.SUBSCRIPTIONS, str(gd), ns])])
            if self.hub.remote_foreign(peer, frozenset(str(n) for n in names)):
                self.service.hub_list_changed()
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            log.warning("wearscript: another process's hub state was not understood: %s", exc)

    def _reply(self, frame: bytes, channel: str) -> None:
        targets = self.hub.matching(channel)
        self.service.forward(wsd.Forward(frame, targets, channel), local_only=True)
