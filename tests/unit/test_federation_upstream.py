"""A federation link's subscriptions upstream (hubbub.federation.upstream), without a connection: what is
asked, what recovers from the cursor, what is refused or asked again live, and when the time mark is due."""

from __future__ import annotations

from hubbub.channels import Pattern, parse_pattern
from hubbub.federation import Cursor
from hubbub.federation.upstream import UpstreamSubscriptions


def _want(*texts: str) -> dict[str, Pattern]:
    return {t: parse_pattern(t) for t in texts}


def test_subscribe_recover_refuse_and_mark() -> None:
    up = UpstreamSubscriptions()
    cursor = Cursor({"/a/x": ("E", 4)}, 100, {"/**": 100})
    gone, new = up.changes(_want("/a/**", "/b", "/c"), cursor)
    frames = dict(new)
    assert gone == [] and up.asking == 3
    assert (
        frames["/a/**"]["since"] == {"/a/x": {"epoch": "E", "seq": 4}} and frames["/a/**"]["from_time"] == 101
    )
    assert frames["/b"]["from_time"] == 101 and "since" not in frames["/b"]
    assert up.subscribed(500) == 0  # /a/** answered; two still asking
    assert up.not_subscribed("/b", 4203)  # too far behind: a gap, asked live next time
    assert not up.not_subscribed("/c", 4101)  # a permission: not asked again on this connection
    assert up.asking == 0 and up.replaying == {"/a/**"}
    assert not up.synced(_want("/a/**", "/b", "/c"))
    assert up.recovered(up.subs["/a/**"], more=False) == 500  # the newest upstream time when subscribing
    gone, new = up.changes(_want("/a/**", "/b", "/c"), cursor)
    assert gone == [] and [t for t, _ in new] == ["/b"] and "from_time" not in new[0][1]  # live only
    up.subscribed(0)
    assert up.synced(_want("/a/**", "/b", "/c"))
    gone, new = up.changes(_want("/b"), cursor)
    assert len(gone) == 1 and new == [] and set(up.subs) == {"/b"}
    # /a/** was withdrawn and /c, refused, is wanted no more: neither is held; /b is, and /** (from before).
    assert set(cursor.owed) == {"/**", "/b"}


def test_a_cut_replay_gives_no_mark() -> None:
    up = UpstreamSubscriptions()
    up.changes(_want("/a/**"), Cursor({}, 50, {"/a/**": 50}))
    assert up.subscribed(900) == 0
    assert up.recovered(up.subs["/a/**"], more=True) == 0  # the rest comes next round, from the cursor


def test_interest_recovers_whenever_it_comes_and_a_pattern_never_held_starts_live_on_new_channels() -> None:
    """No time limit: a held pattern (one subscribed before a restart, say) recovers from the cursor however
    late its interest comes back, its new channels from after the time it is recovered to. A pattern never
    held recovers the channels the cursor has (this node's log of them has no hole) and starts live on the
    others."""
    up = UpstreamSubscriptions()
    cursor = Cursor({"/t/c0": ("E", 7), "/u/x": ("E", 2)}, 100, {"/t/**": 80})
    _, new = up.changes(_want("/t/from-A/**", "/u/**", "/v/**"), cursor)
    frames = dict(new)
    assert frames["/t/from-A/**"] == {
        "op": "subscribe",
        "sub": "s1",
        "pattern": "/t/from-A/**",
        "from_time": 81,
    }
    assert frames["/u/**"]["since"] == {"/u/x": {"epoch": "E", "seq": 2}}
    assert "from_time" not in frames["/u/**"]
    assert frames["/v/**"] == {"op": "subscribe", "sub": "s3", "pattern": "/v/**"}  # live: nothing owed
    assert up.replaying == {"/t/from-A/**", "/u/**"}
    # Held from now: the covered one owed what covers it, the others from the newest time the link knows.
    assert cursor.owed == {"/t/**": 80, "/t/from-A/**": 80, "/u/**": 100, "/v/**": 100}
    # The covering pattern comes back last: it recovers too, its known channels from their positions.
    _, new = up.changes(_want("/t/**", "/u/**", "/v/**"), cursor)
    assert new[0][1]["since"] == {"/t/c0": {"epoch": "E", "seq": 7}} and new[0][1]["from_time"] == 81
    assert "/t/from-A/**" not in cursor.owed  # withdrawn: /t/** covers it now


def test_a_held_pattern_is_owed_from_where_it_last_caught_up_across_reconnects() -> None:
    """A held pattern that has not come back keeps the time it was recovered to, however far the cursor's
    time moves on other patterns and however many connections pass; one caught up on a connection is
    recovered to the cursor's time, which it keeps when the connection ends."""
    cursor = Cursor({}, 100, {"/t/**": 100, "/x/**": 100})
    up = UpstreamSubscriptions()
    up.changes(_want("/x/**"), cursor)  # only /x/** came back
    cursor.caught_up(list(up.subs))
    cursor.last_time = 500  # /x/** events
    assert cursor.owed_from(parse_pattern("/x/**")) == 500 and cursor.owed_from(parse_pattern("/t/a")) == 100
    cursor.interrupted()  # the connection ends; the next one gets /t/** back
    cursor.last_time = 600
    _, new = UpstreamSubscriptions().changes(_want("/x/**", "/t/**"), cursor)
    frames = dict(new)
    assert frames["/t/**"]["from_time"] == 101 and frames["/x/**"]["from_time"] == 501
    again = Cursor.from_json(cursor.to_json())
    assert again.owed == {"/t/**": 100, "/x/**": 500}


def test_a_cursor_keeps_its_patterns_and_an_older_one_holds_everything() -> None:
    cursor = Cursor({"/a": ("E", 1)}, 5, {"/a/**": 3})
    cursor.caught_up(["/a/**", "/b/**"])  # only held ones
    assert cursor.to_json()["patterns"] == {"/a/**": 5}
    again = Cursor.from_json(cursor.to_json())
    assert again.owed_from(parse_pattern("/a/b")) == 5 and again.owed_from(parse_pattern("/b")) is None
    older = Cursor.from_json({"positions": {"/a": ["E", 1]}, "last_time": 5})
    assert older.owed_from(parse_pattern("/b/**")) == 5 and older.owed_from(parse_pattern("/**")) == 5


def test_a_pattern_held_before_the_link_knew_any_upstream_time_is_recovered_from_the_start() -> None:
    """A fresh link (no upstream time yet) holds its first pattern at 0; a cursor saved before that
    pattern's first time mark, with none of its channels' positions, still recovers every channel of it
    (from_time 1) when the pattern comes back after a restart; a pattern never held starts live."""
    up = UpstreamSubscriptions()
    cursor = Cursor()
    _, new = up.changes(_want("/t/**"), cursor)
    assert dict(new)["/t/**"] == {"op": "subscribe", "sub": "s1", "pattern": "/t/**"}  # never held: live
    saved = Cursor.from_json(cursor.to_json())  # saved before any time mark
    assert saved.to_json()["patterns"] == {"/t/**": 0}
    again = UpstreamSubscriptions()
    _, new = again.changes(_want("/t/**", "/x/**"), saved)
    frames = dict(new)
    assert frames["/t/**"]["from_time"] == 1 and "since" not in frames["/t/**"]
    assert "from_time" not in frames["/x/**"] and again.replaying == {"/t/**"}
