"""WearScript's hub across a node's processes (``transports/wearscript_peers.py``) over a test notice relay:
a process that answers a greeting's question for its state after the greeting's wait is still heard."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import TYPE_CHECKING, cast

import msgpack
import pytest

from hubbub.core.notices import ANSWER, ASK, Notices
from hubbub.dialects import wearscript as wsd
from hubbub.transports import wearscript_peers
from hubbub.transports.wearscript_peers import HubPeers

from .notice_mesh import deliver, mesh

if TYPE_CHECKING:
    from hubbub.transports.wearscript import WearscriptService


class _Service:
    """What :class:`HubPeers` uses of a process's WearScript service: its hub, notices and connections."""

    def __init__(self, notices: Notices) -> None:
        self.hub = wsd.WearscriptHub()
        self.node = SimpleNamespace(notices=notices)
        self.wires: dict[int, SimpleNamespace] = {}
        self.pushed: list[list[object]] = []

    def greeted_wire(self) -> None:
        session = SimpleNamespace(push=lambda frame, is_event: self.pushed.append(msgpack.unpackb(frame)))
        self.wires[len(self.wires)] = SimpleNamespace(greeted=True, session=session)

    def hub_list_changed(self) -> None:
        pass


def _peers(svc: _Service) -> HubPeers:
    return HubPeers(cast("WearscriptService", svc))


def test_a_state_answered_after_the_greetings_wait_still_reaches_the_hub(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(wearscript_peers, "SYNC_WAIT_S", 0.01)

    async def main() -> None:
        procs, sent = mesh(2)
        deliver(procs, sent)
        s0, s1 = _Service(procs[0]), _Service(procs[1])
        h0, h1 = _peers(s0), _peers(s1)
        deliver(procs, sent)
        cid, _ = s0.hub.attach()
        s0.hub.announce(cid, "phone:A", ["chan"], 100)
        h0.subscribed(cid)
        sent.clear()  # the announcement is lost on the way (notices are at most once): the question tells it
        s1.greeted_wire()
        syncing = asyncio.get_running_loop().create_task(h1.sync())
        await asyncio.sleep(0)  # the question is sent
        [(sender, topic, question)] = sent
        assert (sender, topic) == (1, ASK)
        sent.clear()
        procs[0].received(topic, question)  # process 0 answers, and the answer is held past the wait
        assert [(i, t) for i, t, _ in sent] == [(0, ANSWER)]
        await asyncio.wait_for(syncing, 5.0)
        assert s1.hub.greeting_frames(s1.hub.attach()[0])[1:] == []  # the greeting went out without it
        deliver(procs, sent)  # the late answer comes
        assert s1.pushed == [[wsd.SUBSCRIPTIONS, "phone:A", ["chan"]]]
        new, _ = s1.hub.attach()
        assert [msgpack.unpackb(f) for f in s1.hub.greeting_frames(new)[1:]] == [
            [wsd.SUBSCRIPTIONS, "phone:A", ["chan"]]
        ]
        h0.close()
        h1.close()

    asyncio.run(main())
