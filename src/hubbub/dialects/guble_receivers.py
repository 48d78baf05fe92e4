"""One guble connection's receivers (guble.md §4-§6), sans-I/O: the receiver table, a receiver replaced by a
second ``+`` for its path, the notices each step sends, and a slow consumer's catch-up from the log.

The wiring (``hubbub.transports.guble``) runs each receiver's subscription or fetch as a task of the
connection and tells this state machine what happened; the state machine says what to send and what to stop:

* ``+ <path>`` → :meth:`GubleReceivers.add`: a new :class:`Receiver` (id ``g<n>``), replacing silently the
  one the path had (the wiring stops the old one's work);
* ``- <path>`` → :meth:`GubleReceivers.cancel` (the wiring stops it, then sends ``#canceled``);
* the core's snapshot and the end of a replay → :meth:`snapshot_notice`, :meth:`replayed_notices`; the
  subscription in place → :meth:`subscribed` (whether the receiver is live: not replaced or dropped
  meanwhile);
* the session dropped its queued live events (overflow ``catch_up``) → :meth:`drop_live`: every live or
  re-subscribing receiver is dropped and pending for a catch-up from the newest live event written
  (:class:`~hubbub.dialects.guble_fetch.LiveMark`); :meth:`take_pending` and :meth:`resubscriber` then give
  the re-subscriptions, ancestors first (:func:`~hubbub.dialects.guble_fetch.catch_up_steps`).

Invariants: ``receivers`` holds at most one receiver per path, the newest; a receiver is ``live`` only while
it is that path's receiver and not dropped; a dropped receiver is in the pending catch-up until its
re-subscription replaces it; ``catch_up_subs`` holds the ids of the receivers whose fetch frames count as
live events for the next catch-up.

Concurrency contract: one connection's object, called from one thread (the event loop).
"""

from __future__ import annotations

import itertools
import time
from typing import Any, Final, Protocol

from hubbub.disconnect import Disconnect
from hubbub.errors import FrameTooLarge, HubbubError

from .actions import Close, Reject
from .guble_fetch import CatchUpStep, LiveMark, catch_up_steps, render_path, subtree_pattern

__all__ = ["GubleFrames", "GubleReceivers", "Receiver"]

_ORDER: Final = itertools.count()


class Notices(Protocol):
    """What renders the notices (``GubleCodec``)."""

    def encode_notice(self, name: str, arg: str | None = None) -> bytes: ...


class Codec(Notices, Protocol):
    """What decodes frames and renders error lines (``GubleCodec``, ``error_text``)."""

    def decode(self, frame: str | bytes) -> Any: ...


class GubleFrames:
    """A guble WebSocket as the driver feeds it (a :class:`~hubbub.dialects.spec.FrameConnection`): each
    frame, text or binary, is one command (guble.md §3), handed over as decoded (``Send``, ``Receive``,
    ``Cancel``); a frame over the limit closes 1009; any other bad frame is answered with its ``!error``
    line (:class:`~hubbub.dialects.actions.Reject`) and the connection stays open."""

    __slots__ = ("_codec", "_error_text")

    def __init__(self, codec: Codec, error_text: Any) -> None:
        self._codec = codec
        self._error_text = error_text

    def receive_frame(self, frame: bytes | str, binary: bool = False) -> list[object]:
        try:
            return [self._codec.decode(frame)]
        except FrameTooLarge as exc:
            return [Close(Disconnect.MESSAGE_TOO_BIG, exc.detail or exc.message)]
        except HubbubError as exc:
            return [Reject(self._error_text(exc))]


class Receiver:
    """One ``+ <path>`` of one connection. ``task`` is the wiring's handle of its work (opaque here)."""

    __slots__ = (
        "catching",
        "channel",
        "dropped",
        "live",
        "order",
        "path",
        "pattern",
        "registered_ns",
        "sub_id",
        "task",
    )

    def __init__(self, channel: str, sub_id: str) -> None:
        self.channel = channel
        self.path = render_path(channel)
        self.pattern = subtree_pattern(channel)
        self.sub_id = sub_id
        self.task: Any = None
        self.live = False
        self.catching = False  # re-subscribing in a catch-up
        self.dropped = False  # unsubscribed by a catch-up, which will re-subscribe its channel
        self.registered_ns = time.time_ns()
        self.order = next(_ORDER)


