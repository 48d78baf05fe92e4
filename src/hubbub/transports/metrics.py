"""Prometheus exposition of the node's statistics (native.md §9), on a per-server registry.

On a node of several worker processes a scrape answers for the node whichever worker takes it: the counters
and the counts of connections, subscriptions, token timers and consumer openers are every worker's summed
(``NodeMetrics.node_figures``, asked of the others at each scrape, with the last counters of a worker
gone: ``core/peer_figures.py``), as Prometheus' multi-process exporters sum a counter over processes; the
log's and the consumers' gauges are the shared log's. The cluster relay's series are the worker's own (a
worker is a member of the cluster of its own)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from hubbub import __version__
from hubbub.auth import Identity
from hubbub.core.api import (
    COMPONENTS,
    LABELLED_MAX,
    OPENERS_FAMILY,
    SUMMED_TOTALS,
    TOTALS_FAMILY,
    Core,
    Figures,
    labels_of,
)
from hubbub.dialects.registry import SPECS

__all__ = [
    "CLUSTER_GAUGES",
    "CONTENT_TYPE",
    "DIALECTS",
    "PRESENCE_GAUGES",
    "ConsumerCollector",
    "ConsumerSeries",
    "NodeCollector",
    "render_metrics",
]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: The cluster relay's numbers that are gauges (the others are counters).
CLUSTER_GAUGES = frozenset({"broker_up", "buffered", "channels", "unannounced_channels"})
#: The presence's numbers that are gauges (the others are counters).
PRESENCE_GAUGES = frozenset({"up", "rosters", "members"})
#: The ``dialect`` labels every per-dialect series shows (at 0 before the first count): each registered
#: dialect's (``DialectSpec.labels``, in the registry's order).
DIALECTS: tuple[str, ...] = tuple(label for spec in SPECS.values() for label in spec.metric_labels)


class NodeCollector:
    """Reads the node's counters at scrape time; nothing is counted twice."""

    def __init__(self, node: Core) -> None:
        self.node = node

    def collect(self) -> Iterator[Any]:
        node = self.node
        m = node.metrics
        f = m.node_figures()  # every worker's, summed (NodeMetrics.refresh asked them)
        conns = GaugeMetricFamily("hubbub_connections", "Open connections", labels=["dialect"])
        counts: dict[str, float] = dict.fromkeys(DIALECTS, 0)
        counts.update(f["connections"])
        for d, n in counts.items():
            conns.add_metric([d], n)
        yield conns
        for name, doc, family in (
            ("hubbub_events_published", "Events published", "published"),
            ("hubbub_deliveries", "Events delivered to connections", "deliveries"),
            ("hubbub_dropped", "Events dropped by the slow-consumer policy", "dropped"),
            ("hubbub_bad_input", "Bad input seen", "bad_input"),
            ("hubbub_slow_consumer_closes", "Connections closed as slow consumers", "slow_closes"),
            ("hubbub_io_errors", "Unexpected socket failures (logged at warning)", "io_errors"),
            (
                "hubbub_write_timeouts",
                "TCP connections aborted because the peer read nothing for limits.write_timeout_s",
                "write_timeouts",
            ),
            (
                "hubbub_internal_closes",
                "Connections closed because serving them raised (logged at error)",
                "internal_closes",
            ),
        ):
            src = f[family]
            c = CounterMetricFamily(name, doc, labels=["dialect"])
            for d in DIALECTS:
                c.add_metric([d], src.get(d, 0))
            for d, v in src.items():
                if d not in DIALECTS:
                    c.add_metric([d], v)
            yield c
        yield from self._access(f)
        failures = CounterMetricFamily(
            "hubbub_component_failures",
            "Failures of a component's background tasks (logged at error or warning; core/supervisor.py)",
            labels=["component"],
        )
        for name, n in sorted({**dict.fromkeys(COMPONENTS, 0), **f["component_failures"]}.items()):
            failures.add_metric([name], n)
        yield failures
        st = m.log()
        yield GaugeMetricFamily("hubbub_log_events", "Retained events in the log", value=st.events)
        yield GaugeMetricFamily("hubbub_log_bytes", "Retained payload, header and tag bytes", value=st.bytes)
        yield GaugeMetricFamily("hubbub_channels", "Channels with retained events", value=st.channels)
        lat = f["ack_latency"]
        buckets = []
        acc = 0.0
        for i, b in enumerate(m.ack_latency.buckets):
            acc += lat.get(str(i), 0)
            buckets.append((repr(b), acc))
        buckets.append(("+Inf", lat.get("count", 0)))
        yield HistogramMetricFamily(
            "hubbub_publish_ack_seconds",
            "Time from publish to acknowledgement",
            buckets=buckets,
            sum_value=lat.get("sum", 0.0),
        )
        yield from self._cluster()
        yield from self._presence()
        info = GaugeMetricFamily("hubbub_build_info", "Build information", labels=["version"])
        info.add_metric([__version__], 1)
        yield info

    def _access(self, f: Figures) -> Iterator[Any]:
        """Refusals by the limits (``limits.*``) and by authentication and permission checks."""
        from hubbub.core.api import LIMIT_NAMES

        lim = CounterMetricFamily(
            "hubbub_limit_refusals",
            "Requests and connections refused by a limit",
            labels=["limit", "dialect"],
        )
        refusals = {tuple(labels_of(k)): n for k, n in f.get("limit_refusals", {}).items()}
        for name in LIMIT_NAMES:
            refusals.setdefault((name, "native"), 0)
        for labels, n in sorted(refusals.items()):
            lim.add_metric(list(labels), n)
        yield lim
        auth = CounterMetricFamily(
            "hubbub_auth_refusals", "Refused authentications and operations", labels=["reason"]
        )
        reasons = {
            "auth_required": 0,
            "bad_token": 0,
            "forbidden": 0,
            "token_expired": 0,
            **f.get("auth_refusals", {}),
        }
        for reason, n in sorted(reasons.items()):
            auth.add_metric([reason], n)
        yield auth
        yield GaugeMetricFamily(
            "hubbub_token_expiry_timers",
            "Connections whose token expires",
            value=f.get("token_timers", {}).get("", 0),
        )

    def _cluster(self) -> Iterator[Any]:
        """The cluster relay's numbers (docs/cluster.md), when there is one: gauges and counters."""
        relay = self.node.relay
        if relay is None:
            return
        for name, v in relay.statistics().items():
            doc = f"Cluster: {name.replace('_', ' ')}"
            if name in CLUSTER_GAUGES:
                yield GaugeMetricFamily(f"hubbub_cluster_{name}", doc, value=v)
            else:
                yield CounterMetricFamily(f"hubbub_cluster_{name}", doc, value=v)

    def _presence(self) -> Iterator[Any]:
        """The rosters' numbers (``core/presence.py``): this node's members; on a cluster, Redis's state."""
        for name, v in self.node.presence.statistics().items():
            doc = f"Presence (rosters): {name.replace('_', ' ')}"
            if name in PRESENCE_GAUGES:
                yield GaugeMetricFamily(f"hubbub_presence_{name}", doc, value=v)
            else:
                yield CounterMetricFamily(f"hubbub_presence_{name}", doc, value=v)


