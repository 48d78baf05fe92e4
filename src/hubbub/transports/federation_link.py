"""This node linked up to another hubbub node over the native protocol (``--upstream``; docs/federation.md).

:class:`FederationUpstream` keeps one native WebSocket (msgpack) open to the node above, named with the
federation handshake headers (:mod:`hubbub.federation.wire`), and runs both directions over it:

* **Down** (what this node's subscribers want from above). The link watches every subscription on this node
  (every dialect, and the links of nodes below: ``Node.watch_subscriptions``) and subscribes upstream to the
  :func:`~hubbub.federation.minimal_cover` of their patterns, re-synced on every change. Each event that
  comes down is committed here (so every local dialect gets it) with its origin, its hops plus this node,
  ``:fed.from = up``, its original publisher and the idempotency key of its origin: an event that reaches
  this node by two upstreams is stored once. One whose path holds this node is dropped.
* **Up** (what was published here, or came up from below). A local session subscribes to ``/**`` and
  receives every event committed here; those that did not come down from an upstream (or did, but were
  published below this node), and whose path does not hold the node above
  (:func:`~hubbub.federation.forwards_up`), are published upstream with their hop headers and the
  idempotency key of their origin, acknowledged one by one.
* **Recovery by position.** Both directions keep a :class:`~hubbub.federation.Cursor`: down, the upstream's
  position per channel of the last event committed here; up, this node's position per channel of the last
  event the upstream acknowledged. Both advance strictly in order (a completion FIFO), are saved to
  ``<data_dir>/federation/<link>.json`` five times a second and at shutdown, and after a reconnect or a
  restart (``kill -9`` included) the link resubscribes with ``since`` from them: upstream with
  ``since``/``from_time`` (native.md §6), for every subscription whenever its interest comes back (the
  down cursor holds the patterns it was subscribed to), locally with a replay of its own (of any length,
  paged from the log while it goes up: :mod:`~hubbub.transports.federation_flow`). A cursor that lags the
  truth (a crash between a commit and a save) resends a few events, which the idempotency keys turn away
  (``native.idempotency_window_s``): no gap, no duplicate. A position the log no longer holds is a ``gap``,
  counted.
* **Reconnects** with capped exponential backoff and full jitter (:class:`~hubbub.federation.Backoff`).
* **Cycles**: the upstream reports its id and the ids above it on the upgrade (and learns the ids below the
  downstream); a link to a node that is this one or below it is refused at either end (``refused``); the
  hops stop what neither end can see.

Concurrency contract: runs on the event loop; one task per link (:meth:`FederationUpstream.run`, under the
link's supervisor), with a cursor saver beside its connections and a reader, a writer and an interest
syncer per connection, each in a :class:`~hubbub.transports.lifetime.Lifetime`: a part that ends ends its
connection, a part that fails ends the link (its supervisor logs it and starts the link again), and
closing the link cancels them all.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Coroutine, Iterator, Mapping
from pathlib import Path
from typing import Any, Final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import aiohttp
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from hubbub.channels import Pattern
from hubbub.client.protocol import (
    BadInput,
    ClientProtocol,
    GapNotice,
    HelloRefused,
    Received,
    Recovered,
    Refused,
    Replies,
    ServerError,
    Welcome,
)
from hubbub.core.api import Core, Overflow, Session, Supervisor
from hubbub.core.flag import Flag
from hubbub.disconnect import Disconnect
from hubbub.errors import BadFrame, HubbubError
from hubbub.federation import Backoff, cycle_reason
from hubbub.federation.upstream import UpstreamSubscriptions
from hubbub.federation.wire import (
    ABOVE_HEADER,
    BELOW_HEADER,
    NODE_HEADER,
    decode_event,
    parse_above,
    parse_node,
    render_above,
)

from .federation_flow import (
    DIALECT,
    LINK_IDENTITY,
    DownFlow,
    Interest,
    LinkCursors,
    LinkStats,
    UpEncoder,
    UpFlow,
)
from .federation_peer import FederationHub
from .lifetime import Lifetime

__all__ = ["FederationLinkCollector", "FederationUpstream", "link_name", "split_token"]

log = logging.getLogger("hubbub.federation")

CONNECT_TIMEOUT_S: Final = 10.0
#: What ends a connection as the network or the node above does (the link reconnects); anything else a
#: connection raises is a failure of the link, for its supervisor.
_LOST: Final = (aiohttp.ClientError, OSError, TimeoutError, BadFrame, HubbubError)
CLIENT: Final = "hubbub-federation/1"
#: A WebSocket ping this often; no pong within half of it closes the connection (and the link reconnects).
HEARTBEAT_S: Final = 20.0
#: Interest changes within this long are sent upstream together.
SYNC_DELAY_S: Final = 0.02
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def link_name(url: str) -> str:
    """The link's name (metrics, its cursor file): ``fed-<host>-<port>``."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "wss" else 80)
    return _UNSAFE.sub("-", f"fed-{parts.hostname or 'node'}-{port}")[:64]


