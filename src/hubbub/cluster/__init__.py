"""Several hubbub nodes on one shared log (PostgreSQL) with Redis between them (docs/cluster.md).

* :class:`~hubbub.cluster.broker.RedisBroker`: publishes each node's committed events to Redis and receives
  the others'.
* :class:`~hubbub.cluster.sequencer.Sequencer`: releases them to the node's sessions in per-channel seq
  order, filling gaps from the log.
* :class:`~hubbub.cluster.view.ClusterView`: the log as the node has delivered it, for subscription
  snapshots.
* :class:`~hubbub.cluster.presence.RedisPresence`: rosters (guble's subscribers, mist ``who``) for the whole
  cluster, with TTLs.

Used by the composition root when ``broker`` is set; never needed by a single node. The package imports
none of its modules: the broker's and the presence's import the Redis client, which a single node (and a
worker process, which uses :mod:`~hubbub.cluster.delivery`) would pay for at each start (a fifth of its
imports) and never use.
"""
