"""Sending a pattern's replay (:class:`~hubbub.core.replay.ReplayScan`): the log read in commit order a page
at a time, each page read on a reader thread while the event loop queues the previous one, paced by the
session's queue (replay traffic never makes a subscriber slow). The replay holds at most two pages whatever
its length or the number of channels.

A replay never hides a gap: a channel whose events no longer continue the snapshot (trimmed or reset while
the replay ran), a listed channel whose replay ends short of the head the snapshot promised, or a counted
scan (:func:`~hubbub.core.replay.count_scan`) that no longer finds what was counted, closes the session as
a slow consumer: the client resumes and is told the gap. An event whose encoding raises closes it with an
internal error (:class:`~hubbub.core.faults.Faults`).

Concurrency contract: called from the event loop thread only; the pages are read on the reader threads.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hubbub.channels import Pattern
from hubbub.disconnect import Disconnect
from hubbub.errors import HubbubError
from hubbub.events import Event, Position
from hubbub.log.base import EventLog

from .faults import Faults
from .filters import withheld
from .reads import LogReads, drop
from .replay import TAKEN_MAX, Gap, ReplayScan, ScanCursor, census_gaps, scan_page
from .session import FrameRun, Session

__all__ = ["ScanSent", "send_scan"]

log = logging.getLogger("hubbub.node")


@dataclass(slots=True)
class ScanSent:
    """What :func:`send_scan` did: ``sent`` events queued, and per channel the last position queued or passed
    over (the live junction's snapshot)."""

    sent: int
    expect: dict[str, Position]


class _PageFault(Exception):
    """A page's encoding raised on a reader thread (``error``) for ``event``, the first of the page whose
    encoding alone raises (or the page's first): the fault is reported with its place, as on the loop."""

    def __init__(self, event: Event, error: Exception) -> None:
        super().__init__(event.channel, event.seq)
        self.event = event
        self.error = error


def _fault(
    encode: Callable[..., list[bytes]], events: list[Event], subs: list[str], error: Exception
) -> _PageFault:
    """The :class:`_PageFault` of a page whose encoding raised ``error``: each event is encoded alone, on this
    failure path only, to find the one that raises."""
    for ev in events:
        try:
            encode([ev], subs, True, {})
        except Exception as exc:
            return _PageFault(ev, exc)
    return _PageFault(events[0], error)


def _lost(session: Session) -> None:
    if not (session.closed or session.kicked or session.ending):
        log.info(
            "replay lost its snapshot (trimmed or reset meanwhile)",
            extra={"dialect": session.dialect, "session": session.id},
        )
        session.kick(session.slow_close_code)


async def _tell_census_gaps(
    reads: LogReads,
    session: Session,
    scan: ReplayScan,
    cur: ScanCursor,
    visible: Callable[[str], bool] | None,
    on_gap: Callable[[Gap], None] | None,
) -> None:
    """The gaps of channels trimmed or reset away while ``scan`` ran (:func:`census_gaps`), told through
    ``on_gap``, or by closing the session as a slow consumer where the dialect has no gap notice."""
    for gap in await reads.call(census_gaps, scan, cur):
        if visible is not None and not visible(gap.channel):
            continue
        if on_gap is None:
            _lost(session)
            return
        on_gap(gap)


async def send_scan(
    reads: LogReads,
    store: EventLog,
    session: Session,
    sub_ids: list[str],
    pattern: Pattern,
    visible: Callable[[str], bool] | None,
    scan: ReplayScan,
    tops: dict[str, int],
    faults: Faults,
    *,
    exact: bool = True,
    on_gap: Callable[[Gap], None] | None = None,
) -> ScanSent:
    """Queue ``scan``'s events to ``session`` for ``sub_ids`` (a list, not a tuple: encoders cache a tuple's
    frame per fan-out, and this cache spans the replay). A scan with a ``limit`` (its count, announced) must
    send exactly that many, else the session is closed as a slow consumer; with ``exact`` (a subscription's
    junction follows, which takes every event of the scan as sent or passed over) it also reads the scan
    to its end to check there is no more, and without it (a fetch) it stops at the limit. An encoding that
    raises closes the session through ``faults``. ``on_gap`` queues the notice of a gap the scan found
    (:attr:`ReplayScan.trim_gaps`, :attr:`ReplayScan.census`), called just before its channel's first event
    (or at the end, for a channel whose last events went); without it a gap closes the session as a slow
    consumer, the close telling it.

    Each page is read and sifted on a reader thread: the channels ``visible`` (thread-safe: a permission,
    asked once per channel per scan) and the events the session's delivery filters let through. When the
    session's encoder is a :class:`~hubbub.core.session.PageEncoder` and the scan has no count to stop at,
    the page is also encoded there and cut into the chunks the queue takes (``Session.replay_chunks``:
    packed into batch frames already for a batching session), so the loop only queues them; other encoders
    get the events one by one on the loop, and so does a page with a gap to tell (rare), so that the notice
    comes just before its channel's first event."""
    cur = ScanCursor(scan.after, dict(scan.since))
    gaps = cur.gaps
    limit = scan.limit
    encode_page = getattr(session.encoder, "encode_page", None) if limit is None else None
    chunks = session.replay_chunks
    seen: dict[str, bool] = {}  # channel -> visible, asked once per scan
    shapes: dict[Any, Any] = {}  # the encoder's, from page to page

    def read_page() -> tuple[list[Event], list[FrameRun] | None, list[tuple[int, Gap]]]:
        events = scan_page(store, pattern, scan, cur)
        kept: list[Event] = []
        notes: list[tuple[int, Gap]] = []  # (index in kept the gap is told before, gap)
        for ev in events:
            if visible is not None:
                ok = seen.get(ev.channel)
                if ok is None:
                    if len(seen) >= TAKEN_MAX:
                        seen.clear()
                    ok = seen[ev.channel] = visible(ev.channel)
                if not ok:
                    continue
            if gaps and ev.channel in gaps:
                # Told even when the event itself is withheld: the gap is the channel's, not the event's.
                notes.append((len(kept), gaps.pop(ev.channel)))
            if ev.headers and withheld(session, ev):
                continue  # not this connection's, as in live fan-out (README §3)
            kept.append(ev)
        if encode_page is None or not kept or notes:
            return kept, None, notes
        try:
            frames = encode_page(kept, sub_ids, True, shapes)
        except Exception as exc:
            raise _fault(encode_page, kept, sub_ids, exc) from exc
        return kept, chunks(frames), notes

    def tell(gap: Gap) -> bool:
        if on_gap is None:  # no way to tell it in this dialect: the close tells it
            _lost(session)
            return False
        on_gap(gap)
        return True

    sent = 0
    ev: Event | None = None
    pending = reads.submit(read_page)
    try:
        while True:
            try:
                events, chunked, notes = await pending
            except HubbubError as exc:
                log.warning("replay read failed: %s", exc, extra={"session": session.id})
                session.kick(Disconnect.of(exc.code))
                break
            done, broken = cur.done, cur.broken
            if not done and (exact or limit is None or sent < limit):
                pending = reads.submit(read_page)
            if chunked is not None:
                n = await session.replay_runs(chunked)
                sent += n
                if n < len(events):
                    return ScanSent(sent, cur.expect)  # the session ended meanwhile
                events = []
            for i, ev in enumerate(events):
                if session.closed or session.kicked or session.ending:
                    return ScanSent(sent, cur.expect)
                while notes and notes[0][0] == i:
                    if not tell(notes.pop(0)[1]):
                        return ScanSent(sent, cur.expect)
                if sent == limit:
                    # More than was counted: the junction's snapshot (cur.expect) is past what was sent.
                    if exact:
                        _lost(session)
                    return ScanSent(sent, cur.expect)
                if session.needs_room():
                    await session.wait_replay_room()
                # A rendering cache of the event's own, as in fan-out: encoders cache its bytes in it under
                # fixed keys, so one cache for the whole replay would send the first event's bytes for all.
                sent += session.deliver(ev, sub_ids, {}, replay=True)
            for _, gap in notes:  # after the page's last event sent: its channel's first ones were withheld
                if session.closed or session.kicked or session.ending or not tell(gap):
                    return ScanSent(sent, cur.expect)
            if done or (limit is not None and sent == limit and not exact):
                short = broken or any(
                    cur.expect[ch].seq < tops.get(ch, 0) for ch in scan.since if ch not in cur.cut
                )
                if limit is not None and sent != limit:
                    short = True  # fewer than counted (and announced): trimmed or reset meanwhile
                if short:
                    _lost(session)
                elif scan.census:
                    await _tell_census_gaps(reads, session, scan, cur, visible, on_gap)
                break
    except Exception as exc:  # this session's failure: see core/faults.py
        if isinstance(exc, _PageFault):
            ev, exc = exc.event, exc.error
        channel, seq = (ev.channel, ev.seq) if ev is not None else ("", 0)
        faults.close(session, channel, seq, exc, stage="replay")
    finally:
        drop(pending)
    return ScanSent(sent, cur.expect)
