"""How the nodes of a cluster share a live exclusive group's events (core/consumer_groups.py ``GroupShares``):
every node decides each event alike from the same roster, by the event's own commit time, so no event goes to
two nodes, and none is missed while the roster is the same everywhere."""

from __future__ import annotations

import asyncio

from hubbub.core import LocalPresence
from hubbub.core.consumer_groups import GroupShares
from hubbub.events import Event, Publisher

S = 1_000_000_000
ROSTER = "consumer.group:g"


def _ev(seq: int, time_ns: int, channel: str = "/a") -> Event:
    return Event(channel, seq, "e", time_ns, Publisher("native"), b"", "text/plain")


def _shares(token: str, settle_s: float = 2.0) -> GroupShares:
    s = GroupShares(LocalPresence(), refresh_s=1.0, settle_s=settle_s)
    s.token = token
    return s


def test_a_group_not_read_yet_takes_nothing_and_alone_takes_everything() -> None:
    a = _shares("a")
    a.joined(ROSTER)
    assert a.pending == 1
    assert not a.mine(ROSTER, _ev(1, 10 * S))
    a.views[ROSTER] = [("a", 1 * S)]
    assert a.pending == 0
    assert all(a.mine(ROSTER, _ev(i, 10 * S)) for i in range(1, 50))


def test_nodes_with_one_roster_split_the_events_between_them() -> None:
    view = [("a", 1 * S), ("b", 2 * S), ("c", 3 * S)]
    nodes = [_shares(t) for t in "abc"]
    for n in nodes:
        n.views[ROSTER] = list(view)
    takers: dict[str, int] = {"a": 0, "b": 0, "c": 0}
    for ch in ("/a", "/b/c", "/x"):
        for seq in range(1, 301):
            who = [n.token for n in nodes if n.mine(ROSTER, _ev(seq, 100 * S, ch))]
            assert len(who) == 1  # exactly one node
            takers[who[0]] += 1
    assert all(n >= 250 for n in takers.values())  # about a third each


def test_a_node_takes_a_share_only_of_events_committed_settle_s_after_it_joined() -> None:
    a, b = _shares("a"), _shares("b")
    # B joined at 10 s; A, alone before, has read the roster with B in it, and B has too.
    for n in (a, b):
        n.views[ROSTER] = [("a", 1 * S), ("b", 10 * S)]
    early = [_ev(seq, 11 * S) for seq in range(1, 20)]  # before B settled: all A's
    assert all(a.mine(ROSTER, e) and not b.mine(ROSTER, e) for e in early)
    late = [_ev(seq, 12 * S + 1) for seq in range(1, 20)]  # after: shared, each to one
    assert all(a.mine(ROSTER, e) != b.mine(ROSTER, e) for e in late)
    assert any(b.mine(ROSTER, e) for e in late)
    # A node that joined and has not read the roster yet takes nothing (another node may hold the group).
    c = _shares("c")
    c.joined(ROSTER)
    assert not any(c.mine(ROSTER, e) for e in late)


def test_while_no_node_has_settled_the_earliest_to_join_takes_every_event() -> None:
    a, b = _shares("a"), _shares("b")
    for n in (a, b):
        n.views[ROSTER] = [("b", 5 * S), ("a", 6 * S)]
    events = [_ev(seq, 6 * S) for seq in range(1, 20)]
    assert all(b.mine(ROSTER, e) and not a.mine(ROSTER, e) for e in events)


def test_the_refresh_reads_the_roster_and_keeps_this_node_in_it() -> None:
    async def main() -> None:
        presence = LocalPresence("n1")
        s = GroupShares(presence, refresh_s=0.01)
        s.joined(ROSTER)
        task = asyncio.ensure_future(s.run())
        try:
            for _ in range(500):
                if not s.pending:
                    break
                await asyncio.sleep(0.01)  # polling the refresh task
            view = s.views[ROSTER]
            assert view is not None and [t for t, _ in view] == [s.token]
            s.left(ROSTER)
            assert ROSTER not in s.views and not await presence.members(ROSTER)
        finally:
            task.cancel()

    asyncio.run(main())
