"""Hub federation, the rules without the I/O: hubbub nodes linked into a directed acyclic graph.

A node started with ``--upstream URL`` is a **downstream** of that node: it links out, subscribes upstream to
the union of what its own subscribers (every dialect, and its own downstream links) listen to, and forwards
upward every event published on it or below it (:func:`forwards_up`). So upward an event climbs to every
ancestor; downward it reaches only nodes where someone listens.

What this package decides (the link's wiring carries it out):

* **Origin and hops** (:func:`stamp`, :func:`accepts`, :func:`forwards_to`): every event that crosses a link
  carries the pseudo-headers ``:fed.origin`` (``<node> <epoch> <seq>``, its position on the node where it was
  first published) and ``:fed.hops`` (the node ids it went through, origin first). A node never takes back an
  event whose hops hold its own id, and never forwards an event to a node already in its hops: loops are
  impossible by construction. The forwarded publish's idempotency key is derived from the origin
  (:func:`idempotency_key`), so an event reaching a node by two paths (A ← B ← C and A ← C) is stored once.
* **Interest** (:func:`minimal_cover`, :func:`covers`): the patterns to subscribe upstream, with every pattern
  that another one already covers left out, so the upstream does not deliver one event twice.
* **Recovery** (:class:`Cursor`): the last upstream position per channel, to resubscribe after a reconnect
  with ``since`` (native.md §6), and the patterns the link held upstream, whose channels that appeared
  meanwhile are recovered with ``from_time``: no gap, no duplicate, however late the interest comes back.
* **Backoff** (:class:`Backoff`): capped exponential delays with full jitter between reconnects.
* **Topology** (:func:`cycle_reason`): a link to an upstream that is already below this node is refused.

Concurrency contract: pure functions and plain objects; a :class:`Cursor` or :class:`Backoff` belongs to one
link and is used from one thread.
"""

from __future__ import annotations

import functools
import random
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

from hubbub.channels import Pattern, parse_pattern
from hubbub.errors import BadChannel

__all__ = [
    "FROM_HEADER",
    "HOPS_HEADER",
    "MAX_HOPS",
    "ORIGIN_HEADER",
    "Backoff",
    "Cursor",
    "Origin",
    "accepts",
    "accepts_path",
    "arrived",
    "covers",
    "cycle_reason",
    "forwards_to",
    "forwards_up",
    "hops_of",
    "idempotency_key",
    "minimal_cover",
    "origin_of",
    "stamp",
    "valid_node_id",
]

ORIGIN_HEADER: Final = ":fed.origin"
HOPS_HEADER: Final = ":fed.hops"
#: ``up`` on an event this node received from one of its upstreams: it is not forwarded up again (upward,
#: an event climbs from where it was published; it comes down only where someone listens).
FROM_HEADER: Final = ":fed.from"
#: The most hops an event may have made; a longer path is refused as a misconfiguration.
MAX_HOPS: Final = 32

_NODE_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")


def valid_node_id(node: str) -> bool:
    """Node ids are 1 to 64 of ``A-Z a-z 0-9 . _ -`` (they are joined with spaces and commas in headers)."""
    return len(node) <= 64 and _valid_short_id(node)


@functools.lru_cache(maxsize=1024)
def _valid_short_id(node: str) -> bool:
    # Cached: a mesh has few node ids, and every event that crosses a link names some.
    return _NODE_ID.fullmatch(node) is not None


@dataclass(frozen=True, slots=True)
class Origin:
    """Where an event was first published: the node, and the event's epoch and seq there."""

    node: str
    epoch: str
    seq: int

    def render(self) -> str:
        return f"{self.node} {self.epoch} {self.seq}"


def origin_of(headers: Mapping[str, str]) -> Origin | None:
    """The origin recorded in an event's headers, or ``None`` for an event published on this node (or a
    header that is not well formed, which is treated the same: the event is this node's own)."""
    raw = headers.get(ORIGIN_HEADER)
    if not raw:
        return None
    parts = raw.split(" ")
    if len(parts) != 3 or not valid_node_id(parts[0]) or not parts[2].isdigit():
        return None
    return Origin(parts[0], parts[1], int(parts[2]))


