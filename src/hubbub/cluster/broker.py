"""The Redis broker: committed events between the nodes of a cluster (docs/cluster.md).

Every node of a cluster shares one PostgreSQL log and one Redis channel (``cluster.redis_channel``). After
each commit a node hands its new events to :meth:`RedisBroker.committed` (the node's ``relay`` seam), which

1. offers them to the node's :class:`~hubbub.cluster.sequencer.Sequencer`, which releases them to the local
   fan-out in per-channel seq order together with the events of the other nodes, and
2. queues them for Redis: one task publishes whatever is queued, batched into few messages (``wire``).

Another task holds a subscription to the Redis channel and offers every other node's events to the sequencer
(gaps are filled from the log there).

**Losing Redis.** A node keeps serving without Redis: its own events are still delivered locally, in order;
what it commits meanwhile is remembered as per-channel tops (not events), which it announces once Redis is
back so that the other nodes fill them from the log; and every ``cluster.poll_interval_s`` it compares the
log's heads with what it delivered and fills the difference, so its subscribers see the other nodes' events
too, later. Once the subscription is back, it catches up from the log the same way. A subscription is always
made first and the log's heads read after it, so nothing committed in between is missed. A catch-up costs
what it must: it reads the log in commit order from the mark of the previous one (:meth:`LogStore.read_log`),
so only the channels committed to since are compared, and reads every channel's head instead only when
more events than channels the node tracks came in between (the cheaper read then). With Redis up, a
cheap watch (the log's newest commit time against the newest delivered) finds events that were committed and
never published (a node killed in between) and fills them. The state shows in
``/healthz`` (``broker``) and ``/metrics`` (``hubbub_cluster_*``).

Concurrency contract: :meth:`committed`, :meth:`start`, :meth:`close`, :meth:`health` and :meth:`statistics`
run on the event loop; :meth:`position` on any other thread (the node's log readers). Log reads of the
broker run on its own small thread pool, never on the node's readers, so a reader waiting in
:meth:`position` cannot starve them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from hubbub.core.supervisor import Supervisor
from hubbub.events import Event
from hubbub.log.base import ChannelInfo, LogMark, LogStore

from . import wire
from .delivery import OrderedDelivery

if TYPE_CHECKING:
    from hubbub.core import Node
    from hubbub.core.session import Session

__all__ = ["BrokerSettings", "RedisBroker", "default_node_id"]

log = logging.getLogger("hubbub.cluster")

#: Channels per page when reading every head of the log (seed and catch-up).
HEADS_PAGE = 5000
#: Events per page of a catch-up's commit-order read (:meth:`RedisBroker._changed_heads`).
SYNC_PAGE = 2048
#: Events queued for Redis beyond which, while Redis is slow or away, they are kept as tops instead.
MAX_OUTBOX = 100_000


def default_node_id() -> str:
    """A node id unique without configuration: host, process and a random part."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


@dataclass(frozen=True, slots=True)
class BrokerSettings:
    url: str
    node_id: str
    redis_channel: str = "hubbub.events"
    gap_wait_s: float = 0.1
    poll_interval_s: float = 1.0
    #: How long a replay's snapshot waits for this node to deliver what the log already holds.
    catch_up_s: float = 2.0


