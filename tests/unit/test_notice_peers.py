"""The peers of ``core/notices.py``: processes joined by a notice relay learn of each other by their hellos,
a restarted process (same id, new incarnation) replaces the old one, and the carrier's ``gone`` notice
removes one; watchers are told each change once."""

from __future__ import annotations

import asyncio

from hubbub.core.notices import GONE, Notices

from .notice_mesh import deliver, mesh


def test_processes_learn_each_other_and_a_gone_one_leaves() -> None:
    procs, sent = mesh(3)
    told: list[tuple[str, bool]] = []
    procs[0].watch_peers(lambda peer, joined: told.append((peer, joined)))
    deliver(procs, sent)
    assert [p.peers for p in procs] == [["1", "2"], ["0", "2"], ["0", "1"]]
    assert sorted(told) == [("1", True), ("2", True)]
    told.clear()
    procs[0].received(GONE, b"2")
    procs[0].received(GONE, b"2")  # once
    assert procs[0].peers == ["1"] and told == [("2", False)]


def test_a_restarted_process_replaces_the_old_one() -> None:
    procs, sent = mesh(2)
    deliver(procs, sent)
    told: list[tuple[str, bool]] = []
    procs[0].watch_peers(lambda peer, joined: told.append((peer, joined)))
    procs[1] = Notices()
    procs[1].connect(lambda topic, data: sent.append((1, topic, data)), "1", "inc1-again")
    deliver(procs, sent)
    assert told == [("1", False), ("1", True)] and procs[1].peers == ["0"]


def test_without_an_id_there_are_no_peers() -> None:
    a, b = Notices(), Notices()
    a.connect(b.received)
    b.connect(a.received)
    assert a.peers == [] and b.peers == []
    got: list[bytes] = []
    b.watch("t", got.append)
    a.send("t", b"x")
    assert got == [b"x"]


def test_arrivals_reach_their_watchers_until_unwatched() -> None:
    n = Notices()
    seen: list[tuple[str, list[object]]] = []
    unwatch = n.watch_arrivals(lambda p, evs: seen.append((p, list(evs))))
    n.arrived("1", [])
    unwatch()
    n.arrived("1", [])
    assert seen == [("1", [])]


def test_a_question_gets_every_live_peers_answer_and_waits_for_no_gone_one() -> None:
    async def main() -> None:
        procs, sent = mesh(3)
        deliver(procs, sent)
        procs[1].answer("q", lambda data: data + b"1")
        procs[2].answer("q", lambda data: data + b"2")
        asking = asyncio.get_running_loop().create_task(procs[0].ask("q", b"x", 5.0))
        await asyncio.sleep(0)  # the question is sent
        deliver(procs, sent)  # and answered
        assert sorted(await asking) == [b"x1", b"x2"]
        # Process 2 goes before it answers: the asker takes process 1's answer and waits no longer.
        asking = asyncio.get_running_loop().create_task(procs[0].ask("q", b"y", 5.0))
        await asyncio.sleep(0)
        (_, topic, question) = sent.pop()
        procs[1].received(topic, question)
        procs[0].received(GONE, b"2")
        deliver(procs, sent)
        assert await asyncio.wait_for(asking, 5.0) == [b"y1"]

    asyncio.run(main())


def test_a_late_answer_goes_to_the_askers_late_taker_once() -> None:
    async def main() -> None:
        procs, sent = mesh(3)
        deliver(procs, sent)
        procs[1].answer("q", lambda data: data + b"1")
        procs[2].answer("q", lambda data: data + b"2")
        late: list[bytes] = []
        asking = asyncio.get_running_loop().create_task(procs[0].ask("q", b"x", 0.01, late=late.append))
        await asyncio.sleep(0)  # the question is sent, and answered after the wait
        assert await asking == [] and late == []
        (_, topic, question) = sent.pop()
        procs[1].received(topic, question)
        procs[2].received(topic, question)
        answers = sent[:]
        deliver(procs, sent)
        assert sorted(late) == [b"x1", b"x2"]
        for _, t, d in answers:  # an answer repeated counts once; the question is done with
            procs[0].received(t, d)
        assert sorted(late) == [b"x1", b"x2"]
        # A peer gone is waited for no longer (nothing is kept for it); one still there is heard.
        asking = asyncio.get_running_loop().create_task(procs[0].ask("q", b"y", 0.01, late=late.append))
        await asyncio.sleep(0)
        await asking
        (_, topic, question) = sent.pop()
        procs[0].received(GONE, b"2")
        procs[1].received(topic, question)
        deliver(procs, sent)
        assert sorted(late) == [b"x1", b"x2", b"y1"]

    asyncio.run(main())
