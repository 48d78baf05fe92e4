"""This node's WearScript hub linked up to another WearScript hub (``wearscript.upstream``).

WearScript hubs chain by connecting to each other as they connect to devices: a hub below is, to the hub
above, one connection that speaks for many devices. :class:`WearscriptUpstream` opens that connection from
this node and runs it as any WearScript connection of the hub (:func:`~hubbub.transports.wearscript.serve`):

* **Up**: the greeting tells the hub above this hub's list (its test channel, the channels of its other
  dialects' subscriptions) and every local device's list; every later list change goes up as it happens. So
  the hub above sends down only what someone here listens to.
* **Down**: the lists the hub above sends (its own and its devices') are this connection's external set:
  local publishes of every dialect that match it are forwarded up, rendered ``[name, *args]``; frames from
  above are published here like a device's data messages (committed to the log, then delivered to every
  dialect).
* **No loop**: the link is the publisher of what comes down, so fan-out never hands it back (``echo`` off);
  each event that came down carries the federation pseudo-headers (:data:`~hubbub.federation.ORIGIN_HEADER`
  ``<link> <epoch> <n>``, :data:`~hubbub.federation.HOPS_HEADER` ``<link>``), so no hubbub node forwards it
  back to this link (:func:`~hubbub.federation.forwards_to`), after a reconnect or through a native
  federation link either. A hubbub hub above answers the upgrade with its hub id and the ids above it
  (``X-Hubbub-Wearscript-Hub``, ``X-Hubbub-Wearscript-Above``), and refuses with 409 a link from a hub
  above it: a link that would close a cycle is refused at either end
  (:func:`~hubbub.federation.cycle_reason`). WearScript frames carry no path, so through hubs that are not
  hubbub the links must form a tree, as WearScript's own hubs require.
* **Reconnects** with capped exponential backoff and full jitter (:class:`~hubbub.federation.Backoff`);
  WearScript has no replay, so what was published while the link was down is not sent (best effort, as
  the dialect).

Concurrency contract: runs on the event loop; one task per link (:meth:`WearscriptUpstream.run`).
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
import string
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from hubbub.auth import ANONYMOUS
from hubbub.core.api import Supervisor
from hubbub.dialects import wearscript as wsd
from hubbub.events import Event
from hubbub.federation import (
    FROM_HEADER,
    HOPS_HEADER,
    ORIGIN_HEADER,
    Backoff,
    Origin,
    cycle_reason,
    forwards_to,
)

from .binding import Mounted, Wiring
from .wearscript import ABOVE_HEADER, DIALECT, HUB_HEADER, WearscriptService, WearscriptSettings, serve

__all__ = [
    "LinkEncoder",
    "WearscriptLinkCollector",
    "WearscriptUpstream",
    "link_id",
    "link_origin",
    "refusal_hint",
]

log = logging.getLogger("hubbub.wearscript.link")

#: Seconds to open the connection (TCP, TLS and the upgrade) before the attempt counts as failed.
CONNECT_TIMEOUT_S = 10.0

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_EPOCH = string.digits + string.ascii_lowercase


def link_origin(url: str) -> str:
    """The ``Origin`` the link sends: the upstream's own http(s) origin (``ws://h:p/…`` → ``http://h:p``,
    ``wss`` → ``https``), without the URL's path, query or credentials. A stock WearScript hub serves
    ``golang.org/x/net/websocket``'s ``Handler``, whose handshake refuses (403) an upgrade whose ``Origin``
    is missing or not an absolute URL; the hub's own origin is one it cannot take for a foreign page."""
    parts = urlsplit(url)
    scheme = "https" if parts.scheme in ("wss", "https") else "http"
    return f"{scheme}://{parts.netloc.rpartition('@')[2]}"


def refusal_hint(status: int, origin: str) -> str:
    """What a refused upgrade's status most likely means, for the log (a token is never shown)."""
    if status == 401:
        return "no token or a bad one: put the hub's token in the URL (/wearscript/ws/<secret> or ?token=)"
    if status == 403:
        return (
            f"forbidden: the hub refused this link's Origin ({origin}) or what its token may do "
            "(a stock WearScript hub refuses an Origin it cannot parse or does not allow)"
        )
    if status == 404:
        return "no WearScript endpoint at that path (a hubbub hub serves /wearscript/ws)"
    return "the hub does not accept WearScript links there"


