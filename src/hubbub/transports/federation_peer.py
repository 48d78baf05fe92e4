"""The upstream end of native federation links: other hubbub nodes linked up to this one (``--upstream``).

A downstream node opens an ordinary native WebSocket (``/ws/hubbub``, msgpack) naming itself in
:data:`~hubbub.federation.wire.NODE_HEADER`. :class:`FederationHub` answers the upgrade (this node's id and
the ids above it, or ``409`` for a link that would close a cycle) and serves the connection as a
:class:`FederationPeer`: a :class:`~hubbub.transports.native.NativeConnection` whose

* **publishes** carry the hop headers (:mod:`hubbub.federation.wire`): each is stored with its origin, its
  hops plus this node, its original publisher and the idempotency key derived from its origin, so an event
  that reaches this node by two paths is stored once; one whose path holds this node already is refused
  (4001), which the peer counts.
* **events** are rendered with their hop headers (stamped with this node: an event published here gets this
  node as its origin), and never sent to the peer when the peer is on their path (no echo of its own
  events, by whatever path they came back).

Subscriptions, recovery (``since``), keepalive, limits and permissions are the native connection's own: a
link is a native client, with a token like any other (auth on: it needs publish and subscribe rights).

Concurrency contract: everything runs on the event loop thread.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from hubbub.core.api import Core, ReplayPlan
from hubbub.dialects import native as nc
from hubbub.disconnect import Disconnect
from hubbub.errors import BadRequest
from hubbub.events import Event, Position, Publisher
from hubbub.federation import accepts_path, forwards_to, idempotency_key, stamp, valid_node_id
from hubbub.federation.wire import (
    ABOVE_HEADER,
    LINK_HOPS,
    LINK_ORIGIN,
    NODE_HEADER,
    link_headers,
    parse_above,
    parse_link_headers,
    parse_publisher,
    render_above,
)
from hubbub.log.base import AppendRequest
from hubbub.selection import CursorResume

from .native import NativeConnection
from .pump import SessionPump

__all__ = ["FederationHub", "FederationHubCollector", "FederationPeer", "PeerEncoder", "PeerStats"]

log = logging.getLogger("hubbub.federation")


@dataclass(slots=True)
class PeerStats:
    """One downstream node's counters, over all its connections."""

    connected: int = 0
    connections: int = 0
    #: Events it published here (stored, or refused as a loop) and events queued down to it.
    received: int = 0
    refused: int = 0
    sent: int = 0


class FederationHub:
    """This node in the federation: its id, the ids above it (reported by its upstream links while they
    are up) and the downstream nodes linked to it. See the module docstring."""

    def __init__(self, node: Core, node_id: str, state_dir: Path | None = None) -> None:
        self.node = node
        self.node_id = node_id
        #: The ids of the nodes below this one (reported by links on their upgrade, and on the paths of the
        #: events they send up), kept in ``<data_dir>/federation/below``: an event from above whose origin
        #: is below still goes up to the other upstreams (:func:`~hubbub.federation.forwards_up`).
        self.below: set[str] = set()
        self._below_path = state_dir / "below" if state_dir is not None else None
        if self._below_path is not None:
            with contextlib.suppress(OSError):
                self.below = {i for i in self._below_path.read_text().split() if valid_node_id(i)}
        #: Per upstream link (its URL id): the upstream's id and the ids above it, while the link is up.
        self.above: dict[str, tuple[str, ...]] = {}
        self.peers: dict[str, PeerStats] = {}

    def learn_below(self, ids: Iterable[str]) -> None:
        """Nodes found to be below this one. Saved when the set grows (rarely: once per new node)."""
        new = {i for i in ids if i not in self.below and i != self.node_id}
        if not new:
            return
        self.below |= new
        if self._below_path is not None:
            try:
                self._below_path.parent.mkdir(parents=True, exist_ok=True)
                self._below_path.write_text("\n".join(sorted(self.below)) + "\n")
            except OSError as exc:
                log.warning("federation: cannot save the nodes below in %s: %s", self._below_path, exc)

    def above_ids(self) -> set[str]:
        out: set[str] = set()
        for ids in self.above.values():
            out.update(ids)
        return out

    def refusal(self, peer: str) -> str | None:
        """Why a link from downstream node ``peer`` may not come up (it would close a cycle), or ``None``."""
        if peer == self.node_id:
            return f"node {peer} cannot link to itself"
        if peer in self.above_ids():
            return f"node {peer} is above {self.node_id}: this link would close a cycle"
        return None

    def upgrade_headers(self) -> dict[str, str]:
        return {NODE_HEADER: self.node_id, ABOVE_HEADER: render_above(self.above_ids())}

    def connection(
        self,
        peer: str,
        codec: nc.NativeCodec,
        *,
        below: str | None = None,
        send: Callable[[bytes], Awaitable[None]],
        close: Callable[[Disconnect], Awaitable[None]],
        send_many: Callable[[list[bytes]], Awaitable[None]] | None,
        max_frame: int,
        max_subscriptions: int,
        send_queue: int,
        send_queue_bytes: int,
        ping_interval: float,
    ) -> FederationPeer:
        self.learn_below([peer, *(parse_above(below) or ())])
        stats = self.peers.get(peer)
        if stats is None:
            stats = self.peers[peer] = PeerStats()
        return FederationPeer(
            self,
            peer,
            stats,
            self.node,
            codec,
            send=send,
            close=close,
            send_many=send_many,
            max_frame=max_frame,
            max_subscriptions=max_subscriptions,
            send_queue=send_queue,
            send_queue_bytes=send_queue_bytes,
            ping_interval=ping_interval,
        )


