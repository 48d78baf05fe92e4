"""The rows a write transaction of :class:`~hubbub.log.postgres._store.PostgresLogStore` works with: a
channel's head, the ``log_state`` row and its lock, and their conversions."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

from hubbub.log.base import ChannelInfo
from hubbub.log.postgres._reads import Conn

if TYPE_CHECKING:
    from hubbub.log.postgres._store import PostgresLogStore

__all__ = ["_Head", "_Lock", "_State", "_Unresolved", "_heads_row", "_info"]

_LOCK_STATE: Final = (
    "SELECT last_time, last_pos, next_id, suspect_below, async_start, pg_postmaster_start_time(), "
    "pg_current_xact_id()::text FROM log_state FOR UPDATE"
)


@dataclass(slots=True)
class _Head:
    """A ``channels`` or ``retired_epochs`` row, as read inside a write transaction."""

    id: int
    epoch: str
    first: int
    top: int
    top_time: int
    count: int
    bytes: int


def _info(channel: str, h: _Head) -> ChannelInfo:
    return ChannelInfo(channel, h.epoch, h.first, h.top, h.top_time)


@dataclass(slots=True)
class _State:
    """The ``log_state`` row, locked by the current write transaction, and what came with it."""

    last_time: int
    last_pos: int
    next_id: int
    suspect_below: int
    async_start: datetime | None
    server_start: datetime
    xid: str
    saved: tuple[Any, ...] = ()

    def row(self) -> tuple[Any, ...]:
        return (self.last_time, self.last_pos, self.next_id, self.suspect_below, self.async_start)


class _Unresolved(Exception):
    """The commit's outcome could not be learnt (internal)."""


def _heads_row(heads: Sequence[_Head]) -> tuple[list[int], ...]:
    return (
        [h.id for h in heads],
        [h.first for h in heads],
        [h.top for h in heads],
        [h.top_time for h in heads],
        [h.count for h in heads],
        [h.bytes for h in heads],
    )


class _Lock:
    """The log lock of one write transaction: its ``SELECT … FOR UPDATE`` is queued at once, its row fetched
    when :attr:`state` is first asked for (so a body can queue its own reads in the same round trip)."""

    __slots__ = ("_conn", "_cur", "_state", "_store")

    def __init__(self, store: PostgresLogStore, conn: Conn) -> None:
        self._store = store
        self._conn = conn
        self._cur = conn.execute(_LOCK_STATE)
        self._state: _State | None = None

    @property
    def state(self) -> _State:
        st = self._state
        if st is None:
            st = self._state = self._store._fetch_state(self._conn, self._cur)
        return st