def link_id(url: str) -> str:
    """The link's name in the federation headers: ``ws-<host>-<port>`` (a valid node id)."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "wss" else 80)
    return _UNSAFE.sub("-", f"ws-{parts.hostname or 'hub'}-{port}")[:64]


class LinkEncoder:
    """The link's session encoder: ``[name, *args]`` as for any WearScript connection, and nothing (an empty
    frame, which the link does not send) for an event that came over this link (:func:`forwards_to`)."""

    def __init__(self, peer: str) -> None:
        self.peer = peer
        self.key = f"{DIALECT}-link:{peer}"
        self.forwarded = 0

    def encode_event(self, event: Event, subs: Sequence[str], replay: bool, cache: dict[Any, Any]) -> bytes:
        if event.headers and ORIGIN_HEADER in event.headers and not forwards_to(self.peer, event.headers):
            return b""
        self.forwarded += 1
        return wsd.render_event(wsd.name_of(event.channel), event)


class WearscriptUpstream:
    """One link up to the WearScript hub at ``url``. ``state`` is ``connecting``, ``up``, ``down`` or
    ``refused`` (a cycle); ``reconnects`` counts the connections opened after the first; ``received``
    the data messages that came down, ``forwarded`` (on :attr:`encoder`) the events queued up."""

    def __init__(self, service: WearscriptService, url: str, backoff: Backoff | None = None) -> None:
        self.service = service
        self.url = url
        self.peer = link_id(url)
        self.encoder = LinkEncoder(self.peer)
        self.backoff = backoff or Backoff(0.1, 30.0)
        self.state = "connecting"
        self.reconnects = 0
        self.received = 0
        #: Data messages that came down, over every connection of the link.
        self.received_total = 0
        self._epoch = ""
        self._stopping = False
        #: The link's connection loop (which reconnects by itself): restarted should it fail.
        self._tasks = Supervisor("wearscript_link", service.node.supervision)

    async def __aenter__(self) -> WearscriptUpstream:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def start(self) -> None:
        self._tasks.open()
        self._tasks.run(f"wearscript-link {self.peer}", self.run)

    async def close(self) -> None:
        """Stop the link: its connection closes (1001) and it does not reconnect."""
        self._stopping = True
        await self._tasks.aclose()

    def _stamp(self) -> dict[str, str]:
        """The federation headers of one event that came down (see the module docstring)."""
        self.received += 1
        self.received_total += 1
        origin = Origin(self.peer, self._epoch, self.received)
        # From above: a native federation link does not send it up again (hubbub.federation.forwards_up).
        return {ORIGIN_HEADER: origin.render(), HOPS_HEADER: self.peer, FROM_HEADER: "up"}

    async def run(self) -> None:
        """Connect, serve the connection until it ends, wait, connect again: until :meth:`close`."""
        service = self.service
        timeout = aiohttp.ClientWSTimeout(ws_close=5.0)
        origin = link_origin(self.url)
        # A hubbub hub above refuses a link from its own ancestors (HUB_HEADER); a stock Go hub refuses an
        # upgrade without an Origin (link_origin).
        headers = {HUB_HEADER: service.hub_id, "Origin": origin}
        # A bound on opening the connection (an unreachable host), none on the connection's life.
        limits = aiohttp.ClientTimeout(total=None, connect=CONNECT_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=limits) as http:
            first = True
            while not self._stopping:
                if not first:
                    self.reconnects += 1
                first = False
                self.state = "connecting"
                try:
                    async with http.ws_connect(
                        self.url,
                        autoping=False,
                        max_msg_size=service.http.max_frame,
                        timeout=timeout,
                        headers=headers,
                    ) as ws:
                        reason = self._refusal(_upgrade_headers(ws))
                        if reason is not None:
                            self.state = "refused"
                            log.error("wearscript upstream refused: %s", reason, extra={"link": self.peer})
                            await ws.close()
                        else:
                            await self._serve(ws)
                except aiohttp.WSServerHandshakeError as exc:
                    if exc.status == 409:  # the hub above sees this one above it already
                        self.state = "refused"
                        log.error("wearscript upstream refused: a cycle", extra={"link": self.peer})
                    else:
                        log.warning(
                            "wearscript upstream refused the upgrade: %s (%s)",
                            exc.status,
                            refusal_hint(exc.status, origin),
                            extra={"link": self.peer},
                        )
                except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                    log.info(
                        "wearscript upstream unreachable: %s: %s",
                        type(exc).__name__,
                        exc,
                        extra={"link": self.peer},
                    )
                if self._stopping:
                    break
                if self.state != "refused":
                    self.state = "down"  # unreachable, or the connection ended
                await asyncio.sleep(self.backoff.next_delay())

    def _refusal(self, headers: Mapping[str, str]) -> str | None:
        """Why the hub above may not be linked to (a cycle it reports), or ``None``."""
        upstream = headers.get(HUB_HEADER)
        if not upstream:
            return None  # not a hubbub hub: nothing to check
        above = [h for h in headers.get(ABOVE_HEADER, "").split(",") if h]
        return cycle_reason(self.service.hub_id, upstream, above)

    async def _serve(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        service = self.service
        self._epoch = "".join(secrets.choice(_EPOCH) for _ in range(8))
        self.received = 0
        headers = _upgrade_headers(ws)
        upstream = headers.get(HUB_HEADER)
        above = headers.get(ABOVE_HEADER, "")
        service.above = ([upstream] if upstream else []) + [h for h in above.split(",") if h]
        loop = set(service.above) & set(service.below)
        if loop:
            # Two links came up at once, each before the other was known: the hub above is below this one
            # too. Give up this side (the other side may do the same; the jittered retries settle it).
            service.above = []
            self.state = "refused"
            log.error("wearscript upstream refused: %s is below this hub too", ",".join(sorted(loop)))
            return
        self.state = "up"
        self.backoff.reset()
        log.info("wearscript upstream up", extra={"link": self.peer})
        try:
            await serve(service, ws, ANONYMOUS, encoder=self.encoder, publish_headers=self._stamp)
        finally:
            service.above = []
            log.info("wearscript upstream down", extra={"link": self.peer})


def _upgrade_headers(ws: aiohttp.ClientWebSocketResponse) -> Mapping[str, str]:
    """The upgrade response's headers (aiohttp keeps the response here and has no public accessor)."""
    response = getattr(ws, "_response", None)
    headers: Mapping[str, str] = response.headers if response is not None else {}
    return headers


