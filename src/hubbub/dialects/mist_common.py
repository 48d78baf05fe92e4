"""What both mist generations share (protocols/mist.md): the commands their connections hand to the core,
the outputs they return, tag validation, the subscription table and generation detection.

The two state machines live in :mod:`.mist2015` (line protocol over TCP, JSON commands over WebSocket) and
:mod:`.mist1` (JSON stream over TCP and WebSocket). Each is fed bytes or frames and returns a list of
**outputs**, to be carried out in order:

* :class:`Send`: bytes for the peer (a reply the connection could answer alone: ``pong``, ``list``, error
  lines). Over WebSocket each ``Send`` is one text frame (the bytes are always valid UTF-8).
* :class:`Close`: close the connection after the sends before it (its ``Disconnect`` is the WebSocket close
  code; over TCP the socket is just closed).

``Send``, ``Close`` and ``Authenticate`` are the shared actions of :mod:`hubbub.dialects.actions`.
* a :data:`Command` for the core: :class:`Publish`, :class:`Subscribe`, :class:`Unsubscribe`,
  :class:`ListAll`, :class:`Who`, :class:`Authenticate` and the registry commands (:class:`Register`,
  :class:`Unregister`, :class:`SetTags`, :class:`UnsetTags`, :class:`TokenTags`). The connection renders the
  core's answer with its ``reply_*`` methods.

Concurrency contract: a connection object belongs to one connection and is called from one thread (the
event loop). The module-level functions are pure and thread-safe.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Final, Literal, TypeAlias

from hubbub.errors import BadRequest, LimitExceeded
from hubbub.events import Event

from .actions import Authenticate, Close, Send

__all__ = [
    "CONTENT_TYPE",
    "DEFAULT_CHANNEL",
    "DEFAULT_MAX_FRAME",
    "DEFAULT_MAX_SUBSCRIPTIONS",
    "DEFAULT_MAX_TAGS",
    "DEFAULT_MAX_TAG_BYTES",
    "REPLICA_HEADER",
    "Authenticate",
    "Close",
    "Command",
    "Generation",
    "ListAll",
    "MistGrant",
    "Output",
    "Publish",
    "Register",
    "RegistryCommand",
    "Send",
    "SetTags",
    "Subscribe",
    "Subscriptions",
    "TokenTags",
    "Unregister",
    "UnsetTags",
    "Unsubscribe",
    "Who",
    "check_tags",
    "delivers",
    "detect_generation",
    "text",
]

DEFAULT_MAX_FRAME: Final = 1 << 20
DEFAULT_MAX_SUBSCRIPTIONS: Final = 1024
DEFAULT_MAX_TAGS: Final = 64
DEFAULT_MAX_TAG_BYTES: Final = 256
#: ``mist.channel``: where every mist publish is stored (mist.md §6).
DEFAULT_CHANNEL: Final = "/mist"
#: The content type of every mist publish (mapping.md §4).
CONTENT_TYPE: Final = "text/plain; charset=utf-8"
#: Pseudo-header on publishes of a 2015 replication peer (mapping.md §6).
REPLICA_HEADER: Final = ":mist.replica"

Generation: TypeAlias = Literal["mist2015", "mist1"]


def detect_generation(data: bytes) -> Generation | None:
    """The generation of a mist TCP connection from its first bytes (mist.md §1): ``{`` → 1.x, any other
    byte → 2015. ``None`` while nothing was received."""
    if not data:
        return None
    return "mist1" if data[0] == 0x7B else "mist2015"


# -- outputs ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MistGrant:
    """What an accepted token allows, as the wiring found it (mist.md §8). ``user`` is the identity the
    publishes carry; ``tags`` is set only for a 2015 WebSocket client that came with a **registry** token:
    each of its subscribes must then share at least one tag with it."""

    user: str = ""
    tags: frozenset[str] | None = None


# -- commands for the core ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Publish:
    """Store an event on ``channel`` (``mist.channel``) with ``tags`` (sorted, distinct, never empty) and
    ``payload``, then deliver it. ``replica`` marks a 2015 replication peer's publish: the event carries
    :data:`REPLICA_HEADER`. No acknowledgement is sent; on failure, render with ``reply_error``."""

    channel: str
    tags: tuple[str, ...]
    payload: bytes
    replica: bool = False

    @property
    def headers(self) -> Mapping[str, str]:
        return {REPLICA_HEADER: "1"} if self.replica else {}


@dataclass(frozen=True, slots=True)
class Subscribe:
    """Add a live subscription of this connection to every event, of any channel, whose tags contain
    ``tags`` (pattern ``/**`` with this tag set). Emitted only when the connection gains the set: the
    2015 reference count goes 0 → 1, or the 1.x set gains it. The tag set identifies the subscription."""

    tags: frozenset[str]


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    """Drop the connection's subscription to exactly ``tags`` (emitted when the connection loses the set)."""

    tags: frozenset[str]


@dataclass(frozen=True, slots=True)
class ListAll:
    """1.x ``listall``: answer with ``reply_listall`` and the distinct tags of every mist subscription on the
    server. ``echo`` holds the request's tags (echoed in the reply)."""

    echo: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Who:
    """1.x ``who``: answer with ``reply_who`` (mist connections accepted since start, and open mist
    connections of both generations holding at least one subscription)."""

    echo: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Register:
    """Registry: create ``token`` with ``tags``. ``reply_registry`` takes True (created) or False (exists)."""

    token: str
    tags: frozenset[str]


@dataclass(frozen=True, slots=True)
class Unregister:
    """Registry: forget ``token`` (unknown tokens are ignored). No reply."""

    token: str


@dataclass(frozen=True, slots=True)
class SetTags:
    """Registry: add ``tags`` to ``token``. ``reply_registry`` takes True (done) or False (not found)."""

    token: str
    tags: frozenset[str]


@dataclass(frozen=True, slots=True)
class UnsetTags:
    """Registry: remove ``tags`` from ``token``. ``reply_registry`` takes True or False (not found)."""

    token: str
    tags: frozenset[str]


@dataclass(frozen=True, slots=True)
class TokenTags:
    """Registry: the tags of ``token``. ``reply_registry`` takes the tag set, or None (not found)."""

    token: str


RegistryCommand: TypeAlias = Register | Unregister | SetTags | UnsetTags | TokenTags
Command: TypeAlias = Publish | Subscribe | Unsubscribe | ListAll | Who | Authenticate | RegistryCommand
#: What a mist connection returns: bytes to send, a close, or a command for the core.
Output: TypeAlias = Send | Close | Command


# -- tags ---------------------------------------------------------------------------------------------------


def check_tags(items: Iterable[str | bytes], max_tags: int, max_tag_bytes: int) -> frozenset[str]:
    """Validate a tag list (mist.md §9): at most ``max_tags`` entries, each at most ``max_tag_bytes`` bytes of
    UTF-8. ``bytes`` entries are decoded strictly. Raises :class:`~hubbub.errors.BadRequest` (answered
    ``Invalid tags``) otherwise. Duplicates collapse: tags are a set."""
    out: list[str] = []
    for raw in items:
        if len(out) >= max_tags:
            raise BadRequest(f"at most {max_tags} tags")
        if isinstance(raw, bytes):
            if len(raw) > max_tag_bytes:
                raise BadRequest(f"a tag is at most {max_tag_bytes} bytes")
            try:
                tag = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise BadRequest("a tag is not UTF-8") from None
        else:
            tag = raw
            if len(tag) * 4 > max_tag_bytes and len(tag.encode("utf-8", "surrogatepass")) > max_tag_bytes:
                raise BadRequest(f"a tag is at most {max_tag_bytes} bytes")
            if not tag.isascii():
                try:
                    tag.encode("utf-8")
                except UnicodeEncodeError:  # a lone surrogate is not UTF-8
                    raise BadRequest("a tag is not UTF-8") from None
        out.append(tag)
    return frozenset(out)


class Subscriptions:
    """One connection's mist subscriptions, in the order first subscribed.

    ``counted`` (2015): each tag set has a reference count; ``add`` returns True when the set is new (1st
    reference) and ``remove`` True when the last reference went. Otherwise (1.x) a set is held once.
    At most ``limit`` distinct sets: ``add`` raises :class:`~hubbub.errors.LimitExceeded` beyond it.
    """

    __slots__ = ("_sets", "counted", "limit")

    def __init__(self, limit: int, counted: bool) -> None:
        self.limit = limit
        self.counted = counted
        self._sets: dict[frozenset[str], int] = {}

    def __len__(self) -> int:
        return len(self._sets)

    def __iter__(self) -> Iterator[frozenset[str]]:
        return iter(self._sets)

    def __contains__(self, tags: object) -> bool:
        return tags in self._sets

    def add(self, tags: frozenset[str]) -> bool:
        n = self._sets.get(tags)
        if n is not None:
            if self.counted:
                self._sets[tags] = n + 1
            return False
        if len(self._sets) >= self.limit:
            raise LimitExceeded(f"at most {self.limit} subscriptions")
        self._sets[tags] = 1
        return True

    def remove(self, tags: frozenset[str]) -> bool:
        n = self._sets.get(tags)
        if n is None:
            return False
        if n > 1:
            self._sets[tags] = n - 1
            return False
        del self._sets[tags]
        return True


# -- events -------------------------------------------------------------------------------------------------


def text(payload: bytes) -> str:
    """mapping.md §5.1 ``text()``: UTF-8 with each invalid sequence replaced by U+FFFD."""
    return payload.decode("utf-8", "replace")


def delivers(event: Event, replica: bool) -> bool:
    """Whether a mist connection may receive ``event`` at all: it has tags (mist.md §5), and a replication
    peer (``replica``) never gets an event another peer published."""
    if not event.tags:
        return False
    return not (replica and REPLICA_HEADER in event.headers)
