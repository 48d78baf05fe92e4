"""Sessions: one connection as the core sees it, with a bounded outbound queue.

A session never sees a wire format. The transport gives it an :class:`Encoder`, which turns events into the
bytes of the connection's dialect; the core calls it once per event and fan-out, sharing a per-event cache
between sessions with the same ``Encoder.key`` so each event is encoded once per dialect, not once per
subscriber.

A run of event frames (a burst's fan-out, a replay chunk) is queued as one :class:`FrameRun` entry, shared
by every session that gets the same frames: queueing it costs the same for ten frames or ten thousand, and
a batching writer (native ``batch``) packs it into batch frames once for all of those sessions. The bounds
still count every frame.

Concurrency contract: every method is called from the event loop thread only, except
:meth:`Session.replay_chunks` and :meth:`Session.replay_run_chunks`, which read only settings fixed before
the first subscription and run on the node's reader threads.

Overflow policies (protocols README §4), applied when a push would exceed ``max_items`` or ``max_bytes``:

=============  ==============================================================================
DISCONNECT     mark the session kicked with ``slow_close_code``; the transport sends the dialect's
               error (if any) and closes. Nothing more is queued.
DROP_OLDEST    drop the oldest queued *event* frames until the new one fits; count them as dropped.
CATCH_UP       drop the queued live events and ask the dialect to catch up from the log
               (``on_catch_up``); used by guble.
=============  ==============================================================================
"""

from __future__ import annotations

import enum
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from itertools import repeat
from typing import Any, Protocol, cast, final

from hubbub.auth import Identity
from hubbub.disconnect import Disconnect
from hubbub.events import Event
from hubbub.log.base import EventRun

from .flag import Flag
from .limits import TokenBucket

__all__ = [
    "BatchEncoder",
    "Encoder",
    "FrameRun",
    "OutboundQueue",
    "Overflow",
    "PageEncoder",
    "RunEncoder",
    "Session",
    "SessionStats",
    "new_session_id",
    "packed_limit",
]

#: A run of fewer event frames is queued frame by frame rather than as one :class:`FrameRun` entry.
RUN_ENTRY_MIN = 8


def new_session_id() -> str:
    """16 lower-case hex digits (protocols README §8)."""
    return secrets.token_hex(8)


class Overflow(enum.Enum):
    DISCONNECT = "disconnect"
    DROP_OLDEST = "drop_oldest"
    CATCH_UP = "catch_up"


class Encoder(Protocol):
    """Renders events for one connection's dialect. Implemented by transports with a dialect codec."""

    #: Sessions with equal keys share the per-event encoding cache.
    key: str

    # An encoder may also set ``per_connection = True``: its ``encode_event`` keeps state of its own
    # connection (guble records each queued event frame), so the fan-out calls it for every session and never
    # hands one session the frames encoded for another (it still shares the rendering cache between them).
    # And ``names_subscriptions = True`` when its frames name the subscriptions ``subs`` (native's ``subs``,
    # qrpc's calls): a held event then goes out once per subscription that gets it, each after its own
    # replay; any other connection gets it once (core/hold.py).

    def encode_event(self, event: Event, subs: Sequence[str], replay: bool, cache: dict[Any, Any]) -> bytes:
        """The bytes of one event frame for a connection whose matching subscriptions are ``subs``."""
        ...


class RunEncoder(Encoder, Protocol):
    """An :class:`Encoder` that also renders a run of events at once (a replay page; see
    :class:`~hubbub.log.base.EventRun`). Encoders without it get the run's events one by one.

    ``encode_run`` must be thread-safe and depend on nothing but its arguments: the node calls it on a reader
    thread, next to the read of the page, while the loop writes the previous page.
    """

    def encode_run(
        self, proto: Event, rows: Sequence[tuple[int, bytes]], subs: Sequence[str], replay: bool
    ) -> list[bytes]:
        """The frames of the run's events, in order: the same bytes as :meth:`encode_event` per event."""
        ...