class WearscriptLinkCollector:
    """The link on ``/metrics``: ``hubbub_wearscript_link_up`` (1 while connected),
    ``hubbub_wearscript_link_state`` (1 for the current state), ``hubbub_wearscript_link_reconnects`` and
    ``hubbub_wearscript_link_events`` (``direction`` ``up``: events queued up the link, ``down``: data
    messages that came down and were published here), each labelled with the link's name."""

    def __init__(self, link: WearscriptUpstream) -> None:
        self.link = link

    def collect(self) -> Iterator[Any]:
        link = self.link
        up = GaugeMetricFamily(
            "hubbub_wearscript_link_up", "WearScript upstream link connected", labels=["link"]
        )
        up.add_metric([link.peer], 1 if link.state == "up" else 0)
        yield up
        state = GaugeMetricFamily(
            "hubbub_wearscript_link_state", "WearScript upstream link state", labels=["link", "state"]
        )
        for s in ("connecting", "up", "down", "refused"):
            state.add_metric([link.peer, s], 1 if link.state == s else 0)
        yield state
        rc = CounterMetricFamily(
            "hubbub_wearscript_link_reconnects",
            "WearScript upstream connections after the first",
            labels=["link"],
        )
        rc.add_metric([link.peer], link.reconnects)
        yield rc
        ev = CounterMetricFamily(
            "hubbub_wearscript_link_events",
            "Events over the WearScript upstream link",
            labels=["link", "direction"],
        )
        ev.add_metric([link.peer, "up"], link.encoder.forwarded)
        ev.add_metric([link.peer, "down"], link.received_total)
        yield ev


# -- the binding ---------------------------------------------------------------------------------------------


class WearscriptMounted(Mounted):
    """WearScript on a node: the hub, and its link up (``wearscript.upstream``) once the HTTP listener is
    up."""

    def __init__(self, service: WearscriptService) -> None:
        super().__init__(wsd.SPEC, service.install)
        self.service = service
        #: The link up to a WearScript hub (``wearscript.upstream``).
        self.upstream: WearscriptUpstream | None = None

    async def started(self, wiring: Wiring, metrics: CollectorRegistry) -> None:
        cfg = wiring.config.section(wsd.WearscriptConfig)
        if not cfg.upstream:
            return
        if cfg.group_device == wsd.WearscriptConfig().group_device:
            log.warning("linked WearScript hubs should each have their own wearscript.group_device")
        self.upstream = WearscriptUpstream(self.service, str(cfg.upstream))
        metrics.register(WearscriptLinkCollector(self.upstream))

    def links(self) -> Iterable[AbstractAsyncContextManager[object]]:
        return () if self.upstream is None else (self.upstream,)

    def close(self) -> None:
        self.service.close()


async def mount(w: Wiring) -> Mounted:
    """WearScript's binding (``wearscript.SPEC``): the hub from the ``wearscript`` section."""
    cfg = w.config.section(wsd.WearscriptConfig)
    settings = WearscriptSettings(
        group_device=cfg.group_device,
        test_handler=cfg.test_handler,
        hub_channels=tuple(str(c) for c in cfg.hub_channels),
        advertise_foreign=cfg.advertise_foreign,
        auth=w.auth("wearscript"),
    )
    return WearscriptMounted(WearscriptService(w.node, settings, w.http))
