"""The log as one node of a cluster has delivered it: :class:`ClusterView`.

A subscription's snapshot (the heads a replay runs up to, ARCHITECTURE §4) must agree with the node's live
stream: events up to the snapshot come from the replay, later ones live, each once. On one node that holds
because the node fans out in commit order. In a cluster, the log may hold events of other nodes that this
node has not delivered yet (in flight through Redis, or waiting for a gap to fill): were the snapshot the
log's head, such an event would come twice, in the replay and then live. So the node reads its snapshots
through this view, whose heads are the log's heads **capped at what the node has released**, after a short
wait for the node to catch up with the log (:meth:`RedisBroker.position`); a pattern's replay, which reads
the log in commit order up to its mark, asks :meth:`ClusterView.delivered` the same of each page's channels
and leaves what the node has not released to the live stream. Everything else goes to the store as it is.

Concurrency contract: that of :class:`~hubbub.log.base.LogStore`; the capping methods wait (briefly) only on
the node's reader threads.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from hubbub.events import Event
from hubbub.log.base import (
    AppendRequest,
    AppendResult,
    ChannelInfo,
    EventRun,
    LogMark,
    LogPage,
    LogStore,
    RetentionPolicy,
    Row,
    ScanColumns,
    ScanPlan,
    StoreStats,
)
from hubbub.log.consumers import ConsumerInfo, ConsumerSpec, JournalItem, Retry

from .broker import RedisBroker

__all__ = ["ClusterView"]


class ClusterView(LogStore):
    """``store`` with heads capped at what ``broker``'s node delivered (see the module docstring)."""

    def __init__(self, store: LogStore, broker: RedisBroker) -> None:
        self.store = store
        self.broker = broker
        self.engine = store.engine
        self.readonly = store.readonly
        self.inline_append = store.inline_append
        self.inline_settle = store.inline_settle
        self.inline_append_max = store.inline_append_max
        self.inline_append_max_bytes = store.inline_append_max_bytes
        self.shared = store.shared

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

    def append(self, batch: Sequence[AppendRequest]) -> list[AppendResult]:
        return self.store.append(batch)

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

    def read_runs(self, channel: str, after_seq: int, up_to_seq: int, limit: int = 1000) -> list[EventRun]:
        return self.store.read_runs(channel, after_seq, up_to_seq, limit)

    def read_rows(
        self,
        channel: str,
        after_seq: int = 0,
        limit: int = 1000,
        from_time: int | None = None,
        to_time: int | None = None,
        *,
        compact_text: bool = False,
        epoch: str | None = None,
    ) -> tuple[str, list[Row]]:
        return self.store.read_rows(
            channel, after_seq, limit, from_time, to_time, compact_text=compact_text, epoch=epoch
        )

    def scan_plan(self, size: int, from_time: int | None = None, to_time: int | None = None) -> ScanPlan:
        return self.store.scan_plan(size, from_time, to_time)

    def scan_columns(
        self,
        lo_pos: int,
        hi_pos: int,
        *,
        max_time: int,
        bounds: Sequence[tuple[int, int, int]] | None = None,
    ) -> list[ScanColumns]:
        return self.store.scan_columns(lo_pos, hi_pos, max_time=max_time, bounds=bounds)

    def read_last(self, channel: str, n: int) -> list[Event]:
        return self.store.read_last(channel, n)

    def retired_epochs(self, channel: str) -> list[ChannelInfo]:
        return self.store.retired_epochs(channel)

    def top_time(self) -> int:
        return self.store.top_time()

    def reset_channel(self, channel: str) -> ChannelInfo:
        return self.store.reset_channel(channel)

    def new_epochs_on_open(self) -> None:
        self.store.new_epochs_on_open()

    def commits_may_be_lost(self, channel: str, epoch: str) -> bool:
        return self.store.commits_may_be_lost(channel, epoch)

    def apply_retention(self, policy: RetentionPolicy, now_ns: int) -> int:
        return self.store.apply_retention(policy, now_ns)

    def trim(self, channel: str, up_to_seq: int, *, epoch: str | None = None) -> ChannelInfo:
        return self.store.trim(channel, up_to_seq, epoch=epoch)

    def stats(self) -> StoreStats:
        return self.store.stats()

    # Durable consumers live in the shared log as they are: the journal is the store's, on every node.

    def consumer_create(self, spec: ConsumerSpec) -> tuple[ConsumerInfo, bool]:
        return self.store.consumer_create(spec)

    def consumer_delete(self, name: str, consumer_id: int | None = None) -> bool:
        return self.store.consumer_delete(name, consumer_id)

    def consumer_settle(
        self, acked: Sequence[tuple[int, Sequence[int]]], retried: Sequence[Retry] = ()
    ) -> None:
        self.store.consumer_settle(acked, retried)

    def consumers(self) -> list[ConsumerInfo]:
        return self.store.consumers()

    def consumer_items(self, consumer_id: int, after_pos: int = 0, limit: int = 1000) -> list[JournalItem]:
        return self.store.consumer_items(consumer_id, after_pos, limit)

    def consumer_hold(self, consumer_id: int, take: bool = True) -> bool:
        return self.store.consumer_hold(consumer_id, take)

    def close(self) -> None:
        self.store.close()

    def __getattr__(self, name: str) -> Any:
        # Engine-specific extras (statistics, test hooks) of the store; only called for missing attributes.
        if name == "store":
            raise AttributeError(name)
        return getattr(self.store, name)
