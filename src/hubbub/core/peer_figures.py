"""The figures of a node's other worker processes, for a scrape that answers for the whole node.

Each process counts in its own memory (``core/stats.py`` ``NodeMetrics``): publishing and delivering pay
nothing for a node of several workers. A scrape asks every other process for its figures (one question
through the node's notices, ``core/notices.py``; the question carries the asker's figures too, so every
process hears every other whichever takes the scrapes) and adds them to its own.

A process that ends (a worker killed or crashed, then restarted by the parent) takes its counters with it,
and the node's sums would fall: Prometheus would read a counter reset, and ``rate()`` the whole of the
others' counts as new. So each process keeps, per process gone (its id and incarnation), that process's
counters as last heard, tells them in every question and answer (each takes the larger of what it kept and
what it is told, series by series), and adds them to the sums: a counter of the node never falls while one
of its processes lives, short of what the process gone counted after it was last heard. The counts of
things (connections, subscriptions, timers) of a process gone are not kept: they are gone with it. At most
:data:`DEPARTED_MAX` processes gone are kept (the oldest forgotten first).

Concurrency contract: event loop thread only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import msgpack

if TYPE_CHECKING:
    from .notices import Notices

__all__ = ["DEPARTED_MAX", "FIGURES_TOPIC", "Figures", "PeerFigures", "add_figures", "label_key", "labels_of"]

#: The question (``core/notices.py``) for a process's figures; question and answer are msgpack
#: ``[id, incarnation, figures, [[id gone, its incarnation, its counters], ...]]``.
FIGURES_TOPIC = "metrics.figures"
#: The most processes gone whose counters are kept.
DEPARTED_MAX = 256

#: Figures that add up across processes: family -> label key (:func:`label_key`) -> value.
Figures = dict[str, dict[str, float]]


def label_key(*labels: str) -> str:
    """One key of a :data:`Figures` family for a series with several labels (a NUL between them)."""
    return "\0".join(labels)


def labels_of(key: str) -> list[str]:
    """The labels :func:`label_key` joined."""
    return key.split("\0")


def add_figures(into: Figures, figures: Mapping[str, Mapping[str, float]]) -> None:
    """Add ``figures`` to ``into``, series by series (``TypeError``/``AttributeError`` for what is none)."""
    for family, values in figures.items():
        mine = into.setdefault(str(family), {})
        for k, v in values.items():
            if not isinstance(v, int | float):
                raise TypeError(f"{family}: {v!r} is no figure")
            mine[str(k)] = mine.get(str(k), 0) + v


def _figures(raw: object) -> Figures:
    out: Figures = {}
    add_figures(out, raw)  # type: ignore[arg-type]  # checked value by value
    return out


class PeerFigures:
    """The other processes' figures (see the module docstring). ``own``: this process's figures;
    ``gauges``: the families that count things now rather than events since the start."""

    def __init__(self, own: Callable[[], Figures], gauges: Callable[[], frozenset[str]]) -> None:
        self._own = own
        self._gauges = gauges
        self._notices: Notices | None = None
        #: The live processes' figures, summed, as the last scrape heard them.
        self._live: Figures = {}
        #: Each live process's counters as last heard: id -> (incarnation, counters).
        self._heard: dict[str, tuple[str, Figures]] = {}
        #: The counters of processes gone, as last heard: (id, incarnation) -> counters, oldest first.
        self._departed: dict[tuple[str, str], Figures] = {}

    def share(self, notices: Notices) -> None:
        """Answer the other processes' questions, and hear of processes gone, through ``notices``."""
        self._notices = notices
        notices.answer(FIGURES_TOPIC, self._answer)
        notices.watch_peers(self._peer)

    async def ask(self) -> None:
        """Ask every other process for its figures (nothing without peers; a process that does not answer
        within the question's wait counts nothing in this scrape, its counters not kept either)."""
        notices = self._notices
        live: Figures = {}
        if notices is not None and notices.peers:
            for answer in await notices.ask(FIGURES_TOPIC, self._message()):
                figures = self._take(answer)
                if figures is not None:
                    add_figures(live, figures)
        self._live = live

    def live(self, family: str) -> dict[str, float]:
        """Family ``family`` of the live processes' figures, summed, as the last :meth:`ask` heard them."""
        return dict(self._live.get(family, {}))

    def summed(self) -> Figures:
        """The live processes' figures as the last :meth:`ask` heard them, plus the kept counters of the
        processes gone."""
        out: Figures = {}
        add_figures(out, self._live)
        for counters in self._departed.values():
            add_figures(out, counters)
        return out

    # -- messages ---------------------------------------------------------------------------------------

    def _message(self) -> bytes:
        notices = self._notices
        assert notices is not None
        departed = [[p, i, f] for (p, i), f in self._departed.items()]
        return bytes(msgpack.packb([notices.me, notices.incarnation, self._own(), departed]))

    def _answer(self, question: bytes) -> bytes:
        self._take(question)
        return self._message()

    def _take(self, data: bytes) -> Figures | None:
        """Keep what another process's message tells; its figures (None: not a message of ours)."""
        try:
            peer, incarnation, raw, departed = msgpack.unpackb(data)
            figures = _figures(raw)
            gone = [((str(p), str(i)), _figures(f)) for p, i, f in departed]
        except (ValueError, TypeError, AttributeError, msgpack.UnpackException):
            return None
        gauges = self._gauges()
        self._heard[str(peer)] = (str(incarnation), {f: v for f, v in figures.items() if f not in gauges})
        for key, counters in gone:
            self._keep(key, counters)
        return figures

    def _peer(self, peer: str, joined: bool) -> None:
        if joined:
            return
        heard = self._heard.pop(peer, None)
        if heard is not None:
            self._keep((peer, heard[0]), heard[1])

    def _keep(self, key: tuple[str, str], counters: Figures) -> None:
        """Keep a process gone's counters: the larger of each series' kept and told values."""
        kept = self._departed.setdefault(key, {})
        for family, values in counters.items():
            mine = kept.setdefault(family, {})
            for k, v in values.items():
                mine[k] = max(mine.get(k, 0), v)
        while len(self._departed) > DEPARTED_MAX:
            del self._departed[next(iter(self._departed))]
