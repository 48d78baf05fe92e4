"""``LiveFanOut.fan_out_committed`` asks the router once for a burst of events that match nothing
(same channel and tags, one after the other), and again as soon as a fan-out ran (whose callbacks may have
subscribed someone)."""

from __future__ import annotations

from typing import Any

from hubbub.core.batcher import _Completion
from hubbub.core.live import LiveFanOut
from hubbub.events import Event, Publisher
from hubbub.log.appended import Committed
from hubbub.log.base import AppendResult, EventRun


class _Router:
    def __init__(self) -> None:
        self.subs: dict[str, tuple[str, ...]] = {"/b": ("S",)}
        self.asked: list[str] = []

    def match(self, channel: str, tags: Any = ()) -> tuple[str, ...]:
        self.asked.append(channel)
        return self.subs.get(channel, ())


class _FanOut:
    def __init__(self, router: _Router) -> None:
        self.router = router
        self.got: list[tuple[tuple[str, ...], list[str]]] = []
        self.seqs: list[list[int]] = []
        self.grouped = 0

    def fan_out(self, ev: Event, origin: Any) -> None:
        self.fan_out_run(self.router.match(ev.channel, ev.tags), [ev], origin)

    def fan_out_run(
        self, subs: tuple[str, ...], run: list[Event], origin: Any, runs: list[EventRun] | None = None
    ) -> None:
        self.got.append((subs, [e.channel for e in run]))
        self.seqs.append([e.seq for e in run])
        if runs is not None:  # given: they are the run's events, grouped
            assert [e for r in runs for e in r.events()] == run
            self.grouped += 1
        # A callback subscribes someone to /none (as a guble catch-up may change subscriptions).
        self.router.subs["/none"] = ("T",)


def _ev(channel: str, seq: int, tags: tuple[str, ...] = ()) -> AppendResult:
    return AppendResult(Event(channel, seq, "e", 1, Publisher("native"), b"p", "x/y", {}, tags))


def test_an_unmatched_burst_asks_once_and_a_fan_out_asks_again() -> None:
    router = _Router()
    fan = _FanOut(router)
    reg = LiveFanOut(router, set(), fan, {})  # type: ignore[arg-type]  # fakes of Router and FanOut
    router.subs["/c"] = ("S2",)
    results: list[Committed] = [
        _ev("/none", 1),
        _ev("/none", 2),
        _ev("/none", 3, ("t",)),  # other tags: asked again
        _ev("/b", 1),
        _ev("/c", 1),  # other subscribers: the /b run goes out here, and its callback subscribes to /none
        _ev("/none", 4),  # asked again: matched now
        _ev("/none", 5),
    ]
    reg.fan_out_committed([(None, None, 0.0)] * len(results), results)
    assert router.asked[:4] == ["/none", "/none", "/b", "/c"]
    assert router.asked.count("/none") >= 3  # the burst once, the tagged one, and after the fan-out
    assert reg.published == {"native": 7}
    assert fan.got[0] == (("S",), ["/b"])
    assert (("T",), ["/none", "/none"]) in fan.got or (("T",), ["/none"]) in fan.got


def test_a_matched_burst_of_one_publisher_asks_once_and_keeps_its_runs_apart() -> None:
    """Events of one publisher, origin and channel (the same objects, as a commit of one read gives them)
    join their run without a router match each; another origin, other tags, headers or another publisher
    (counted under its own dialect) ask again, and every event goes out once, in order."""
    router = _Router()
    fan = _FanOut(router)
    reg = LiveFanOut(router, set(), fan, {})  # type: ignore[arg-type]  # fakes of Router and FanOut
    pub, other = Publisher("native"), Publisher("mqtt")
    ch = "/b"

    def ev(seq: int, p: Publisher = pub, headers: dict[str, str] | None = None) -> AppendResult:
        return AppendResult(Event(ch, seq, "e", seq, p, b"p", "x/y", headers or {}, ()))

    second = ev(2)
    results: list[Committed] = [
        ev(1),
        second,
        ev(3),
        ev(4, headers={"h": "v"}),
        ev(5),
        ev(6),
        ev(7, other),
        ev(8),
        ev(9),
    ]
    origins = ["A", "A", "A", "A", "A", "B", "B", "B", "B"]
    # One duplicate (not fanned out, not counted) in the middle of the burst.
    results.insert(2, AppendResult(second.event, duplicate=True))
    origins.insert(2, "A")
    # The origins stand in for sessions: only compared.
    reg.fan_out_committed([(o, None, 0.0) for o in origins], results)  # type: ignore[misc]
    # Asked for 1, for 4 (headers), 5 (after headers), 6 (origin B), 7 (publisher), 8 (publisher back).
    assert router.asked == [ch] * 6
    assert fan.got == [(("S",), [ch] * 5), (("S",), [ch] * 4)]
    assert fan.seqs == [[1, 2, 3, 4, 5], [6, 7, 8, 9]]
    assert reg.published == {"native": 8, "mqtt": 1}


def test_a_commit_of_submitted_runs_fans_out_run_by_run() -> None:
    """Publishes submitted as runs (``WriteBatcher.submit_run``, whose items share one completion) fan out
    as the runs they are: one router match each, every event once and in order, counted per dialect; what
    follows the first item that is no run goes event by event."""
    router = _Router()
    fan = _FanOut(router)
    reg = LiveFanOut(router, set(), fan, {})  # type: ignore[arg-type]  # fakes of Router and FanOut
    pub, other = Publisher("native"), Publisher("ivy")
    ch = "/b"

    def ev(seq: int, p: Publisher = pub) -> AppendResult:
        return AppendResult(Event(ch, seq, "e", seq, p, b"%d" % seq, "x/y", {}, ()))

    def run(origin: str, k: int) -> list[Any]:
        return [(origin, _Completion(print, print, k, True), 0.0)] * k

    results: list[Committed] = [*(ev(s) for s in range(1, 8)), ev(8, other), ev(9, other)]
    items = run("A", 3) + run("B", 1) + run("A", 2) + [("C", None, 0.0), *run("A", 2)]
    reg.fan_out_committed(items, results)
    assert fan.seqs == [[1, 2, 3], [4], [5, 6], [7], [8, 9]]
    assert [s for seqs in fan.seqs for s in seqs] == list(range(1, 10))
    assert fan.grouped == 3  # the three leading runs; the rest as before, grouped by the fan-out
    # One match per run; then event by event: 7, 8 (another publisher) and 8 again after 7's fan-out.
    assert router.asked == [ch] * 6
    assert reg.published == {"native": 7, "ivy": 2}

    # A subscription holding: every event goes one by one, as without runs.
    fan.seqs.clear()
    held = LiveFanOut(router, {"S"}, fan, {})  # type: ignore[arg-type]  # fakes of Router and FanOut
    held.fan_out_committed(run("A", 3), [ev(s) for s in range(10, 13)])
    assert fan.seqs == [[10], [11], [12]]
