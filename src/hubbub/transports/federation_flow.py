"""The two directions of a native federation link (:mod:`hubbub.transports.federation_link`), and its
cursors on disk.

* :class:`UpFlow`: a local session subscribed to ``/**`` (replaying from the up cursor, a
  :class:`~hubbub.selection.CursorResume` paged from the log in commit order) whose events go up as
  acknowledged publishes, each channel in order; the up cursor advances, in order, as the upstream
  acknowledges them.
* :class:`DownFlow`: events that come down are committed here; the down cursor advances, strictly in order,
  as they commit (or are dropped as loops, or reported as gaps).
* :class:`LinkCursors`: both cursors, saved to ``<data_dir>/federation/<link>.json`` (write, fsync, rename).

Both flows keep a completion FIFO (``[done, …position]`` entries in arrival order): a cursor moves only past
a prefix of completed entries, so a saved cursor never claims an event that is not safely on the other side.

Concurrency contract: everything runs on the event loop, except :meth:`LinkCursors.save_now` (an executor
thread, on a snapshot taken on the loop).
:class:`UpEncoder` has no ``encode_run``, so the node calls it on the loop only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import struct
import threading
import time
from collections import Counter, deque
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import aiohttp
import msgpack

from hubbub.auth import EVERYTHING, Identity
from hubbub.channels import Pattern, parse_pattern
from hubbub.client.protocol import ClientProtocol
from hubbub.client.protocol import Gap as UpstreamGap
from hubbub.core.api import Core, ReplayPlan, Session, Subscription
from hubbub.core.flag import Flag
from hubbub.errors import HubbubError
from hubbub.events import Event, Position, Publisher
from hubbub.federation import (
    Cursor,
    accepts_path,
    forwards_up,
    idempotency_key,
    minimal_cover,
    stamp,
)
from hubbub.federation.wire import LinkEvent, link_headers, parse_link_headers, render_publisher
from hubbub.log.base import AppendRequest, AppendResult
from hubbub.selection import CursorResume

__all__ = [
    "DIALECT",
    "LINK_IDENTITY",
    "DownFlow",
    "Interest",
    "LinkCursors",
    "LinkStats",
    "UpEncoder",
    "UpFlow",
]

log = logging.getLogger("hubbub.federation")

#: The dialect of a link's local session (excluded from the interest it advertises upstream).
DIALECT: Final = "federation"
#: Who a link is on this node: it reads every channel and publishes what comes down.
LINK_IDENTITY: Final = Identity("federation", EVERYTHING, EVERYTHING, via="federation")
#: Publishes sent up and not yet acknowledged, at most.
MAX_INFLIGHT: Final = 512
#: Events from above not yet committed here, at most (then the link stops reading).
MAX_DOWN_PENDING: Final = 4096
SAVE_INTERVAL_S: Final = 0.2
_ALL: Final = parse_pattern("/**")
#: The head of an up frame (:class:`UpEncoder`): seq, time, channel length, epoch length.
_HEAD = struct.Struct(">QQHB")


@dataclass(slots=True)
class LinkStats:
    """A link's counters over all its connections (``/metrics``)."""

    sent_up: int = 0
    refused_up: int = 0
    received_down: int = 0
    dropped_down: int = 0
    gaps: int = 0
    lag_down_s: float = 0.0


class Interest:
    """What this node's subscribers listen to: every subscription's pattern (every dialect, the links of
    nodes below included, but not the links' own up sessions), counted; ``changed`` is set on a change."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.patterns: dict[str, Pattern] = {}
        self.changed = Flag()

    def watch(self, sub: Subscription, added: bool) -> None:
        """``Node.watch_subscriptions``'s watcher."""
        if sub.session.dialect == DIALECT:
            return
        text = sub.pattern.text
        if added:
            self.counts[text] += 1
            self.patterns[text] = sub.pattern
        else:
            self.counts[text] -= 1
            if self.counts[text] <= 0:
                del self.counts[text]
                self.patterns.pop(text, None)
        self.changed.set()

    def cover(self) -> dict[str, Pattern]:
        """The minimal cover of the patterns (:func:`~hubbub.federation.minimal_cover`), by text."""
        return {p.text: p for p in minimal_cover(self.patterns.values())}