def hops_of(headers: Mapping[str, str]) -> tuple[str, ...]:
    """The node ids an event went through, origin first (empty for an event published here)."""
    raw = headers.get(HOPS_HEADER)
    return tuple(h for h in raw.split(",") if h) if raw else ()


def stamp(node: str, headers: Mapping[str, str], epoch: str, seq: int) -> tuple[dict[str, str], Origin]:
    """The headers an event carries when ``node`` forwards it over a link, and its origin.

    ``headers``, ``epoch`` and ``seq`` are the event's as stored on ``node``. An event published here gets
    ``node`` as its origin; one that came over a link keeps its origin. ``node`` is appended to the hops
    unless it is already last (it is, after the event was stored here with the hops it came with plus
    this node)."""
    out = dict(headers)
    origin = origin_of(headers) or Origin(node, epoch, seq)
    hops = hops_of(headers)
    if not hops or hops[-1] != node:
        hops = (*hops, node)
    out[ORIGIN_HEADER] = origin.render()
    out[HOPS_HEADER] = ",".join(hops)
    return out, origin


def accepts(node: str, headers: Mapping[str, str]) -> bool:
    """Does ``node`` take an event that arrives over a link? Not when it went through ``node`` already (or
    started there), nor when its path is implausibly long."""
    return accepts_path(node, origin_of(headers), hops_of(headers))


def accepts_path(node: str, origin: Origin | None, hops: tuple[str, ...]) -> bool:
    """:func:`accepts` on an origin and hops parsed already."""
    if origin is None or len(hops) > MAX_HOPS:
        return False
    return node not in hops and origin.node != node


def forwards_to(peer: str, headers: Mapping[str, str]) -> bool:
    """May an event (as stamped by :func:`stamp`) be sent to ``peer``? Not to a node on its path."""
    origin = origin_of(headers)
    return peer not in hops_of(headers) and (origin is None or origin.node != peer)


def forwards_up(peer: str, headers: Mapping[str, str], below: Collection[str] = ()) -> bool:
    """May an event stored on this node go up to its upstream ``peer``? Unless ``peer`` is on its path: yes
    when it was published here or came from a downstream; when it came from an upstream, only if its
    origin is ``below`` this node (one of its descendants: a copy from above won the race against the copy
    from below, and the other upstreams still need it), never otherwise (up, an event climbs from where it
    was published; it does not go sideways)."""
    if headers.get(FROM_HEADER) == "up":
        origin = origin_of(headers)
        if origin is None or origin.node not in below:
            return False
    return forwards_to(peer, headers)


def arrived(node: str, fed: Mapping[str, str], from_upstream: bool) -> dict[str, str]:
    """The federation pseudo-headers ``node`` stores with an event that came over a link (``fed``: its
    origin and hops as received, which :func:`accepts` took): the same origin, ``node`` appended to the
    hops, and :data:`FROM_HEADER` when it came down from an upstream."""
    out = {ORIGIN_HEADER: fed[ORIGIN_HEADER], HOPS_HEADER: ",".join((*hops_of(fed), node))}
    if from_upstream:
        out[FROM_HEADER] = "up"
    return out


def idempotency_key(origin: Origin) -> str:
    """The idempotency key of a forwarded publish: one per event at its origin, whatever the path."""
    return f"fed:{origin.node}:{origin.epoch}:{origin.seq}"


# -- interest -----------------------------------------------------------------------------------------------


def covers(q: Pattern, p: Pattern) -> bool:
    """Does every channel that ``p`` matches also match ``q``? (Patterns of native.md §4: ``None`` parts are
    ``*``; ``subtree`` is a trailing ``**``, which also matches the prefix itself.)"""
    qp, pp = q.parts, p.parts
    if q.subtree:
        # q = Q/**: p must stay under Q. A subtree p may match channels as short as its own parts.
        if len(pp) < len(qp):
            # Every channel has a segment (the root is [""]), so /** matches what /*/** does; any other
            # shorter p matches channels too short for q.
            return p.subtree and not pp and qp == (None,)
    elif p.subtree or len(pp) != len(qp):
        return False
    return all(a is None or (b is not None and a == b) for a, b in zip(qp, pp, strict=False))


