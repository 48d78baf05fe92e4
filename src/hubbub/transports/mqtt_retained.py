"""MQTT retained messages (docs/dialects/mqtt.md "Retained messages"): the log holds them, this index says
where.

A retained PUBLISH is stored in the log as any other, with the pseudo-header ``:mqtt.retain``; the index
keeps, per channel, the position (``seq``, ``epoch``) and commit time of its last retained event with a
payload (one with an empty payload clears the channel's entry [MQTT-3.3.1-10]). The index is a state map of
the log (``mqtt.retained``, :mod:`~.mqtt_store`): every worker of a node and every node of a cluster reads
and writes the same one. An entry is written once its event is committed and before the PUBLISH is
acknowledged, versioned by the event's commit time (:func:`~.mqtt_store.retained_version`), so that writes
arriving in any order (two nodes publishing on one channel) leave the newest event's. A subscription reads
each matching entry's event back from the log (``Core.read_channel``) and sends it with the retain flag; an
entry whose event is gone (trimmed, or the channel reset) is removed then (unless a newer one replaced it).

:func:`read_retained` reads a SUBSCRIBE's retained messages before its filters are registered, and again
once they are (reusing what did not change), so that a retained message committed between the two reads is
not missed: one committed before the filters are registered reaches the client as retained (and may also
come live, from a node that had not delivered it yet), one after comes live only (the second read skips what
was rendered for the connection since the registration, ``MqttConnection.rendered``).

Concurrency contract: everything runs on the event loop thread; the store's reads and writes go through the
core (reader threads, the writer thread).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from hubbub.channels import Pattern
from hubbub.core.api import Core
from hubbub.dialects import mqtt as mq
from hubbub.events import Event

from .mqtt_store import RETAINED, retained_version

__all__ = ["Entry", "RetainedIndex", "RetainedMessage", "read_retained"]

log = logging.getLogger("hubbub.mqtt")

#: Where a channel's retained event is: ``(seq, epoch, time_ns)``.
Entry = tuple[int, str, int]


def _entry(value: str | None) -> Entry | None:
    if value is None:
        return None
    try:
        seq, epoch, t = json.loads(value)
        return int(seq), str(epoch), int(t)
    except (ValueError, TypeError):
        log.warning("mqtt: a retained entry that does not decode: %r", value[:80])
        return None


def _prefix(pattern: Pattern) -> str:
    """The channel prefix every channel ``pattern`` matches starts with (its literal leading segments)."""
    lead: list[str] = []
    for p in pattern.parts:
        if p is None:
            break
        lead.append(p)
    return "/" + "/".join(lead)


class RetainedIndex:
    """Channel → where its retained event is, in the log's ``mqtt.retained`` map; see the module docstring.
    ``count`` is the number of entries as last counted (:meth:`recount`, before each ``/metrics`` scrape)."""

    def __init__(self, node: Core) -> None:
        self.node = node
        self.count = 0

    async def retain(self, ev: Event) -> None:
        """``ev``, a retained publish, is committed: its channel's entry (an empty payload clears it)."""
        value = json.dumps([ev.seq, ev.epoch, ev.time_ns]) if ev.payload else None
        await self.node.state_set(RETAINED, ev.channel, value, retained_version(ev.time_ns))

    async def drop(self, channel: str, entry: Entry) -> None:
        """The event of ``entry`` is gone from the log: forget it (unless a newer one replaced it)."""
        await self.node.state_set(RETAINED, channel, None, retained_version(entry[2], drop=True))

    async def where(self, channel: str) -> Entry | None:
        got = await self.node.state_get(RETAINED, channel)
        return None if got is None else _entry(got[0])

    async def matching(self, patterns: Iterable[Pattern]) -> dict[str, Entry]:
        """The entries on channels any of ``patterns`` matches, in channel order."""
        out: dict[str, Entry] = {}
        for pattern in patterns:
            if pattern.is_exact:
                channel = _prefix(pattern)
                hit = await self.where(channel)
                if hit is not None:
                    out[channel] = hit
                continue
            for channel, value in await self.node.state_list(RETAINED, _prefix(pattern)):
                if channel not in out and pattern.matches(channel) and (hit := _entry(value)) is not None:
                    out[channel] = hit
        return dict(sorted(out.items()))

    async def recount(self) -> None:
        self.count = len(await self.node.state_list(RETAINED, ""))


@dataclass(frozen=True, slots=True)
class RetainedMessage:
    """A channel's retained event as read, and the index entry it was read for."""

    event: Event
    entry: Entry


async def read_retained(
    node: Core,
    index: RetainedIndex,
    filters: Sequence[mq.FilterRequest],
    known: Mapping[str, RetainedMessage] | None = None,
) -> dict[str, RetainedMessage]:
    """The retained messages of ``filters`` (each channel once), read from the log in channel order (those
    of ``known`` whose entry did not change are not read again); an entry whose event is gone is removed."""
    entries = await index.matching(f.pattern for f in filters if f.pattern is not None)
    out: dict[str, RetainedMessage] = {}
    for channel, entry in entries.items():
        if not any(mq.filter_applies(f.topic_filter, channel) for f in filters):
            continue  # the `$` rule: a leading wildcard skips `$` topics
        had = None if known is None else known.get(channel)
        if had is not None and had.entry == entry:
            out[channel] = had
            continue
        seq, epoch, _ = entry
        page = await node.read_channel(channel, since=seq - 1, limit=1, epoch=epoch)
        if not page.events or page.events[0].seq != seq:
            await index.drop(channel, entry)  # trimmed, or the channel was reset
            continue
        out[channel] = RetainedMessage(page.events[0], entry)
    return out
