"""A committed :class:`~hubbub.log.base.AppendRun` answered as one run, not an event and a result per event.

``LogStore.append`` answers a run with one :class:`~hubbub.log.base.AppendResult` per event, each with its
:class:`~hubbub.events.Event`: building those two objects was the largest single cost of a memory-store
publish (a quarter of the server's CPU in a 1→1 run), although what follows a commit mostly wants the run as a
whole: its fan-out encodes a run's frames from its rows (``EventRun``), and a publisher that asked for no
acknowledgement wants nothing per event. An engine that can (a :class:`RunAppender`) answers
:meth:`~RunAppender.append_runs` with a :class:`RunAppended` for each run whose events no durable consumer
journaled: one object standing in each of the run's places of the result list (the list keeps one entry per
event, so the batcher's items and results stay aligned), from which each result is built only when asked for.

The write batcher (``hubbub.core.batcher``) is the one caller: it hands each run's :class:`RunAppended` to the
publisher's completion as the sequence of results it is, gives the live fan-out the run, and
:func:`expand_runs` to any other consumer of the commit.

Immutable and pure: safe to share between threads.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol, TypeVar, cast, overload, runtime_checkable

from hubbub.events import Event
from hubbub.log.base import AppendRequest, AppendResult, AppendRun, EventRun

__all__ = [
    "Committed",
    "RunAppended",
    "RunAppender",
    "RunEvents",
    "answers_runs",
    "expand_runs",
    "run_results",
]

_T = TypeVar("_T")


class _RunView(Sequence[_T]):
    """A sequence of one value per event of an :class:`EventRun` (``run``), each built when it is read:
    :meth:`_at` builds one, :meth:`_all` all of them in one go."""

    __slots__ = ("run",)

    def __init__(self, run: EventRun) -> None:
        self.run = run

    def __len__(self) -> int:
        return len(self.run.rows)

    def _at(self, i: int) -> _T:
        raise NotImplementedError

    def _all(self) -> list[_T]:
        raise NotImplementedError

    @overload
    def __getitem__(self, i: int) -> _T: ...

    @overload
    def __getitem__(self, i: slice) -> list[_T]: ...

    def __getitem__(self, i: int | slice) -> _T | list[_T]:
        if isinstance(i, slice):
            return self._all()[i]
        n = len(self.run.rows)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("run index out of range")
        return self._at(i)

    def __iter__(self) -> Iterator[_T]:
        return iter(self._all())


class RunEvents(_RunView[Event]):
    """The events of an :class:`EventRun` as a sequence, each built when it is read."""

    __slots__ = ()

    def _at(self, i: int) -> Event:
        p = self.run.proto
        if not i:
            return p  # (the first row is the proto's own: a run of one event builds none)
        t, payload = self.run.rows[i]
        return Event(
            p.channel, p.seq + i, p.epoch, t, p.publisher, payload, p.content_type, p.headers, p.tags
        )

    def _all(self) -> list[Event]:
        return self.run.events()


class RunAppended(_RunView[AppendResult]):
    """The results of one committed :class:`AppendRun`: its events, all new (a run has no idempotency key)
    and journaled for no durable consumer, as one :class:`EventRun` (``run``). As a sequence it is the
    ``AppendResult`` of each of them, in order, built when read."""

    __slots__ = ()

    def _at(self, i: int) -> AppendResult:
        return AppendResult(RunEvents(self.run)._at(i))

    def _all(self) -> list[AppendResult]:
        return self.results()

    def results(self) -> list[AppendResult]:
        """The run's results as ``LogStore.append`` gives them."""
        return list(map(AppendResult, self.run.events()))

    def __repr__(self) -> str:
        p = self.run.proto
        return f"RunAppended({p.channel!r}, seq {p.seq}..{self.run.last_seq})"


#: One place of :meth:`RunAppender.append_runs`'s results.
Committed = AppendResult | RunAppended


def run_results(proto: Event, payloads: list[bytes], as_runs: bool) -> list[Committed]:
    """An engine's results for a committed run of ``payloads`` whose first event is ``proto`` (the others:
    the next seqs, times one nanosecond apart): one :class:`RunAppended` in each of its places, or, unless
    ``as_runs`` (a durable consumer journals them), an ``AppendResult`` per event."""
    t = proto.time_ns
    run = EventRun(proto, list(zip(range(t, t + len(payloads)), payloads, strict=True)))
    if not as_runs:
        return list(map(AppendResult, run.events()))
    out: list[Committed] = [RunAppended(run)]
    return out * len(payloads)


def expand_runs(results: Sequence[Committed]) -> list[AppendResult]:
    """:meth:`RunAppender.append_runs`'s results as ``LogStore.append`` gives them: one result per event."""
    if RunAppended not in set(map(type, results)):
        return cast("list[AppendResult]", results if isinstance(results, list) else list(results))
    out: list[AppendResult] = []
    i, n = 0, len(results)
    while i < n:
        r = results[i]
        if type(r) is RunAppended:
            out += r.results()
            i += len(r)
        else:
            out.append(r)  # type: ignore[arg-type]  # (an AppendResult: the type is checked above)
            i += 1
    return out


@runtime_checkable
class RunAppender(Protocol):
    """An engine that answers runs as runs (see the module docstring)."""

    def append_runs(self, batch: Sequence[AppendRequest | AppendRun]) -> list[AppendResult | RunAppended]:
        """``append(batch)``, one result per event, in order, except that the places of a run whose events no
        durable consumer journaled all hold one :class:`RunAppended` (the same object)."""
        ...


def answers_runs(store: object) -> bool:
    """Whether ``store`` is to be asked through :meth:`RunAppender.append_runs`: it has it, and no class of
    it overrides ``append`` below the one that defines ``append_runs`` (a store that changes ``append``
    without saying how it answers runs, a wrapper or a test's double, is asked through its ``append``)."""
    if not isinstance(store, RunAppender):
        return False
    for cls in type(store).__mro__:
        if "append_runs" in cls.__dict__:
            return True
        if "append" in cls.__dict__:
            return False
    return False