def minimal_cover(patterns: Iterable[Pattern]) -> list[Pattern]:
    """The patterns with duplicates and every pattern covered by another removed, sorted by text. Where two
    patterns cover each other (the same set of channels), the one first in text order stays."""
    unique = sorted({p.text: p for p in patterns}.values(), key=lambda p: p.text)

    def dropped(p: Pattern) -> bool:
        # Covered by another pattern; of two that cover each other, the first in text order stays.
        return any(k is not p and covers(k, p) and (k.text < p.text or not covers(p, k)) for k in unique)

    kept = [p for p in unique if not dropped(p)]
    return sorted(kept, key=lambda p: p.text)


# -- recovery -----------------------------------------------------------------------------------------------


#: What a cursor saved without its patterns held: every pattern (it recovers all, as it always did).
_HELD_ALL: Final = "/**"


@dataclass(slots=True)
class Cursor:
    """How far one link has read its upstream: per channel, the epoch and seq of the last event received;
    the commit time of the newest event received on any channel; and the patterns **held**: subscribed
    upstream and never withdrawn since (a connection lost or a restart does not withdraw them; an
    unsubscribe because the interest went does), each with the upstream time it is recovered to (``owed``:
    channels that appeared after it are owed). A held pattern caught up on the live connection (``live``)
    is recovered to ``last_time``, moving with it. Persist it with :meth:`to_json` where the link's state is
    kept.

    What a new upstream subscription recovers, whenever it comes (:meth:`since`, :meth:`owed_from`): the
    channels it matches that have a position here, from their position (this node's log of a channel has
    no hole, whoever listened meanwhile); and, for a pattern that a held one covers, the channels without a
    position, from after the time that held pattern is recovered to. A pattern never held (or withdrawn)
    has nothing owed beyond the channels it has: those start live."""

    positions: dict[str, tuple[str, int]] = field(default_factory=dict)
    last_time: int = 0
    owed: dict[str, int] = field(default_factory=dict)
    live: set[str] = field(default_factory=set, compare=False)
    _patterns: dict[str, Pattern] = field(default_factory=dict, compare=False, repr=False)

    def advance(self, channel: str, epoch: str, seq: int, time_ns: int) -> bool:
        """Record an event received from upstream. ``False`` when it is not after the recorded position
        (a duplicate the link should drop)."""
        cur = self.positions.get(channel)
        if cur is not None and cur[0] == epoch and seq <= cur[1]:
            return False
        self.positions[channel] = (epoch, seq)
        self.last_time = max(self.last_time, time_ns)
        return True

    def since(self, pattern: Pattern) -> dict[str, dict[str, str | int]]:
        """The ``since`` map of a resubscription (native.md §6): the recorded channels the pattern matches."""
        return {
            ch: {"epoch": epoch, "seq": seq}
            for ch, (epoch, seq) in sorted(self.positions.items())
            if pattern.matches(ch)
        }

    def recovered_to(self, text: str) -> int:
        """The upstream time the held pattern ``text`` is recovered to."""
        return self.last_time if text in self.live else self.owed[text]

    def owed_from(self, pattern: Pattern) -> int | None:
        """The upstream time after which ``pattern``'s channels without a position are owed: the earliest
        of the held patterns that cover it (``None``: none covers it, nothing is owed). 0 is a time like
        any other: a pattern held before the link knew any upstream time is owed everything."""
        times = [self.recovered_to(t) for t in self.owed if covers(self._pattern(t), pattern)]
        return min(times, default=None)

    def hold(self, pattern: Pattern, owed: int) -> None:
        """``pattern`` is subscribed upstream, recovering its new channels from after ``owed`` (kept if it is
        held already: what it is recovered to moves only when it has caught up, :meth:`caught_up`)."""
        if pattern.text not in self.owed:
            self.owed[pattern.text] = owed
            self._patterns[pattern.text] = pattern

    def caught_up(self, texts: Collection[str]) -> None:
        """The held patterns ``texts`` have every event up to ``last_time`` (a time mark, settled): from now
        they are recovered to ``last_time`` as it moves."""
        self.live.update(t for t in texts if t in self.owed)

    def interrupted(self) -> None:
        """The connection ended: the patterns caught up on it are recovered to ``last_time`` now."""
        for text in self.live:
            self.owed[text] = self.last_time
        self.live.clear()

    def release(self, text: str) -> None:
        """The pattern ``text`` was withdrawn (no local interest in it any more): nothing is owed for it."""
        self.owed.pop(text, None)
        self._patterns.pop(text, None)
        self.live.discard(text)

    def _pattern(self, text: str) -> Pattern:
        p = self._patterns.get(text)
        if p is None:
            p = self._patterns[text] = parse_pattern(text)
        return p

    def to_json(self) -> dict[str, object]:
        positions = {ch: [e, s] for ch, (e, s) in self.positions.items()}
        held = {t: self.recovered_to(t) for t in sorted(self.owed)}
        return {"positions": positions, "last_time": self.last_time, "patterns": held}

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> Cursor:
        """Read :meth:`to_json`'s output; raises ``ValueError`` when it is not that shape. A cursor saved
        without ``patterns`` holds every pattern (``/**``), recovered to its ``last_time``."""
        raw = data.get("positions", {})
        last = data.get("last_time", 0)
        if not isinstance(raw, dict) or not isinstance(last, int):
            raise ValueError("a federation cursor needs positions (a map) and last_time (an integer)")
        held = data.get("patterns", {_HELD_ALL: last})
        if not isinstance(held, dict):
            raise ValueError("a federation cursor's patterns are a map of pattern to time")
        positions: dict[str, tuple[str, int]] = {}
        for ch, pos in raw.items():
            if (
                not isinstance(ch, str)
                or not isinstance(pos, list)
                or len(pos) != 2
                or not isinstance(pos[0], str)
                or not isinstance(pos[1], int)
            ):
                raise ValueError(f"bad federation cursor entry for {ch!r}")
            positions[ch] = (pos[0], pos[1])
        cur = cls(positions, last)
        for text, owed in held.items():
            if not isinstance(owed, int):
                raise ValueError(f"bad federation cursor time for {text!r}")
            try:
                cur.hold(parse_pattern(text), owed)
            except (BadChannel, TypeError, AttributeError) as exc:
                raise ValueError(f"bad federation cursor pattern {text!r}") from exc
        return cur