class RedisBroker(OrderedDelivery):
    """See the module docstring. ``store`` is the node's log (the real one, not a view)."""

    def __init__(self, settings: BrokerSettings, store: LogStore) -> None:
        super().__init__(store, gap_wait_s=settings.gap_wait_s, catch_up_s=settings.catch_up_s)
        self.settings = settings
        self.node_id = settings.node_id
        #: This process in the messages it sends (``wire``): the node id and a random instance token.
        self.sender = f"{settings.node_id}/{secrets.token_hex(4)}"
        self._twin_warned = False
        self.store: LogStore = store
        retry = Retry(NoBackoff(), 0)  # no silent reconnects: an outage must be seen, to catch up after it
        opts: dict[str, Any] = {
            "socket_connect_timeout": 2.0,
            "socket_keepalive": True,
            "health_check_interval": 5,
            "retry": retry,
        }
        self._pub = aioredis.Redis.from_url(settings.url, socket_timeout=5.0, **opts)
        self._sub = aioredis.Redis.from_url(settings.url, socket_timeout=None, **opts)
        self._pubsub: Any = None
        self._outbox: list[Event] = []
        #: Notices (``core/notices.py``) to publish with the next message.
        self._notices: list[tuple[str, bytes]] = []
        self._wake = asyncio.Event()
        self._dirty: dict[str, tuple[str, int]] = {}
        #: The receive, publish and watch loops (restarted should one fail): the node's supervision once
        #: :meth:`start` has it.
        self._tasks = Supervisor("broker")
        self.up = False
        self._changed = time.monotonic()
        #: The log's mark when its heads were last compared (seed or catch-up): every channel committed to
        #: up to it is delivered or being filled, so the next catch-up reads the log from there.
        self._synced: LogMark | None = None
        #: Called with ``up`` at each change of :attr:`up` (``watch_state``).
        self._watchers: list[Callable[[bool], None]] = []
        # statistics
        self.published = 0
        self.publish_errors = 0
        self.received = 0
        self.messages = 0
        self.bad_messages = 0
        self.reconnects = 0
        self.syncs = 0
        self.watch_syncs = 0
        self.notices_dropped = 0

    # -- lifecycle ----------------------------------------------------------------------------------------

    async def start(self, node: Node) -> None:
        """Subscribe (or note that Redis is away), read the log's heads, attach to ``node`` and start the
        tasks. Call before the node's listeners start: nothing is delivered before the heads are read."""
        self.attach(node)
        self._tasks = Supervisor("broker", node.supervision)
        try:
            await self._subscribe()
        except (RedisError, OSError) as exc:
            log.warning(
                "cluster: Redis unavailable at start (%s); serving from the log until it is back", exc
            )
            self._set_up(False)
        mark, heads = await self._changed_heads(None)
        self.sequencer.seed(heads)
        self.sequencer.note_time(mark.time_ns)
        self._synced = mark
        node.relay = self
        node.notices.connect(self.notify)
        self._tasks.open()
        self._tasks.run("cluster-receive", self._receive_loop)
        self._tasks.run("cluster-publish", self._publish_loop)
        self._tasks.run("cluster-watch", self._watch_loop)
        log.info(
            "cluster: node %s on %s",
            self.node_id,
            self.settings.redis_channel,
            extra={"node_id": self.node_id, "broker": "up" if self.up else "down"},
        )

    async def close(self) -> None:
        """Publish what is queued (briefly), stop the tasks and release the connections."""
        if self._closed:
            return
        if self._outbox and self.up:
            try:
                await asyncio.wait_for(self._publish(self._take()), 2.0)
            except (RedisError, OSError, TimeoutError) as exc:
                self._tasks.supervision.note(
                    "broker", "last publish", exc, "the other nodes fill from the log"
                )
        self._closed = True
        await self._tasks.aclose()
        await self.close_delivery()
        await self._drop_pubsub()
        for client in (self._pub, self._sub):
            try:
                await client.aclose()
            except Exception as exc:  # closing: nothing to do but say so
                self._tasks.supervision.note("broker", "closing a Redis client", exc, "ignored")
        if self._node is not None and self._node.relay is self:
            self._node.relay = None
            self._node.notices.connect(None)

    def _set_up(self, up: bool) -> None:
        changed = up != self.up
        if changed:
            self._changed = time.monotonic()
            if up:
                log.info("cluster: Redis connected")
            else:
                log.warning("cluster: Redis lost; serving from the log until it is back")
        self.up = up
        if changed:
            for fn in list(self._watchers):
                fn(up)

    def watch_state(self, fn: Callable[[bool], None]) -> None:
        """Call ``fn(up)`` on the loop whenever the broker's view of Redis changes: its subscription, held
        open all the time, is the first to see Redis go (the node's presence follows it, so that the two
        never disagree in ``/healthz``)."""
        self._watchers.append(fn)

    # -- the node's seam ----------------------------------------------------------------------------------

    def committed(self, events: Sequence[tuple[Session | None, Event]]) -> None:
        """This node's newly committed events, in commit order (on the loop, after their acks)."""
        self.offer_many(events)
        if self.up and len(self._outbox) < MAX_OUTBOX:
            self._outbox.extend(ev for _, ev in events)
            self._wake.set()
        else:
            self._mark_dirty(ev for _, ev in events)

    def notify(self, topic: str, data: bytes) -> None:
        """A notice for the other nodes (``Node.notices``): published with the next message, or dropped
        while Redis is away (a notice is a hint, never a record)."""
        if not self.up or len(self._notices) >= MAX_OUTBOX:
            self.notices_dropped += 1
            return
        self._notices.append((topic, data))
        self._wake.set()

    # -- log reads (own threads) ----------------------------------------------------------------------------

    async def _changed_heads(self, since: LogMark | None) -> tuple[LogMark, list[ChannelInfo]]:
        """The log's mark and the heads of the channels committed to after ``since`` (None: of every
        channel), read after the mark so that they cover everything up to it. Events between the two marks
        are read in commit order when there are fewer of them than channels this node tracks (a head per
        channel committed to, ``first`` unknown: 0); past that, or with no ``since``, every channel's head
        is read, the cheaper read then. Either way a catch-up costs the smaller of the events committed
        since the last one and the channels of the log, never both."""
        store = self.store
        tracked = self.sequencer.channels

        def read() -> tuple[LogMark, list[ChannelInfo]]:
            mark = store.log_mark()
            if since is not None and mark.pos - since.pos <= max(tracked, SYNC_PAGE):
                last: dict[str, Event] = {}
                after = since.pos
                while after < mark.pos:
                    page = store.read_log(after, mark, SYNC_PAGE)
                    for e in page.events:
                        last[e.channel] = e
                    if len(page.events) < SYNC_PAGE:
                        break
                    after = page.pos
                return mark, [ChannelInfo(ch, e.epoch, 0, e.seq, e.time_ns) for ch, e in last.items()]
            out: list[ChannelInfo] = []
            after_ch = ""
            while True:
                heads = store.channels(after=after_ch, limit=HEADS_PAGE, include_empty=True)
                out += heads
                if len(heads) < HEADS_PAGE:
                    return mark, out
                after_ch = heads[-1].channel

        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._reads, read)

    async def _top_time(self) -> int:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._reads, self.store.top_time)

    async def _sync(self) -> None:
        """Fill every channel the log has further than this node delivered."""
        self.syncs += 1
        mark, heads = await self._changed_heads(self._synced)
        n = self.sequencer.sync_all(heads)
        self.sequencer.note_time(mark.time_ns)
        if self._synced is None or mark.pos > self._synced.pos:
            self._synced = mark
        consumers = None if self._node is None else self._node.consumers
        if n and consumers is not None:
            consumers.others_committed(None)
        if n:
            log.info("cluster: catching up %d channels from the log", n)

    async def _sync_logged(self) -> None:
        """:meth:`_sync`, its failure (the log away) logged and counted: the caller tries again later."""
        try:
            await self._sync()
        except Exception as exc:
            self._tasks.supervision.note("broker", "catching up from the log", exc, "tried again later")

    async def _watch_loop(self) -> None:
        """While Redis is up, the events of a node killed between its commit and its publish, or of a message
        Redis dropped, would reach this node only with a later event of their channel. So every poll interval
        the log's newest commit time is compared with the newest this node delivered; still ahead one
        interval later, it means such events: sync from the log. (While Redis is away, the receive loop syncs
        every interval anyway.) One small query per interval."""
        behind = 0
        while not self._closed:
            await asyncio.sleep(self.settings.poll_interval_s)
            if not self.up:
                behind = 0
                continue
            try:
                if behind and self.sequencer.max_time < behind:
                    self.watch_syncs += 1
                    await self._sync()
                behind = 0
                t = await self._top_time()
                if t > self.sequencer.max_time:
                    behind = t
            except Exception as exc:  # the log away: try again next interval
                self._tasks.supervision.note("broker", "watching the log", exc, "tried again next interval")

    # -- Redis: receiving --------------------------------------------------------------------------------

    async def _subscribe(self) -> None:
        await self._drop_pubsub()
        ps = self._sub.pubsub(ignore_subscribe_messages=True)
        try:
            await asyncio.wait_for(ps.subscribe(self.settings.redis_channel), 5.0)
        except BaseException:
            await self._close_pubsub(ps)
            raise
        self._pubsub = ps
        self._set_up(True)

    async def _drop_pubsub(self) -> None:
        ps, self._pubsub = self._pubsub, None
        if ps is not None:
            await self._close_pubsub(ps)

    async def _close_pubsub(self, ps: Any) -> None:
        try:
            await ps.aclose()
        except Exception as exc:  # a subscription Redis already dropped: nothing to do but say so
            self._tasks.supervision.note("broker", "closing the Redis subscription", exc, "ignored")

    async def _receive_loop(self) -> None:
        delay = 0.1
        while not self._closed:
            if self._pubsub is None:
                # Away: deliver from the log every poll interval, and try Redis again meanwhile.
                try:
                    await self._subscribe()
                    self.reconnects += 1
                    delay = 0.1
                except (RedisError, OSError, TimeoutError) as exc:
                    log.debug("cluster: Redis still unavailable: %s", exc)
                    await self._sync_logged()  # the log away too: the next interval tries again
                    await asyncio.sleep(min(delay, self.settings.poll_interval_s))
                    delay = min(delay * 2, self.settings.poll_interval_s)
                    continue
                # Subscribed again: what was committed while away is in the log.
                self._wake.set()  # announce this node's own tops
                await self._sync_logged()
            try:
                msg = await self._pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
            except (RedisError, OSError) as exc:
                log.warning("cluster: Redis subscription lost: %s", exc)
                self._set_up(False)
                await self._drop_pubsub()
                continue
            if msg is None or msg.get("type") != "message":
                continue
            self._on_message(msg["data"])

    def _on_message(self, data: Any) -> None:
        self.messages += 1
        try:
            m = wire.decode(data if isinstance(data, bytes) else bytes(data))
        except wire.BadMessage as exc:
            self.bad_messages += 1
            if self.bad_messages == 1 or self.bad_messages % 1000 == 0:
                log.warning("cluster: ignoring a message on %s: %s", self.settings.redis_channel, exc)
            return
        if m.node == self.sender:
            return  # this node's own: offered at commit
        if m.notices:
            if self._node is not None:
                for topic, payload in m.notices:
                    self._node.notices.received(topic, payload)
            return
        if not self._twin_warned and m.node.rpartition("/")[0] == self.node_id:
            self._twin_warned = True
            log.error(
                "cluster: another node uses this node's id %r (cluster.node_id must be unique)", self.node_id
            )
        consumers = None if self._node is None else self._node.consumers
        if consumers is not None:  # their journal items are committed: open durable consumers read them
            consumers.others_committed(m.events)
            if m.tops:
                consumers.others_committed(None)
        self.offer_many((None, ev) for ev in m.events)
        self.received += len(m.events)
        for channel, epoch, top in m.tops:
            self.sequencer.committed_up_to(channel, epoch, top)

    # -- Redis: publishing -------------------------------------------------------------------------------

    def _take(self) -> list[Event]:
        out, self._outbox = self._outbox, []
        return out

    def _mark_dirty(self, events: Any) -> None:
        dirty = self._dirty
        for ev in events:
            dirty[ev.channel] = (ev.epoch, ev.seq)

    async def _publish(self, events: list[Event]) -> None:
        name = self.settings.redis_channel
        msgs = list(wire.encode_events(self.sender, events))
        notices, self._notices = self._notices, []
        if notices:
            msgs.append(wire.encode_notices(self.sender, notices))
        dirty = dict(self._dirty)
        if dirty:
            msgs.append(wire.encode_tops(self.sender, [(ch, ep, seq) for ch, (ep, seq) in dirty.items()]))
        if not msgs:
            return
        async with self._pub.pipeline(transaction=False) as pipe:
            for m in msgs:
                pipe.publish(name, m)
            await pipe.execute()
        for ch, top in dirty.items():  # announced, unless it moved on meanwhile
            if self._dirty.get(ch) == top:
                del self._dirty[ch]

    async def _publish_loop(self) -> None:
        while not self._closed:
            await self._wake.wait()
            self._wake.clear()
            events = self._take()
            if not self.up:
                self._mark_dirty(events)
                self.notices_dropped += len(self._notices)
                self._notices.clear()
                continue
            try:
                await self._publish(events)
                self.published += len(events)
            except (RedisError, OSError, TimeoutError) as exc:
                # Whether Redis took them is unknown: announce their tops later (a repeat is harmless).
                self.publish_errors += 1
                log.warning("cluster: publishing to Redis failed: %s", exc)
                self._mark_dirty(events)

    # -- reporting ----------------------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """For ``/healthz``: the broker's state (``up`` or ``down``: serving from the log)."""
        return {
            "state": "up" if self.up else "down",
            "node_id": self.node_id,
            "for_s": round(time.monotonic() - self._changed, 3),
        }

    def statistics(self) -> dict[str, int | float]:
        """Counters and gauges for ``/metrics`` (``hubbub_cluster_<name>``)."""
        return {
            "broker_up": int(self.up),
            "published": self.published,
            "publish_errors": self.publish_errors,
            "received": self.received,
            "messages": self.messages,
            "bad_messages": self.bad_messages,
            "reconnects": self.reconnects,
            "syncs": self.syncs,
            "watch_syncs": self.watch_syncs,
            "notices_dropped": self.notices_dropped,
            "unannounced_channels": len(self._dirty),
            **self.sequencer.statistics(),
        }
