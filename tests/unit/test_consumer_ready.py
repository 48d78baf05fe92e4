"""A consumer's pending positions (``ConsumerState.fresh`` and ``ready``): whatever order they are added in
(journal order, items given back, out of order), they go out lowest first, each once."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hubbub.core.consumer_state import ConsumerState
from hubbub.events import Event, Publisher
from hubbub.log.consumers import ConsumerInfo, ConsumerSpec, JournalItem


def _state() -> ConsumerState:
    return ConsumerState(ConsumerInfo(1, ConsumerSpec("c", "/a/**"), 0))


def test_journal_order_stays_in_fresh() -> None:
    c = _state()
    for pos in range(1, 6):
        c.add_ready(pos)
    assert list(c.fresh) == [1, 2, 3, 4, 5] and c.ready == []
    assert c.ready_count == 5
    assert [c.pop_ready() for _ in range(5)] == [1, 2, 3, 4, 5]
    assert c.next_ready() is None and c.ready_count == 0


def test_given_back_goes_before_later_positions() -> None:
    c = _state()
    for pos in (10, 11, 12):
        c.add_ready(pos)
    c.add_ready(3)  # an item given back
    c.add_ready(7)
    assert c.ready_count == 5
    assert c.next_ready() == 3
    assert [c.pop_ready() for _ in range(5)] == [3, 7, 10, 11, 12]


# Each step: add a position not pending yet (drawn from a pool), or pop the lowest.
_steps = st.lists(st.one_of(st.integers(1, 60), st.none()), max_size=120)


@given(_steps)
def test_lowest_first_against_a_model(steps: list[int | None]) -> None:
    c = _state()
    model: set[int] = set()
    out: list[int] = []
    for step in steps:
        if step is None:
            if not model:
                assert c.next_ready() is None
                continue
            low = min(model)
            assert c.next_ready() == low
            got = c.pop_ready()
            assert got == low
            model.discard(got)
            out.append(got)
        elif step not in model:
            c.add_ready(step)
            model.add(step)
        assert c.ready_count == len(model)
        assert list(c.fresh) == sorted(c.fresh)
    rest = [c.pop_ready() for _ in range(c.ready_count)]
    assert rest == sorted(model)


def _hold(c: ConsumerState, pos: int, payload: bytes) -> None:
    ev = Event("/a/b", pos, "e", 0, Publisher("native", "u", "", ""), payload, "", {}, ())
    c.items[pos] = JournalItem(pos, ev)
    c.add_ready(pos)


@given(st.booleans())
def test_take_ready_counts_and_bytes(given_back: bool) -> None:
    c = _state()
    for pos in range(10, 20):
        _hold(c, pos, b"x" * 10)
    if given_back:
        _hold(c, 2, b"x" * 10)  # below everything in fresh: goes first
    one = c.items[10].event.size
    out, size = c.take_ready(3, 10**9)
    want = [2, 10, 11] if given_back else [10, 11, 12]
    assert [it.pos for it in out] == want and size == 3 * one
    # A byte limit below one item still takes one; then at most what fits.
    out, size = c.take_ready(100, 1)
    assert len(out) == 1 and size == one
    out, size = c.take_ready(100, 2 * one)
    assert len(out) == 2 and size == 2 * one
    taken = 3 + 1 + 2
    assert c.ready_count == 10 + int(given_back) - taken
    out, _ = c.take_ready(100, 10**9)
    assert [it.pos for it in out] == sorted(it.pos for it in out) and c.ready_count == 0


def test_take_ready_skips_positions_no_longer_held() -> None:
    c = _state()
    for pos in (1, 2, 3):
        _hold(c, pos, b"p")
    del c.items[2]
    _hold(c, 0, b"p")
    del c.items[0]
    out, _ = c.take_ready(10, 10**9)
    assert [it.pos for it in out] == [1, 3]
