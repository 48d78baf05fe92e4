"""The run encoding of a multi-worker node's appends, results and broadcasts (``workers/frames.py``) under
hypothesis: any batch of requests, any commit's results (new events at the store's consecutive seqs and
times, journaled ones, duplicates) and any events come back equal through a real message, whatever runs
they make."""

from __future__ import annotations

import pickle
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from hubbub.events import Event, Publisher
from hubbub.log import MemoryLogStore
from hubbub.log.appended import expand_runs
from hubbub.log.base import AppendRequest, AppendResult, AppendRun
from hubbub.workers.frames import (
    Publishers,
    encode,
    pack_events,
    pack_requests,
    pack_results,
    unpack_appends,
    unpack_events,
    unpack_requests,
    unpack_results,
)
from hubbub.workers.owner import new_events
from tests.hypothesis_budget import examples

PUBS = [
    Publisher("native", "alice", "app", ""),
    Publisher("mist", "bob"),
    Publisher("native", "alice", "app", "m1"),
]


def _trip(obj: Any) -> Any:
    return pickle.loads(encode(obj)[4:])


requests = st.builds(
    AppendRequest,
    st.sampled_from(["/a", "/b"]),
    st.sampled_from(PUBS),
    st.binary(max_size=4),
    st.sampled_from(["text/plain", "application/json"]),
    st.sampled_from([{}, {}, {"h": "1"}]),
    st.sampled_from([(), (), ("t",)]),
    st.sampled_from(["", "", "", "k1"]),
)


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(requests, max_size=30))
def test_requests_come_back_equal(batch: list[AppendRequest]) -> None:
    assert unpack_requests(_trip(pack_requests(batch)), Publishers()) == batch


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(requests, max_size=30))
def test_requests_come_back_as_runs_for_a_store_that_takes_them(batch: list[AppendRequest]) -> None:
    """The log owner's form for a store that takes runs: the same requests, each run of plain ones as one
    ``AppendRun``, and the number of events its results answer."""
    back, events = unpack_appends(_trip(pack_requests(batch)), Publishers())
    assert events == len(batch)
    assert [r for e in back for r in (e.requests() if isinstance(e, AppendRun) else [e])] == batch
    assert all(e.payloads for e in back if isinstance(e, AppendRun))
    plain = [r for r in batch if not (r.headers or r.tags or r.idem)]
    assert sum(isinstance(e, AppendRun) for e in back) <= len(plain)
    assert not any(isinstance(e, AppendRequest) and not (e.headers or e.tags or e.idem) for e in back)


def _commit(batch: list[AppendRequest], kinds: list[int], t0: int) -> list[AppendResult]:
    """Results as a store makes them: new events at consecutive seqs per channel and consecutive times,
    some journaled; a duplicate (kind 2) is an earlier event of another publisher."""
    tops = {"/a": 10, "/b": 0}
    out = []
    t = t0
    for req, kind in zip(batch, kinds, strict=False):
        if kind == 2:
            orig = Event(req.channel, 1, "e0", 5, PUBS[1], b"orig", "x/y", {"o": "1"}, ("z",))
            out.append(AppendResult(orig, True))
            continue
        tops[req.channel] += 1
        ev = Event(
            req.channel, tops[req.channel], "ep-" + req.channel, t, req.publisher, req.payload,
            req.content_type, dict(req.headers), tuple(req.tags),
        )  # fmt: skip
        t += 1
        out.append(AppendResult(ev, False, ((7, t),) if kind == 1 else ()))
    return out


@settings(max_examples=examples(300), deadline=None)
@given(
    st.lists(requests, max_size=30),
    st.lists(st.sampled_from([0, 0, 0, 1, 2]), max_size=30),
    st.integers(0, 99),
)
def test_results_and_broadcasts_come_back_equal(
    batch: list[AppendRequest], kinds: list[int], t0: int
) -> None:
    kinds = (kinds + [0] * len(batch))[: len(batch)]
    results = _commit(batch, kinds, t0)
    assert unpack_results(_trip(pack_results(results)), batch, Publishers()) == results
    events = [r.event for r in results if not r.duplicate]
    assert unpack_events(_trip(pack_events(events)), Publishers()) == events


@settings(max_examples=examples(300), deadline=None)
@given(
    st.lists(requests, max_size=20),
    st.lists(st.tuples(st.integers(0, 20), st.sampled_from(["/a", "/b"]), st.integers(1, 4)), max_size=3),
    st.lists(st.sampled_from([0, 0, 0, 1, 2]), max_size=40),
    st.integers(0, 99),
)
def test_a_workers_runs_go_and_come_back_as_their_requests(
    batch: list[AppendRequest], runs: list[tuple[int, str, int]], kinds: list[int], t0: int
) -> None:
    """A worker's batch with runs (its store takes them) packs as the batch of the runs' requests would
    (a run may join the plain requests around it; its own list is left alone), the owner reads the same
    requests back, and the results unpack against the runs as against their requests."""
    mixed: list[AppendRequest | AppendRun] = list(batch)
    for at, channel, k in sorted(runs, reverse=True):
        mixed.insert(at, AppendRun(channel, PUBS[0], "text/plain", [b"r%d" % j for j in range(k)]))
    flat = [r for e in mixed for r in (e.requests() if isinstance(e, AppendRun) else [e])]
    lists = [list(e.payloads) for e in mixed if isinstance(e, AppendRun)]
    packed = _trip(pack_requests(mixed))
    assert [list(e.payloads) for e in mixed if isinstance(e, AppendRun)] == lists
    assert unpack_requests(packed, Publishers()) == flat
    back, events = unpack_appends(packed, Publishers())
    assert events == len(flat)
    assert [r for e in back for r in (e.requests() if isinstance(e, AppendRun) else [e])] == flat
    kinds = (kinds + [0] * len(flat))[: len(flat)]
    results = _commit(flat, kinds, t0)
    assert unpack_results(_trip(pack_results(results)), mixed, Publishers()) == results


@settings(max_examples=examples(200), deadline=None)
@given(
    st.lists(requests, max_size=20),
    st.lists(st.tuples(st.integers(0, 20), st.sampled_from(["/a", "/b"]), st.integers(1, 4)), max_size=3),
)
def test_runs_answered_as_runs_travel_as_their_results_and_events(
    batch: list[AppendRequest], runs: list[tuple[int, str, int]]
) -> None:
    """The log owner asks its store through ``append_runs``: a run answered as one (``RunAppended``) packs as
    its results would, one by one, and its events broadcast as they would (``new_events``)."""
    mixed: list[AppendRequest | AppendRun] = list(batch)
    for at, channel, k in sorted(runs, reverse=True):
        mixed.insert(at, AppendRun(channel, PUBS[0], "text/plain", [b"r%d" % j for j in range(k)]))
    store = MemoryLogStore()
    try:
        got = store.append_runs(mixed)
    finally:
        store.close()
    results = expand_runs(got)
    assert unpack_results(_trip(pack_results(got)), mixed, Publishers()) == results
    events = [r.event for r in results if not r.duplicate]
    assert unpack_events(_trip(pack_events(new_events(got))), Publishers()) == events
