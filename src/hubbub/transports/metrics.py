"""Prometheus exposition of the node's statistics (native.md §9), on a per-server registry."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from hubbub import __version__
from hubbub.core import Node

__all__ = ["CLUSTER_GAUGES", "CONTENT_TYPE", "DIALECTS", "PRESENCE_GAUGES", "NodeCollector", "render_metrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: The cluster relay's numbers that are gauges (the others are counters).
CLUSTER_GAUGES = frozenset({"broker_up", "buffered", "channels", "unannounced_channels"})
#: The presence's numbers that are gauges (the others are counters).
PRESENCE_GAUGES = frozenset({"up", "rosters", "members"})
DIALECTS = ("ivy", "guble", "wearscript", "mist2015", "mist1", "qpubs", "native")


class NodeCollector:
    """Reads the node's counters at scrape time; nothing is counted twice."""

    def __init__(self, node: Node, store_stats: Callable[[], Any]) -> None:
        self.node = node
        self.store_stats = store_stats

    def collect(self) -> Iterator[Any]:
        node = self.node
        conns = GaugeMetricFamily("hubbub_connections", "Open connections", labels=["dialect"])
        counts: dict[str, int] = dict.fromkeys(DIALECTS, 0)
        for s in node.sessions:
            counts[s.dialect] = counts.get(s.dialect, 0) + 1
        for d, n in counts.items():
            conns.add_metric([d], n)
        yield conns
        for name, doc, src in (
            ("hubbub_events_published", "Events published", node.published),
            ("hubbub_deliveries", "Events delivered to connections", node.deliveries),
            ("hubbub_dropped", "Events dropped by the slow-consumer policy", self._dropped()),
            ("hubbub_bad_input", "Bad input seen", node.bad_input),
            ("hubbub_slow_consumer_closes", "Connections closed as slow consumers", node.slow_closes),
            ("hubbub_io_errors", "Unexpected socket failures (logged at warning)", node.io_errors),
        ):
            c = CounterMetricFamily(name, doc, labels=["dialect"])
            for d in DIALECTS:
                c.add_metric([d], src.get(d, 0))
            for d, v in src.items():
                if d not in DIALECTS:
                    c.add_metric([d], v)
            yield c
        yield from self._access()
        st = self.store_stats()
        yield GaugeMetricFamily("hubbub_log_events", "Retained events in the log", value=st.events)
        yield GaugeMetricFamily("hubbub_log_bytes", "Retained payload, header and tag bytes", value=st.bytes)
        yield GaugeMetricFamily("hubbub_channels", "Channels with retained events", value=st.channels)
        h = node.ack_latency
        buckets = []
        acc = 0
        for b, n in zip(h.buckets, h.counts, strict=False):
            acc += n
            buckets.append((repr(b), acc))
        buckets.append(("+Inf", h.count))
        yield HistogramMetricFamily(
            "hubbub_publish_ack_seconds",
            "Time from publish to acknowledgement",
            buckets=buckets,
            sum_value=h.sum,
        )
        yield from self._cluster()
        yield from self._presence()
        info = GaugeMetricFamily("hubbub_build_info", "Build information", labels=["version"])
        info.add_metric([__version__], 1)
        yield info

    def _access(self) -> Iterator[Any]:
        """Refusals by the limits (``limits.*``) and by authentication and permission checks."""
        from hubbub.core.limits import LIMIT_NAMES

        access = self.node.access
        lim = CounterMetricFamily(
            "hubbub_limit_refusals",
            "Requests and connections refused by a limit",
            labels=["limit", "dialect"],
        )
        refusals = dict(access.limiter.refusals)
        for name in LIMIT_NAMES:
            refusals.setdefault((name, "native"), 0)
        for (name, dialect), n in sorted(refusals.items()):
            lim.add_metric([name, dialect], n)
        yield lim
        auth = CounterMetricFamily(
            "hubbub_auth_refusals", "Refused authentications and operations", labels=["reason"]
        )
        reasons = {"auth_required": 0, "bad_token": 0, "forbidden": 0, "token_expired": 0, **access.refusals}
        for reason, n in sorted(reasons.items()):
            auth.add_metric([reason], n)
        yield auth
        yield GaugeMetricFamily(
            "hubbub_token_expiry_timers", "Connections whose token expires", value=access.timers
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

    def _dropped(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self.node.sessions:
            out[s.dialect] = out.get(s.dialect, 0) + s.stats.dropped
        return out


def render_metrics(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
