"""Writes held to the end of the loop callback that queued them.

A connection's write loop writes what a loop step queued for it at the end of that step
(:meth:`~hubbub.transports.pump.SessionPump._write_now`, a ``call_soon``), so that a step's frames for one
connection go out in one write. The callback that delivers events, a commit's
(``WriteBatcher._on_committed``: made inline by the tick's flush, or handed back by the writer thread),
holds those writes instead (:func:`hold`) and makes them when it ends (:func:`release`): the frames go out
in the callback that made them, not after the loop's next turn (its ``epoll`` call, its bookkeeping, the
ready callbacks before this one). The writes are coalesced all the same: every frame a commit queued for a
connection (its acks, its whole fan-out) goes out in one write, as a loop step's did.

A write due outside a held callback is scheduled as before (:func:`call_soon`, ``loop.call_soon``). Holds
do not nest: a callback run inside a held one adds to the outer hold, released once. What a released write
queues (a failure's close, a second write) joins the same release.

Concurrency contract: the loop thread only; each thread that runs a loop has its own hold (a thread-local),
so a client's loop in another thread of the same process never sees the server's.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

__all__ = ["Deferred", "call_soon", "hold", "release"]


class Deferred:
    """A write :func:`call_soon` put off to the end of the running hold: :meth:`cancel` takes it back (what a
    scheduled ``asyncio.Handle`` offers, so the caller keeps either)."""

    __slots__ = ("callback", "cancelled")

    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class _Holds(threading.local):
    #: The writes of the running hold, in the order they came; None while nothing holds.
    due: list[Deferred] | None = None


_holds = _Holds()


def call_soon(callback: Callable[[], None]) -> Deferred | asyncio.Handle:
    """Call ``callback`` when the running hold is released, or at the end of this loop step when nothing
    holds. The result's ``cancel()`` takes the call back."""
    due = _holds.due
    if due is None:
        return asyncio.get_running_loop().call_soon(callback)
    held = Deferred(callback)
    due.append(held)
    return held


def hold() -> bool:
    """Hold the writes :func:`call_soon` is given from here on; True when this call started the hold (its
    caller then releases it, :func:`release`, in a ``finally``), False inside a hold already."""
    if _holds.due is not None:
        return False
    _holds.due = []
    return True


def release() -> None:
    """Make the held writes, in order, the ones they add included, and end the hold. A write that raises is
    reported to the loop's exception handler, as a failing ``call_soon`` callback is, and the others are
    made all the same: one connection's failure never reaches the callback that held its write (a read of
    another connection, which would be closed for it)."""
    holds = _holds
    due = holds.due
    if due is None:
        return
    i = 0
    try:
        while i < len(due):
            held = due[i]
            i += 1
            if held.cancelled:
                continue
            try:
                held.callback()
            except Exception as exc:
                _failed(held, exc)
    finally:
        holds.due = None
        if i < len(due):  # left by a BaseException: the rest at the end of the loop step, not lost
            loop = asyncio.get_running_loop()
            for held in due[i:]:
                loop.call_soon(_make, held)


def _make(held: Deferred) -> None:
    if not held.cancelled:
        try:
            held.callback()
        except Exception as exc:
            _failed(held, exc)


def _failed(held: Deferred, exc: Exception) -> None:
    asyncio.get_running_loop().call_exception_handler(
        {"message": "a held write failed", "exception": exc, "callback": held.callback}
    )
