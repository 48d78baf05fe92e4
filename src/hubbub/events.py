"""The currency between layers: immutable, slotted event values.

Nothing here has behaviour beyond trivial derived properties. Every layer (codecs, router, log, core,
transports) passes these objects around and never mutates them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["EMPTY_POSITION", "Event", "Position", "Publisher"]


@dataclass(frozen=True, slots=True)
class Position:
    """A place in one channel's log: the sequence number within an epoch.

    ``Position(0, "")`` is the position of a channel that never had an event.
    """

    seq: int
    epoch: str


EMPTY_POSITION = Position(0, "")


@dataclass(frozen=True, slots=True)
class Publisher:
    """Who published an event (mapping.md §1)."""

    dialect: str
    user: str = ""
    app: str = ""
    msg_id: str = ""


@dataclass(frozen=True, slots=True)
class Event:
    """One committed event, exactly as stored in the log.

    ``headers`` may include pseudo-headers (keys starting with ``:``), which renderings hide.
    ``tags`` is sorted ascending (UTF-8 byte order, which equals code point order) without duplicates.
    """

    channel: str
    seq: int
    epoch: str
    time_ns: int
    publisher: Publisher
    payload: bytes
    content_type: str
    headers: Mapping[str, str] = field(default_factory=dict)
    tags: tuple[str, ...] = ()

    @property
    def position(self) -> Position:
        return Position(self.seq, self.epoch)

    @property
    def user_headers(self) -> dict[str, str]:
        """Headers without pseudo-headers."""
        return {k: v for k, v in self.headers.items() if not k.startswith(":")}

    @property
    def size(self) -> int:
        """Bytes counted against log size limits: payload, header and tag bytes."""
        n = len(self.payload)
        for k, v in self.headers.items():
            n += len(k.encode()) + len(v.encode())
        for t in self.tags:
            n += len(t.encode())
        return n
