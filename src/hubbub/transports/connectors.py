"""The node's push connectors (docs/connectors.md): built from the configuration, entered by the server after
the consumer service (and left before it), shown at ``GET /api/v1/connectors`` (admin) and in ``/metrics``.

Concurrency contract: event loop thread only; :meth:`Connectors.start` once, before the listeners open.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily

from hubbub.config import Config
from hubbub.core.api import ConsumerService, Core

from .connector import CONNECTOR_IDENTITY, DIALECT, Connector
from .http import HttpSettings, request_identity
from .webhook import CONSUMER_PREFIX, WebhookProvider, retry_policy, route_of, routes
from .webhook_admin import WebhookAdmin

__all__ = ["ConnectorCollector", "Connectors"]

log = logging.getLogger("hubbub.connectors")


class Connectors:
    """Every connector of the node by name (``webhook`` today)."""

    def __init__(self, node: Core, consumers: ConsumerService, config: Config) -> None:
        self._node = node
        self._consumers = consumers
        self._config = config
        self.by_name: dict[str, Connector] = {}
        #: The connectors built here (the webhooks), which :meth:`close` stops; the others are shown only.
        self._owned: list[Connector] = []
        #: ``/api/v1/webhooks`` (made by :meth:`start`).
        self.admin: WebhookAdmin | None = None

    async def __aenter__(self) -> Connectors:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Build the webhook connector from the configuration and the API's hooks (kept with the log),
        delete the consumers of this node's hooks whose pattern or tags changed (started again empty), and
        start delivering. A ``webhook.*`` consumer that neither names is kept, with a warning: the nodes of a
        cluster share the log but each has its own file, so it may be another node's hook (an API hook's
        consumer goes with its record, ``DELETE /api/v1/webhooks``; an abandoned one is the operator's to
        delete, ``DELETE /api/v1/admin/consumers/webhook.NAME``)."""
        cfg = self._config.webhooks
        hooks = Connector(
            "webhook",
            self._node,
            self._consumers,
            WebhookProvider(cfg.timeout_s, cfg.workers),
            workers=cfg.workers,
            retry=retry_policy(cfg),
            dead_letter=cfg.dead_letter,
            hold_poll_s=self._config.cluster.poll_interval_s,
        )
        admin = self.admin = WebhookAdmin(
            self._node,
            hooks,
            cfg.hooks,
            poll_s=self._config.cluster.poll_interval_s,
            old_file=Path(self._config.storage.data_dir) / "connectors" / "webhooks.json",
        )
        await admin.migrate()
        await admin.routes.read()
        wanted = {r.consumer: r for r in routes(cfg)}
        wanted.update({r.consumer: r for r in (route_of(n, h) for n, h in admin.hooks.items())})
        for info in await self._consumers.consumers():
            name = info.spec.name
            if not name.startswith(CONSUMER_PREFIX):
                continue
            r = wanted.get(name)
            if r is None:
                log.warning(
                    "webhook %s: not defined here (another node's file may define it), its consumer kept "
                    "with %d undelivered events; when no node defines it, delete it: "
                    "DELETE /api/v1/admin/consumers/%s",
                    name.removeprefix(CONSUMER_PREFIX),
                    info.pending,
                    name,
                )
                continue
            if (info.spec.pattern, info.spec.tags) == (r.pattern, r.tags):
                continue
            log.warning(
                "webhook %s: pattern or tags changed, its %d undelivered events dropped",
                name.removeprefix(CONSUMER_PREFIX),
                info.pending,
            )
            await self._consumers.delete(name, identity=CONNECTOR_IDENTITY, dialect=DIALECT)
        self.by_name[hooks.name] = hooks
        self._owned.append(hooks)
        for r in wanted.values():
            await hooks.create(r)  # journaled from now on, even before its task opens it
        await admin.routes.__aenter__()  # every hook's delivery starts, and what others change is followed

    def show(self, connector: Connector) -> None:
        """Show a connector another part runs (a dialect's) in the status and the metrics."""
        self.by_name[connector.name] = connector

    async def close(self) -> None:
        if self.admin is not None:
            await self.admin.routes.__aexit__(None, None, None)
        for c in self._owned:
            await c.close()

    async def status(self) -> dict[str, Any]:
        """Every connector's figures and subscriptions, backlogs as the store counts them now."""
        backlogs = {i.spec.name: i.pending for i in await self._consumers.consumers()}
        return {"connectors": [c.status(backlogs) for c in self.by_name.values()]}

    def installer(self, app: web.Application, node: Core, settings: HttpSettings) -> None:
        """Adds ``GET /api/v1/connectors`` (with auth on, for an admin token only, as ``/api/v1/trim``)."""

        async def status(request: web.Request) -> web.Response:
            node.access.check_admin(request_identity(node, request, "native"), "native")
            body = orjson.dumps(await self.status()) + b"\n"
            return web.Response(status=200, body=body, content_type="application/json")

        app.router.add_get("/api/v1/connectors", status)
        if self.admin is not None:
            self.admin.install(app)


class ConnectorCollector:
    """The connectors' series for ``/metrics``, labelled ``connector`` (a handful: one per kind)."""

    def __init__(self, connectors: Connectors) -> None:
        self._connectors = connectors

    def collect(self) -> Iterator[Any]:
        sent = CounterMetricFamily(
            "hubbub_connector_sent", "Events a connector's provider took", labels=["connector"]
        )
        retries = CounterMetricFamily("hubbub_connector_retries", "Pushes tried again", labels=["connector"])
        failed = CounterMetricFamily(
            "hubbub_connector_failed", "Pushes that failed, by reason", labels=["connector", "reason"]
        )
        dead = CounterMetricFamily(
            "hubbub_connector_dead_lettered",
            "Events refused for good, on the dead-letter channel",
            labels=["connector"],
        )
        removed = CounterMetricFamily(
            "hubbub_connector_removed", "Subscriptions removed as unregistered", labels=["connector"]
        )
        in_flight = GaugeMetricFamily("hubbub_connector_in_flight", "Pushes under way", labels=["connector"])
        paused = GaugeMetricFamily(
            "hubbub_connector_paused",
            "1 while the provider refuses the connector's credentials (every subscription waits)",
            labels=["connector"],
        )
        subs = GaugeMetricFamily(
            "hubbub_connector_subscriptions", "Subscriptions delivered", labels=["connector"]
        )
        latency = SummaryMetricFamily(
            "hubbub_connector_latency_seconds",
            "Seconds from an event's commit to its delivery",
            labels=["connector"],
        )
        for name, c in self._connectors.by_name.items():
            s = c.stats
            sent.add_metric([name], s.sent)
            retries.add_metric([name], s.retries)
            for reason, n in sorted(s.failed.items()):
                failed.add_metric([name, reason], n)
            dead.add_metric([name], s.dead_lettered)
            removed.add_metric([name], s.removed)
            in_flight.add_metric([name], s.in_flight)
            paused.add_metric([name], 1 if c.pause.active else 0)
            subs.add_metric([name], len(c.routes()))
            latency.add_metric([name], s.latency_count, s.latency_sum_s)
        yield from (sent, retries, failed, dead, removed, in_flight, paused, subs, latency)
