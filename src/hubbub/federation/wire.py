"""What a native federation link carries beyond the native protocol, sans-I/O: the handshake headers, the
hop headers of each event, and the decoding of the events a link reads from the node above (the link's
:class:`~hubbub.client.protocol.ClientProtocol` reads the frames and gives each ``event`` map to
:func:`decode_event`).

A link is a native WebSocket connection (``hubbub.v1.msgpack``) that names itself on the upgrade:

* **Handshake.** The request carries :data:`NODE_HEADER` (the downstream node's id) and
  :data:`BELOW_HEADER` (the ids below it, as far as it knows); the answer carries the
  upstream's id in :data:`NODE_HEADER` and the ids above it (its own upstream links, transitively) in
  :data:`ABOVE_HEADER`, comma-separated. An upstream answers ``409`` to a node that is itself or above it
  (a link that would close a cycle); the downstream refuses an upstream that lists it above
  (:func:`hubbub.federation.cycle_reason`).
* **Hop headers.** Each event that crosses the link, either way, carries its origin and hops as the user
  headers :data:`LINK_ORIGIN` and :data:`LINK_HOPS` (the values of the pseudo-headers
  :data:`~hubbub.federation.ORIGIN_HEADER` and :data:`~hubbub.federation.HOPS_HEADER`), and, going up, its
  original publisher as :data:`LINK_PUBLISHER` (a JSON list ``[dialect, user, app, msg_id]``; going down the
  event frame's own ``publisher`` says it). The node that receives an event stores them back as
  pseudo-headers, which ordinary subscribers never see. Ordinary connections are unaffected: for them these
  are user headers like any other.

Everything here is bounded: a header value over :data:`MAX_VALUE` characters, or a hop list over
:data:`~hubbub.federation.MAX_HOPS`, is refused. Parse errors are ``None`` (headers) or
:class:`~hubbub.errors.BadFrame` (frames); nothing else is raised.

Concurrency contract: pure functions and frozen values.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from hubbub.errors import BadFrame
from hubbub.events import fast_init

from . import FROM_HEADER, HOPS_HEADER, MAX_HOPS, ORIGIN_HEADER, Origin, origin_of, valid_node_id

__all__ = [
    "ABOVE_HEADER",
    "BELOW_HEADER",
    "LINK_HEADERS",
    "LINK_HOPS",
    "LINK_ORIGIN",
    "LINK_PUBLISHER",
    "MAX_VALUE",
    "NODE_HEADER",
    "LinkEvent",
    "LinkPath",
    "decode_event",
    "fed_headers",
    "link_headers",
    "parse_above",
    "parse_link_headers",
    "parse_node",
    "parse_publisher",
    "render_above",
    "render_publisher",
    "split_link_headers",
]

NODE_HEADER: Final = "Hubbub-Federation-Node"
ABOVE_HEADER: Final = "Hubbub-Federation-Above"
#: On a link's upgrade request: the ids of the nodes below the downstream (its descendants).
BELOW_HEADER: Final = "Hubbub-Federation-Below"
LINK_ORIGIN: Final = "hubbub-fed-origin"
LINK_HOPS: Final = "hubbub-fed-hops"
LINK_PUBLISHER: Final = "hubbub-fed-publisher"
LINK_HEADERS: Final = frozenset({LINK_ORIGIN, LINK_HOPS, LINK_PUBLISHER})
#: The longest value of a handshake or hop header, in characters.
MAX_VALUE: Final = 4096
_STR_ONLY: Final = {str}
#: The most node ids an ``Above`` header may list.
MAX_ABOVE: Final = 256


# -- handshake ----------------------------------------------------------------------------------------------


def parse_node(raw: str | None) -> str | None:
    """A node id from :data:`NODE_HEADER`, or ``None`` when absent or not a valid id."""
    if raw is None or len(raw) > 64 or not valid_node_id(raw):
        return None
    return raw


def parse_above(raw: str | None) -> tuple[str, ...] | None:
    """The ids of :data:`ABOVE_HEADER` (empty when absent), or ``None`` when one is not a valid node id or
    there are too many."""
    if not raw:
        return ()
    if len(raw) > MAX_VALUE:
        return None
    ids = tuple(h.strip() for h in raw.split(",") if h.strip())
    if len(ids) > MAX_ABOVE or not all(valid_node_id(h) for h in ids):
        return None
    return ids


def render_above(ids: Iterable[str]) -> str:
    return ",".join(sorted(set(ids)))


# -- hop headers --------------------------------------------------------------------------------------------


@fast_init
@dataclass(frozen=True, slots=True)
class LinkPath:
    """Where a link event comes from: its origin and hops, parsed, and their header texts."""

    origin: Origin
    hops: tuple[str, ...]
    origin_text: str
    hops_text: str

    def arrived(self, node: str, from_upstream: bool) -> dict[str, str]:
        """:func:`hubbub.federation.arrived`, without parsing again."""
        out = {ORIGIN_HEADER: self.origin_text, HOPS_HEADER: f"{self.hops_text},{node}"}
        if from_upstream:
            out[FROM_HEADER] = "up"
        return out


def parse_link_headers(headers: Mapping[str, str]) -> tuple[dict[str, str], LinkPath | None, str]:
    """A link event's headers as ``(user headers, its path, publisher text)``. The path is ``None`` when the
    origin or hops are missing or malformed (the event cannot be taken: its path is unknown)."""
    user = {k: v for k, v in headers.items() if k not in LINK_HEADERS}
    origin_text = headers.get(LINK_ORIGIN, "")
    hops_text = headers.get(LINK_HOPS, "")
    publisher = headers.get(LINK_PUBLISHER, "")
    if not origin_text or not hops_text or len(origin_text) > MAX_VALUE or len(hops_text) > MAX_VALUE:
        return user, None, publisher
    origin = origin_of({ORIGIN_HEADER: origin_text})
    hops = tuple(h for h in hops_text.split(",") if h)
    if origin is None or not hops or len(hops) > MAX_HOPS or not all(map(valid_node_id, hops)):
        return user, None, publisher
    return user, LinkPath(origin, hops, origin_text, ",".join(hops)), publisher


def split_link_headers(headers: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str] | None, str]:
    """:func:`parse_link_headers` with the path as the federation pseudo-headers (``None``: no valid path)."""
    user, path, publisher = parse_link_headers(headers)
    if path is None:
        return user, None, publisher
    return user, {ORIGIN_HEADER: path.origin_text, HOPS_HEADER: path.hops_text}, publisher


def link_headers(user: Mapping[str, str], stamped: Mapping[str, str], publisher: str = "") -> dict[str, str]:
    """The headers of an event sent over a link: its user headers, and its origin and hops (from headers
    stamped by :func:`hubbub.federation.stamp`), and, going up, its publisher."""
    out = {k: v for k, v in user.items() if k not in LINK_HEADERS}
    out[LINK_ORIGIN] = stamped[ORIGIN_HEADER]
    out[LINK_HOPS] = stamped[HOPS_HEADER]
    if publisher:
        out[LINK_PUBLISHER] = publisher
    return out


def fed_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The federation pseudo-headers of a stored event (``:fed.*``)."""
    return {k: v for k, v in headers.items() if k.startswith(":fed.")}


