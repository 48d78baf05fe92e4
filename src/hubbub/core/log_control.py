"""The node's writes to the log other than publishes, from the event loop: trimming, new epochs, and the
log's state maps (:class:`~hubbub.log.base.StateMaps`: small versioned maps in the log's own storage, one for
every process of the log, such as MQTT's retained index and persistent sessions).

:class:`LogControl` is the node's part for them: writes on the writer thread, in order with the appends (a
write made after a commit's completion comes after that commit), state reads on the reader threads. It
works on the store itself, never a cluster node's view. The node exposes its bound methods as ``trim``,
``reset_channel``, ``state_get``, ``state_list`` and ``state_set`` (``core/api.py``).

Concurrency contract: the coroutines are called from the event loop thread.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from hubbub.errors import ShuttingDown
from hubbub.log.base import ChannelInfo, LogStore

from .batcher import WriteBatcher
from .reads import LogReads

__all__ = ["LogControl", "StateGet", "StateList", "StateSet", "Trimmed"]

#: ``state_get(ns, key)``: the entry's value (None: removed) and version, None for a key never set.
StateGet = Callable[[str, str], Awaitable[tuple[str | None, int] | None]]
#: ``state_list(ns, prefix)``: the entries under ``prefix`` that are not removed, in key order.
StateList = Callable[[str, str], Awaitable[list[tuple[str, str]]]]
#: ``state_set(ns, key, value, version)``: the version the entry has now, None when ``version`` lost.
StateSet = Callable[[str, str, str | None, int | None], Awaitable[int | None]]


@dataclass(frozen=True, slots=True)
class Trimmed:
    """What :meth:`LogControl.trim` did: ``info`` is the trimmed epoch's position afterwards (its ``epoch``
    the one named; ``first`` is ``top + 1`` once it holds no events), ``current`` whether that epoch is the
    channel's current one. A retired epoch left without events is gone from the store (docs/log.md
    "Epochs")."""

    info: ChannelInfo
    current: bool


class LogControl:
    """See the module docstring. ``closing`` says whether the node is closing."""

    __slots__ = ("_batcher", "_closing", "_reads", "_store")

    def __init__(
        self, store: LogStore, reads: LogReads, batcher: WriteBatcher, closing: Callable[[], bool]
    ) -> None:
        self._store = store
        self._reads = reads
        self._batcher = batcher
        self._closing = closing

    async def reset_channel(self, channel: str) -> Any:
        """Start a new epoch for a channel (on the writer thread, in order with appends)."""
        return await self._batcher.control(lambda st: st.reset_channel(channel))

    async def trim(self, channel: str, epoch: str, up_to_seq: int) -> Trimmed:
        """Trim the events with ``seq <= up_to_seq`` of the channel's epoch ``epoch``: its current epoch, or a
        retired one still holding events (docs/log.md "Epochs"; the current epoch is untouched then). On the
        writer thread, in order with appends; the epoch is looked up in the same call, so a reset cannot slip
        in between (a reset just before makes the named epoch a retired one, which is trimmed all the same).
        Raises :class:`~hubbub.errors.TrimEpochGone` (an :class:`~hubbub.errors.EpochMismatch`) with the
        current head (``epoch`` is neither: never used, or a retired epoch already gone with its last event)
        or :class:`~hubbub.errors.TrimOutOfRange` (``up_to_seq`` negative or beyond that epoch's top): the
        store's own typed errors (``LogStore.trim``)."""
        if self._closing() or self._batcher.writer is None:
            raise ShuttingDown()

        def trim(st: LogStore) -> Trimmed:
            info = st.trim(channel, up_to_seq, epoch=epoch)
            return Trimmed(info, current=st.head(channel).epoch == epoch)

        done: Trimmed = await self._batcher.control(trim)
        return done

    async def state_get(self, ns: str, key: str) -> tuple[str | None, int] | None:
        """``StateMaps.state_get``, on a reader thread."""
        return await self._reads.submit(self._store.state_get, ns, key)

    async def state_list(self, ns: str, prefix: str) -> list[tuple[str, str]]:
        """``StateMaps.state_list``, on a reader thread."""
        return await self._reads.submit(self._store.state_list, ns, prefix)

    async def state_set(self, ns: str, key: str, value: str | None, version: int | None) -> int | None:
        """``StateMaps.state_set`` on the writer thread, in order with the appends (``ShuttingDown`` once the
        node closes)."""
        done: int | None = await self._batcher.control(lambda st: st.state_set(ns, key, value, version))
        return done
