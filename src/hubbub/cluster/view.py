"""The log as one node of a cluster has delivered it: :class:`ClusterView`.

A subscription's snapshot (the heads a replay runs up to, ARCHITECTURE §4) must agree with the node's live
stream: events up to the snapshot come from the replay, later ones live, each once. On one node that holds
because the node fans out in commit order. In a cluster, the log may hold events of other nodes that this
node has not delivered yet (in flight through Redis, or waiting for a gap to fill): were the snapshot the
log's head, such an event would come twice, in the replay and then live. So the node reads its snapshots
through this view, whose heads are the log's heads **capped at what the node has released**, after a short
wait for the node to catch up with the log (:meth:`OrderedDelivery.position`, the relay's: Redis between
nodes, the owner's sockets between the workers of one node); a pattern's replay, which reads
the log in commit order up to its mark, asks :meth:`ClusterView.delivered` the same of each page's channels
and leaves what the node has not released to the live stream. The view is an
:class:`~hubbub.log.base.EventLog` only: the node reads its snapshots and replays through it
(``Node(view=…)``); the writer, epochs, retention, the consumers' journals and bulk scans use the store
itself.

Concurrency contract: that of :class:`~hubbub.log.base.EventLog`; the capping methods wait (briefly) only on
the node's reader threads.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from hubbub.events import Event
from hubbub.log.base import (
    AppendRequest,
    AppendResult,
    AppendRun,
    ChannelInfo,
    EventLog,
    EventRun,
    LogMark,
    LogPage,
)

from .delivery import OrderedDelivery

__all__ = ["ClusterView"]


class ClusterView(EventLog):
    """``store`` with heads capped at what ``broker``'s node delivered (see the module docstring)."""

    def __init__(self, store: EventLog, broker: OrderedDelivery) -> None:
        self.store = store
        self.broker = broker
        self.engine = store.engine
        self.readonly = store.readonly
        self.inline_append = store.inline_append
        self.inline_append_max = store.inline_append_max
        self.inline_append_max_bytes = store.inline_append_max_bytes
        self.takes_runs = store.takes_runs

    def _cap(self, infos: list[ChannelInfo]) -> list[ChannelInfo]:
        """``infos`` capped at what the node delivered (waiting for all of them at once)."""
        live = [i for i, ci in enumerate(infos) if ci.epoch and ci.top > 0]
        if not live:
            return infos
        tops = self.broker.positions([(infos[i].channel, infos[i].epoch, infos[i].top) for i in live])
        out = list(infos)
        for i, top in zip(live, tops, strict=True):
            ci = infos[i]
            if top < ci.top:
                out[i] = ChannelInfo(ci.channel, ci.epoch, min(ci.first, top + 1), top, ci.top_time)
        return out

    # -- capped -------------------------------------------------------------------------------------------

    def head(self, channel: str) -> ChannelInfo:
        return self._cap([self.store.head(channel)])[0]

    def heads(self, channels: Iterable[str]) -> dict[str, ChannelInfo]:
        found = self.store.heads(channels)
        return dict(zip(found, self._cap(list(found.values())), strict=True))

    def channels(
        self, after: str = "", limit: int = 1000, prefix: str = "", *, include_empty: bool = False
    ) -> list[ChannelInfo]:
        return self._cap(self.store.channels(after, limit, prefix, include_empty=include_empty))

    def delivered(self, wanted: Sequence[tuple[str, str, int]]) -> list[int]:
        return self.broker.positions(wanted)

    # -- as they are --------------------------------------------------------------------------------------

    def log_mark(self) -> LogMark:
        return self.store.log_mark()

    def log_seek(self, time_ns: int) -> int:
        return self.store.log_seek(time_ns)

    def read_log(
        self,
        after_pos: int,
        mark: LogMark,
        limit: int = 1000,
        prefix: str = "",
        *,
        reverse: bool = False,
        max_bytes: int | None = None,
    ) -> LogPage:
        return self.store.read_log(after_pos, mark, limit, prefix, reverse=reverse, max_bytes=max_bytes)

    # The count and census are of the log's rows as read_log gives them (uncapped): what a replay leaves to
    # the live stream it checks itself (delivered, ScanCursor.cut). The store's own, not the default that
    # reads the events through read_log.

    def count_log(
        self,
        after_pos: int,
        mark: LogMark,
        prefix: str = "",
        *,
        from_time: int = 0,
        channel: str | None = None,
    ) -> tuple[int, int]:
        return self.store.count_log(after_pos, mark, prefix, from_time=from_time, channel=channel)

    def log_census(
        self, after_pos: int, mark: LogMark, prefix: str = "", *, from_time: int = 0
    ) -> dict[str, tuple[str, int, int]]:
        return self.store.log_census(after_pos, mark, prefix, from_time=from_time)

    def append(self, batch: Sequence[AppendRequest | AppendRun]) -> list[AppendResult]:
        # Runs reach this only when the store takes them (``takes_runs`` is the store's).
        return self.store.append(batch)  # type: ignore[arg-type]

    def read(
        self,
        channel: str,
        after_seq: int = 0,
        limit: int = 1000,
        from_time: int | None = None,
        to_time: int | None = None,
        *,
        epoch: str | None = None,
    ) -> list[Event]:
        return self.store.read(channel, after_seq, limit, from_time, to_time, epoch=epoch)

    def read_runs(
        self, channel: str, after_seq: int, up_to_seq: int, limit: int = 1000, *, max_bytes: int | None = None
    ) -> list[EventRun]:
        return self.store.read_runs(channel, after_seq, up_to_seq, limit, max_bytes=max_bytes)

    def read_last(self, channel: str, n: int) -> list[Event]:
        return self.store.read_last(channel, n)

    def top_time(self) -> int:
        return self.store.top_time()