def render_publisher(dialect: str, user: str, app: str, msg_id: str) -> str:
    return orjson.dumps([dialect, user, app, msg_id]).decode()


def parse_publisher(raw: str) -> tuple[str, str, str, str] | None:
    """The publisher of :data:`LINK_PUBLISHER`, or ``None`` when it is not four strings."""
    if not raw or len(raw) > MAX_VALUE:
        return None
    try:
        v = orjson.loads(raw)
    except ValueError:
        return None
    if type(v) is not list or len(v) != 4 or not all(type(x) is str for x in v):
        return None
    return (v[0], v[1], v[2], v[3])


# -- events from the node above ------------------------------------------------------------------------------


@fast_init
@dataclass(frozen=True, slots=True)
class LinkEvent:
    """An ``event`` frame: the event as the upstream stored it (``headers`` are the frame's, hop headers
    included)."""

    channel: str
    seq: int
    epoch: str
    time_ns: int
    publisher: tuple[str, str, str, str]
    content_type: str
    payload: bytes
    headers: dict[str, str] = field(default_factory=dict)
    tags: tuple[str, ...] = ()


def _str(obj: dict[Any, Any], key: str) -> str:
    v = obj.get(key)
    if type(v) is not str:
        raise BadFrame(f"{key} must be a string")
    return v


def _uint(obj: dict[Any, Any], key: str) -> int:
    v = obj.get(key)
    if type(v) is not int or v < 0:
        raise BadFrame(f"{key} must be a non-negative integer")
    return v


def _str_map(v: object, key: str) -> dict[str, str]:
    if v is None:
        return {}
    # map(type, …) runs in C: this is once or twice per event on a busy link.
    if type(v) is not dict or (v and (set(map(type, v)) | set(map(type, v.values()))) != _STR_ONLY):
        raise BadFrame(f"{key} must be a map of strings")
    return v


def decode_event(obj: dict[Any, Any]) -> LinkEvent:
    """An ``event`` frame's map as a :class:`LinkEvent`; raises BadFrame when a field is malformed."""
    pub = obj.get("publisher")
    if type(pub) is not dict:
        raise BadFrame("publisher must be a map")
    p = _str_map(pub, "publisher")
    payload = obj.get("payload")
    if type(payload) is str:
        payload = payload.encode()
    if type(payload) is not bytes:
        raise BadFrame("payload must be bin")
    tags = obj.get("tags") or []
    if type(tags) is not list or not all(type(t) is str for t in tags):
        raise BadFrame("tags must be a list of strings")
    return LinkEvent(
        _str(obj, "channel"),
        _uint(obj, "seq"),
        _str(obj, "epoch"),
        _uint(obj, "time"),
        (p.get("dialect", ""), p.get("user", ""), p.get("app", ""), p.get("msg_id", "")),
        _str(obj, "content_type"),
        payload,
        _str_map(obj.get("headers"), "headers"),
        tuple(tags),
    )