class LinkCursors:
    """The link's two cursors: ``down`` (upstream positions committed here) and ``up`` (positions here the
    upstream acknowledged), loaded from and saved to ``path`` (``None``: kept in memory only)."""

    def __init__(self, path: Path | None, name: str) -> None:
        self.path = path
        self.name = name
        self.down = Cursor()
        # A new link sends up what is published from now on.
        self.up = Cursor(last_time=time.time_ns() - 1)
        self.dirty = False
        #: Set for a save that should not wait for the next interval (the first recovery point).
        self.urgent = Flag()
        # Saves run on executor threads: one at a time, and never one older than what is on disk (the
        # interval's save may still be writing when the link's last save, on closing, starts).
        self._save_lock = threading.Lock()
        self._taken = 0
        self._written = 0
        if path is None:
            return
        try:
            data = json.loads(path.read_text())
            self.down = Cursor.from_json(data["down"])
            self.up = Cursor.from_json(data["up"])
        except FileNotFoundError:
            # Saved at once: a crash before the first interval must not make the link start afresh (and
            # skip what was published here since it was created).
            try:
                self.save_now()
            except OSError as exc:
                log.error("federation: cannot save the link's cursors in %s: %s", path, exc)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.error("federation: cannot read %s (%s); starting the link afresh", path, exc)

    def snapshot(self) -> tuple[int, dict[str, Any]]:
        """The cursors as saved, numbered in the order taken (on the loop)."""
        self._taken += 1
        return self._taken, {"down": self.down.to_json(), "up": self.up.to_json()}

    def save_now(self, taken: tuple[int, dict[str, Any]] | None = None) -> None:
        """Write a :meth:`snapshot` (by default a new one) to ``path``, unless a later one is there already.
        Thread-safe."""
        if self.path is None:
            return
        number, data = taken if taken is not None else self.snapshot()
        with self._save_lock:
            if number <= self._written:
                return
            tmp = self.path.with_suffix(".tmp")
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "w") as fh:
                json.dump(data, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
            self._written = number

    def save_logged(self, taken: tuple[int, dict[str, Any]] | None = None) -> None:
        """:meth:`save_now`, a failure logged and not raised: the cursors are saved again later, and a link
        that resumes from an older cursor re-sends only what the idempotency keys turn away."""
        try:
            self.save_now(taken)
        except OSError as exc:
            log.error("federation: cannot save the link's cursors: %s", exc, extra={"link": self.name})

    async def save_loop(self) -> None:
        """Save every :data:`SAVE_INTERVAL_S` while anything moved."""
        loop = asyncio.get_running_loop()
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.urgent.wait(), SAVE_INTERVAL_S)
            self.urgent.clear()
            if self.dirty and self.path is not None:
                self.dirty = False
                await loop.run_in_executor(None, self.save_logged, self.snapshot())


class UpEncoder:
    """The up session's encoder: each event as a head (its position here) and, when it goes up, the
    msgpack ``publish`` map without its ``id`` (the writer adds it)."""

    def __init__(self, node_id: str, peer: str, below: Collection[str] = ()) -> None:
        self.node_id = node_id
        self.peer = peer
        self.below = below  # the hub's live set (read on the loop only: no encode_run)
        self.key = f"{DIALECT}-up:{peer}:{id(self)}"

    def encode_event(self, event: Event, subs: Any, replay: bool, cache: dict[Any, Any]) -> bytes:
        ch = event.channel.encode()
        ep = event.epoch.encode()
        head = _HEAD.pack(event.seq, event.time_ns, len(ch), len(ep)) + ch + ep
        if not forwards_up(self.peer, event.headers, self.below):
            return head
        stamped, origin = stamp(self.node_id, event.headers, event.epoch, event.seq)
        p = event.publisher
        publisher = render_publisher(p.dialect, p.user, p.app, p.msg_id)
        body: bytes = msgpack.packb(
            {
                "op": "publish",
                "channel": event.channel,
                "payload": bytes(event.payload),
                "content_type": event.content_type,
                "headers": link_headers(event.user_headers, stamped, publisher),
                "tags": list(event.tags),
                "idem": idempotency_key(origin),
                "ack": True,
            },
            use_bin_type=True,
        )
        return head + body