class PeerEncoder:
    """Events for one downstream node: the native event frame with the hop headers, or nothing (an empty
    frame, which is never written) for an event whose path holds the peer."""

    __slots__ = ("codec", "cut", "key", "node_id", "peer", "stats")

    #: Its frames name the subscriptions (``subs``; core/session.py).
    names_subscriptions = True

    def __init__(self, codec: nc.NativeCodec, node_id: str, peer: str, stats: PeerStats) -> None:
        self.codec = codec
        self.node_id = node_id
        self.peer = peer
        self.stats = stats
        self.key = f"native-fed.{codec.encoding}:{peer}:{id(self)}"

    def encode_event(self, event: Event, subs: Sequence[str], replay: bool, cache: dict[Any, Any]) -> bytes:
        headers = event.headers
        if not headers:  # published here, no headers: the common case, nothing to parse
            fed = {LINK_ORIGIN: f"{self.node_id} {event.epoch} {event.seq}", LINK_HOPS: self.node_id}
        else:
            if not forwards_to(self.peer, headers):
                return b""
            stamped, _ = stamp(self.node_id, headers, event.epoch, event.seq)
            fed = link_headers(event.user_headers, stamped)
        out = Event(event.channel, event.seq, event.epoch, event.time_ns, event.publisher, event.payload,
                    event.content_type, fed, event.tags)  # fmt: skip
        self.stats.sent += 1
        return self.codec.encode_event(out, subs, replay, None)

    def encode_batches(self, frames: Sequence[bytes], limit: int) -> list[bytes]:
        return self.codec.encode_batches([f for f in frames if f], limit)