class PageEncoder(Encoder, Protocol):
    """An :class:`Encoder` that also renders a page of replayed events of any channels at once (a pattern's
    replay, :func:`~hubbub.core.replay_scan.send_scan`). Encoders without it get the events one by one.

    ``encode_page`` must be thread-safe and depend on nothing but its arguments: the node calls it on a
    reader thread, next to the read of the page, while the loop writes the previous page.
    """

    def encode_page(
        self, events: Sequence[Event], subs: Sequence[str], replay: bool, shapes: dict[Any, Any]
    ) -> list[bytes]:
        """The frames of ``events``, in order: the same bytes as :meth:`encode_event` per event. ``shapes``
        is the encoder's to keep what it rendered from one page of a replay to the next (the node gives one
        dict per replay, whose pages it encodes one after another)."""
        ...


class BatchEncoder(Encoder, Protocol):
    """An :class:`Encoder` for a dialect with batch frames (native ``batch``; :attr:`Session.batch_limit`).

    Both methods are thread-safe and depend on nothing but their arguments.
    """

    def encode_batches(self, frames: Sequence[bytes], limit: int) -> list[bytes]:
        """``frames`` packed in order into as few batch frames of at most ``limit`` bytes as possible (a frame
        that fits no batch goes alone, as itself)."""
        ...

    def encode_run_batches(
        self, proto: Event, rows: Sequence[tuple[int, bytes]], subs: Sequence[str], replay: bool, limit: int
    ) -> list[bytes]:
        """A run's event frames (``RunEncoder.encode_run``) packed as :meth:`encode_batches` packs them,
        built without the single frames where the encoding allows."""
        ...


@final
@dataclass(eq=False, slots=True)
class FrameRun:
    """Event frames queued as one entry: a fan-out run's frames, shared by every session that gets the same
    frames (the node gives them the same object), or a chunk of a replay. It counts as ``count`` events
    against the queue's bounds.

    ``packed`` caches the frames packed into batch frames of at most ``packed_for`` bytes (see
    :meth:`Session.next_entries`): the first batching writer packs them, and every other session holding the
    same run sends the very same bytes. Sessions sharing a run share its encoding (the node groups sessions by
    ``Encoder.key``), so the limit is the whole key.

    A replay chunk for a batching session may come packed only (``frames`` is ``None``; see
    :meth:`Session.replay_run_chunks`): its batch frames are then all there is of it.

    ``wired`` caches the frames as one write of a transport's framing (:meth:`wire`: a WebSocket's frame
    headers and payloads), shared alike by every writer with the same framing.
    """

    frames: list[bytes] | None
    nbytes: int
    packed: list[bytes] | None = None
    packed_for: int = 0
    count: int = 0
    wired: dict[Callable[[list[bytes]], bytes], bytes] | None = None

    def __post_init__(self) -> None:
        if self.frames is not None:
            self.count = len(self.frames)

    def batches(self, pack: Callable[[Sequence[bytes], int], list[bytes]], limit: int) -> list[bytes]:
        """The run as batch frames of at most ``limit`` bytes, packed by ``pack`` on first use."""
        packed = self.packed
        frames = self.frames
        if frames is None:
            assert packed is not None  # a packed-only run is built packed
            return packed
        if packed is None or self.packed_for != limit:
            packed = self.packed = pack(frames, limit)
            self.packed_for = limit
        return packed

    def wire(self, frame: Callable[[list[bytes]], bytes]) -> bytes:
        """The run's frames (:meth:`single`) as one write of the framing ``frame`` (a module-level function,
        the same object for every connection that frames alike), framed on first use. Held until the last
        session lets go of the run: the run's bytes twice, at most, beside the queue's own count of them."""
        wired = self.wired
        if wired is None:
            wired = self.wired = {}
        data = wired.get(frame)
        if data is None:
            data = wired[frame] = frame(self.single())
        return data

    def single(self) -> list[bytes]:
        """The frames one by one (a packed-only run's batch frames: there is nothing finer)."""
        frames = self.frames
        if frames is None:
            assert self.packed is not None
            return self.packed
        return frames


