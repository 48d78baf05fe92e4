"""Durable consumers in the log store: definitions, journals, and the filters that pick their events.

A **durable consumer** (docs/consumers.md) is a named subscription whose matching events the
store **journals**: at every append, inside the append's own transaction, each committed event that matches a
consumer's filter is put into that consumer's journal under the next journal position ``pos`` (1, 2, …
per consumer, never reused). An item stays in the journal until it is acknowledged
(:meth:`~hubbub.log.base.LogStore.consumer_settle`), whatever log retention, ``trim`` or a channel reset do
to the event in the log: the item keeps the **whole event** (channel, seq, epoch, time, publisher, content
type, headers, tags, payload). That is the retention rule of every engine: the log's limits apply to the
log, a consumer's unacknowledged items are never dropped (an engine may refer to the event while the log
holds it and copy it before the log drops it, as SQLite does, or copy it from the start), and an item's bytes
count in :attr:`ConsumerInfo.bytes`, not in the log's ``StoreStats``.

Because journaling happens inside the append transaction, an event is either committed *and* journaled for
every consumer that existed when its batch was committed, or neither: a crash cannot lose an item between
the log and a journal. A consumer created by :meth:`~hubbub.log.base.LogStore.consumer_create` gets every
event of every later append (writer methods are serialised, so "later" is exact).

The store keeps, per item, the number of deliveries that were given back (``attempts``: nacks, and openers
that went away with the item unacknowledged) and the earliest time it may be delivered again
(``not_before_ns``, for nack backoff). Which opener holds which item is not stored: after a restart every
unacknowledged item is pending again (at least once).

A consumer's filter is written in one of the log's two pattern **syntaxes** (:data:`SYNTAXES`), both
hubbub's own and named for what they are, never for a dialect: ``native``, a channel pattern, and
``separated``, a channel's name in a separator mapping with a head or tail wildcard
(:func:`~hubbub.channels.separated_matcher`). A dialect whose topics read that way creates its consumers
in that syntax; the log evaluates them with no knowledge of the dialect.

This module is pure: the engines and core share its types, and :func:`compile_filter` (used by the engines
at append) depends only on :mod:`hubbub.channels`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, Final

from hubbub.channels import Pattern, parse_pattern, separated_matcher, separated_pattern
from hubbub.errors import BadRequest
from hubbub.events import Event, hot_value

__all__ = [
    "DEFAULT_BATCH_BYTES",
    "DEFAULT_BATCH_WAIT_MS",
    "NATIVE",
    "SEPARATED",
    "SYNTAXES",
    "ConsumerInfo",
    "ConsumerSpec",
    "JournalIndex",
    "JournalItem",
    "Retry",
    "check_name",
    "check_spec",
    "compile_filter",
    "reach",
]

DEFAULT_BATCH_BYTES: Final = 2_097_152
DEFAULT_BATCH_WAIT_MS: Final = 5
_NAME_CHARS: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")

Filter = Callable[[str, Collection[str]], bool]

#: A channel pattern (native.md §4: ``/a/*``, ``/a/**``).
NATIVE: Final = "native"
#: A channel's name rendered with the consumer's ``separator`` (mapping.md §2.4), exact, with a head
#: wildcard (``foo.*``) or with a tail wildcard (``*.bar``): :func:`~hubbub.channels.separated_matcher`.
SEPARATED: Final = "separated"
SYNTAXES: Final = (NATIVE, SEPARATED)
#: Syntax names that rows stored before the syntaxes had these names carry, read as the syntax they were:
#: the separated syntax was stored under the name of the first dialect that created such consumers. Kept
#: for as long as a store may hold such rows; never written.
_STORED_NAMES: Final = {"qpubs": SEPARATED}


def check_name(name: str) -> str:
    """A consumer name is 1-128 characters of ``[A-Za-z0-9._-]`` (docs/consumers.md); else BadRequest."""
    if not 1 <= len(name) <= 128 or not _NAME_CHARS.issuperset(name):
        raise BadRequest("bad consumer name")
    return name


@dataclass(frozen=True, slots=True)
class ConsumerSpec:
    """What defines a consumer, fixed at creation.

    ``syntax`` says how ``pattern`` reads (:data:`SYNTAXES`): ``native`` (a native pattern, native.md §4:
    ``/a/*``, ``/a/**``) or ``separated`` (a name with ``separator``: exact, head ``foo.*``, tail
    ``*.bar``). ``tags``: an event must carry all of them. ``shared``: a work queue (several openers, each
    batch to one). ``batch_wait_ms`` / ``batch_bytes``: how a batch is collected (docs/consumers.md).
    """

    name: str
    pattern: str
    syntax: str = NATIVE
    separator: str = "."
    tags: tuple[str, ...] = ()
    shared: bool = False
    batch_wait_ms: int = DEFAULT_BATCH_WAIT_MS
    batch_bytes: int = DEFAULT_BATCH_BYTES
    #: Who created it (the creating identity's user, set by the consumer service; empty when unknown or
    #: created by an identity without a user): deleting another's consumer takes the admin permission
    #: (docs/consumers.md "Permissions").
    owner: str = ""

    def to_json(self) -> str:
        """The stored form (one text column): every field but ``name`` (``owner`` only when set)."""
        d: dict[str, Any] = {
            "pattern": self.pattern,
            "syntax": self.syntax,
            "separator": self.separator,
            "tags": list(self.tags),
            "shared": self.shared,
            "batch_wait_ms": self.batch_wait_ms,
            "batch_bytes": self.batch_bytes,
        }
        if self.owner:
            d["owner"] = self.owner
        return json.dumps(d, separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, name: str, text: str) -> ConsumerSpec:
        d: dict[str, Any] = json.loads(text)
        return cls(
            name=name,
            pattern=str(d["pattern"]),
            syntax=_stored_syntax(str(d.get("syntax", NATIVE))),
            separator=str(d.get("separator", ".")),
            tags=tuple(str(t) for t in d.get("tags", ())),
            shared=bool(d.get("shared", False)),
            batch_wait_ms=int(d.get("batch_wait_ms", DEFAULT_BATCH_WAIT_MS)),
            batch_bytes=int(d.get("batch_bytes", DEFAULT_BATCH_BYTES)),
            owner=str(d.get("owner", "")),
        )


@dataclass(frozen=True, slots=True)
class ConsumerInfo:
    """A stored consumer. ``id``: the store's number for it (never reused). ``top``: the last journal
    position assigned. ``pending``/``bytes``: unacknowledged items in its journal and their event bytes."""

    id: int
    spec: ConsumerSpec
    created_ns: int
    top: int = 0
    pending: int = 0
    bytes: int = 0


@hot_value  # built once per item journaled, read or given back, mostly on the loop
class JournalItem:
    """One unacknowledged journal item: its event, its position, the deliveries given back so far and
    the earliest time it may be delivered again (0: at once)."""

    pos: int
    event: Event
    attempts: int = 0
    not_before_ns: int = 0


@dataclass(frozen=True, slots=True)
class Retry:
    """Items of a consumer given back unacknowledged: each one's ``attempts`` goes up by one, and it may not
    be delivered again before ``not_before_ns``."""

    consumer_id: int
    positions: tuple[int, ...]
    not_before_ns: int = 0


def _stored_syntax(name: str) -> str:
    return _STORED_NAMES.get(name, name)


def _check_separator(sep: str) -> None:
    if not sep or "*" in sep:
        raise BadRequest("bad separator")


def compile_filter(spec: ConsumerSpec) -> Filter:
    """``spec``'s filter: ``f(channel, tags)`` is whether an event belongs in its journal. Raises
    ``BadChannel``/``BadRequest`` for a pattern that cannot be read."""
    if spec.syntax == NATIVE:
        pat = parse_pattern(spec.pattern)
        chan: Callable[[str], bool] = pat.matches
    elif spec.syntax == SEPARATED:
        _check_separator(spec.separator)
        chan = separated_matcher(spec.pattern, spec.separator)
    else:
        raise BadRequest("unknown pattern syntax")
    need = frozenset(spec.tags)
    if not need:
        return lambda ch, tags: chan(ch)
    return lambda ch, tags: chan(ch) and need.issubset(tags)


def reach(spec: ConsumerSpec) -> Pattern | None:
    """The native pattern covering every channel ``spec``'s filter can journal (``None``: none, a separated
    name that never matches): what reading all of a consumer's items takes, whatever its syntax. A native
    pattern is its own reach; a separated name's is :func:`~hubbub.channels.separated_pattern` (exact for
    an exact name and a head, ``/**`` for a tail). Raises ``BadChannel``/``BadRequest`` as
    :func:`compile_filter` does."""
    if spec.syntax == NATIVE:
        return parse_pattern(spec.pattern, 1 << 30)
    if spec.syntax == SEPARATED:
        _check_separator(spec.separator)
        return separated_pattern(spec.pattern, spec.separator, 1 << 30)
    raise BadRequest("unknown pattern syntax")


def check_spec(spec: ConsumerSpec) -> ConsumerSpec:
    """Whether ``spec`` can be created: a good name, ``batch_wait_ms >= 0``, ``batch_bytes >= 1`` and a
    filter that reads. Raises ``BadRequest``/``BadChannel``."""
    check_name(spec.name)
    if spec.batch_wait_ms < 0 or spec.batch_bytes < 1:
        raise BadRequest("bad batch_wait_ms or batch_bytes")
    compile_filter(spec)
    return spec


class JournalIndex:
    """Which consumers journal an event: the engines' matcher at append.

    Holds each consumer's compiled filter and caches the answer per ``(channel, tags)`` (bounded; cleared
    whenever a consumer is added or removed). Not thread-safe: an engine touches it from its writer methods
    only, which are serialised.
    """

    _CACHE_MAX: Final = 4096

    def __init__(self) -> None:
        self._filters: dict[int, Filter] = {}
        self._cache: dict[tuple[str, tuple[str, ...]], tuple[int, ...]] = {}
        #: No consumer is indexed: read per append (an attribute, where ``bool()`` would be a call).
        self.empty = True

    def __bool__(self) -> bool:
        return not self.empty

    def __len__(self) -> int:
        return len(self._filters)

    def add(self, consumer_id: int, spec: ConsumerSpec) -> None:
        self._filters[consumer_id] = compile_filter(spec)
        self._cache.clear()
        self.empty = False

    def remove(self, consumer_id: int) -> None:
        self._filters.pop(consumer_id, None)
        self._cache.clear()
        self.empty = not self._filters

    def clear(self) -> None:
        self._filters.clear()
        self._cache.clear()
        self.empty = True

    def match(self, channel: str, tags: tuple[str, ...]) -> tuple[int, ...]:
        """The ids of the consumers whose filter matches, ascending."""
        key = (channel, tags)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        found = tuple(cid for cid, f in sorted(self._filters.items()) if f(channel, tags))
        if len(self._cache) >= self._CACHE_MAX:
            self._cache.clear()
        self._cache[key] = found
        return found
