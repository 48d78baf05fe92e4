"""guble's receivers as a sans-I/O state machine (dialects/guble_receivers.py): replacement, cancel, the
notices, and a slow consumer's catch-up, without a socket, a loop or a log."""

from __future__ import annotations

from hubbub.dialects import actions
from hubbub.dialects import guble as gc
from hubbub.disconnect import Disconnect


def _state() -> gc.GubleReceivers:
    return gc.GubleReceivers(gc.GubleCodec())


def test_a_second_receive_replaces_the_first_and_cancel_removes_it() -> None:
    st = _state()
    first, old = st.add("/a")
    assert old is None and first.sub_id == "g1" and first.path == "/a"
    second, old = st.add("/a")
    assert old is first and second.sub_id == "g2" and st.receivers == {"/a": second}
    assert not st.subscribed(first) and st.subscribed(second)  # only the path's receiver goes live
    assert st.cancel("/a") is second and st.cancel("/a") is None and not st.receivers


def test_notices() -> None:
    st = _state()
    rec, _ = st.add("/a,b")
    assert st.snapshot_notice(rec, fetch=False, count=0, from_time=None) == b"#subscribed-to /a%2Cb"
    registered = rec.registered_ns
    assert st.snapshot_notice(rec, fetch=True, count=3, from_time=5) == b"#fetch-start /a%2Cb 3"
    assert rec.registered_ns == min(registered, 5)  # a catch-up may reach back to the fetch's start
    assert st.replayed_notices(rec) == [b"#fetch-end /a%2Cb", b"#subscribed-to /a%2Cb"]


def test_discard_only_the_current_receiver() -> None:
    st = _state()
    old, _ = st.add("/a")
    new, _ = st.add("/a")
    assert not st.discard(old) and st.receivers == {"/a": new}
    assert st.discard(new) and not st.receivers


def test_catch_up_drops_live_receivers_and_resubscribes_ancestors_first() -> None:
    st = _state()
    child, _ = st.add("/a/b")
    parent, _ = st.add("/a")
    fetch_only, _ = st.add("/c")  # never live: not part of the catch-up
    assert st.subscribed(child) and st.subscribed(parent)
    st.mark.queued(10, True)
    st.mark.written([b"x"])
    dropped, stop, start = st.drop_live()
    assert {r.channel for r in dropped} == {"/a", "/a/b"} and stop == [] and start
    assert all(r.dropped and not r.live for r in dropped) and not fetch_only.dropped
    assert st.catch_ups == 1
    again, _, start_again = st.drop_live()  # a second overflow joins the catch-up under way
    assert again == [] and not start_again and st.catch_ups == 2
    steps = st.take_pending()
    assert [(old.channel, s.covered) for old, s in steps] == [("/a", False), ("/a/b", True)]
    assert all(s.from_time >= 11 for _, s in steps)
    resub = st.resubscriber(steps[0][0])
    assert resub is not None and resub.catching and st.receivers["/a"] is resub
    assert resub.sub_id in st.catch_up_subs
    st.cancel("/a/b")
    assert st.resubscriber(steps[1][0]) is None  # cancelled meanwhile: not re-subscribed
    assert st.subscribed(resub) and not resub.catching
    assert st.take_pending() == []
    st.end_catch_up()
    _, _, start_next = st.drop_live()
    assert start_next  # the next overflow starts a new catch-up


def test_frames_are_commands_bad_ones_rejected_and_too_large_closes() -> None:
    codec = gc.GubleCodec(max_frame=64)
    frames = gc.GubleFrames(codec, gc.error_text)
    assert frames.receive_frame("+ /a") == [codec.decode("+ /a")]
    assert frames.receive_frame(b"- /a", binary=True) == [codec.decode("- /a")]
    (reject,) = frames.receive_frame("? nope")
    assert isinstance(reject, actions.Reject) and reject.data.startswith(b"!error")
    (close,) = frames.receive_frame("+ /" + "a" * 100)
    assert isinstance(close, actions.Close) and close.code == Disconnect.MESSAGE_TOO_BIG