class UpFlow:
    """One connection's up direction. See the module docstring."""

    def __init__(self, name: str, node: Core, cursors: LinkCursors, stats: LinkStats) -> None:
        self.name = name
        self.node = node
        self.cursors = cursors
        self.stats = stats
        self.fifo: deque[list[Any]] = deque()
        #: Publishes sent up and not answered yet.
        self.inflight = 0
        self._acked = Flag()
        #: Per channel, the last position queued up (the cursor moves on acknowledgements).
        self.sent: dict[str, tuple[str, int]] = {}
        #: Per channel, the newest event that came down over this connection and committed here: never
        #: queued to the up session (it would not go up: the node above is on its hops), it moves the up
        #: cursor only once nothing committed before it is still on its way up (:meth:`settle`).
        self.passed: dict[str, tuple[str, int, int]] = {}
        #: The up session's replay and held events are all queued (its subscription is live).
        self.live = False
        #: The writer holds frames taken from the session that are not in :attr:`fifo` yet.
        self._busy = False
        self._sess: Session | None = None

    async def subscribe_local(self, sess: Session) -> None:
        """The local ``/**`` subscription, replaying (a :class:`~hubbub.selection.CursorResume`, paged from
        the log while it goes up) everything the upstream has not acknowledged."""
        up = self.cursors.up
        since = {ch: Position(seq, ep) for ch, (ep, seq) in up.positions.items()}
        self.sent = dict(up.positions)
        selection = CursorResume(since, from_time=up.last_time + 1)

        def on_snapshot(plan: ReplayPlan) -> None:
            for gap in plan.gaps:
                self.stats.gaps += 1
                log.warning(
                    "federation: events of %s are gone here before they went up (%s)",
                    gap.channel,
                    gap.reason,
                    extra={"link": self.name},
                )
                up.positions[gap.channel] = self.sent[gap.channel] = (gap.position.epoch, gap.position.seq)

        self._sess = sess
        await self.node.subscribe(sess, "up", _ALL, frozenset(), selection, on_snapshot=on_snapshot)
        self.live = True
        self.settle()

    def came_down(self, ch: str, ep: str, seq: int, time_ns: int) -> None:
        """An event from above committed here as ``(ch, ep, seq)``, kept from the up session (it is the
        origin of the publish, and does not echo): the up cursor may pass it once the events before it are
        acknowledged."""
        self.passed[ch] = (ep, seq, time_ns)
        self.settle()

    def _in_order(self, ch: str, ep: str, seq: int) -> bool:
        """Whether an event goes on: not one sent already. Holes are events kept from this session (its
        delivery filters, ``:filter.*``: another connection's private events, not federated)."""
        last = self.sent.get(ch)
        if last is not None and last[0] == ep and seq <= last[1]:
            return False
        self.sent[ch] = (ep, seq)
        return True

    async def write(
        self, ws: aiohttp.ClientWebSocketResponse, sess: Session, proto: ClientProtocol[Any], max_frame: int
    ) -> None:
        """Send the up session's events as publishes (``proto`` numbers them and hands their answers back to
        :meth:`completed`) until it ends (kicked: the upstream is slower than this node; the link reconnects
        and resends from the up cursor)."""
        fifo = self.fifo
        size = _HEAD.size
        while True:
            self._busy = False
            self.settle()
            frames = await sess.next_frames(max_frame)
            if not frames:
                return
            self._busy = True
            for f in frames:
                seq, t, chl, epl = _HEAD.unpack_from(f)
                body = size + chl + epl
                ch, ep = f[size : size + chl].decode(), f[size + chl : body].decode()
                if not self._in_order(ch, ep, seq):
                    continue
                entry = [len(f) == body, ch, ep, seq, t]
                fifo.append(entry)
                if entry[0]:
                    continue
                while self.inflight >= MAX_INFLIGHT:
                    self._acked.clear()
                    await self._acked.wait()
                self.inflight += 1
                await ws.send_bytes(proto.request_message(f[body:], entry))
                self.stats.sent_up += 1
            del frames
            self.settle()

    def completed(self, entry: list[Any], refused: bool) -> None:
        """A reply (or an error) to the publish of ``entry``."""
        self.inflight -= 1
        if refused:  # refused above (a loop it saw, a permission): done with it all the same
            self.stats.refused_up += 1
        entry[0] = True
        self._acked.set()
        self.settle()

    def settle(self) -> None:
        fifo = self.fifo
        moved = False
        up = self.cursors.up
        while fifo and fifo[0][0]:
            _, ch, ep, seq, t = fifo.popleft()
            up.advance(ch, ep, seq, t)
            moved = True
        passed, sess = self.passed, self._sess
        if passed and not fifo and self.live and not self._busy and sess is not None and not sess.queued:
            # Every event committed before these (each channel's lower positions among them) was queued to
            # the session before they committed, and is acknowledged by now: nothing is left behind them.
            # (Under steady traffic up this waits for a lull; meanwhile the cursor only lags.)
            for ch, (ep, seq, t) in passed.items():
                up.advance(ch, ep, seq, t)
            passed.clear()
            moved = True
        if moved:
            self.cursors.dirty = True

    def lag_s(self) -> float:
        """How long the oldest event not yet acknowledged above has waited (0 when none)."""
        fifo = self.fifo
        return max(0.0, (time.time_ns() - int(fifo[0][4])) / 1e9) if fifo else 0.0


