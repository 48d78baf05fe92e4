"""The push connectors' routes as the log keeps them: a webhook made over REST, a device subscribed through
guble's FCM or APNs connector. They live in the log's state maps (:class:`~hubbub.log.base.StateMaps`), so
every process that shares the log (a node's workers, a cluster's nodes) lists, serves and deletes the same
routes; each route's delivery is its durable consumer's (``hubbub.log.consumers``).

A :class:`RouteRecord` is opaque to the log beyond its three names: ``connector`` (``webhook``, ``fcm``,
``apns``), ``name`` (unique per connector: the route's own name, its consumer's) and ``key`` (unique per
connector too: what makes two routes the same one, such as a device subscription's token, user and topic,
so that one made twice at once on two nodes is stored once). ``body`` is the connector's JSON.

Layout: one map per connector (:func:`route_ns`), one entry per record **under its key**, the record's
name and body as the entry's JSON value. The key is the identity two processes may race on, so it is what
the map's insert-if-absent (``state_swap`` from the version the entry has) decides: of two puts of one key
at once, one is stored. A name is unique by its maker's choice (a webhook's name is its key; a device
subscription's has a random part), so it is checked against the map as read, not under the swap.

Concurrency contract: :func:`put_route` and :func:`delete_route` are writer-thread calls (they write the
maps), :func:`route_records` a read, as the :class:`~hubbub.log.base.StateMaps` methods they run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from hubbub.log.base import StateMaps

__all__ = ["RouteRecord", "delete_route", "put_route", "route_ns", "route_records"]


@dataclass(frozen=True, slots=True)
class RouteRecord:
    """One route of one connector (module docstring)."""

    connector: str
    name: str
    key: str
    body: str


def route_ns(connector: str) -> str:
    """The state map holding ``connector``'s records."""
    return f"routes:{connector}"


def _entries(maps: StateMaps, connector: str) -> list[RouteRecord]:
    """Every readable entry of the connector's map, in key order (an unreadable one is left out)."""
    out = []
    for key, value in maps.state_list(route_ns(connector)):
        try:
            doc = json.loads(value)
            out.append(RouteRecord(connector, str(doc["name"]), key, str(doc["body"])))
        except (ValueError, KeyError, TypeError):
            continue
    return out


def put_route(maps: StateMaps, record: RouteRecord, *, replace: bool = False) -> bool:
    """Store ``record`` unless its name exists and not ``replace``, or another record of its connector has
    its key: whether it was stored (durable then). A replaced record that changes its key leaves its old key
    free: the new entry is swapped in first, the old one removed after, so a crash between leaves both,
    which :func:`route_records` shows as one and the next put or delete of that name clears."""
    ns = route_ns(record.connector)
    same_name = [r for r in _entries(maps, record.connector) if r.name == record.name]
    if same_name and not replace:
        return False
    had = maps.state_get(ns, record.key)
    if had is not None and had[0] is not None and all(r.key != record.key for r in same_name):
        return False  # another record's key (or an entry this hubbub cannot read)
    value = json.dumps({"name": record.name, "body": record.body}, sort_keys=True)
    if maps.state_swap(ns, record.key, value, 0 if had is None else had[1]) is None:
        return False  # another process put this key meanwhile
    for r in same_name:
        if r.key != record.key:
            maps.state_set(ns, r.key, None)
    return True


def delete_route(maps: StateMaps, connector: str, name: str) -> bool:
    """Delete the record ``name`` of ``connector``; whether it existed."""
    found = [r for r in _entries(maps, connector) if r.name == name]
    for r in found:
        maps.state_set(route_ns(connector), r.key, None)
    return bool(found)


def route_records(maps: StateMaps, connector: str) -> list[RouteRecord]:
    """Every record of ``connector``, by name (one per name: the first in key order)."""
    by_name: dict[str, RouteRecord] = {}
    for r in _entries(maps, connector):
        by_name.setdefault(r.name, r)
    return sorted(by_name.values(), key=lambda r: r.name)
