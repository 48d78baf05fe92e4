"""The rosters of a node of several workers (core/peer_presence.py): each worker's members and counters seen
from every other, oldest first; a worker that joins later is told them; a worker gone leaves them."""

from __future__ import annotations

import asyncio

from hubbub.core.notices import GONE, Notices
from hubbub.core.peer_presence import PeerPresence

from .notice_mesh import deliver, mesh


def test_every_workers_members_from_every_worker() -> None:
    async def main() -> None:
        procs, sent = mesh(2)
        deliver(procs, sent)
        p0, p1 = PeerPresence(procs[0]), PeerPresence(procs[1])
        p0.join("r", "a", {"u": "x"})
        p1.join("r", "b", {"u": "y"})
        p0.join("r", "c", {"u": "z"})
        p0.add("conns", 2)
        p1.add("conns")
        deliver(procs, sent)
        for p in (p0, p1):
            assert [(m.key, m.fields["u"], m.node) for m in await p.members("r")] == [
                ("a", "x", "0"),
                ("b", "y", "1"),
                ("c", "z", "0"),
            ]
            assert await p.count("r") == 3 and await p.total("conns") == 3
            assert p.statistics() == {"rosters": 1, "members": 3}
        p1.leave("r", "b")
        p0.join("r", "a", {"u": "x2"})  # new fields, same place
        deliver(procs, sent)
        assert [(m.key, m.fields["u"]) for m in await p1.members("r")] == [("a", "x2"), ("c", "z")]
        # A worker that joins later is told everything; one gone leaves every roster and counter.
        procs.append(Notices())
        procs[2].connect(lambda topic, data: sent.append((2, topic, data)), "2", "inc2")
        p2 = PeerPresence(procs[2])
        deliver(procs, sent)
        assert [m.key for m in await p2.members("r")] == ["a", "c"] and await p2.total("conns") == 3
        procs[2].received(GONE, b"0")
        assert await p2.members("r") == [] and await p2.total("conns") == 1

    asyncio.run(main())
