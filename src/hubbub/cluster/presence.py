"""Cluster-wide presence in Redis (the :class:`~hubbub.core.presence.Presence` of a cluster node).

Each node keeps its own members in memory (a :class:`~hubbub.core.presence.LocalPresence`, the truth for this
node) and mirrors them to Redis, where every node reads the others'. Keys, under
``P = <redis_channel>:presence``:

* ``P:nodes``: a sorted set, node id → the time (ms, the node's clock) until which it is alive.
* ``P:node:<node>``: a marker, present while the node's entries are; it expires with them.
* ``P:r:<node>:<roster>``: a hash per node and roster, member key → ``{"f": fields, "t": since_ns, "n": n}``
  (JSON), expiring ``cluster.presence_ttl_s`` after the node's last heartbeat.
* ``P:c:<counter>``: a hash, node id → that node's part of the counter (no expiry: read only for live nodes).

A heartbeat every third of the TTL refreshes the node's keys and its ``nodes`` score. A node killed stops
refreshing: its members disappear from every roster within the TTL, and readers ignore it from then on. A
node that finds its marker gone (Redis restarted, or the node was away longer than the TTL) writes all its
entries again. Changes are written in the background as they happen (the latest state of each changed member,
so a join and a leave between two writes cost nothing).

A read takes this node's members from memory and the other live nodes' from Redis (two round trips); while
Redis is away, it answers with this node's own members alone and counts a ``read_errors``.

Redis's state: presence writes only at changes and heartbeats, so on its own it would notice Redis gone only
at its next write (seconds later). A cluster node therefore makes it :meth:`follow` the broker, whose
subscription sees Redis go at once: presence is ``down`` whenever the broker is, and writes everything again
as soon as the broker has Redis back.

Concurrency contract: everything runs on the event loop; :meth:`start` and :meth:`close` once each.
Clocks: liveness compares the writer's clock with the reader's, so keep the nodes' clocks in step (NTP), well
within the TTL.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping

import orjson
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from hubbub.core.presence import LocalPresence, Member
from hubbub.core.supervisor import Supervision, Supervisor

__all__ = ["RedisPresence"]

log = logging.getLogger("hubbub.cluster")

_FAILURES = (RedisError, OSError, TimeoutError)
#: A read gives up after this long and answers with this node's members alone.
READ_TIMEOUT_S = 2.0


class RedisPresence:
    """See the module docstring. ``prefix``: the cluster's Redis channel (clusters sharing a Redis differ)."""

    def __init__(
        self,
        url: str,
        node_id: str,
        prefix: str,
        ttl_s: float = 15.0,
        *,
        supervision: Supervision | None = None,
    ) -> None:
        if ttl_s <= 0:
            raise ValueError("ttl_s must be positive")
        self.node_id = node_id
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self.local = LocalPresence(node_id)
        self._p = f"{prefix}:presence"
        self._redis = aioredis.Redis.from_url(
            url,
            socket_timeout=READ_TIMEOUT_S,
            socket_connect_timeout=READ_TIMEOUT_S,
            retry=Retry(NoBackoff(), 0),
        )
        self._dirty: set[tuple[str, str]] = set()
        self._dirty_counters: set[str] = set()
        #: Rosters that have a key of this node in Redis (to delete those left while Redis was away).
        self._written: set[str] = set()
        self._resync = True
        self._wake = asyncio.Event()
        #: Redis as the broker sees it (:meth:`follow`; always up without a broker to follow).
        self._link_up = True
        self._retry = asyncio.Event()
        self._rewait = False
        #: The background writer (restarted should it fail), and its task.
        self._tasks = Supervisor("presence", supervision)
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.up = False
        # statistics
        self.writes = 0
        self.resyncs = 0
        self.write_errors = 0
        self.read_errors = 0

    # -- keys -------------------------------------------------------------------------------------------

    @property
    def _nodes(self) -> str:
        return f"{self._p}:nodes"

    def _marker(self) -> str:
        return f"{self._p}:node:{self.node_id}"

    def _roster_key(self, node: str, roster: str) -> str:
        return f"{self._p}:r:{node}:{roster}"

    def _counter_key(self, counter: str) -> str:
        return f"{self._p}:c:{counter}"

    # -- lifecycle --------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Write this node's (empty) presence, or note that Redis is away, and start the heartbeat."""
        await self._step()
        self._tasks.open()
        self._task = self._tasks.run("presence-writer", self._run)

    async def __aenter__(self) -> RedisPresence:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop the heartbeat and remove this node's entries (so its members leave every roster now)."""
        if self._closed:
            return
        self._closed = True
        await self._tasks.aclose()
        if self.up:
            try:
                async with self._redis.pipeline(transaction=False) as pipe:
                    for roster in self._written:
                        pipe.delete(self._roster_key(self.node_id, roster))
                    for counter in self.local.counters:
                        pipe.hdel(self._counter_key(counter), self.node_id)
                    pipe.delete(self._marker())
                    pipe.zrem(self._nodes, self.node_id)
                    await asyncio.wait_for(pipe.execute(), READ_TIMEOUT_S)
            except _FAILURES as exc:
                action = "its entries expire with the TTL"
                self._tasks.supervision.note("presence", "removing this node's entries", exc, action)
        try:
            await self._redis.aclose()
        except Exception as exc:  # closing: nothing to do but say so
            self._tasks.supervision.note("presence", "closing the Redis client", exc, "ignored")

    # -- writes (never block) ---------------------------------------------------------------------------

    def join(self, roster: str, key: str, fields: Mapping[str, str]) -> None:
        self.local.join(roster, key, fields)
        self._dirty.add((roster, key))
        self._wake.set()

    def leave(self, roster: str, key: str) -> None:
        self.local.leave(roster, key)
        self._dirty.add((roster, key))
        self._wake.set()

    def add(self, counter: str, n: int = 1) -> None:
        self.local.add(counter, n)
        self._dirty_counters.add(counter)
        self._wake.set()

    # -- the background writer --------------------------------------------------------------------------

    async def _run(self) -> None:
        beat_s = self.ttl_ms / 3000
        next_beat = time.monotonic() + beat_s
        while not self._closed:
            left = max(0.0, next_beat - time.monotonic())
            # Redis away: try again at the next beat or when the broker has it back, not at every change.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for((self._wake if self.up else self._retry).wait(), left)
            self._wake.clear()
            back = self._retry.is_set()
            self._retry.clear()
            if self._rewait:  # follow() took Redis away: wait for the broker's signal instead
                self._rewait = False
                continue
            beat = time.monotonic() >= next_beat
            if beat:
                next_beat = time.monotonic() + beat_s
            await self._step(beat)
            if back and not self.up:
                # The broker has Redis back, but the first command on a connection Redis dropped fails (it
                # is discarded then): once more on a new one, rather than a beat later.
                await self._step()

    async def _step(self, beat: bool = False) -> None:
        try:
            if not self._resync and beat:
                await self._heartbeat()
            if self._resync:
                await self._write_all()
            elif self._dirty or self._dirty_counters:
                await self._write_changes()
            self._set_up(True)
        except _FAILURES as exc:
            self.write_errors += 1
            if self.up:
                log.warning("cluster: presence: Redis unavailable (%s); rosters show this node only", exc)
            self._set_up(False)
            self._resync = True

    def _set_up(self, up: bool) -> None:
        if up and not self.up and self.write_errors:
            log.info("cluster: presence: Redis back; this node's members written again")
        self.up = up

    def follow(self, up: bool) -> None:
        """The broker's view of Redis changed (``RedisBroker.watch_state``; on the loop). Down: presence is
        down at once, and writes everything again once back. Up: it tries now, not at its next beat."""
        self._link_up = up
        if up:
            self._retry.set()
            return
        if self.up:
            log.warning("cluster: presence: Redis lost (the broker saw it go); rosters show this node only")
        self._set_up(False)
        self._resync = True
        self._rewait = True
        self._wake.set()  # the writer may be waiting for changes: it waits for the broker's signal now

    @property
    def _remote(self) -> bool:
        """Whether reads ask Redis for the other nodes' members."""
        return self.up and self._link_up

    def _alive_until(self) -> int:
        return time.time_ns() // 1_000_000 + self.ttl_ms

    def _entry(self, m: Member) -> bytes:
        return orjson.dumps({"f": m.fields, "t": m.since_ns, "n": m.n})

    async def _write_all(self) -> None:
        """Every entry of this node, anew (at start, and when Redis lost them or was away)."""
        self._dirty.clear()
        self._dirty_counters.clear()
        rosters = self.local.rosters
        ttl = self.ttl_ms
        async with self._redis.pipeline(transaction=True) as pipe:
            for roster in self._written - rosters.keys():
                pipe.delete(self._roster_key(self.node_id, roster))
            for roster, members in rosters.items():
                key = self._roster_key(self.node_id, roster)
                pipe.delete(key)
                pipe.hset(key, mapping={k: self._entry(m) for k, m in members.items()})
                pipe.pexpire(key, ttl)
            for counter, v in self.local.counters.items():
                pipe.hset(self._counter_key(counter), self.node_id, v)
            pipe.set(self._marker(), b"1", px=ttl)
            pipe.zadd(self._nodes, {self.node_id: self._alive_until()})
            await pipe.execute()
        self._written = set(rosters)
        self._resync = False
        self.resyncs += 1
        self.writes += 1

    async def _write_changes(self) -> None:
        dirty, self._dirty = self._dirty, set()
        counters, self._dirty_counters = self._dirty_counters, set()
        rosters = self.local.rosters
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for roster, key in dirty:
                    rkey = self._roster_key(self.node_id, roster)
                    m = rosters.get(roster, {}).get(key)
                    if m is None:
                        pipe.hdel(rkey, key)
                    else:
                        pipe.hset(rkey, key, self._entry(m))
                        pipe.pexpire(rkey, self.ttl_ms)
                        self._written.add(roster)
                for counter in counters:
                    pipe.hset(self._counter_key(counter), self.node_id, self.local.counters.get(counter, 0))
                await pipe.execute()
        except BaseException:
            self._dirty |= dirty  # written again (all of it) once Redis is back
            self._dirty_counters |= counters
            raise
        self.writes += 1

    async def _heartbeat(self) -> None:
        ttl = self.ttl_ms
        now_ms = time.time_ns() // 1_000_000
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.pexpire(self._marker(), ttl)
            pipe.zadd(self._nodes, {self.node_id: now_ms + ttl})
            pipe.zrangebyscore(self._nodes, "-inf", now_ms)
            for roster in self._written:
                pipe.pexpire(self._roster_key(self.node_id, roster), ttl)
            res = await pipe.execute()
        if not res[0]:
            # The marker expired (away longer than the TTL) or Redis lost it (restarted): write everything.
            self._resync = True
            return
        dead = [d.decode() if isinstance(d, bytes) else str(d) for d in res[2]]
        if dead:
            # Forget nodes gone for good: their entries expired; their parts of the counters go too.
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.zrem(self._nodes, *dead)
                for counter in self.local.counters:
                    pipe.hdel(self._counter_key(counter), *dead)
                await pipe.execute()
        self._written &= self.local.rosters.keys() | {r for r, _ in self._dirty}

    # -- reads ------------------------------------------------------------------------------------------

    async def _others(self) -> list[str]:
        now_ms = time.time_ns() // 1_000_000
        raw = await self._redis.zrangebyscore(self._nodes, now_ms, "+inf")
        return [n for n in (r.decode() if isinstance(r, bytes) else str(r) for r in raw) if n != self.node_id]

    async def _remote_members(self, roster: str) -> list[Member]:
        others = await self._others()
        if not others:
            return []
        async with self._redis.pipeline(transaction=False) as pipe:
            for node in others:
                pipe.hgetall(self._roster_key(node, roster))
            res = await pipe.execute()
        out: list[Member] = []
        for node, entries in zip(others, res, strict=True):
            for k, v in entries.items():
                try:
                    e = orjson.loads(v)
                    fields = {str(a): str(b) for a, b in e["f"].items()}
                    out.append(Member(k.decode(), fields, int(e["t"]), node, int(e["n"])))
                except (ValueError, KeyError, TypeError, AttributeError):
                    continue  # not ours: ignore
        return out

    async def members(self, roster: str) -> list[Member]:
        out = self.local.local_members(roster)
        if self._remote:
            try:
                out += await asyncio.wait_for(self._remote_members(roster), READ_TIMEOUT_S)
            except _FAILURES:
                self.read_errors += 1
            out.sort(key=lambda m: m.order)
        return out

    async def count(self, roster: str) -> int:
        n = len(self.local.rosters.get(roster, ()))
        if not self._remote:
            return n

        async def remote() -> int:
            others = await self._others()
            if not others:
                return 0
            async with self._redis.pipeline(transaction=False) as pipe:
                for node in others:
                    pipe.hlen(self._roster_key(node, roster))
                return sum(int(x) for x in await pipe.execute())

        try:
            n += await asyncio.wait_for(remote(), READ_TIMEOUT_S)
        except _FAILURES:
            self.read_errors += 1
        return n

    async def total(self, counter: str) -> int:
        n = self.local.counters.get(counter, 0)
        if not self._remote:
            return n

        async def remote() -> int:
            others = await self._others()
            if not others:
                return 0
            vals = await self._redis.hmget(self._counter_key(counter), others)
            return sum(int(v) for v in vals if v is not None)

        try:
            n += await asyncio.wait_for(remote(), READ_TIMEOUT_S)
        except (*_FAILURES, ValueError):
            self.read_errors += 1
        return n

    async def nodes(self) -> list[str]:
        """The live nodes as their heartbeats show them (this one alone while Redis is away)."""
        out = [self.node_id]
        if self._remote:
            try:
                out += await asyncio.wait_for(self._others(), READ_TIMEOUT_S)
            except _FAILURES:
                self.read_errors += 1
        return sorted(out)

    # -- reporting --------------------------------------------------------------------------------------

    def health(self) -> dict[str, str]:
        return {"state": "up" if self._remote else "down"}

    def statistics(self) -> dict[str, int | float]:
        return {
            "up": int(self._remote),
            **self.local.statistics(),
            "writes": self.writes,
            "write_errors": self.write_errors,
            "resyncs": self.resyncs,
            "read_errors": self.read_errors,
        }
