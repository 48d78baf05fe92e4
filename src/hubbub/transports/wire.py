"""One dialect connection as the drivers run it: its session, its write loop and the interpretation of its
actions against the core (ARCHITECTURE §2).

A :class:`DialectWire` is built by a dialect's binding for each connection (the WebSocket driver,
:mod:`~hubbub.transports.ws_driver`, and the byte-stream driver, :mod:`~hubbub.transports.stream_driver`,
then run it). It owns the connection's :class:`~hubbub.core.Session` (queue bound and overflow policy from
the :class:`~hubbub.dialects.spec.DialectSpec`) and its :class:`~hubbub.transports.pump.SessionPump`, and
carries out the shared actions of :mod:`hubbub.dialects.actions`:

* ``Send`` → the session's queue (a reply: the reader waits for its room);
* ``Close`` → the session ends with that reason (counted as bad input unless it is a normal close or a
  policy refusal, or the connection says it failed; a 1009 also as a refused ``max_frame``);
* ``Publish`` → ``Node.submit`` (committed before delivery), a refusal rendered by the binding's
  ``refused`` (the dialect's error reply or close);
* ``Subscribe`` / ``Unsubscribe`` → core subscriptions of the connection, with the action's replay selection
  (:mod:`hubbub.selection`; :data:`~hubbub.selection.LIVE` for every dialect on the wire: no log read).

A dialect's own actions (mist's registry commands, WearScript's forwarded frames) go to the handlers its
binding registers by type in ``handlers``: one dispatch table, no ``isinstance`` ladder. A handler may
replace a shared one (mist counts its error replies as bad input).

Concurrency contract: everything runs on the event loop thread; a connection's actions are carried out
one at a time, in order (a subscription exists in the core before the next action runs). Every task of the
connection belongs to the :class:`~hubbub.transports.lifetime.Lifetime` its driver opened.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, TypeAlias

from hubbub.auth import Identity
from hubbub.channels import parse_pattern
from hubbub.core.api import Core, Encoder, Overflow, ReplayPlan, Session
from hubbub.dialects import actions as a
from hubbub.dialects.spec import DialectSpec, FrameConnection
from hubbub.disconnect import Disconnect
from hubbub.errors import AuthError, HubbubError, LimitExceeded, ShuttingDown, SubscriptionError
from hubbub.events import Publisher
from hubbub.log.base import AppendRequest, AppendResult

from .lifetime import Lifetime
from .pump import SessionPump, Wire, grace_left, stopped

__all__ = ["DialectWire", "Handler", "Refused", "no_reply"]

#: A binding's handler of one action type (awaited in order with the others).
Handler: TypeAlias = Callable[[Any], Awaitable[None]]
#: The dialect's answer to a refusal of the core: ``Send`` and ``Close`` actions (a reply or a close).
Refused: TypeAlias = Callable[[Any, HubbubError], Sequence[object]]

#: Closes that are no bad input: a normal close, a refusal by policy (auth, limits).
_NOT_BAD: frozenset[Disconnect] = frozenset({Disconnect.NORMAL, Disconnect.POLICY_VIOLATION})
#: Closes for a message over ``limits.max_frame`` (WebSocket 1009, the stream dialects' 4003).
_TOO_BIG: frozenset[Disconnect] = frozenset({Disconnect.MESSAGE_TOO_BIG, Disconnect.FRAME_TOO_LARGE})


def no_reply(plan: ReplayPlan) -> None:
    """No subscribe reply from the core: the dialect answered already, where it answers at all."""


def _never_failed() -> bool:
    return False


def _no_answer(cmd: object, exc: HubbubError) -> Sequence[object]:
    """The refusal answer of a binding that answers refusals itself."""
    return ()


class DialectWire:
    """One connection: its session, write loop and actions. See the module docstring.

    ``send`` writes one frame (a stream write or a WebSocket frame; an empty frame is not written: an event
    the connection must not get, as its encoder decided), ``close`` closes the socket, ``send_many`` (streams)
    writes several frames at once. ``refused`` renders a refusal of the core; ``failed()`` says whether the
    connection's own state machine failed (its closes then count as bad input whatever their code);
    ``pace`` makes the wire wait for the session's room between actions (byte streams hand it a whole
    read's actions at once); ``echo`` whether the connection gets its own publishes; ``after`` runs after
    each run of actions that left the connection open; ``close_wait_s`` bounds the wait for a pending
    close; ``session_id``, ``user``, ``on_frames``, ``farewell`` and ``wire`` are the session's and the
    pump's (:class:`~hubbub.core.Session`, :class:`~hubbub.transports.pump.SessionPump`): a WebSocket's
    ``wire`` (:class:`~hubbub.transports.ws_write.WsSink`) writes a burst of frames in one write and a fan-out
    run framed once for every connection that holds it, for a dialect whose encoder never drops an event
    with an empty frame (``send`` skips those; the wire frames every frame)."""

    def __init__(
        self,
        node: Core,
        spec: DialectSpec,
        *,
        dialect: str,
        encoder: Encoder,
        send_queue: int,
        send_queue_bytes: int,
        max_frame: int,
        send: Callable[[bytes], Awaitable[object]],
        close: Callable[[Disconnect], Awaitable[object]],
        send_many: Callable[[list[bytes]], Awaitable[object]] | None = None,
        refused: Refused = _no_answer,
        failed: Callable[[], bool] = _never_failed,
        echo: bool = False,
        pace: bool = False,
        after: Callable[[], None] | None = None,
        close_wait_s: float = 10.0,
        session_id: str | None = None,
        user: str = "",
        on_frames: Callable[[list[bytes]], None] | None = None,
        farewell: Callable[[Disconnect], bytes | None] | None = None,
        wire: Wire | None = None,
    ) -> None:
        self.node = node
        self.spec = spec
        self.session = Session(
            dialect,
            encoder,
            max_items=send_queue,
            max_bytes=send_queue_bytes,
            overflow=Overflow(spec.overflow),
            slow_close_code=Disconnect.TRY_AGAIN_LATER,
            fault_close_code=Disconnect.INTERNAL_ERROR,
            echo=echo,
            user=user,
        )
        if session_id is not None:
            self.session.id = session_id
        self.log = logging.getLogger(f"hubbub.{spec.name}")
        self.refused = refused
        self._failed = failed
        self._pace = pace
        self._after = after
        self._close_wait_s = close_wait_s
        #: Monotonic time of the last frame or read received (keepalive).
        self.last_recv = time.monotonic()
        self.handlers: dict[type, Handler] = {
            a.Send: self._send,
            a.Reject: self._reject,
            a.Close: self._close,
            a.Publish: self._publish,
            a.Subscribe: self._subscribe,
            a.Unsubscribe: self._unsubscribe,
        }
        self._group: Lifetime | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

        async def send_nonempty(data: bytes) -> None:
            if data:
                await send(data)

        self._pump = SessionPump(
            node,
            self.session,
            send=send_nonempty,
            close=close,
            max_frame=max_frame,
            send_many=send_many,
            on_frames=on_frames,
            farewell=farewell,
            wire=wire,
        )

    # -- lifecycle ----------------------------------------------------------------------------------------

    def start(self, group: Lifetime, identity: Identity | None) -> None:
        """Bind ``identity`` (None: none yet, or the dialect's default), attach the session to the node and
        start the writer (:meth:`SessionPump.start`: a task only while there is something to write, so an
        idle connection holds none; :meth:`finish` stops it). ``group`` takes the connection's other tasks
        (:meth:`spawn`)."""
        self._group = group
        if identity is not None:
            # Bound before the session is attached: its subscriptions see the token's permissions, and its
            # expiry ends it.
            self.node.access.bind(self.session, identity)
        self.node.attach(self.session)
        self._pump.start()

    def spawn(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        """A task of this connection (in its lifetime; cancelled by :meth:`finish`)."""
        assert self._group is not None
        t: asyncio.Task[Any] = self._group.create_task(coro)  # type: ignore[arg-type]
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        return t

    @property
    def done(self) -> bool:
        s = self.session
        return bool(s.ending or s.kicked or s.closed)

    async def finish(self) -> None:
        """The reader is done: a pending close goes out (for at most ``close_wait_s``, none once the handler
        was cancelled), the session leaves the node, the connection's tasks stop."""
        sess = self.session
        writer = self._pump.current()  # the session's end started its last run
        if (sess.ending or sess.kicked) and writer is not None and grace_left():
            await stopped(
                asyncio.wait_for(asyncio.shield(writer), self._close_wait_s),
                self.node,
                sess.dialect,
                sess.id,
            )
        # Before the session leaves the node (which closes it): a parked writer must not start for that.
        writer = self._pump.stop()
        self.node.detach(sess)
        await stopped(writer, self.node, sess.dialect, sess.id)
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            await stopped(t, self.node, sess.dialect, sess.id)

    def receiver(self, conn: FrameConnection | None) -> Callable[[bytes | str, bool], Awaitable[None]]:
        """The WebSocket driver's step for one frame: ``conn``'s actions, carried out by :meth:`run`."""
        assert conn is not None, "a dialect wire reads its frames through its connection"
        run, receive = self.run, conn.receive_frame

        def step(frame: bytes | str, binary: bool) -> Awaitable[None]:
            return run(receive(frame, binary))

        return step

    # -- actions ------------------------------------------------------------------------------------------

    async def run(self, actions: Iterable[object]) -> None:
        """Carry out ``actions`` in order, until the connection ends, then the binding's ``after`` step.
        With ``pace``, each action waits for the session's room (read-side back-pressure,
        :mod:`~hubbub.transports.backpressure`): a read's actions are those of every message it completes,
        and the rest waits while the replies fill the queue."""
        handlers, sess = self.handlers, self.session
        for action in actions:
            if self.done:
                return
            await handlers[type(action)](action)
            if self._pace and not sess.has_room:
                await sess.wait_room()
        if self._after is not None and not self.done:
            self._after()

    def refuse(self, cmd: object, exc: HubbubError) -> None:
        """The core refused ``cmd``: the dialect's answer, sent or closed without counting bad input."""
        for out in self.refused(cmd, exc):
            if isinstance(out, a.Send):
                self.session.push(out.data)
            elif isinstance(out, a.Close):
                self.session.end(out.code)

    async def _send(self, out: a.Send) -> None:
        self.session.push(out.data)

    async def _reject(self, out: a.Reject) -> None:
        self.node.metrics.count_bad_input(self.session.dialect)
        self.session.push(out.data)

    async def _close(self, out: a.Close) -> None:
        self.close(out.code, out.reason)

    def close(self, code: Disconnect, why: str = "") -> None:
        """The connection closes for ``code`` (bad input, or a refusal), counted and logged at debug level."""
        dialect = self.session.dialect
        if code not in _NOT_BAD or self._failed():
            self.node.metrics.count_bad_input(dialect)
        if code in _TOO_BIG:
            self.node.limiter.refused("max_frame", dialect)
        if why:
            self.log.debug("closing %s connection: %s", dialect, why, extra={"session": self.session.id})
        self.session.end(code)

    async def publish(self, cmd: object, out: a.Publish) -> None:
        """Store ``out`` (the dialect's ``cmd``, for its refusal) and deliver it once committed."""
        sess = self.session
        req = AppendRequest(
            channel=out.channel,
            publisher=Publisher(sess.dialect, sess.user, sess.id, ""),
            payload=out.payload,
            content_type=out.content_type,
            headers=out.headers,
            tags=out.tags,
        )

        def done(r: AppendResult | HubbubError) -> None:
            if isinstance(r, HubbubError):
                self.log.warning("%s publish failed: %s", sess.dialect, r, extra={"session": sess.id})
                self.refuse(cmd, r)

        await self.node.writable()
        try:
            self.node.submit(req, sess, done)
        except (AuthError, LimitExceeded) as exc:
            self.refuse(cmd, exc)
        except ShuttingDown:
            sess.end(Disconnect.GOING_AWAY)

    async def subscribe(self, subs: Sequence[a.Subscribe]) -> list[HubbubError | None]:
        """Subscribe the connection to every one of ``subs`` (each with its selection; live only, the default,
        never reads the log), all at once: each is registered (and holds live events) as soon as its task
        starts, so none misses an event published while another's snapshot is read. Returns, for each, None or
        the core's refusal (``LimitExceeded``, ``AuthError``; ``SubscriptionError`` or ``ShuttingDown`` when
        the connection closed meanwhile)."""
        sess, node = self.session, self.node
        results = await asyncio.gather(
            *(
                node.subscribe(
                    sess,
                    s.sub,
                    parse_pattern(s.pattern) if isinstance(s.pattern, str) else s.pattern,
                    s.tags,
                    s.selection,
                    on_snapshot=no_reply,
                )
                for s in subs
            ),
            return_exceptions=True,
        )
        out: list[HubbubError | None] = []
        for r in results:
            if isinstance(r, LimitExceeded | AuthError | SubscriptionError | ShuttingDown):
                out.append(r)
            elif isinstance(r, BaseException):
                raise r
            else:
                out.append(None)
        return out

    async def _publish(self, out: a.Publish) -> None:
        await self.publish(out, out)

    async def _subscribe(self, out: a.Subscribe) -> None:
        (exc,) = await self.subscribe([out])
        if exc is not None and not isinstance(exc, SubscriptionError):  # already subscribed: a no-op
            self.refuse(out, exc)

    async def _unsubscribe(self, out: a.Unsubscribe) -> None:
        with contextlib.suppress(SubscriptionError):  # gone with a detach meanwhile
            self.node.unsubscribe(self.session, out.sub)

    def handle(self, table: Mapping[type, Handler]) -> None:
        """Register a binding's handlers (its own action types, or replacements of shared ones)."""
        self.handlers.update(table)