#: Per consumer (label ``consumer``): (name, help, gauge?, the figure's field).
_PER_CONSUMER = (
    ("hubbub_consumer_pending", "Journal items not yet delivered", True, "pending"),
    ("hubbub_consumer_outstanding", "Items delivered and not yet acknowledged", True, "outstanding"),
    ("hubbub_consumer_openers", "Openers holding the consumer on this node", True, "openers"),
    ("hubbub_consumer_batches", "Batches delivered", False, "batches"),
    ("hubbub_consumer_acked", "Items acknowledged", False, "acked"),
    ("hubbub_consumer_nacked", "Items given back by nack", False, "nacked"),
    (
        "hubbub_consumer_redelivered",
        "Items delivered again (after nack, disconnect or restart)",
        False,
        "redelivered",
    ),
    (
        "hubbub_consumer_oldest_unacked_seconds",
        "Age of the oldest unacknowledged item held",
        True,
        "oldest_unacked_s",
    ),
)
#: Service-wide: (name, help, gauge?, the totals' field).
_TOTALS = (
    ("hubbub_consumers", "Durable consumers", True, "consumers"),
    ("hubbub_consumers_pending", "Journal items not yet delivered, every consumer", True, "pending"),
    (
        "hubbub_consumers_outstanding",
        "Items delivered and not yet acknowledged, every consumer",
        True,
        "outstanding",
    ),
    ("hubbub_consumers_openers", "Consumer openers on this node", True, "openers"),
    ("hubbub_consumers_batches", "Consumer batches delivered", False, "batches"),
    ("hubbub_consumers_acked", "Consumer items acknowledged", False, "acked"),
    ("hubbub_consumers_nacked", "Consumer items given back by nack", False, "nacked"),
    ("hubbub_consumers_redelivered", "Consumer items delivered again", False, "redelivered"),
    ("hubbub_consumer_groups", "Live exclusive groups with members on this node", True, "groups"),
    ("hubbub_consumer_group_members", "Members of live exclusive groups on this node", True, "group_members"),
    (
        "hubbub_consumer_group_events",
        "Events delivered to live exclusive group members",
        False,
        "group_events",
    ),
)


