"""The actions a dialect connection hands to its driver, and the core results handed back: the shared
vocabulary of every sans-I/O connection in :mod:`hubbub.dialects` (ARCHITECTURE §2).

A connection is fed bytes (a byte stream) or frames (a WebSocket route) and returns a list of actions,
carried out in order by a driver in :mod:`hubbub.transports`:

* :class:`Send`: bytes for the peer (one stream write, or one WebSocket frame); :class:`Reject`, the same
  as the answer to bad input (counted).
* :class:`Close`: close the connection, after the actions before it, for a
  :class:`~hubbub.disconnect.Disconnect` reason; the dialect's spec maps the reason to what its peers
  see (``DialectSpec.close_code``).
* :class:`Publish`: store an event, then deliver it (the core's ``publish``); the connection renders a
  refusal with its own ``refused`` method.
* :class:`Subscribe` / :class:`Unsubscribe`: a subscription of this connection, identified by ``sub``, to
  a channel pattern (and tag set), with a replay selection of :mod:`hubbub.selection` (the one vocabulary
  of selections, shared with the core; :data:`~hubbub.selection.LIVE` by default).
* :class:`Authenticate`: a token presented in the stream; the driver answers with the identity's grant.

A dialect adds actions of its own (mist's token registry commands, WearScript's forwarded frames) as frozen
dataclasses in its module; its driver binding handles them through a dispatch table, never an
``isinstance`` ladder.

Every action is a frozen, slotted dataclass: an immutable value, comparable in tests.

Concurrency contract: values only; nothing here holds state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from hubbub.channels import Pattern
from hubbub.disconnect import Disconnect
from hubbub.selection import LIVE, Selection

__all__ = [
    "Authenticate",
    "Close",
    "Publish",
    "Reject",
    "Send",
    "Subscribe",
    "Unsubscribe",
]


@dataclass(frozen=True, slots=True)
class Send:
    """Bytes for the peer: one stream write, or one WebSocket frame (text or binary by the dialect's spec)."""

    data: bytes


@dataclass(frozen=True, slots=True)
class Reject:
    """The reply to bad input the connection stays open after (a dialect's error line): sent as a
    :class:`Send`, and counted as bad input."""

    data: bytes


@dataclass(frozen=True, slots=True)
class Close:
    """Close the connection after the actions before it, for ``code`` (``reason`` is for the server's log
    only: peers see the spec's close mapping of ``code``)."""

    code: Disconnect = Disconnect.NORMAL
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Publish:
    """Store an event on the canonical ``channel`` and deliver it."""

    channel: str
    payload: bytes
    content_type: str
    headers: Mapping[str, str] = field(default_factory=dict)
    tags: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Subscribe:
    """Subscribe this connection as ``sub`` to ``pattern`` (parsed, or a pattern string the driver parses)
    with the tag set ``tags`` (an event must carry them all), replaying what ``selection`` says (the core
    plans it; live only by default: the log is not read)."""

    sub: str
    pattern: Pattern | str
    tags: frozenset[str] = frozenset()
    selection: Selection = LIVE


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    """End this connection's subscription ``sub`` (nothing when it has none by that id)."""

    sub: str


@dataclass(frozen=True, slots=True)
class Authenticate:
    """A token presented in the stream (a TCP connection's first line): the driver checks it and hands the
    result back to the connection."""

    token: str