#: A queue entry: one frame and whether it is an event, or a run of event frames.
Entry = tuple[bytes, bool] | FrameRun


@dataclass(slots=True)
class SessionStats:
    queued_frames: int = 0
    queued_bytes: int = 0
    delivered: int = 0
    dropped: int = 0


@dataclass(eq=False, slots=True)
class OutboundQueue:
    """A connection's state in the core and the producing (core) side of its bounded outbound queue.
    Identity-hashed: it is used as a dict key in fan-out. :class:`Session` adds the consuming (transport) side
    and the replay's chunking; the core and the transports only ever make :class:`Session` objects."""

    dialect: str
    encoder: Encoder
    max_items: int
    max_bytes: int
    overflow: Overflow = Overflow.DISCONNECT
    slow_close_code: Disconnect = Disconnect.SLOW_CONSUMER
    #: The close when serving the connection met an internal fault (an encoder or a hook that raised;
    #: core/faults.py): native's 4300, temporary; dialects that close with WebSocket codes set 1011.
    fault_close_code: Disconnect = Disconnect.INTERNAL
    id: str = field(default_factory=new_session_id)
    user: str = ""
    #: The peer's address (``ip:port``; "" for a session with no socket of its own), set by the driver or
    #: route that accepted the connection: what the admin API shows of it.
    peer: str = ""
    #: When the session was made (``time.time_ns()``).
    opened_ns: int = field(default_factory=time.time_ns)
    echo: bool = True
    params: dict[str, str] = field(default_factory=dict)
    #: Who the connection is (``Node.login``); ``None`` until it authenticates (auth on: may do nothing).
    identity: Identity | None = None
    #: The connection's publish rate bucket (``limits.publish_rate``), set by ``Node.attach``.
    bucket: TokenBucket | None = None
    on_catch_up: Callable[[], None] | None = None
    #: Called once when the session is kicked as a slow consumer (the node counts it).
    on_slow: Callable[[Session], None] | None = None
    #: When nonzero, the transport's writer packs event frames into batch frames of at most this many bytes
    #: and takes the queue with :meth:`next_entries`; a replay then queues its chunks already packed.
    batch_limit: int = 0
    #: Publishes of this connection submitted to the node and not completed yet, kept by the write batcher
    #: (``WriteBatcher.submit``/``submit_many`` add, their completion takes away through :meth:`settled`).
    #: Each may still queue a reply, so read-side back-pressure counts them with the queued frames
    #: (:meth:`has_room`, :meth:`wait_room`): a pipelining publisher's own acknowledgements can never outgrow
    #: its queue, whatever the dialect.
    owed: int = 0
    # A list, not a deque: an idle connection's empty list is 56 bytes, an empty deque 760 (it keeps a block
    # of 64 slots); the writer takes the queue whole or a prefix at a time, never one entry by one.
    _frames: list[Entry] = field(default_factory=list)
    _nbytes: int = 0
    #: Frames queued (a :class:`FrameRun` counts its frames: events of a run one by one); read-only outside
    #: the queue (an attribute, not a property: the write loop reads it per write). And the
    #: :class:`FrameRun` entries among them.
    queued: int = 0
    _runs: int = 0
    # Flags, not asyncio.Events: a session exists per idle connection, and an Event costs some 850 bytes.
    _wake: Flag = field(default_factory=Flag)
    _room: Flag = field(default_factory=Flag)
    #: Why the session was kicked (closed without writing what is queued), or ``None``.
    kicked: Disconnect | None = None
    #: Why the session ends once what is queued is written, or ``None``.
    ending: Disconnect | None = None
    closed: bool = False
    stats: SessionStats = field(default_factory=SessionStats)

    # -- producing (core side) --------------------------------------------------------------------------

    def push(self, data: bytes, *, is_event: bool = False) -> bool:
        """Queue one frame. Returns False when the frame was not queued (closed, kicked, or dropped).

        The overflow policy applies to *events*. Other frames (replies, notices) are answers to the
        client's own requests: the transport throttles reading requests instead (:meth:`wait_room`), so
        they are queued beyond the bound, up to a hard cap of four times the bound, past which the session
        is kicked all the same.
        """
        if self.closed or self.kicked or self.ending:
            return False
        n = len(data)
        if self.queued >= self.max_items or self._nbytes + n > self.max_bytes:
            if not is_event:
                if self.queued >= 4 * self.max_items or self._nbytes + n > 4 * self.max_bytes:
                    self.kick(self.slow_close_code)
                    return False
            elif not self._overflow(n, is_event):
                return False
        self._frames.append((data, is_event))
        self._nbytes += n
        self.queued += 1
        if self.queued == 1:
            self._wake.set()
        return True

    def push_replies(self, frames: list[bytes]) -> bool:
        """Queue non-event frames (replies) in order, as :meth:`push` would one by one, in one step.
        Returns False when they were not queued (closed, kicked, or past the hard cap, which kicks)."""
        if self.closed or self.kicked or self.ending:
            return False
        k = len(frames)
        if not k:
            return True
        nbytes = sum(map(len, frames))
        # push() checks each frame against the cap before queueing it; the last one is the one that counts.
        if self.queued + k - 1 >= 4 * self.max_items or self._nbytes + nbytes > 4 * self.max_bytes:
            self.kick(self.slow_close_code)
            return False
        was_empty = not self.queued
        self._frames.extend(zip(frames, repeat(False)))
        self._nbytes += nbytes
        self.queued += k
        if was_empty:
            self._wake.set()
        return True

    def settled(self, k: int) -> None:
        """``k`` of this connection's publishes completed (their replies, if any, are queued by now): they are
        no longer owed, and a reader waiting in :meth:`wait_room` may go on once there is room."""
        self.owed -= k
        if self.queued + self.owed < self.max_items // 2 and not self._room.value:
            self._room.set()

    @property
    def has_room(self) -> bool:
        """Whether the connection may be read without waiting: the frames queued and the replies owed
        (:attr:`owed`) are below the queue's bound. Past it, the transport stops reading the connection
        (:meth:`wait_room`) instead of queueing more replies: back-pressure, never a close."""
        return self.queued + self.owed < self.max_items

    def deliver(self, event: Event, subs: Sequence[str], cache: dict[Any, Any], replay: bool = False) -> bool:
        """Encode (through the shared cache) and queue one event."""
        data = self.encoder.encode_event(event, subs, replay, cache)
        n = len(data)
        if (
            self.queued < self.max_items
            and self._nbytes + n <= self.max_bytes
            and not (self.closed or self.kicked or self.ending)
        ):
            # push()'s common case, inlined: this runs once per event per subscribed connection.
            self._frames.append((data, True))
            self._nbytes += n
            self.queued += 1
            if self.queued == 1:
                self._wake.set()
            self.stats.delivered += 1
            return True
        ok = self.push(data, is_event=True)
        if ok:
            self.stats.delivered += 1
        return ok

    def deliver_frames(self, frames: list[bytes], nbytes: int) -> int:
        """Queue already-encoded event frames (``nbytes`` in all); returns how many were queued.

        See :meth:`deliver_run`, which this is for frames that no other session shares.
        """
        return self.deliver_run(FrameRun(frames, nbytes))

    def deliver_run(self, run: FrameRun) -> int:
        """Queue the event frames of ``run``; returns how many were queued.

        The fan-out of a run of events: when they fit, they are queued in one step, as one entry (frame by
        frame when there are only a few); otherwise one by one through :meth:`push`, so the overflow policy
        applies exactly as for single events, up to a catch-up, which stands in for the rest of the run (a
        packed-only run is queued whole or not at all). ``run`` may be shared with other sessions and is never
        changed.
        """
        q = self._frames
        frames = run.frames
        k = run.count
        if (
            self.queued + k <= self.max_items
            and self._nbytes + run.nbytes <= self.max_bytes
            and not (self.closed or self.kicked or self.ending)
        ):
            if not k:
                return 0
            was_empty = not self.queued
            if k >= RUN_ENTRY_MIN or frames is None:
                q.append(run)
                self._runs += 1
            else:
                q.extend(zip(frames, repeat(True)))
            self._nbytes += run.nbytes
            self.queued += k
            if was_empty:
                self._wake.set()
            self.stats.delivered += k
            return k
        if frames is None:
            self._overflow(run.nbytes, True)
            return 0
        n = 0
        catch_up = self.overflow is Overflow.CATCH_UP
        for f in frames:
            if self.push(f, is_event=True):
                n += 1
            elif self.kicked or self.closed or catch_up:
                # A catch-up refills from the log every event from the dropped ones on, the rest of this run
                # included: queueing it as well would deliver it twice, and out of order.
                break
        self.stats.delivered += n
        return n

    def kick(self, code: Disconnect) -> None:
        """Ask the transport to close the connection with ``code`` (after the dialect's error, if any)."""
        if not self.kicked and not self.closed:
            self.kicked = code
            self._clear()
            self._wake.set()
            self._room.set()
            if code == self.slow_close_code and self.on_slow is not None:
                self.on_slow(cast("Session", self))  # only Session objects are ever made

    def call_when_ready(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once there is something for the writer: a frame queued, or the session kicked,
        closed or ending (at once if there is already). A writer parked here holds no task while its
        connection is idle; :meth:`forget_ready` takes the callback back. Called from the event loop thread;
        the callback runs in whatever queues the frame (a fan-out, a reply): quick, and it must not raise."""
        if self.queued or self.kicked or self.closed or self.ending:
            callback()
            return
        self._wake.call_when_next_set(callback)

    def forget_ready(self, callback: Callable[[], None]) -> None:
        """Take back a callback of :meth:`call_when_ready` that was not called yet. Idempotent."""
        self._wake.discard(callback)

    def _clear(self) -> None:
        self._frames.clear()
        self._nbytes = self.queued = self._runs = 0

    def _flatten(self) -> None:
        """Turn every :class:`FrameRun` entry into single-frame entries (the overflow policies drop frames one
        by one; rare, so it need not be fast)."""
        if self._runs:
            flat: list[Entry] = []
            for e in self._frames:
                if type(e) is FrameRun:
                    single = e.single()
                    flat.extend(zip(single, repeat(True)))
                    # A packed-only run's batch frames are its finest parts: each counts as one frame now.
                    self.queued -= e.count - len(single)
                else:
                    flat.append(e)
            self._frames = flat
            self._runs = 0

    def _overflow(self, n: int, is_event: bool) -> bool:
        if self.overflow is Overflow.DISCONNECT:
            self.kick(self.slow_close_code)
            return False
        self._flatten()
        entries = cast("list[tuple[bytes, bool]]", self._frames)  # single frames only, after _flatten
        if self.overflow is Overflow.DROP_OLDEST:
            # The oldest events go; the replies among them stay, in order, at the front.
            kept: list[tuple[bytes, bool]] = []
            i = 0
            while i < len(entries) and (self.queued >= self.max_items or self._nbytes + n > self.max_bytes):
                data, ev = entries[i]
                i += 1
                if ev:
                    self._nbytes -= len(data)
                    self.queued -= 1
                    self.stats.dropped += 1
                else:
                    kept.append((data, ev))
            entries[:i] = kept
            if self.queued >= self.max_items or self._nbytes + n > self.max_bytes:
                if is_event:
                    self.stats.dropped += 1
                    return False
                self.kick(self.slow_close_code)
                return False
            return True
        # CATCH_UP: drop every queued live event and let the dialect refill from the log.
        remaining = [f for f in entries if not f[1]]
        self.stats.dropped += self.queued - len(remaining)
        self._frames = list(remaining)
        self.queued = len(remaining)
        self._nbytes = sum(len(d) for d, _ in remaining)
        if self.on_catch_up is not None:
            self.on_catch_up()
        return not is_event


@dataclass(eq=False, slots=True)
class Session(OutboundQueue):
    """A connection's state in the core (fields and producing side: :class:`OutboundQueue`), the consuming
    side the transport's write loop drains, and the chunking of replays."""

    # -- replay (core side; the chunking runs on reader threads) -----------------------------------------

    def encode_run(self, run: EventRun, subs: Sequence[str]) -> list[bytes]:
        """The replayed event frames of ``run`` for this connection (through the encoder's ``encode_run`` when
        it has one, else event by event, each through a rendering cache of its own: encoders cache an event's
        bytes under fixed keys)."""
        encode_run = getattr(self.encoder, "encode_run", None)
        if encode_run is not None:
            frames: list[bytes] = encode_run(run.proto, run.rows, subs, True)
            return frames
        encode = self.encoder.encode_event
        return [encode(ev, subs, True, {}) for ev in run.events()]

    def replay_chunks(self, frames: list[bytes]) -> list[FrameRun]:
        """Replayed event frames cut into the chunks :meth:`replay_runs` queues one at a time: at most half
        the queue's bound each, in frames and in bytes (a single frame may be larger). With ``batch_limit``
        set, each chunk comes packed into batch frames already.

        Depends only on the session's bounds and encoder, which do not change: the node calls it on a reader
        thread, next to the read and encoding of a page.
        """
        out: list[FrameRun] = []
        total = len(frames)
        step = max(1, self.max_items // 2)
        half_bytes = self.max_bytes // 2
        done = 0
        while done < total:
            chunk = frames[done : done + step] if done or total > step else frames
            nbytes = sum(map(len, chunk))
            while nbytes > half_bytes and len(chunk) > 1:
                chunk = chunk[: len(chunk) // 2]
                nbytes = sum(map(len, chunk))
            out.append(FrameRun(chunk, nbytes))
            done += len(chunk)
        limit = self.batch_limit
        pack = getattr(self.encoder, "encode_batches", None) if limit else None
        if pack is not None:
            for run in out:
                if run.count >= RUN_ENTRY_MIN:
                    run.batches(pack, limit)
        return out

    def replay_run_chunks(self, run: EventRun, subs: Sequence[str]) -> list[FrameRun] | None:
        """A replayed :class:`~hubbub.log.base.EventRun` as packed-only chunks (:class:`FrameRun` without
        single frames), cut as :meth:`replay_chunks` cuts frames; ``None`` when this session does not take
        them: they are for a batching session (``batch_limit``) whose encoder is a :class:`BatchEncoder`, and
        only with the DISCONNECT policy, as the other policies drop single frames.

        Thread-safe, like :meth:`replay_chunks`.
        """
        limit = packed_limit(self)
        if not limit:
            return None
        encode = cast("BatchEncoder", self.encoder).encode_run_batches
        proto, rows = run.proto, run.rows
        step = max(1, self.max_items // 2)
        half_bytes = self.max_bytes // 2
        out: list[FrameRun] = []
        total = len(rows)
        done = 0
        while done < total:
            k = min(step, total - done)
            while True:
                part = rows[done : done + k] if done or k < total else rows
                # The chunk's own first event: only seq, time and payload differ along a run.
                head = (
                    proto
                    if not done
                    else replace(proto, seq=proto.seq + done, time_ns=part[0][0], payload=part[0][1])
                )
                packed: list[bytes] = encode(head, part, subs, True, limit)
                nbytes = sum(map(len, packed))
                if nbytes <= half_bytes or k == 1:
                    break
                k //= 2
            out.append(FrameRun(None, nbytes, packed, limit, k))
            done += k
        return out

    async def replay_runs(self, runs: list[FrameRun]) -> int:
        """Queue replayed chunks of event frames (:meth:`replay_chunks`) in order, pacing on the queue: wait
        for room rather than overflow, since a replay can read the log much faster than the connection
        drains. Returns how many frames were queued (fewer only when the session ended meanwhile).

        Each chunk is queued once the queue has room for it; the writer frees room as it takes frames.
        """
        done = 0
        for run in runs:
            if self.closed or self.kicked or self.ending:
                break
            k = run.count
            while self.queued and (
                self.queued + k >= self.max_items or self._nbytes + run.nbytes > self.max_bytes
            ):
                if self.closed or self.kicked or self.ending:
                    return done
                self._room.clear()
                await self._room.wait()
            if self.closed or self.kicked or self.ending:
                break
            n = self.deliver_run(run)
            done += n
            if n < k:
                break
        return done

    # -- consuming (transport side) ---------------------------------------------------------------------

    async def _wait_frames(self) -> bool:
        """Wait for queued frames; False when the session was kicked or closed (or ended with none left)."""
        while not self.queued:
            if self.kicked or self.closed or self.ending:
                return False
            self._wake.clear()
            await self._wake.wait()
        return not (self.kicked or self.closed)

    def _taken(self, total: int, count: int) -> None:
        self._nbytes -= total
        self.queued -= count
        room = self.queued < self.max_items // 2 or self._nbytes <= self.max_bytes // 2
        if room and not self._room.value:
            self._room.set()

    async def next_frames(self, limit_bytes: int = 1 << 20) -> list[bytes]:
        """Wait for queued frames and take them (:meth:`take_frames`). Returns an empty list when the session
        was kicked or closed: the transport then closes."""
        if not await self._wait_frames():
            return []
        return self.take_frames(limit_bytes)

    def take_frames(self, limit_bytes: int = 1 << 20) -> list[bytes]:
        """Take queued frames: at least one (if any), then up to ``limit_bytes`` in total. (A packed-only run,
        which only a batching session gets, comes as its batch frames.) A writer that need not wait (its
        socket takes the bytes at once) takes them here, without a coroutine."""
        frames = self._frames
        out: list[bytes]
        if self._nbytes <= limit_bytes:
            # Everything fits (the common case): take the whole queue in one step.
            if not self._runs:
                out = [data for data, _ in cast("list[tuple[bytes, bool]]", frames)]  # no runs queued
            else:
                out = []
                for e in frames:
                    if type(e) is FrameRun:
                        out += e.single()
                    else:
                        out.append(e[0])
                self._runs = 0
            frames.clear()
            self._taken(self._nbytes, self.queued)
            return out
        out = []
        total = 0
        count = 0
        i = 0  # the entries taken: frames[:i], removed in one step at the end
        while i < len(frames):
            e = frames[i]
            if type(e) is not FrameRun:
                n = len(e[0])
                if out and total + n > limit_bytes:
                    break
                i += 1
                out.append(e[0])
                total += n
                count += 1
                continue
            run_frames = e.frames
            if run_frames is None or total + e.nbytes <= limit_bytes:
                if out and total + e.nbytes > limit_bytes:
                    break  # a packed-only run goes whole
                i += 1
                self._runs -= 1
                out += e.single()
                total += e.nbytes
                count += e.count
                continue
            # Take the part of the run that fits (at least one frame); the rest stays queued as a new run.
            k = 0
            part = 0
            for f in run_frames:
                if (out or k) and total + part + len(f) > limit_bytes:
                    break
                part += len(f)
                k += 1
            if k:
                out += run_frames[:k]
                total += part
                count += k
                if k < len(run_frames):
                    frames[i] = FrameRun(run_frames[k:], e.nbytes - part)
                else:  # its last frame, alone over the limit: the run is done
                    i += 1
                    self._runs -= 1
            break
        del frames[:i]
        self._taken(total, count)
        return out

    async def next_entries(self, limit_bytes: int = 1 << 20) -> list[bytes | FrameRun]:
        """Like :meth:`next_frames`, for a writer that packs batch frames: the event runs come whole, as
        :class:`FrameRun` (pack them with :meth:`FrameRun.batches`, which shares the packing with every
        session holding the same run); other frames come alone. Takes at least one entry, then entries up to
        ``limit_bytes`` in total (a run counts whole, and may alone exceed it).
        """
        if not await self._wait_frames():
            return []
        return self.take_entries(limit_bytes)

    def take_entries(self, limit_bytes: int = 1 << 20) -> list[bytes | FrameRun]:
        """:meth:`next_entries` without the wait, as :meth:`take_frames` is :meth:`next_frames`'s."""
        frames = self._frames
        out: list[bytes | FrameRun] = []
        total = 0
        count = 0
        if self._nbytes <= limit_bytes:
            for e in frames:
                if type(e) is FrameRun:
                    out.append(e)
                else:
                    out.append(e[0])
            frames.clear()
            self._runs = 0
            self._taken(self._nbytes, self.queued)
            return out
        i = 0  # the entries taken: frames[:i], removed in one step at the end
        while i < len(frames):
            e = frames[i]
            if type(e) is FrameRun:
                n, k = e.nbytes, e.count
            else:
                n, k = len(e[0]), 1
            if out and total + n > limit_bytes:
                break
            i += 1
            if type(e) is FrameRun:
                self._runs -= 1
                out.append(e)
            else:
                out.append(e[0])
            total += n
            count += k
        del frames[:i]
        self._taken(total, count)
        return out

    async def wait_room(self) -> None:
        """Wait until the frames queued and the replies owed (:attr:`owed`) are below half the queue's bound,
        or the session ends: read-side back-pressure. Every transport stops reading its connection here,
        and a connection whose socket failed is closed by its pump (``SessionPump.run``), which wakes it."""
        while self.queued + self.owed >= self.max_items // 2 and not (
            self.closed or self.kicked or self.ending
        ):
            self._room.clear()
            await self._room.wait()

    def needs_room(self) -> bool:
        """Whether a replay must wait (:meth:`wait_replay_room`) before it queues one more event frame."""
        return self.queued >= self.max_items - 1 or self._nbytes > self.max_bytes // 2

    async def wait_replay_room(self) -> None:
        """Wait until one more event frame (up to half the byte bound) fits without overflowing the queue, or
        the session ends: the pacing of a replay and of the held events after it, which must never trigger
        the overflow policy."""
        while self.needs_room() and not (self.closed or self.kicked or self.ending):
            self._room.clear()
            await self._room.wait()

    def end(self, code: Disconnect) -> None:
        """Close gracefully with ``code`` once the frames already queued are written."""
        if not self.ending:
            self.ending = code
            self._wake.set()
            self._room.set()

    def close(self) -> None:
        self.closed = True
        self._clear()
        self._wake.set()
        self._room.set()

    def statistics(self) -> dict[str, int]:
        return {
            "queued_frames": self.queued,
            "queued_bytes": self._nbytes,
            "delivered": self.stats.delivered,
            "dropped": self.stats.dropped,
            "owed": self.owed,
        }


def packed_limit(sess: OutboundQueue) -> int:
    """The batch size of a session that takes packed-only runs (:class:`FrameRun` without single frames: a
    replay's chunks, a fan-out's runs), else 0: a batching session (``batch_limit``) whose encoder is a
    :class:`BatchEncoder`, under the DISCONNECT policy (the others drop single frames)."""
    ok = sess.overflow is Overflow.DISCONNECT and hasattr(sess.encoder, "encode_run_batches")
    return sess.batch_limit if ok else 0