class ConsumerCollector:
    """The durable consumers' service-wide figures (docs/consumers.md "Monitoring"), while the node has a
    consumer service: what every scraper sees. Each consumer's own series are :class:`ConsumerSeries`, added
    per scrape for the scrapers allowed to see them. The store's backlog counts are read by
    :meth:`NativeHttp.metrics` before each scrape."""

    def __init__(self, node: Core, limit: int | None = None) -> None:
        self.node = node
        self.limit = LABELLED_MAX if limit is None else limit

    def collect(self) -> Iterator[Any]:
        svc = self.node.consumers
        if svc is None:
            return
        totals = svc.metrics.totals()
        # Deliveries and openers are each worker's: summed with the other workers' (NodeMetrics.refresh
        # asked them); the consumers and their backlog are the shared log's.
        summed = {**self.node.metrics.peers(TOTALS_FAMILY), **self.node.metrics.peers(OPENERS_FAMILY)}
        for name, doc, gauge, field in _TOTALS:
            value = getattr(totals, field) + (summed.get(field, 0) if field in SUMMED_TOTALS else 0)
            yield (GaugeMetricFamily if gauge else CounterMetricFamily)(name, doc, value=value)
        yield GaugeMetricFamily(
            "hubbub_consumers_unlabelled",
            "Consumers beyond the per-consumer series' limit (in the totals only)",
            value=max(totals.consumers - self.limit, 0),
        )


class ConsumerSeries(Collector):
    """Each consumer's own series (label ``consumer``, the first ``limit`` by name: a bounded label set) for
    one scrape by ``identity``: nothing unless the core shows it each consumer
    (``ConsumerMetrics.shown_to``: a consumer's name tells of its channels and users)."""

    def __init__(self, node: Core, identity: Identity | None, limit: int | None = None) -> None:
        self.node = node
        self.identity = identity
        self.limit = LABELLED_MAX if limit is None else limit

    def collect(self) -> Iterator[Any]:
        svc = self.node.consumers
        if svc is None or not svc.metrics.shown_to(self.identity):
            return
        figures = list(svc.metrics.consumers(self.limit))
        for name, doc, gauge, field in _PER_CONSUMER:
            fam = (GaugeMetricFamily if gauge else CounterMetricFamily)(name, doc, labels=["consumer"])
            for f in figures:
                fam.add_metric([f.name], getattr(f, field))
            yield fam


def render_metrics(registry: CollectorRegistry, *more: Collector) -> bytes:
    """The exposition of ``registry`` and then of each of ``more`` (collectors made for one scrape)."""
    return generate_latest(registry) + b"".join(generate_latest(c) for c in more)
