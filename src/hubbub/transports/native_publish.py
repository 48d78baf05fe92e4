"""The publish path of a native connection: the hot path, kept apart from the rest of the glue.

:class:`NativePublishing` turns the native ``publish`` commands of one connection into core submissions with
read-side back-pressure (a bounded number of publishes in flight, the session's room for the replies queued
and owed, ``Session.has_room``, shared with every dialect, and the writer's room),
and their commit results into replies through the connection's
:class:`~hubbub.dialects.native_protocol.NativeProtocol` (which keeps the FIFO of request ids).
:class:`~hubbub.transports.native.NativeConnection` is the one subclass.

Concurrency contract: everything runs on the event loop thread.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from hubbub.core.api import Core, Session
from hubbub.core.flag import Flag
from hubbub.dialects import native as nc
from hubbub.errors import HubbubError
from hubbub.events import Publisher
from hubbub.log.base import AppendRequest, AppendResult, AppendRun

__all__ = ["NativePublishing"]

_OPEN = nc.Phase.OPEN


class NativePublishing:
    """The publish half of a native connection; see the module docstring. The subclass sets every slot."""

    __slots__ = ("_acked", "_publisher", "last_recv", "node", "proto", "session")

    node: Core
    session: Session
    proto: nc.NativeProtocol
    _acked: Flag
    _publisher: Publisher
    last_recv: float

    async def handle(self, cmd: nc.Command) -> None:
        """Handle any command (the subclass's); the publishes beyond the back-pressure room go here."""
        raise NotImplementedError

    def publish_nowait(self, cmd: nc.Publish) -> bool:
        """Submit a publish at once when nothing asks to wait; False means call :meth:`handle` instead.

        The common case of the hot path: no coroutine, no closure, one request object per publish. (The
        WebSocket driver, its one caller, marks the connection heard for each frame: keepalive, native.md §2.)
        """
        proto = self.proto
        if (
            proto.phase is not _OPEN
            or proto.inflight >= proto.max_inflight
            or not self.session.has_room
            or not self.node.has_room
        ):
            return False
        try:
            self._submit(cmd)
        except HubbubError as exc:
            proto.failed(exc, cmd.id)
        return True

    async def publish_many(self, cmds: list[nc.Publish]) -> None:
        """Submit the publishes of one read, in order: as many as back-pressure allows in one batch (one node
        call, one FIFO extension), the rest one by one through :meth:`handle`, which waits for room.

        Stops early once the session ends (a fatal error answered one of them), as :meth:`handle` would.
        """
        self.last_recv = time.monotonic()
        sess = self.session
        done = 0
        proto = self.proto
        if proto.phase is _OPEN and self.node.has_room:
            room = min(proto.max_inflight - proto.inflight, sess.max_items - sess.queued - sess.owed)
            if room >= len(cmds):
                done = len(cmds) if self._submit_many(cmds) else 0
            elif room > 1:
                done = room if self._submit_many(cmds[:room]) else 0
        for cmd in cmds[done:] if done else cmds:
            await self.handle(cmd)
            if sess.ending or sess.kicked:
                return

    async def publish_run(self, run: nc.PublishRun) -> None:
        """Submit a run of common publishes, as :meth:`publish_many` would their commands: the requests are
        made straight from the run's lists. Publishes beyond the back-pressure room wait in :meth:`handle`.
        """
        self.last_recv = time.monotonic()
        sess = self.session
        n = len(run.replies)
        done = 0
        proto = self.proto
        if proto.phase is _OPEN and self.node.has_room:
            room = min(proto.max_inflight - proto.inflight, sess.max_items - sess.queued - sess.owed)
            if room >= n:
                done = n if self._submit_run(run, n) else 0
            elif room > 1:
                done = room if self._submit_run(run, room) else 0
        if done == n:
            return
        for cmd in run.commands(done):
            await self.handle(cmd)
            if sess.ending or sess.kicked:
                return

    def _bucket_holds(self, n: int) -> bool:
        """Whether the connection's publish-rate bucket (if any) holds ``n`` tokens as last refilled: a run it
        may not hold goes one by one (each publish beyond the bucket refused and counted once), since the
        node refuses a run whole and counts that refusal too. A stale reading only sends a run one by one."""
        bucket = self.session.bucket
        return bucket is None or bucket.tokens >= n

    def _submit_run(self, run: nc.PublishRun, count: int) -> bool:
        """Submit the first ``count`` publishes of ``run`` as one batch (one :class:`AppendRun` when they
        share their channel and content type); False when the node refused them (nothing was queued), as
        :meth:`_submit_many`."""
        pub = self._publisher
        channels, payloads, types, replies = run.channels, run.payloads, run.content_types, run.replies
        if count < len(replies):
            channels, payloads, types = channels[:count], payloads[:count], types[:count]
            replies = replies[:count]
        bucket = self.session.bucket
        if bucket is not None and bucket.tokens < count:  # (_bucket_holds, inline: a run's per-read path)
            return False
        channel, ctype = channels[0], types[0]
        sess, committed, done_many = self.session, self.proto.committed, self._done_many
        try:
            if channels.count(channel) == count and types.count(ctype) == count:
                # The usual run (a burst to one channel): one request for all, no object per publish.
                # (The run's lists are the decoder's for this read only: the request may keep them.)
                self.node.submit_run(AppendRun(channel, pub, ctype, payloads), sess, committed, done_many)
            else:
                triples = zip(channels, payloads, types, strict=True)
                reqs = [AppendRequest(c, pub, p, t) for c, p, t in triples]
                self.node.submit_many(reqs, sess, committed, done_many)
        except HubbubError:
            return False
        # The node completes publishes in submission order (see _submit).
        self.proto.submitted_many(replies, count)
        return True

    def _submit_many(self, cmds: list[nc.Publish]) -> bool:
        """Submit publishes as one batch; False when the node refused them (nothing was queued): the caller
        then submits them one by one, which answers each with its own error."""
        sess = self.session
        if not self._bucket_holds(len(cmds)):
            return False
        pub = self._publisher
        reqs = [
            AppendRequest(
                c.channel,
                pub if not c.idem else Publisher("native", sess.user, sess.id, c.idem),
                c.payload,
                c.content_type,
                c.headers,
                c.tags,
                c.idem,
            )
            for c in cmds
        ]
        try:
            self.node.submit_many(reqs, sess, self.proto.committed, self._done_many)
        except HubbubError:
            return False
        # The node completes publishes in submission order, so the replies' ids queue here (see _submit).
        self.proto.submitted_many([(c.id, c.ack) for c in cmds], len(cmds))
        return True

    async def _publish(self, cmd: nc.Publish) -> None:
        # Read-side back-pressure: bounded publishes in flight and a bounded reply queue.
        if not self.proto.has_room():
            self._acked.clear()
            await self._acked.wait()
        await self._queues_room()
        self._submit(cmd)

    async def _queues_room(self) -> None:
        """Wait until the connection's reply queue (replies queued and owed, ``Session.has_room``) and the
        node's writer take more."""
        sess = self.session
        if not sess.has_room:
            await sess.wait_room()
        if not self.node.has_room:
            await self.node.writable()

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
        proto = self.proto
        self.node.submit(req, sess, proto.committed)
        # The node completes publishes in submission order (Node.submit), so the replies' ids queue here.
        proto.submitted(cmd.id, cmd.ack)

    async def _publish_batch(self, cmd: nc.PublishBatch) -> None:
        """Submit a ``publish_batch`` as one unit: its rows in one commit, in order, one reply for all.
        Waits for room as :meth:`_publish` does (the rows count as publishes in flight). A refusal (the
        rate, a permission) raises before anything is queued: the caller answers the batch with it."""
        sess = self.session
        proto = self.proto
        n = len(cmd)
        while not proto.batch_room(n):
            self._acked.clear()
            await self._acked.wait()
        await self._queues_room()
        pub = self._publisher
        user, sid = sess.user, sess.id
        reqs = [
            AppendRequest(c, Publisher("native", user, sid, k) if k else pub, p, ct, h, t, k)
            for c, p, ct, h, t, k in zip(
                cmd.channels, cmd.payloads, cmd.content_types, cmd.headers, cmd.tags, cmd.idems, strict=True
            )
        ]
        done = _BatchDone(self, cmd.id, cmd.ack, n)
        self.node.submit_many(reqs, sess, done.failed, done.committed)
        proto.batch_submitted(n)

    def _done_many(self, results: Sequence[AppendResult]) -> None:
        """A run of this connection's publishes was committed (``Node.submit_many``): the replies of those
        that asked for one, queued in one step."""
        frames = self.proto.committed_many(results)
        if frames:
            self.session.push_replies(frames)


class _BatchDone:
    """The completion of one ``publish_batch``: the core calls :meth:`committed` once with every row's
    result, or :meth:`failed` once per row when the commit failed (answered with one error)."""

    __slots__ = ("ack", "conn", "n", "rid", "told")

    def __init__(self, conn: NativePublishing, rid: int, ack: bool, n: int) -> None:
        self.conn = conn
        self.rid = rid
        self.ack = ack
        self.n = n
        self.told = False

    def committed(self, results: Sequence[AppendResult]) -> None:
        frame = self.conn.proto.batch_committed(self.rid, self.ack, results)
        if frame is not None:
            self.conn.session.push_replies([frame])

    def failed(self, r: AppendResult | HubbubError) -> None:
        if self.told or not isinstance(r, HubbubError):
            return
        self.told = True
        self.conn.proto.batch_failed(self.rid, self.n, r)
