"""One node on every core: the worker processes of a multi-worker node and the one log they share
(``server.workers``; the processes themselves are started by ``hubbub/server_workers.py``).

* :class:`~hubbub.workers.owner.LogOwner`: in the parent, every write to the log, with group commit across
  workers, and each commit's events sent to the other workers, encoded once.
* :class:`~hubbub.workers.remote.RemoteLogStore`: a worker's store: writes through the owner, reads from the
  log's file.
* :class:`~hubbub.workers.relay.WorkerRelay`: a worker's relay (``core/relay.py``): every worker's events
  delivered in per-channel order, each once (the cluster's ordered delivery, ``cluster/delivery.py``).
* ``frames``: the messages between owner and workers.
* ``forkserver``: the process the parent forks first, which forks the workers (each starts with hubbub
  imported) and reports their exits.
"""

from __future__ import annotations

from .owner import LogOwner
from .relay import WorkerRelay
from .remote import RemoteLogStore

__all__ = ["LogOwner", "RemoteLogStore", "WorkerRelay"]
