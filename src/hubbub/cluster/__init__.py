"""Several hubbub nodes on one shared log (PostgreSQL) with Redis between them (docs/cluster.md).

* :class:`RedisBroker`: publishes each node's committed events to Redis and receives the others'.
* :class:`~hubbub.cluster.sequencer.Sequencer`: releases them to the node's sessions in per-channel seq
  order, filling gaps from the log.
* :class:`ClusterView`: the log as the node has delivered it, for subscription snapshots.
* :class:`RedisPresence`: rosters (guble's subscribers, mist ``who``) for the whole cluster, with TTLs.

Used by the composition root when ``broker`` is set; never needed by a single node.
"""

from __future__ import annotations

from .broker import BrokerSettings, RedisBroker, default_node_id
from .presence import RedisPresence
from .sequencer import Sequencer
from .view import ClusterView

__all__ = ["BrokerSettings", "ClusterView", "RedisBroker", "RedisPresence", "Sequencer", "default_node_id"]