def split_token(url: str) -> tuple[str, str]:
    """A link URL without its ``token`` query parameter, and that token (sent in ``hello``, never logged).
    A URL without a path gets the native WebSocket path, ``/ws/hubbub``."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    token = next((v for k, v in query if k == "token"), "")
    rest = urlencode([(k, v) for k, v in query if k != "token"])
    path = parts.path if parts.path not in ("", "/") else "/ws/hubbub"
    return urlunsplit((parts.scheme, parts.netloc, path, rest, "")), token


def handshake(node_id: str, headers: Mapping[str, str]) -> tuple[str, tuple[str, ...], str | None]:
    """The upstream's id and the ids above it from its upgrade answer, and why the link may not come up
    (``None``: it may)."""
    upstream = parse_node(headers.get(NODE_HEADER))
    above = parse_above(headers.get(ABOVE_HEADER))
    if upstream is None or above is None:
        return "", (), "the upstream is not a hubbub node taking federation links"
    return upstream, above, cycle_reason(node_id, upstream, above)


async def link_token(token: str, token_file: Path | None, link: str) -> str:
    """The token for a connection's ``hello``: the content of ``token_file`` (``federation.token_file``), read
    now, so that a token renewed in the file (a short-lived JWT) is presented from the next connection on
    (after a 4103 the link reconnects); without one, ``token`` (the URL's or ``federation.token``)."""
    if token_file is None:
        return token
    try:
        text = await asyncio.to_thread(token_file.read_text, "utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        log.warning("federation.token_file unreadable: %s: %s", token_file, exc, extra={"link": link})
        raise OSError(f"federation.token_file {token_file} unreadable") from exc
    return text.strip()


#: Request tokens of the link's connection protocol: a subscription's pattern text, or an up publish's
#: completion entry (:class:`~hubbub.transports.federation_flow.UpFlow`).
LinkToken = str | list[Any]


async def hello(
    ws: aiohttp.ClientWebSocketResponse, token: str, link: str
) -> ClientProtocol[LinkToken] | None:
    """Say ``hello`` (with ``token`` if any; no echo of the link's own publishes, batch frames down) and read
    the answer: the connection's protocol when the node above took it, else None (a refusal is logged with
    its code). Raises ``BadFrame`` when the upstream closes instead."""
    proto: ClientProtocol[LinkToken] = ClientProtocol(
        "msgpack", client=CLIENT, token=token or None, echo=False, batch=True, event_decoder=decode_event
    )
    await ws.send_bytes(proto.hello())
    msg = await ws.receive(timeout=CONNECT_TIMEOUT_S)
    if msg.type != aiohttp.WSMsgType.BINARY:
        raise BadFrame("the upstream closed the link during hello")
    items = proto.receive(msg.data)
    if not items or not isinstance(items[0], Welcome):
        code = items[0].error.code if items and isinstance(items[0], HelloRefused) else 0
        log.error("federation upstream refused hello: %s (a token?)", code, extra={"link": link})
        return None
    return proto


class FederationUpstream:
    """One link up to the hubbub node at ``url``. ``state`` is ``connecting``, ``up``, ``down`` or
    ``refused``. See the module docstring."""

    def __init__(
        self,
        node: Core,
        hub: FederationHub,
        url: str,
        *,
        token: str = "",
        token_file: Path | None = None,
        state_dir: Path | None = None,
        backoff: Backoff | None = None,
        max_frame: int = 1 << 20,
        send_queue: int = 1024,
        send_queue_bytes: int = 16 << 20,
    ) -> None:
        self.node = node
        self.hub = hub
        self.url, url_token = split_token(url)
        self._token = url_token or token  # a link's own ?token= is more specific than federation.token
        self._token_file = None if url_token else token_file
        self.name = link_name(self.url)
        self.backoff = backoff or Backoff(0.1, 10.0)
        self.max_frame = max_frame
        self.send_queue = send_queue
        self.send_queue_bytes = send_queue_bytes
        self.state = "connecting"
        self.upstream = ""
        self.reconnects = 0
        self.stats = LinkStats()
        self.cursors = LinkCursors(
            state_dir / f"{self.name}.json" if state_dir is not None else None, self.name
        )
        self.interest = Interest()
        self._interest_changed = self.interest.changed
        self._stopping = False
        #: The link's connection loop (which reconnects by itself): restarted should it fail.
        self._tasks = Supervisor("federation", node.supervision)
        # From now, before any listener opens: no subscription may come before the link watches.
        self._unwatch: Any = node.watch_subscriptions(self.interest.watch)
        #: This connection's subscriptions upstream.
        self.upward = UpstreamSubscriptions()
        self.up: UpFlow | None = None
        self.down: DownFlow | None = None

    # -- lifecycle -------------------------------------------------------------------------------------------

    async def __aenter__(self) -> FederationUpstream:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def start(self) -> None:
        self._tasks.open()
        self._tasks.run(f"federation-link {self.name}", self.run)

    async def close(self) -> None:
        """Stop the link (it does not reconnect) and save its cursors."""
        self._stopping = True
        if self._unwatch is not None:
            self._unwatch()
            self._unwatch = None
        await self._tasks.aclose()
        taken = self.cursors.snapshot()
        await asyncio.get_running_loop().run_in_executor(None, self.cursors.save_logged, taken)

    # -- interest --------------------------------------------------------------------------------------------

    def wanted(self) -> dict[str, Pattern]:
        """The patterns to subscribe upstream: the minimal cover of the local subscriptions'."""
        return self.interest.cover()

    @property
    def synced(self) -> bool:
        """Up, subscribed upstream to exactly :meth:`wanted`, every subscription answered and replayed."""
        return self.state == "up" and self.upward.synced(self.wanted())

    # -- the connection loop ---------------------------------------------------------------------------------

    async def run(self) -> None:
        """Connect, and reconnect after a backoff, until :meth:`close`. The cursor saver runs beside the
        connections, in one :class:`~hubbub.transports.lifetime.Lifetime` with them: a failure of either
        ends both and reaches the link's supervisor (which starts the link again); cancelling the link
        cancels both."""
        limits = aiohttp.ClientTimeout(total=None, connect=CONNECT_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=limits) as http, Lifetime() as life:
            saver = life.create_task(self.cursors.save_loop(), name=f"federation-saver {self.name}")
            await self._connect_loop(http)
            saver.cancel()  # stopping: close() saves the cursors last

    async def _connect_loop(self, http: aiohttp.ClientSession) -> None:
        first = True
        while not self._stopping:
            if not first:
                self.reconnects += 1
            first = False
            self.state = "connecting"
            try:
                async with http.ws_connect(
                    self.url,
                    protocols=("hubbub.v1.msgpack",),
                    headers={
                        NODE_HEADER: self.hub.node_id,
                        BELOW_HEADER: render_above(self.hub.below),
                    },
                    max_msg_size=self.max_frame,
                    autoping=True,
                    heartbeat=HEARTBEAT_S,  # a node above that vanished (no pong) ends the link
                    timeout=aiohttp.ClientWSTimeout(ws_close=5.0),
                ) as ws:
                    await self._connected(ws)
            except aiohttp.WSServerHandshakeError as exc:
                if exc.status == 409:
                    self.state = "refused"  # the upstream sees this node above it: a cycle
                log.error("federation upstream refused the link: %s", exc.status, extra={"link": self.name})
            except _LOST as exc:
                log.info(
                    "federation upstream unreachable: %s: %s",
                    type(exc).__name__,
                    exc,
                    extra={"link": self.name},
                )
            if self._stopping:
                break
            if self.state != "refused":
                self.state = "down"
            await asyncio.sleep(self.backoff.next_delay())

    async def _connected(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        response = getattr(ws, "_response", None)
        upstream, above, why = handshake(self.hub.node_id, response.headers if response is not None else {})
        if why is None and upstream in self.hub.below:
            why = f"{upstream} is below {self.hub.node_id}: linking up to it would close a cycle"
        if why is not None:
            self.state = "refused"
            log.error("federation upstream refused: %s", why, extra={"link": self.name})
            return
        proto = await hello(ws, await link_token(self._token, self._token_file, self.name), self.name)
        if proto is None:
            return
        self.upstream = upstream
        self.hub.above[self.name] = (upstream, *above)
        self.upward = UpstreamSubscriptions()
        up = self.up = UpFlow(self.name, self.node, self.cursors, self.stats)
        sess = Session(
            DIALECT,
            UpEncoder(self.hub.node_id, upstream, self.hub.below),
            max_items=self.send_queue,
            max_bytes=self.send_queue_bytes,
            overflow=Overflow.DISCONNECT,
            slow_close_code=Disconnect.SLOW_CONSUMER,
            # What comes down is published with this session as its origin: the live fan-out keeps it
            # from the session, so a fast stream from above fills no queue meant for what goes up.
            echo=False,
        )
        self.node.access.bind(sess, LINK_IDENTITY)
        self.node.attach(sess)
        sess.bucket = None  # what comes down is paced by DownFlow.pace, never rate-limited as a client
        down = self.down = DownFlow(
            self.name, self.node, self.hub.node_id, self.cursors, self.stats, up, sess
        )
        self.state = "up"
        self.backoff.reset()
        log.info("federation upstream up", extra={"link": self.name, "upstream": upstream})
        ended = Flag()

        async def until_ended(part: Coroutine[Any, Any, None]) -> None:
            try:
                await part
            finally:
                ended.set()

        try:
            async with Lifetime() as life:
                # The connection ends when any part does: the reader (the node above closed), the writer
                # (the up session ended) or the interest syncer; a part that fails ends it too.
                parts = [
                    life.create_task(until_ended(self._read(ws, proto, up, down)), name="read"),
                    life.create_task(until_ended(up.write(ws, sess, proto, self.max_frame)), name="write"),
                    life.create_task(until_ended(self._sync(ws, proto, down)), name="sync"),
                ]
                await up.subscribe_local(sess)
                await ended.wait()
                for t in parts:
                    t.cancel()
        except* _LOST as lost:
            exc = lost.exceptions[0]
            log.info(
                "federation upstream connection lost: %s: %s",
                type(exc).__name__,
                exc,
                extra={"link": self.name},
            )
        finally:
            self.node.detach(sess)
            self.cursors.down.interrupted()
            self.cursors.dirty = True
            self.hub.above.pop(self.name, None)
            log.info("federation upstream down", extra={"link": self.name})

    # -- reading what the node above sends -------------------------------------------------------------------

    async def _read(
        self,
        ws: aiohttp.ClientWebSocketResponse,
        proto: ClientProtocol[LinkToken],
        up: UpFlow,
        down: DownFlow,
    ) -> None:
        async for msg in ws:
            if msg.type != aiohttp.WSMsgType.BINARY:
                if msg.type == aiohttp.WSMsgType.TEXT:
                    raise BadFrame("a text frame on a msgpack link")
                break
            for item in proto.receive(msg.data):
                kind = type(item)
                if kind is Received:
                    down.event(item.value)  # type: ignore[union-attr]
                elif isinstance(item, Replies):
                    for token, frame in item.answers:
                        if type(token) is list:
                            up.completed(token, False)
                        else:
                            self._time_mark(down, self.upward.subscribed(frame.get("top_time", 0)))
                elif isinstance(item, Refused):
                    if type(item.token) is list:
                        up.completed(item.token, True)
                    else:
                        self._not_subscribed(item.token, item.error.code)
                elif isinstance(item, ServerError):
                    if item.request_id is None:
                        log.warning(
                            "federation upstream error %s", item.error.code, extra={"link": self.name}
                        )
                elif isinstance(item, Recovered):
                    more = item.frame.get("more") is True  # the node above cut the replay: the next round
                    down.broken |= more
                    self._time_mark(down, self.upward.recovered(item.sub, more))
                elif isinstance(item, GapNotice):
                    down.gap(item.gap)
                elif isinstance(item, BadInput):
                    raise item.error
            for data in proto.take_outgoing():  # pongs
                await ws.send_bytes(data)
            del msg
            if down.broken:
                return
            await down.pace()

    def _not_subscribed(self, text: str, code: int) -> None:
        # 4203: too much missed to recover (a gap: the next round subscribes live); anything else (a
        # permission, a limit) is not asked again until the link reconnects: no retry loop.
        self.stats.gaps += self.upward.not_subscribed(text, code)
        log.error("federation upstream refused subscribing to %s: %s", text, code, extra={"link": self.name})
        self._interest_changed.set()

    def _time_mark(self, down: DownFlow, top_time: int) -> None:
        """Once no subscription is pending or replaying, every pattern subscribed has come up to the newest
        upstream time seen when subscribing: where channels not in the cursor are recovered from next time."""
        if top_time:
            down.recovered_to(top_time, list(self.upward.subs))

    async def _sync(
        self, ws: aiohttp.ClientWebSocketResponse, proto: ClientProtocol[LinkToken], down: DownFlow
    ) -> None:
        """Keep the upstream subscriptions on :meth:`wanted`. A new subscription recovers from the cursor
        whenever it comes (:meth:`~hubbub.federation.upstream.UpstreamSubscriptions.changes`): this node's
        subscribers and the nodes below may come back long after the link did (a slow restart, a loaded
        machine), and what they missed is fetched all the same."""
        cursor = self.cursors.down
        while True:
            self._interest_changed.clear()
            gone, new = self.upward.changes(self.wanted(), cursor)
            if gone or new:
                self.cursors.dirty = True  # the patterns held changed
            if new:
                # Written ahead: a pattern is on disk as held (recovered from no later than now) before
                # its subscribe goes up, so a crash before the saver's next interval does not make the
                # restarted link take it for one never held, and subscribe live past what it missed.
                taken = self.cursors.snapshot()
                await asyncio.get_running_loop().run_in_executor(None, self.cursors.save_logged, taken)
            for sid in gone:
                # Not waited for: its answer matches no request in flight.
                await ws.send_bytes(proto.encode({"op": "unsubscribe", "id": proto.next_id(), "sub": sid}))
            for text, frame in new:
                data = proto.request(frame, text)
                log.info("federation: subscribing upstream", extra={"link": self.name, "frame": repr(frame)})
                await ws.send_bytes(data)
            await self._interest_changed.wait()
            await asyncio.sleep(SYNC_DELAY_S)


class FederationLinkCollector:
    """Every upstream link on ``/metrics``, labelled ``link`` (``fed-<host>-<port>``; docs/federation.md)."""

    def __init__(self, links: list[FederationUpstream]) -> None:
        self.links = links

    def collect(self) -> Iterator[Any]:
        up = GaugeMetricFamily(
            "hubbub_federation_link_up", "Upstream link connected", labels=["link", "upstream"]
        )
        state = GaugeMetricFamily(
            "hubbub_federation_link_state", "Upstream link state", labels=["link", "state"]
        )
        synced = GaugeMetricFamily(
            "hubbub_federation_link_synced",
            "Upstream link subscribed to the local interest and done recovering",
            labels=["link"],
        )
        rc = CounterMetricFamily(
            "hubbub_federation_link_reconnects", "Upstream connections after the first", labels=["link"]
        )
        ev = CounterMetricFamily(
            "hubbub_federation_link_events", "Events over the upstream link", labels=["link", "direction"]
        )
        gaps = CounterMetricFamily(
            "hubbub_federation_link_gaps",
            "Channels whose missed events could not be recovered",
            labels=["link"],
        )
        lag = GaugeMetricFamily(
            "hubbub_federation_link_lag_seconds",
            "down: age of the last event received; up: wait of the oldest event not yet acknowledged",
            labels=["link", "direction"],
        )
        backlog = GaugeMetricFamily(
            "hubbub_federation_link_backlog", "Events sent up and not yet acknowledged", labels=["link"]
        )
        pats = GaugeMetricFamily(
            "hubbub_federation_link_patterns", "Patterns subscribed upstream", labels=["link"]
        )
        for link in self.links:
            n, st = link.name, link.stats
            up.add_metric([n, link.upstream], 1 if link.state == "up" else 0)
            for s in ("connecting", "up", "down", "refused"):
                state.add_metric([n, s], 1 if link.state == s else 0)
            synced.add_metric([n], 1 if link.synced else 0)
            rc.add_metric([n], link.reconnects)
            ev.add_metric([n, "up"], st.sent_up)
            ev.add_metric([n, "up_refused"], st.refused_up)
            ev.add_metric([n, "down"], st.received_down)
            ev.add_metric([n, "down_dropped"], st.dropped_down)
            gaps.add_metric([n], st.gaps)
            flow = link.up if link.state == "up" else None
            lag.add_metric([n, "down"], st.lag_down_s)
            lag.add_metric([n, "up"], flow.lag_s() if flow is not None else 0.0)
            backlog.add_metric([n], len(flow.fifo) if flow is not None else 0)
            pats.add_metric([n], len(link.upward.subs))
        yield from (up, state, synced, rc, ev, gaps, lag, backlog, pats)
