"""The push connectors' routes as the log keeps them (``LogStore``'s :class:`~hubbub.log.base.RouteRegistry`
role): a webhook made over REST, a device subscribed through guble's FCM or APNs connector. Kept in the log's
own storage, so every process that shares the log (a node's workers, a cluster's nodes) lists, serves and
deletes the same routes; each route's delivery is its durable consumer's (``hubbub.log.consumers``).

A :class:`RouteRecord` is opaque to the log beyond its three names: ``connector`` (``webhook``, ``fcm``,
``apns``), ``name`` (unique per connector: the route's own name, its consumer's) and ``key`` (unique per
connector too: what makes two routes the same one, such as a device subscription's token, user and topic,
so that one made twice at once on two nodes is stored once). ``body`` is the connector's JSON.

The rules of :meth:`~hubbub.log.base.RouteRegistry.route_put` are :func:`put_allowed`, which the memory
engine runs and the SQL engines state in their statements.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["RouteRecord", "put_allowed"]


@dataclass(frozen=True, slots=True)
class RouteRecord:
    """One route of one connector (module docstring)."""

    connector: str
    name: str
    key: str
    body: str


def put_allowed(existing: Mapping[str, RouteRecord], record: RouteRecord, replace: bool) -> bool:
    """Whether ``record`` may be stored among ``existing`` (its connector's records by name): a new name
    whose key no other record has; with ``replace``, also the record of its name, unless another record has
    the new key."""
    if record.name in existing and not replace:
        return False
    return not any(r.key == record.key and r.name != record.name for r in existing.values())