# -- reconnecting -------------------------------------------------------------------------------------------


class Backoff:
    """Delays between reconnect attempts: attempt n waits a uniformly random time in
    ``[0, min(cap, base * 2**n)]`` ("full jitter"), so links cut at the same moment do not come back in
    step. :meth:`reset` after a link has been up."""

    def __init__(self, base_s: float = 0.1, cap_s: float = 30.0, rng: random.Random | None = None) -> None:
        if base_s <= 0 or cap_s < base_s:
            raise ValueError("backoff needs 0 < base <= cap")
        self.base_s = base_s
        self.cap_s = cap_s
        self.attempt = 0
        self._rng = rng or random.Random()

    def next_delay(self) -> float:
        ceiling = min(self.cap_s, self.base_s * (2 ** min(self.attempt, 62)))
        self.attempt += 1
        return self._rng.uniform(0, ceiling)

    def reset(self) -> None:
        self.attempt = 0


# -- topology -----------------------------------------------------------------------------------------------


def cycle_reason(node: str, upstream: str, upstream_ancestors: Iterable[str]) -> str | None:
    """Why a link from ``node`` to ``upstream`` would close a cycle, or ``None``. ``upstream_ancestors`` are
    the node ids above the upstream, as its link handshake reports them. A cycle this cannot see (through
    a link not yet up) is still harmless to events: the hops stop them."""
    if upstream == node:
        return f"node {node} cannot be its own upstream"
    if node in set(upstream_ancestors):
        return f"{upstream} is below {node} already: linking up to it would close a cycle"
    return None