class DownFlow:
    """One connection's down direction. See the module docstring."""

    def __init__(
        self,
        name: str,
        node: Core,
        node_id: str,
        cursors: LinkCursors,
        stats: LinkStats,
        up: UpFlow | None = None,
        up_session: Session | None = None,
    ) -> None:
        self.name = name
        #: The link's up direction: what comes down is published as its session's own (``up_session``,
        #: which does not echo), so the live fan-out never queues it to go back up; ``up`` hears of each
        #: commit to move its cursor past it.
        self.up = up
        self.up_session = up_session
        self.node = node
        self.node_id = node_id
        self.cursors = cursors
        self.stats = stats
        down = cursors.down
        #: What this connection received already (two subscriptions' replays may overlap).
        self.seen = Cursor(dict(down.positions), down.last_time)
        self.fifo: deque[list[Any]] = deque()
        self.broken = False
        self._settled = Flag()

    def event(self, ev: LinkEvent) -> None:
        stats = self.stats
        stats.received_down += 1
        stats.lag_down_s = max(0.0, (time.time_ns() - ev.time_ns) / 1e9)
        if not self.seen.advance(ev.channel, ev.epoch, ev.seq, ev.time_ns):
            return
        entry: list[Any] = [False, "event", ev.channel, ev.epoch, ev.seq, ev.time_ns]
        self.fifo.append(entry)
        node_id = self.node_id
        user, path, _ = parse_link_headers(ev.headers)
        if path is None or not accepts_path(node_id, path.origin, path.hops):
            stats.dropped_down += 1
            entry[0] = True
            self.settle()
            return
        req = AppendRequest(
            ev.channel,
            Publisher(*ev.publisher),
            ev.payload,
            ev.content_type,
            {**user, **path.arrived(node_id, True)},
            ev.tags,
            idempotency_key(path.origin),
        )

        def done(r: AppendResult | HubbubError) -> None:
            if isinstance(r, HubbubError):
                # Not committed: the cursor stays before it; the connection ends and recovery resends it.
                log.warning(
                    "federation: an event from above was not stored: %s", r, extra={"link": self.name}
                )
                self.broken = True
                return
            entry[0] = True
            self.settle()
            if up is not None and not r.duplicate:
                e = r.event
                up.came_down(e.channel, e.epoch, e.seq, e.time_ns)

        up = self.up
        try:
            self.node.submit(req, self.up_session, done, LINK_IDENTITY)
        except HubbubError as exc:
            log.warning("federation: an event from above was refused: %s", exc, extra={"link": self.name})
            self.broken = True

    def gap(self, item: UpstreamGap) -> None:
        if item.reason != "cut":  # "cut": where a channel left for the next round starts, not a loss
            self.stats.gaps += 1
            log.warning(
                "federation: events of %s are gone upstream (%s)",
                item.channel,
                item.reason,
                extra={"link": self.name},
            )
        at = item.position
        self.seen.positions[item.channel] = (at.epoch, at.seq)
        self.fifo.append([True, "gap", item.channel, at.epoch, at.seq])
        self.settle()

    def recovered_to(self, top_time: int, patterns: list[str]) -> None:
        """Every event up to the upstream's ``top_time`` that the subscriptions to ``patterns`` want has
        come: once what is before it has committed, those patterns are caught up (their unlisted channels are
        recovered from after the cursor's time next time)."""
        self.fifo.append([True, "time", top_time, patterns])
        self.settle()

    def settle(self) -> None:
        fifo = self.fifo
        down = self.cursors.down
        moved = False
        while fifo and fifo[0][0]:
            entry = fifo.popleft()
            kind = entry[1]
            if kind == "event":
                down.advance(entry[2], entry[3], entry[4], entry[5])
            elif kind == "gap":
                down.positions[entry[2]] = (entry[3], entry[4])
            else:
                if not down.last_time:
                    self.cursors.urgent.set()  # the first recovery point: saved at once
                down.last_time = max(down.last_time, entry[2])
                down.caught_up(entry[3])
            moved = True
        if moved:
            self.cursors.dirty = True
            self._settled.set()

    async def pace(self) -> None:
        """Wait while the node or this flow has too much in flight (the link stops reading meanwhile)."""
        if not self.node.has_room:
            await self.node.writable()
        while len(self.fifo) >= MAX_DOWN_PENDING:
            self._settled.clear()
            await self._settled.wait()