class GubleReceivers:
    """The receivers of one connection. See the module docstring."""

    def __init__(self, codec: Notices) -> None:
        self.codec = codec
        self.receivers: dict[str, Receiver] = {}
        self._ids = itertools.count(1)
        #: Where a catch-up starts: the newest live event written (guble.md §6).
        self.mark = LiveMark()
        #: Receivers whose fetch frames count as live events for a catch-up (see the module docstring).
        self.catch_up_subs: set[str] = set()
        self._pending: dict[str, Receiver] | None = None  # receivers waiting for a catch-up
        self._from_ns: int | None = None
        self.catch_ups = 0

    # -- commands -----------------------------------------------------------------------------------------

    def add(self, channel: str) -> tuple[Receiver, Receiver | None]:
        """A new receiver of ``channel``, and the one it replaces (to stop), if any."""
        old = self.receivers.pop(channel, None)
        rec = self.receivers[channel] = Receiver(channel, f"g{next(self._ids)}")
        return rec, old

    def cancel(self, channel: str) -> Receiver | None:
        """``- <path>``: the receiver to stop (None: the path has none)."""
        return self.receivers.pop(channel, None)

    def is_current(self, rec: Receiver) -> bool:
        return self.receivers.get(rec.channel) is rec

    def discard(self, rec: Receiver) -> bool:
        """``rec``'s work ended without a live subscription (a fetch done, a failure): it leaves the table
        if it is still its path's receiver (returned)."""
        if self.is_current(rec):
            del self.receivers[rec.channel]
            return True
        return False

    # -- notices ------------------------------------------------------------------------------------------

    def notice(self, name: str, arg: str | None = None) -> bytes:
        return self.codec.encode_notice(name, arg)

    def snapshot_notice(self, rec: Receiver, fetch: bool, count: int, from_time: int | None) -> bytes:
        """The notice of a receiver's snapshot: ``#fetch-start <path> <count>`` before a fetch (whose start,
        ``from_time``, is as far back as a catch-up may reach for it), else ``#subscribed-to <path>``."""
        if not fetch:
            return self.notice("subscribed-to", rec.path)
        if from_time is not None:
            rec.registered_ns = min(rec.registered_ns, from_time)
        return self.notice("fetch-start", f"{rec.path} {count}")

    def replayed_notices(self, rec: Receiver) -> list[bytes]:
        return [self.notice("fetch-end", rec.path), self.notice("subscribed-to", rec.path)]

    def subscribed(self, rec: Receiver) -> bool:
        """``rec``'s subscription is in place: whether it is live (still its path's receiver, not dropped
        meanwhile)."""
        rec.catching = False
        rec.live = not rec.dropped and self.is_current(rec)
        return rec.live

    # -- catch-up -----------------------------------------------------------------------------------------

    def drop_live(self) -> tuple[list[Receiver], list[Receiver], bool]:
        """The session dropped its queued live events: the receivers to unsubscribe now (live, or
        re-subscribing in a catch-up under way), those of them whose work is to be stopped (the
        re-subscribing ones), and whether a catch-up must start (else the one under way takes them)."""
        t = self.mark.dropped()
        self.catch_ups += 1
        self._from_ns = t if self._from_ns is None else min(self._from_ns, t)
        start = self._pending is None
        pending = self._pending if self._pending is not None else {}
        out: list[Receiver] = []
        stop: list[Receiver] = []
        for r in list(self.receivers.values()):
            if r.live or r.catching:
                out.append(r)
                if r.catching:
                    stop.append(r)
                r.live = r.catching = False
                r.dropped = True
                pending[r.channel] = r
        self._pending = pending
        return out, stop, start

    def take_pending(self) -> list[tuple[Receiver, CatchUpStep]]:
        """The next round of a catch-up: each dropped receiver with its step, ancestors first (empty: the
        catch-up is over)."""
        dropped = self._pending
        if not dropped:
            self._pending = None
            return []
        self._pending = {}
        from_ns = self._from_ns or 0
        self._from_ns = None
        steps = catch_up_steps([(r.channel, r.registered_ns) for r in dropped.values()], from_ns)
        return [(dropped[s.channel], s) for s in steps]

    def resubscriber(self, old: Receiver) -> Receiver | None:
        """The receiver re-subscribing ``old``'s path in a catch-up (None: ``old`` was cancelled or replaced
        meanwhile)."""
        if not self.is_current(old):
            return None
        rec = Receiver(old.channel, f"g{next(self._ids)}")
        rec.registered_ns = old.registered_ns
        rec.catching = True
        self.receivers[old.channel] = rec
        self.catch_up_subs.add(rec.sub_id)
        return rec

    def end_catch_up(self) -> None:
        self._pending = None
