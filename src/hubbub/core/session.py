"""Sessions: one connection as the core sees it, with a bounded outbound queue.

A session never sees a wire format. The transport gives it an :class:`Encoder`, which turns events into the
bytes of the connection's dialect; the core calls it once per event and fan-out, sharing a per-event cache
between sessions with the same ``Encoder.key`` so each event is encoded once per dialect, not once per
subscriber.

Concurrency contract: every method is called from the event loop thread only.

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
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, Protocol

from hubbub.events import Event
from hubbub.log.base import EventRun

from .flag import Flag

__all__ = ["Encoder", "Overflow", "RunEncoder", "Session", "SessionStats", "new_session_id"]


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


@dataclass(slots=True)
class SessionStats:
    queued_frames: int = 0
    queued_bytes: int = 0
    delivered: int = 0
    dropped: int = 0


@dataclass(eq=False, slots=True)
class Session:
    """A connection's state in the core. Identity-hashed: it is used as a dict key in fan-out."""

    dialect: str
    encoder: Encoder
    max_items: int
    max_bytes: int
    overflow: Overflow = Overflow.DISCONNECT
    slow_close_code: int = 4302
    id: str = field(default_factory=new_session_id)
    user: str = ""
    echo: bool = True
    params: dict[str, str] = field(default_factory=dict)
    on_catch_up: Callable[[], None] | None = None
    #: Called once when the session is kicked as a slow consumer (the node counts it).
    on_slow: Callable[[Session], None] | None = None
    _frames: deque[tuple[bytes, bool]] = field(default_factory=deque)
    _nbytes: int = 0
    # Flags, not asyncio.Events: a session exists per idle connection, and an Event costs some 850 bytes.
    _wake: Flag = field(default_factory=Flag)
    _room: Flag = field(default_factory=Flag)
    kicked: int = 0
    ending: int = 0
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
        if len(self._frames) >= self.max_items or self._nbytes + n > self.max_bytes:
            if not is_event:
                if len(self._frames) >= 4 * self.max_items or self._nbytes + n > 4 * self.max_bytes:
                    self.kick(self.slow_close_code)
                    return False
            elif not self._overflow(n, is_event):
                return False
        self._frames.append((data, is_event))
        self._nbytes += n
        if len(self._frames) == 1:
            self._wake.set()
        return True

    def deliver(self, event: Event, subs: Sequence[str], cache: dict[Any, Any], replay: bool = False) -> bool:
        """Encode (through the shared cache) and queue one event."""
        data = self.encoder.encode_event(event, subs, replay, cache)
        frames = self._frames
        n = len(data)
        if (
            len(frames) < self.max_items
            and self._nbytes + n <= self.max_bytes
            and not (self.closed or self.kicked or self.ending)
        ):
            # push()'s common case, inlined: this runs once per event per subscribed connection.
            frames.append((data, True))
            self._nbytes += n
            if len(frames) == 1:
                self._wake.set()
            self.stats.delivered += 1
            return True
        ok = self.push(data, is_event=True)
        if ok:
            self.stats.delivered += 1
        return ok

    def deliver_frames(self, frames: list[bytes], nbytes: int) -> int:
        """Queue already-encoded event frames (``nbytes`` in all); returns how many were queued.

        The fan-out of a run of events: when they fit, they are queued in one step; otherwise one by one
        through :meth:`push`, so the overflow policy applies exactly as for single events.
        """
        q = self._frames
        k = len(frames)
        if (
            len(q) + k <= self.max_items
            and self._nbytes + nbytes <= self.max_bytes
            and not (self.closed or self.kicked or self.ending)
        ):
            was_empty = not q
            q.extend(zip(frames, repeat(True)))
            self._nbytes += nbytes
            if was_empty and k:
                self._wake.set()
            self.stats.delivered += k
            return k
        n = 0
        for f in frames:
            if self.push(f, is_event=True):
                n += 1
            elif self.kicked or self.closed:
                break
        self.stats.delivered += n
        return n

    def encode_run(self, run: EventRun, subs: Sequence[str], cache: dict[Any, Any]) -> list[bytes]:
        """The replayed event frames of ``run`` for this connection (through the encoder's ``encode_run`` when
        it has one, else event by event through ``cache``)."""
        encode_run = getattr(self.encoder, "encode_run", None)
        if encode_run is not None:
            frames: list[bytes] = encode_run(run.proto, run.rows, subs, True)
            return frames
        encode = self.encoder.encode_event
        return [encode(ev, subs, True, cache) for ev in run.events()]

    async def replay_frames(self, frames: list[bytes]) -> int:
        """Queue replayed event frames in order, pacing on the queue: wait for room rather than overflow,
        since a replay can read the log much faster than the connection drains. Returns how many were queued
        (fewer only when the session ended meanwhile).

        The frames go in chunks of at most half the queue's bound (in frames and in bytes; a single frame may
        be larger), each queued once the queue has room for it; the writer frees room as it takes frames.
        """
        done = 0
        total = len(frames)
        step = max(1, self.max_items // 2)
        while done < total:
            if self.closed or self.kicked or self.ending:
                break
            chunk = frames[done : done + step] if done or total > step else frames
            nbytes = sum(map(len, chunk))
            while nbytes > self.max_bytes // 2 and len(chunk) > 1:
                chunk = chunk[: len(chunk) // 2]
                nbytes = sum(map(len, chunk))
            while self._frames and (
                len(self._frames) + len(chunk) >= self.max_items or self._nbytes + nbytes > self.max_bytes
            ):
                if self.closed or self.kicked or self.ending:
                    return done
                self._room.clear()
                await self._room.wait()
            if self.closed or self.kicked or self.ending:
                break
            done += self.deliver_frames(chunk, nbytes)
        return done

    def kick(self, code: int) -> None:
        """Ask the transport to close the connection with ``code`` (after the dialect's error, if any)."""
        if not self.kicked and not self.closed:
            self.kicked = code
            self._frames.clear()
            self._nbytes = 0
            self._wake.set()
            self._room.set()
            if code == self.slow_close_code and self.on_slow is not None:
                self.on_slow(self)

    def _overflow(self, n: int, is_event: bool) -> bool:
        if self.overflow is Overflow.DISCONNECT:
            self.kick(self.slow_close_code)
            return False
        if self.overflow is Overflow.DROP_OLDEST:
            frames = self._frames
            kept: deque[tuple[bytes, bool]] = deque()
            while frames and (len(frames) + len(kept) >= self.max_items or self._nbytes + n > self.max_bytes):
                data, ev = frames.popleft()
                if ev:
                    self._nbytes -= len(data)
                    self.stats.dropped += 1
                else:
                    kept.append((data, ev))
            frames.extendleft(reversed(kept))
            if len(frames) >= self.max_items or self._nbytes + n > self.max_bytes:
                if is_event:
                    self.stats.dropped += 1
                    return False
                self.kick(self.slow_close_code)
                return False
            return True
        # CATCH_UP: drop every queued live event and let the dialect refill from the log.
        remaining = deque(f for f in self._frames if not f[1])
        self.stats.dropped += len(self._frames) - len(remaining)
        self._frames = remaining
        self._nbytes = sum(len(d) for d, _ in remaining)
        if self.on_catch_up is not None:
            self.on_catch_up()
        return not is_event

    # -- consuming (transport side) ---------------------------------------------------------------------

    async def next_frames(self, limit_bytes: int = 1 << 20) -> list[bytes]:
        """Wait for queued frames and take them (at least one, then up to ``limit_bytes`` in total).

        Returns an empty list when the session was kicked or closed: the transport then closes.
        """
        while not self._frames:
            if self.kicked or self.closed or self.ending:
                return []
            self._wake.clear()
            await self._wake.wait()
        if self.kicked or self.closed:
            return []
        frames = self._frames
        out: list[bytes]
        if self._nbytes <= limit_bytes:
            # Everything fits (the common case): take the whole queue in one step.
            out = [data for data, _ in frames]
            frames.clear()
            total = self._nbytes
        else:
            out = []
            total = 0
            while frames and (not out or total + len(frames[0][0]) <= limit_bytes):
                data, _ = frames.popleft()
                total += len(data)
                out.append(data)
        self._nbytes -= total
        if len(frames) < self.max_items // 2 or self._nbytes <= self.max_bytes // 2:
            self._room.set()
        return out

    async def wait_room(self) -> None:
        """Wait until the queue is at most half full (or the session ends): read-side back-pressure."""
        while len(self._frames) >= self.max_items // 2 and not (self.closed or self.kicked or self.ending):
            self._room.clear()
            await self._room.wait()

    def end(self, code: int) -> None:
        """Close gracefully with ``code`` once the frames already queued are written."""
        if not self.ending:
            self.ending = code
            self._wake.set()
            self._room.set()

    def close(self) -> None:
        self.closed = True
        self._frames.clear()
        self._nbytes = 0
        self._wake.set()
        self._room.set()

    @property
    def queued(self) -> int:
        return len(self._frames)

    def statistics(self) -> dict[str, int]:
        return {
            "queued_frames": len(self._frames),
            "queued_bytes": self._nbytes,
            "delivered": self.stats.delivered,
            "dropped": self.stats.dropped,
        }
