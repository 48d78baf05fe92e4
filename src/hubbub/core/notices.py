"""Notices: short messages between the processes that serve one log, for state that is no event.

A node made of several processes (the workers of ``serve --workers N``, the nodes of a cluster) delivers
every committed event in each of them; a few things that happen in one process must be known in the others
without being events: MQTT's takeover of a client id, which closes the connection of that id wherever it
is. :class:`Notices` is that channel: a component :meth:`watches <Notices.watch>` a topic and
:meth:`sends <Notices.send>` on it; the node's relay (the Redis broker of a cluster, the worker's relay of a
multi-worker node) carries what is sent to every other process and hands what they send to
:meth:`Notices.received`. A single process has no relay: a notice goes nowhere (the sender handles its own
process itself).

Delivery is at most once and unordered between senders (Redis pub/sub, the owner's sockets), in the order
sent from one sender: a notice is a hint to act on now, never the record of anything; what must survive is
kept in the log (its state maps).

**Peers.** A relay that knows when a process ends (a worker's relay: the log owner sees a worker's sockets
close, and tells the others with a :data:`GONE` notice) connects with this process's id (``me``); the
process then says :data:`HELLO` and every other answers it, so each knows the live processes
(:attr:`Notices.peers`) and components that mirror state of the others (wearscript's device lists) are
told when one joins (send it your state) or is gone (drop its state, announce its departures):
:meth:`Notices.watch_peers`. An id is a process's index; a new process of the same index (a worker
restarted) says hello with another incarnation and replaces the old one (gone, then joined). A relay without
that knowledge (a cluster's Redis broker) connects without an id: no peers, components keep to their own
process.

**Questions.** A component may ask every peer a question and await their answers (:meth:`Notices.ask`:
``/metrics`` asks for the other workers' figures at each scrape); a peer answers what its
:meth:`Notices.answer` function for the topic returns. The asker waits for every live peer, at most its
timeout (a peer gone is not waited for), and gets the answers that came. An asker that keeps state in step
with the others' may take the answers that come after its wait too (``late``): a peer slower than the wait
(a worker busy with a burst of commits) is still counted once it answers, so the state converges instead
of missing that peer's part until something else changes (at most :data:`LATE_MAX` questions are kept
waiting so, the oldest given up first; a peer gone is waited for no longer).

**Arrivals.** Other processes' committed events are no notices, but a component may have to answer for them
the moment they reach this process, before their fan-out here (qpubs' ``delivered`` counts each worker's
recipients of an emit): the relay hands them to :meth:`Notices.arrived`, with the id of the process that
committed them, and :meth:`Notices.watch_arrivals` watchers see them (a worker's relay does; nothing else
calls it).

Concurrency contract: every method is called on the event loop; watchers run on it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import msgpack

if TYPE_CHECKING:
    from hubbub.events import Event

__all__ = ["ANSWER", "ASK", "GONE", "HELLO", "ArrivalWatcher", "NoticeSender", "Notices", "PeerWatcher"]

log = logging.getLogger("hubbub.node")

#: What a relay offers: send ``(topic, data)`` to every other process of the node or cluster.
NoticeSender = Callable[[str, bytes], None]
#: A component told of peers: ``(peer, joined)``, joined False when it is gone.
PeerWatcher = Callable[[str, bool], None]
#: A component shown other processes' events as they arrive: ``(process, events)``.
ArrivalWatcher = Callable[[str, "Sequence[Event]"], None]

#: The membership's topics (handled here, never handed to watchers). ``HELLO``:
#: ``b"<id> <incarnation> <0|1>"`` (1: an answer to a hello, not answered again); ``GONE``: ``b"<id>"``, sent
#: by the relay's carrier.
HELLO = "notices.hello"
GONE = "notices.gone"
#: A question (msgpack ``[asker, token, topic, data]``) and its answer (``[asker, token, peer, answer]``,
#: answer None when the peer has no answerer for the topic).
ASK = "notices.ask"
ANSWER = "notices.answer"
#: How long a question waits for its answers by default.
ASK_WAIT_S = 1.0
#: The most questions past their wait still taking late answers (``Notices.ask(late=...)``).
LATE_MAX = 64


class _Asking:
    """One question waiting for its answers (``late``: what takes those that come after the wait)."""

    __slots__ = ("answers", "done", "expected", "late")

    def __init__(self, expected: set[str]) -> None:
        self.expected = expected
        self.answers: list[bytes] = []
        self.done = asyncio.Event()
        self.late: Callable[[bytes], None] | None = None

    def drop(self, peer: str) -> None:
        self.expected.discard(peer)
        if not self.expected:
            self.done.set()


class Notices:
    """See the module docstring."""

    def __init__(self) -> None:
        self._watchers: dict[str, list[Callable[[bytes], None]]] = {}
        self._sender: NoticeSender | None = None
        #: This process's id among its peers ("" without peers) and its incarnation.
        self.me = ""
        self._incarnation = ""
        #: The live peers: id -> incarnation.
        self._peers: dict[str, str] = {}
        self._peer_watchers: list[PeerWatcher] = []
        self._arrival_watchers: list[ArrivalWatcher] = []
        self._answerers: dict[str, Callable[[bytes], bytes]] = {}
        self._asking: dict[int, _Asking] = {}
        #: Questions past their wait whose asker takes late answers, oldest first (at most LATE_MAX).
        self._late: dict[int, _Asking] = {}
        self._tokens = itertools.count(1)
        self.sent = 0
        self.received_count = 0

    def connect(self, sender: NoticeSender | None, me: str = "", incarnation: str = "") -> None:
        """The relay's sender from now on (None: the relay is gone, and with it every peer). ``me``: this
        process's id, from a relay that tells when a peer is gone (the module docstring): it says hello."""
        self._sender = sender
        if sender is None:
            for peer in list(self._peers):
                self._drop(peer)
            self.me = ""
            return
        if me:
            self.me, self._incarnation = me, incarnation
            self.send(HELLO, f"{me} {incarnation} 0".encode())

    @property
    def incarnation(self) -> str:
        """This process's incarnation among its peers ("" without peers)."""
        return self._incarnation if self.me else ""

    @property
    def peers(self) -> list[str]:
        """The ids of the other live processes, sorted (empty without a relay that knows them)."""
        return sorted(self._peers)

    def watch_peers(self, fn: PeerWatcher) -> Callable[[], None]:
        """Call ``fn(peer, joined)`` when a peer joins or is gone; returns the unwatch."""
        self._peer_watchers.append(fn)

        def unwatch() -> None:
            if fn in self._peer_watchers:
                self._peer_watchers.remove(fn)

        return unwatch

    def watch_arrivals(self, fn: ArrivalWatcher) -> Callable[[], None]:
        """Call ``fn(process, events)`` with other processes' committed events as they arrive, before
        their fan-out here (see the module docstring); returns the unwatch."""
        self._arrival_watchers.append(fn)

        def unwatch() -> None:
            if fn in self._arrival_watchers:
                self._arrival_watchers.remove(fn)

        return unwatch

    def arrived(self, process: str, events: Sequence[Event]) -> None:
        """Events process ``process`` committed, about to be fanned out here (the relay's, on the loop)."""
        for fn in self._arrival_watchers:
            try:
                fn(process, events)
            except Exception:
                log.exception("an arrival watcher failed", extra={"peer": process})

    def _tell(self, peer: str, joined: bool) -> None:
        for fn in list(self._peer_watchers):
            try:
                fn(peer, joined)
            except Exception:
                log.exception("a peer watcher failed", extra={"peer": peer})

    def _drop(self, peer: str) -> None:
        if self._peers.pop(peer, None) is not None:
            for asking in list(self._asking.values()):
                asking.drop(peer)
            for token, asking in list(self._late.items()):
                asking.drop(peer)
                if not asking.expected:
                    del self._late[token]
            self._tell(peer, False)

    # -- questions --------------------------------------------------------------------------------------

    def answer(self, topic: str, fn: Callable[[bytes], bytes]) -> Callable[[], None]:
        """Answer the peers' questions on ``topic`` with ``fn(data)`` (one answerer a topic); returns the
        removal."""
        self._answerers[topic] = fn

        def remove() -> None:
            if self._answerers.get(topic) is fn:
                del self._answerers[topic]

        return remove

    async def ask(
        self,
        topic: str,
        data: bytes = b"",
        wait_s: float = ASK_WAIT_S,
        late: Callable[[bytes], None] | None = None,
    ) -> list[bytes]:
        """Ask every live peer; their answers (none without peers), once each has answered, is gone, or
        ``wait_s`` has passed. ``late``: called with each answer that comes after ``wait_s`` (on the loop,
        as a notice arrives; see the module docstring)."""
        if not self.me or not self._peers:
            return []
        token = next(self._tokens)
        asking = self._asking[token] = _Asking(set(self._peers))
        try:
            self.send(ASK, msgpack.packb([self.me, token, topic, data]))
            try:
                await asyncio.wait_for(asking.done.wait(), wait_s)
            except TimeoutError:
                log.info("peers %s did not answer %s in time", sorted(asking.expected), topic)
                if late is not None and asking.expected:
                    asking.late = late
                    self._late[token] = asking
                    while len(self._late) > LATE_MAX:
                        del self._late[next(iter(self._late))]
        finally:
            del self._asking[token]
        return asking.answers

    def _asked(self, data: bytes) -> None:
        asker, token, topic, payload = msgpack.unpackb(data)
        fn = self._answerers.get(topic)
        reply = fn(payload) if fn is not None else None
        self.send(ANSWER, msgpack.packb([asker, token, self.me, reply]))

    def _answered(self, data: bytes) -> None:
        to, token, peer, reply = msgpack.unpackb(data)
        if to != self.me:
            return
        asking = self._asking.get(token) or self._late.get(token)
        if asking is None or peer not in asking.expected:
            return
        if asking.late is None:
            if reply is not None:
                asking.answers.append(reply)
            asking.drop(peer)
            return
        asking.drop(peer)
        if not asking.expected:
            del self._late[token]
        if reply is not None:
            try:
                asking.late(reply)
            except Exception:
                log.exception("a late answer's taker failed", extra={"peer": peer})

    def _hello(self, data: bytes) -> None:
        try:
            peer, incarnation, answer = data.decode().split(" ")
        except ValueError:
            return
        if not self.me or peer == self.me:
            return
        if answer == "0":  # first, so that it knows this process before what watchers send it
            self.send(HELLO, f"{self.me} {self._incarnation} 1".encode())
        known = self._peers.get(peer)
        if known != incarnation:
            if known is not None:  # a new process of that id: the old one is gone
                self._drop(peer)
            self._peers[peer] = incarnation
            self._tell(peer, True)

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
        if topic == HELLO:
            self._hello(data)
            return
        if topic == GONE:
            self._drop(data.decode(errors="replace"))
            return
        if topic in (ASK, ANSWER):
            try:
                (self._asked if topic == ASK else self._answered)(data)
            except (ValueError, TypeError, msgpack.UnpackException):
                log.exception("a question between processes failed", extra={"topic": topic})
            return
        for fn in list(self._watchers.get(topic, ())):
            try:
                fn(data)
            except Exception:
                log.exception("a notice watcher failed", extra={"topic": topic})
