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
    cursor = Cursor({"/a/x": ("E", 4)}, 100)
    gone, new = up.changes(_want("/a/**", "/b", "/c"), cursor, 100, recover=True)
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
    gone, new = up.changes(_want("/a/**", "/b", "/c"), cursor, 100, recover=True)
    assert gone == [] and [t for t, _ in new] == ["/b"] and "from_time" not in new[0][1]  # live only
    up.subscribed(0)
    assert up.synced(_want("/a/**", "/b", "/c"))
    gone, new = up.changes(_want("/b"), cursor, 100, recover=False)
    assert len(gone) == 1 and new == [] and set(up.subs) == {"/b"}


def test_a_cut_replay_gives_no_mark() -> None:
    up = UpstreamSubscriptions()
    up.changes(_want("/a/**"), Cursor({}, 50), 50, recover=True)
    assert up.subscribed(900) == 0
    assert up.recovered(up.subs["/a/**"], more=True) == 0  # the rest comes next round, from the cursor