class FederationPeer(NativeConnection):
    """A downstream node's link: see the module docstring."""

    __slots__ = ("hub", "peer_id", "stats")

    def __init__(
        self,
        hub: FederationHub,
        peer: str,
        stats: PeerStats,
        node: Core,
        codec: nc.NativeCodec,
        *,
        send: Callable[[bytes], Awaitable[None]],
        close: Callable[[Disconnect], Awaitable[None]],
        send_many: Callable[[list[bytes]], Awaitable[None]] | None,
        max_frame: int,
        max_subscriptions: int,
        send_queue: int,
        send_queue_bytes: int,
        ping_interval: float,
    ) -> None:
        encoder = PeerEncoder(codec, hub.node_id, peer, stats)
        super().__init__(
            node,
            codec,
            send=send,
            close=close,
            send_many=send_many,
            max_frame=max_frame,
            max_subscriptions=max_subscriptions,
            send_queue=send_queue,
            send_queue_bytes=send_queue_bytes,
            ping_interval=ping_interval,
            encoder=encoder,  # type: ignore[arg-type]  # a native encoder without runs: frames one by one
        )
        self.hub = hub
        self.peer_id = peer
        self.stats = stats

        async def send_some(data: bytes) -> None:
            if data:  # an empty frame is an event the peer must not get (PeerEncoder)
                await send(data)

        async def send_all(frames: list[bytes]) -> None:
            kept = [f for f in frames if f]
            if send_many is not None and len(kept) > 1:
                await send_many(kept)
            else:
                for f in kept:
                    await send(f)

        self._pump = SessionPump(
            node,
            self.session,
            send=send_some,
            close=close,
            max_frame=max_frame,
            send_many=send_all,
            pack=encoder.encode_batches,
            farewell=self._farewell,
        )

    def start(self, group: Any = None, identity: Any = None) -> None:
        self.stats.connected += 1
        self.stats.connections += 1
        log.info("federation link from below up", extra={"link": self.peer_id})
        super().start(group, identity)

    async def finish(self, close_wait_s: float = 10.0) -> None:
        self.stats.connected -= 1
        log.info("federation link from below down", extra={"link": self.peer_id})
        await super().finish(close_wait_s)

    async def _subscribe(self, cmd: nc.Subscribe) -> None:
        """A recovering subscription of the node below: replayed whole, paged from the log while it is sent
        (a :class:`~hubbub.selection.CursorResume`), never refused as too large (4203), gaps
        reported and passed."""
        if (cmd.since is None and cmd.from_time is None) or cmd.tags:  # links never send tags
            await super()._subscribe(cmd)
            return
        proto, pattern = self.proto, cmd.pattern
        since = {pattern.text: cmd.since} if isinstance(cmd.since, Position) else dict(cmd.since or {})
        selection = CursorResume(since, from_time=cmd.from_time)

        def on_snapshot(plan: ReplayPlan) -> None:
            if pattern.is_exact:
                proto.subscribed(cmd.id, cmd.sub, plan.position, None, plan.gaps)
            else:
                proto.subscribed(cmd.id, cmd.sub, None, plan.top_time, plan.gaps)

        def on_replayed(plan: ReplayPlan) -> None:
            self.session.push(self.codec.encode_push("recovered", sub=cmd.sub, replayed=plan.sent))

        await self.node.subscribe(
            self.session, cmd.sub, pattern, cmd.tags, selection,
            on_snapshot=on_snapshot, on_replayed=on_replayed,
        )  # fmt: skip

    def _submit_many(self, cmds: list[nc.Publish]) -> bool:
        return False  # one by one (each answered on its own): links publish over WebSocket, one per message

    def _submit_run(self, run: nc.PublishRun, count: int) -> bool:
        return False

    def _submit(self, cmd: nc.Publish) -> None:
        """Store an event the peer forwards up: its origin, its hops plus this node, its publisher."""
        hub = self.hub
        user, path, publisher = parse_link_headers(cmd.headers)
        self.stats.received += 1
        if (
            path is None
            or path.hops[-1] != self.peer_id
            or not accepts_path(hub.node_id, path.origin, path.hops)
        ):
            self.stats.refused += 1
            raise BadRequest("a federated event needs its origin and hops, and must not have been here")
        if not hub.below.issuperset(path.hops):
            hub.learn_below(path.hops)
        pub = parse_publisher(publisher)
        sess = self.session
        ident = sess.identity
        if pub is None:
            pub = ("native", sess.user, sess.id, "")
        elif ident is not None and not ident.admin and pub[1] != sess.user:
            # Only an admin token (or auth off) may speak for other users: otherwise the user is the link's.
            pub = (pub[0], sess.user, pub[2], pub[3])
        req = AppendRequest(
            cmd.channel,
            Publisher(*pub),
            cmd.payload,
            cmd.content_type,
            {**user, **path.arrived(hub.node_id, False)},
            cmd.tags,
            idempotency_key(path.origin),
        )
        proto = self.proto
        self.node.submit(req, sess, proto.committed)
        proto.submitted(cmd.id, cmd.ack)


class FederationHubCollector:
    """The downstream links on ``/metrics``: ``hubbub_federation_peer_up`` (connections open now) and
    ``hubbub_federation_peer_events`` (``direction`` ``up``: events it forwarded here, ``down``: events
    queued to it; ``refused``: its events refused as loops), labelled with the peer's node id."""

    def __init__(self, hub: FederationHub) -> None:
        self.hub = hub

    def collect(self) -> Iterator[Any]:
        up = GaugeMetricFamily(
            "hubbub_federation_peer_up", "Links from downstream nodes open", labels=["peer"]
        )
        ev = CounterMetricFamily(
            "hubbub_federation_peer_events",
            "Events over links from downstream nodes",
            labels=["peer", "direction"],
        )
        conns = CounterMetricFamily(
            "hubbub_federation_peer_connections", "Connections of downstream nodes' links", labels=["peer"]
        )
        for peer, s in sorted(self.hub.peers.items()):
            up.add_metric([peer], s.connected)
            ev.add_metric([peer, "up"], s.received - s.refused)
            ev.add_metric([peer, "down"], s.sent)
            ev.add_metric([peer, "refused"], s.refused)
            conns.add_metric([peer], s.connections)
        yield up
        yield ev
        yield conns
