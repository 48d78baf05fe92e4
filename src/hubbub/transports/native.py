"""Native protocol connections: commands from the native codec become node calls; replies go back out.

One :class:`NativeConnection` serves one WebSocket or TCP connection. The transport feeds it decoded
commands (in order) and runs :meth:`NativeConnection.write_loop` to drain the session's queue.

Concurrency contract: everything runs on the event loop thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from hubbub.core import Node, ReplayPlan, ReplaySpec, Session
from hubbub.core.session import Overflow
from hubbub.dialects import native as nc
from hubbub.errors import HubbubError
from hubbub.events import Event, Publisher
from hubbub.log.base import AppendRequest, AppendResult

__all__ = ["NativeConnection", "NativeEncoder"]

log = logging.getLogger("hubbub.native")

SHUTDOWN_CODE = 1001


class NativeEncoder:
    """Session encoder for one native encoding; sessions with the same encoding share the fan-out cache."""

    def __init__(self, codec: nc.NativeCodec) -> None:
        self.codec = codec
        self.key = f"native.{codec.encoding}"
        # The codec's method itself, not a wrapper: one call less per event and subscriber.
        self.encode_event: Callable[[Event, Sequence[str], bool, dict[Any, Any]], bytes] = codec.encode_event


class NativeConnection:
    """Glue between one native connection, its codec and the node."""

    def __init__(
        self,
        node: Node,
        codec: nc.NativeCodec,
        *,
        send: Callable[[bytes], Awaitable[None]],
        close: Callable[[int], Awaitable[None]],
        send_many: Callable[[list[bytes]], Awaitable[None]] | None = None,
        max_frame: int,
        max_subscriptions: int,
        send_queue: int,
        send_queue_bytes: int,
        ping_interval: float,
    ) -> None:
        self.node = node
        self.codec = codec
        self._send = send
        # Writes several frames at once (one socket write), for clients that did not ask for batch frames.
        self._send_many = send_many
        self._close = close
        self.max_frame = max_frame
        self.max_subscriptions = max_subscriptions
        self.ping_interval = ping_interval
        self.session = Session(
            "native",
            NativeEncoder(codec),
            max_items=send_queue,
            max_bytes=send_queue_bytes,
            overflow=Overflow.DISCONNECT,
            slow_close_code=4302,
        )
        self.hello_done = False
        self._publisher = Publisher("native")
        self.batch = False
        self.inflight = 0
        self.max_inflight = send_queue
        self._acked = asyncio.Event()
        #: (request id, ack wanted) of each publish in flight, oldest first.
        self._pending: deque[tuple[int, bool]] = deque()
        self.last_recv = time.monotonic()
        self.last_send = time.monotonic()
        self._tasks: set[asyncio.Task[Any]] = set()

    # -- inbound ----------------------------------------------------------------------------------------

    def bad_input(self, exc: HubbubError) -> None:
        """Answer a decoding error: the error frame, then a close when it is fatal."""
        self.node.count_bad_input("native")
        self.session.push(self.codec.encode_error(exc.code, exc.request_id, exc.detail))
        if exc.fatal:
            self.session.end(exc.code)

    async def handle(self, cmd: nc.Command) -> None:
        self.last_recv = time.monotonic()
        sess = self.session
        if not self.hello_done:
            if not isinstance(cmd, nc.Hello):
                if isinstance(cmd, nc.Pong):
                    return
                self._fatal(4005, getattr(cmd, "id", None))
                return
            self._hello(cmd)
            return
        try:
            if isinstance(cmd, nc.Publish):
                await self._publish(cmd)
            elif isinstance(cmd, nc.Subscribe):
                await self._subscribe(cmd)
            elif isinstance(cmd, nc.Unsubscribe):
                self.node.unsubscribe(sess, cmd.sub)
                sess.push(self.codec.encode_reply(cmd.id, {}))
            elif isinstance(cmd, nc.Ping):
                sess.push(self.codec.encode_push("pong", **({} if cmd.id is None else {"id": cmd.id})))
            elif isinstance(cmd, nc.Pong):
                pass
            elif isinstance(cmd, nc.Hello):
                self._fatal(4005, cmd.id, "hello already done")
            elif isinstance(cmd, nc.Auth):
                # With auth off the identity cannot change. When tokens arrive, a refresh that changes the
                # user must also renew self._publisher.
                sess.push(self.codec.encode_reply(cmd.id, {"user": sess.user}))
        except HubbubError as exc:
            sess.push(self.codec.encode_error(exc.code, getattr(cmd, "id", None), exc.detail))
            if exc.fatal:
                sess.end(exc.code)

    def _fatal(self, code: int, req_id: int | None, detail: str = "", **extra: Any) -> None:
        self.node.count_bad_input("native")
        self.session.push(self.codec.encode_error(code, req_id, detail, **extra))
        self.session.end(code)

    def _hello(self, cmd: nc.Hello) -> None:
        if cmd.v != 1:
            self._fatal(4006, cmd.id, supported=[1])
            return
        sess = self.session
        sess.echo = cmd.echo
        self.batch = cmd.batch
        self.hello_done = True
        # The common publish carries no idempotency key: one Publisher value serves them all.
        self._publisher = Publisher("native", sess.user, sess.id, "")
        self.node.attach(sess)
        pi = self.ping_interval
        sess.push(
            self.codec.encode_hello_reply(
                cmd.id,
                sess.id,
                sess.user,
                int(pi) if float(pi).is_integer() else pi,
                self.max_frame,
                self.max_subscriptions,
                self.batch,
            )
        )

    def publish_nowait(self, cmd: nc.Publish) -> bool:
        """Submit a publish at once when nothing asks to wait; False means call :meth:`handle` instead.

        The common case of the hot path: no coroutine, no closure, one request object per publish.
        """
        if (
            not self.hello_done
            or self.inflight >= self.max_inflight
            or self.session.queued >= self.session.max_items
            or not self.node.has_room
        ):
            return False
        try:
            self._submit(cmd)
        except HubbubError as exc:
            self.session.push(self.codec.encode_error(exc.code, cmd.id, exc.detail))
            if exc.fatal:
                self.session.end(exc.code)
        return True

    async def _publish(self, cmd: nc.Publish) -> None:
        # Read-side back-pressure: bounded publishes in flight and a bounded reply queue.
        sess = self.session
        if self.inflight >= self.max_inflight:
            self._acked.clear()
            await self._acked.wait()
        if sess.queued >= sess.max_items:
            await sess.wait_room()
        if not self.node.has_room:
            await self.node.writable()
        self._submit(cmd)

    def _submit(self, cmd: nc.Publish) -> None:
        sess = self.session
        req = AppendRequest(
            cmd.channel,
            self._publisher if not cmd.idem else Publisher("native", sess.user, sess.id, cmd.idem),
            cmd.payload,
            cmd.content_type,
            cmd.headers,
            cmd.tags,
            cmd.idem,
        )
        self.node.submit(req, sess, self._done)
        # The node completes publishes in submission order (Node.submit), so the replies' ids queue here.
        self._pending.append((cmd.id, cmd.ack))
        self.inflight += 1

    def _done(self, r: AppendResult | HubbubError) -> None:
        """A publish of this connection was committed (or failed): reply, and release read back-pressure."""
        rid, want_ack = self._pending.popleft()
        self.inflight -= 1
        if self.inflight < self.max_inflight // 2:
            self._acked.set()
        if isinstance(r, HubbubError):
            self.session.push(self.codec.encode_error(r.code, rid, r.detail))
        elif want_ack:
            self.session.push(self.codec.encode_publish_reply(rid, r.event, r.duplicate))

    async def _subscribe(self, cmd: nc.Subscribe) -> None:
        sess = self.session
        codec = self.codec
        spec = ReplaySpec(cmd.since, cmd.last, cmd.from_time)
        exact = cmd.pattern.is_exact

        def on_snapshot(plan: ReplayPlan) -> None:
            if exact:
                assert plan.position is not None
                sess.push(codec.encode_subscribe_reply(cmd.id, cmd.sub, plan.position, None))
            else:
                sess.push(codec.encode_subscribe_reply(cmd.id, cmd.sub, None, plan.top_time))
            for g in plan.gaps:
                sess.push(
                    codec.encode_push(
                        "gap",
                        sub=cmd.sub,
                        channel=g.channel,
                        since={"seq": g.since.seq, "epoch": g.since.epoch},
                        position={"seq": g.position.seq, "epoch": g.position.epoch},
                        reason=g.reason,
                    )
                )

        def on_replayed(plan: ReplayPlan) -> None:
            fields: dict[str, Any] = {"sub": cmd.sub, "replayed": len(plan.events)}
            if exact and plan.position is not None:
                fields["position"] = {"seq": plan.position.seq, "epoch": plan.position.epoch}
            sess.push(codec.encode_push("recovered", **fields))

        await self.node.subscribe(
            sess, cmd.sub, cmd.pattern, cmd.tags, spec, on_snapshot=on_snapshot, on_replayed=on_replayed
        )

    # -- outbound ---------------------------------------------------------------------------------------

    async def write_loop(self) -> None:
        """Drain the session's queue to the socket until the session ends; then close the connection."""
        sess = self.session
        codec = self.codec
        try:
            while True:
                frames = await sess.next_frames(self.max_frame)
                if not frames:
                    break
                self.last_send = time.monotonic()
                if self.batch and len(frames) > 1:
                    await self._send(codec.encode_batch(frames))
                elif self._send_many is not None and len(frames) > 1:
                    await self._send_many(frames)
                else:
                    for f in frames:
                        await self._send(f)
            if sess.kicked:
                if sess.kicked != SHUTDOWN_CODE:
                    with contextlib.suppress(Exception):
                        await self._send(codec.encode_error(sess.kicked))
                await self._close(sess.kicked)
            elif sess.ending:
                await self._close(sess.ending)
        except (ConnectionError, asyncio.CancelledError):
            raise
        except Exception:
            log.debug("native write loop ended", exc_info=True)

    async def keepalive(self) -> None:
        """Server pings when idle; no client frame for three intervals is a timeout (4304)."""
        interval = self.ping_interval
        while not self.session.closed:
            await asyncio.sleep(min(interval, 1.0) if interval < 1.0 else interval / 5)
            now = time.monotonic()
            if now - self.last_recv > 3 * interval:
                self._fatal(4304, None)
                return
            if self.hello_done and now - self.last_send >= interval:
                self.last_send = now
                self.session.push(self.codec.encode_push("ping"))

    def start(self) -> None:
        for coro in (self.write_loop(), self.keepalive()):
            t = asyncio.ensure_future(coro)
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)

    async def finish(self) -> None:
        """The peer is gone: detach from the node and stop the tasks."""
        self.node.detach(self.session)
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    async def wait_written(self) -> None:
        """Wait until the write loop ended (after a graceful end or a kick)."""
        for t in list(self._tasks):
            if t.get_coro().__qualname__.endswith("write_loop"):  # type: ignore[union-attr]
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await asyncio.shield(t)
