"""The accepted MQTT connection of each client id, in this process and in the others of the log (the
workers of a node, the nodes of a cluster): the takeover of [MQTT-3.1.4-2], "the Server MUST disconnect the
existing Client", wherever that client is connected.

Each CONNECT is stamped when it is handled: ``(time_ns, process token)``, an order over every process (the
nodes' clocks, kept in step by NTP, then the token for a tie). The newest CONNECT of a client id wins:

* in this process, :class:`ClientTable` holds the connection of each id: a newer CONNECT closes the one it
  finds (and waits, briefly, for it to end: its persistent session's consumers must be free), an older one
  arriving late is closed instead;
* to the other processes, a connection that takes its id sends a notice (``mqtt.takeover``, through the
  node's relay: ``core/notices.py``); a process that has an older connection of that id closes it. A notice
  arriving before this process's own CONNECT of the id is registered is remembered (for
  :data:`REMEMBER_S`), and that CONNECT, older, is closed at registration: two CONNECTs racing on two nodes
  leave exactly one connection, the newer.

The connection closed by a takeover ends without DISCONNECT: its will is published ([MQTT-3.1.2-8]: a will
is published when the network connection closes, unless a DISCONNECT deleted it; 3.1.1 makes no exception
for a takeover).

Notices are at most once (Redis pub/sub): while Redis is away, a takeover across nodes closes nothing, and
two connections of one id may run on two nodes until one of them ends (docs/dialects/mqtt.md).

Concurrency contract: everything runs on the event loop thread.
"""

from __future__ import annotations

import collections
import logging
import secrets
import time
from typing import TYPE_CHECKING, Final

import msgpack

from hubbub.core.api import Notices
from hubbub.disconnect import Disconnect

if TYPE_CHECKING:
    from .mqtt import MqttWire

__all__ = ["TOPIC", "ClientTable", "Stamp"]

log = logging.getLogger("hubbub.mqtt")

#: The notice topic of a takeover.
TOPIC: Final = "mqtt.takeover"
#: Seconds a takeover notice from another process is remembered (longer than a CONNECT takes to register).
REMEMBER_S: Final = 60.0
#: The most notices remembered at once.
REMEMBER_MAX: Final = 100_000

#: A CONNECT's place in the order of every process's: ``(time_ns, process token)``.
Stamp = tuple[int, str]


class ClientTable:
    """See the module docstring. ``local`` is this process's accepted connection of each client id."""

    def __init__(self, notices: Notices) -> None:
        self.local: dict[str, MqttWire] = {}
        self.token = secrets.token_hex(8)
        self._notices = notices
        #: Client id -> the newest stamp another process announced for it (insertion order: arrival).
        self._newer: collections.OrderedDict[str, Stamp] = collections.OrderedDict()
        self._unwatch = notices.watch(TOPIC, self._on_notice)
        self.taken_over = 0

    def close(self) -> None:
        self._unwatch()

    def stamp(self) -> Stamp:
        """A CONNECT's stamp, now."""
        return (time.time_ns(), self.token)

    def superseded(self, client_id: str, stamp: Stamp) -> bool:
        """Whether another process announced a newer CONNECT of ``client_id`` than ``stamp``."""
        newer = self._newer.get(client_id)
        return newer is not None and newer > stamp

    def register(self, client_id: str, wire: MqttWire, stamp: Stamp) -> None:
        """``wire`` is the connection of ``client_id`` now: the other processes are told."""
        self.local[client_id] = wire
        self._notices.send(TOPIC, msgpack.packb([client_id, stamp[0], stamp[1]]))

    def _on_notice(self, data: bytes) -> None:
        try:
            client_id, t, token = msgpack.unpackb(data)
            stamp = (int(t), str(token))
            client_id = str(client_id)
        except (ValueError, TypeError, msgpack.UnpackException):
            log.warning("mqtt: a takeover notice that does not decode")
            return
        self._remember(client_id, stamp)
        wire = self.local.get(client_id)
        if wire is not None and wire.stamp < stamp:
            log.debug("mqtt client id taken over on another process", extra={"session": wire.session.id})
            self.taken_over += 1
            wire.session.end(Disconnect.NORMAL)

    def _remember(self, client_id: str, stamp: Stamp) -> None:
        newer = self._newer
        had = newer.pop(client_id, None)
        newer[client_id] = stamp if had is None or had < stamp else had
        horizon = time.time_ns() - int(REMEMBER_S * 1e9)
        while newer and (len(newer) > REMEMBER_MAX or next(iter(newer.values()))[0] < horizon):
            newer.popitem(last=False)
