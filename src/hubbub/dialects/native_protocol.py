"""The native protocol's per-connection state machine (native.md §2-§6), sans-I/O.

:class:`NativeProtocol` holds what one native connection must remember between frames: whether ``hello``
was done and what it negotiated (``echo``, ``batch``), and the pipelining of publish replies: the request ids
of the publishes in flight, oldest first, so that each commit result (which the core delivers in submission
order) becomes the reply to the right request. It decides which commands a connection in its current phase
may give, and renders the frames of the handshake, the publish replies and the subscription notices. It
never touches a socket, the event loop or the core: frames go out through ``emit`` (the transport queues them
on the connection's session), and the transport turns the decisions into core calls.

Legal transitions (the phase of a connection)::

    phase   input                           next    frames out
    -----   -----                           ----    ----------
    HELLO   hello v1 (accepted by the core) OPEN    hello reply
    HELLO   hello, another version          CLOSED  error 4006 (supported: [1]), close
    HELLO   pong                            HELLO   none
    HELLO   anything else                   CLOSED  error 4005, close
    OPEN    hello                           CLOSED  error 4005 "hello already done", close
    OPEN    any other command               OPEN    its reply (the core decides what it does)
    any     a fatal error                   CLOSED  the error, close
    CLOSED  anything                        CLOSED  none (the connection is closing)

Invariants: replies to publishes go out in the order of the publishes (the FIFO of ids); ``inflight`` is the
number of publishes submitted and not completed, never negative.

Concurrency contract: one object per connection, called from the event loop thread only.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from operator import itemgetter
from typing import Any, Final, Protocol

from hubbub.disconnect import Disconnect
from hubbub.errors import HubbubError
from hubbub.events import Event, Position

from .native_codec import PROTOCOL_VERSION, NativeCodec
from .native_commands import Command, Hello, Pong

__all__ = ["Admit", "GapNotice", "NativeProtocol", "Phase", "Result"]


class Phase(enum.Enum):
    HELLO = "hello"
    OPEN = "open"
    CLOSED = "closed"


class Admit(enum.Enum):
    """What the connection does with a command in its current phase (:meth:`NativeProtocol.admit`)."""

    HANDLE = "handle"  # give it to the core
    HELLO = "hello"  # the handshake: authenticate, then :meth:`NativeProtocol.opened`
    IGNORE = "ignore"
    REFUSED = "refused"  # an error went out and the connection closes


#: (phase, command kind) → (verdict, next phase): the table of the module docstring.
#: Whether a queued publish ``(id, ack wanted)`` wants its reply.
_WANTS_ACK: Final = itemgetter(1)

_TABLE: Final[dict[tuple[Phase, str], tuple[Admit, Phase]]] = {
    (Phase.HELLO, "hello"): (Admit.HELLO, Phase.HELLO),
    (Phase.HELLO, "pong"): (Admit.IGNORE, Phase.HELLO),
    (Phase.HELLO, "other"): (Admit.REFUSED, Phase.CLOSED),
    (Phase.OPEN, "hello"): (Admit.REFUSED, Phase.CLOSED),
    (Phase.OPEN, "pong"): (Admit.HANDLE, Phase.OPEN),
    (Phase.OPEN, "other"): (Admit.HANDLE, Phase.OPEN),
    # Closing: the error went out already; what the client sent after it is not answered.
    (Phase.CLOSED, "hello"): (Admit.IGNORE, Phase.CLOSED),
    (Phase.CLOSED, "pong"): (Admit.IGNORE, Phase.CLOSED),
    (Phase.CLOSED, "other"): (Admit.IGNORE, Phase.CLOSED),
}


class GapNotice(Protocol):
    """A gap to announce (``hubbub.core.Gap`` is one)."""

    @property
    def channel(self) -> str: ...
    @property
    def since(self) -> Position: ...
    @property
    def position(self) -> Position: ...
    @property
    def reason(self) -> str: ...


class Result(Protocol):
    """A commit result (``hubbub.log.AppendResult`` is one)."""

    @property
    def event(self) -> Event: ...
    @property
    def duplicate(self) -> bool: ...


class NativeProtocol:
    """See the module docstring. ``emit(frame)`` queues a frame; ``end(reason)`` closes the connection once
    the frames queued are written; ``room()`` is called when the publishes in flight fell to half of
    ``max_inflight`` (the transport resumes reading)."""

    __slots__ = (
        "_pending",
        "batch",
        "codec",
        "echo",
        "emit",
        "end",
        "inflight",
        "max_frame",
        "max_inflight",
        "max_subscriptions",
        "phase",
        "ping_interval",
        "room",
    )

    def __init__(
        self,
        codec: NativeCodec,
        *,
        emit: Callable[[bytes], object],
        end: Callable[[Disconnect], None],
        room: Callable[[], None],
        max_frame: int,
        max_subscriptions: int,
        max_inflight: int,
        ping_interval: float,
    ) -> None:
        self.codec = codec
        self.emit = emit
        self.end = end
        self.room = room
        self.max_frame = max_frame
        self.max_subscriptions = max_subscriptions
        self.max_inflight = max_inflight
        self.ping_interval = ping_interval
        self.phase = Phase.HELLO
        self.echo = True
        self.batch = False
        self.inflight = 0
        #: (request id, ack wanted) of each publish in flight, oldest first; created by the first publish (an
        #: empty deque is some 750 bytes, and many connections only subscribe).
        self._pending: deque[tuple[int, bool]] | None = None

    @property
    def open(self) -> bool:
        return self.phase is Phase.OPEN

    # -- the handshake ----------------------------------------------------------------------------------

    def admit(self, cmd: Command) -> Admit:
        """The verdict on ``cmd`` in the current phase (the table above); a refusal is answered here."""
        kind = "hello" if isinstance(cmd, Hello) else "pong" if isinstance(cmd, Pong) else "other"
        verdict, phase = _TABLE[(self.phase, kind)]
        if verdict is Admit.REFUSED:
            detail = "hello already done" if self.phase is Phase.OPEN else ""
            self.fatal(Disconnect.HELLO_REQUIRED, getattr(cmd, "id", None), detail)
        elif isinstance(cmd, Hello) and cmd.v != PROTOCOL_VERSION:
            self.fatal(Disconnect.UNSUPPORTED_VERSION, cmd.id, supported=[PROTOCOL_VERSION])
            return Admit.REFUSED
        self.phase = phase
        return verdict

    def opened(self, cmd: Hello, session_id: str, user: str) -> None:
        """The core accepted the hello's token: the connection is open; the hello reply goes out."""
        self.phase = Phase.OPEN
        self.echo = cmd.echo
        self.batch = cmd.batch
        pi = self.ping_interval
        self.emit(
            self.codec.encode_hello_reply(
                cmd.id,
                session_id,
                user,
                int(pi) if float(pi).is_integer() else pi,
                self.max_frame,
                self.max_subscriptions,
                self.batch,
            )
        )

    def fatal(self, reason: Disconnect, req_id: int | None, detail: str = "", **extra: Any) -> None:
        """Answer with the error, then close (native.md §7: a fatal error ends the connection)."""
        self.phase = Phase.CLOSED
        self.emit(self.codec.encode_error(reason, req_id, detail, **extra))
        self.end(reason)

    def failed(self, exc: HubbubError, req_id: int | None) -> None:
        """Answer a command the core refused: the error (with the ``row`` of a batch it is about), and a
        close when the error is fatal."""
        if exc.row is None:
            self.emit(self.codec.encode_error(exc.code, req_id, exc.detail, message=exc.message))
        else:
            self.emit(self.codec.encode_error(exc.code, req_id, exc.detail, message=exc.message, row=exc.row))
        if exc.fatal:
            self.phase = Phase.CLOSED
            self.end(Disconnect.of(exc.code))

    # -- publish pipelining -----------------------------------------------------------------------------

    def has_room(self, n: int = 1) -> bool:
        """Whether ``n`` more publishes may be in flight."""
        return self.inflight + n <= self.max_inflight

    def submitted(self, req_id: int, ack: bool) -> None:
        """A publish went to the core (its result comes back through :meth:`committed`, in order)."""
        pending = self._pending
        if pending is None:
            pending = self._pending = deque()
        pending.append((req_id, ack))
        self.inflight += 1

    def submitted_many(self, ids: Iterable[tuple[int, bool]], count: int) -> None:
        """``count`` publishes went to the core at once, with these (request id, ack wanted)."""
        pending = self._pending
        if pending is None:
            pending = self._pending = deque()
        pending.extend(ids)
        self.inflight += count

    def committed(self, r: Result | HubbubError) -> None:
        """The oldest publish in flight was committed (or failed): its reply, if it wants one."""
        assert self._pending is not None  # submitted() queued this publish's entry
        rid, want_ack = self._pending.popleft()
        self.inflight -= 1
        if self.inflight < self.max_inflight // 2:
            self.room()
        if isinstance(r, HubbubError):
            self.emit(self.codec.encode_error(r.code, rid, r.detail, message=r.message))
        elif want_ack:
            self.emit(self.codec.publish_replies.encode(rid, r.event, r.duplicate))

    def committed_many(self, results: Sequence[Result]) -> list[bytes]:
        """The oldest ``len(results)`` publishes were committed together: the replies of those that asked
        for one, in order (the caller queues them in one step)."""
        pending = self._pending
        assert pending is not None  # submitted_many() queued the entries
        n = len(results)
        self.inflight -= n
        if self.inflight < self.max_inflight // 2:
            self.room()
        if n == len(pending):  # the common case: every publish in flight committed together
            publishes = list(pending)
            pending.clear()
        else:
            popleft = pending.popleft
            publishes = [popleft() for _ in range(n)]
        if not any(map(_WANTS_ACK, publishes)):
            return []  # (nothing read from the results, which a run builds only when read)
        run = getattr(results, "run", None)
        if run is not None:  # a run answered as one (``hubbub.log.appended.RunAppended``): from its rows
            return self.codec.publish_replies.encode_run(publishes, run.proto, run.rows)
        return self.codec.encode_publish_replies(publishes, results)

    # -- batched publishes (publish_batch) --------------------------------------------------------------
    #
    # A batch's rows count as publishes in flight, but the batch keeps no FIFO entry: the core completes it
    # with one call at its place in submission order (after the publishes submitted before it), so its
    # reply goes out in order without one.

    def batch_room(self, n: int) -> bool:
        """Whether a batch of ``n`` rows may go in flight now (always when nothing is: a batch larger than
        ``max_inflight`` still goes, alone)."""
        return self.inflight == 0 or self.inflight + n <= self.max_inflight

    def batch_submitted(self, n: int) -> None:
        """A batch of ``n`` rows went to the core."""
        self.inflight += n

    def batch_committed(self, req_id: int, ack: bool, results: Sequence[Result]) -> bytes | None:
        """A batch was committed: its reply (one for all rows) when it wants one. A duplicate row carries
        its original event's position."""
        self._batch_done(len(results))
        if not ack:
            return None
        events = [r.event for r in results]
        duplicates = [i for i, r in enumerate(results) if r.duplicate]
        return self.codec.encode_batch_reply(
            req_id,
            [e.seq for e in events],
            [e.epoch for e in events],
            [e.time_ns for e in events],
            duplicates,
        )

    def batch_failed(self, req_id: int, n: int, exc: HubbubError) -> None:
        """A batch's commit failed (none of its rows is in the log): the error, once."""
        self._batch_done(n)
        self.emit(self.codec.encode_error(exc.code, req_id, exc.detail, message=exc.message))

    def _batch_done(self, n: int) -> None:
        self.inflight -= n
        if self.inflight < self.max_inflight // 2:
            self.room()

    # -- subscriptions ----------------------------------------------------------------------------------

    def subscribed(
        self,
        req_id: int,
        sub: str,
        position: Position | None,
        top_time: int | None,
        gaps: Iterable[GapNotice],
    ) -> None:
        """The subscribe reply (``position`` for an exact channel, else ``top_time``) and its gap notices."""
        self.emit(self.codec.encode_subscribe_reply(req_id, sub, position, top_time))
        for g in gaps:
            self.gap(sub, g)

    def gap(self, sub: str, g: GapNotice) -> None:
        """A ``gap`` push: after the reply for one found in the snapshot, or, for one found while a pattern's
        replay runs (a channel trimmed or reset meanwhile), just before its channel's next event."""
        self.emit(
            self.codec.encode_push(
                "gap",
                sub=sub,
                channel=g.channel,
                since={"seq": g.since.seq, "epoch": g.since.epoch},
                position={"seq": g.position.seq, "epoch": g.position.epoch},
                reason=g.reason,
            )
        )

    def recovered(self, sub: str, replayed: int, position: Position | None) -> None:
        """The end of a subscription's replay (``position`` for an exact channel)."""
        fields: dict[str, Any] = {"sub": sub, "replayed": replayed}
        if position is not None:
            fields["position"] = {"seq": position.seq, "epoch": position.epoch}
        self.emit(self.codec.encode_push("recovered", **fields))
