"""MQTT's takeover across processes (transports/mqtt_clients.py): two processes' client tables joined by a
notice relay, CONNECTs stamped in a chosen order. The newest CONNECT of a client id wins wherever it is,
whatever order the notices arrive in: exactly one connection stays."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from hubbub.core.api import Notices
from hubbub.disconnect import Disconnect
from hubbub.transports.mqtt_clients import ClientTable, Stamp


@dataclass
class _Session:
    id: str = "s"
    ended: list[Disconnect] = field(default_factory=list)

    def end(self, code: Disconnect) -> None:
        self.ended.append(code)


@dataclass
class _Wire:
    """What the table uses of a connection: its stamp and its session."""

    stamp: Stamp
    session: _Session = field(default_factory=_Session)


def _pair() -> tuple[ClientTable, ClientTable, list[tuple[Notices, str, bytes]]]:
    """Two processes' tables; what each sends is held (``sent``) until the test delivers it."""
    a, b = Notices(), Notices()
    sent: list[tuple[Notices, str, bytes]] = []
    a.connect(lambda topic, data: sent.append((b, topic, data)))
    b.connect(lambda topic, data: sent.append((a, topic, data)))
    return ClientTable(a), ClientTable(b), sent


def _deliver(sent: list[tuple[Notices, str, bytes]]) -> None:
    while sent:
        to, topic, data = sent.pop(0)
        to.received(topic, data)


#: When the running test started: stamps are offsets from it. Taken per test, not at import: a table forgets
#: notices older than REMEMBER_S by the clock, and a test run minutes after collection (xdist) had its
#: stamps forgotten as soon as they were held.
_start: list[int] = [0]


@pytest.fixture(autouse=True)
def _test_start() -> None:
    _start[0] = time.time_ns()


def _register(table: ClientTable, client_id: str, t: int) -> Any:
    """A CONNECT stamped ``t`` ns after the test started, registered unless a newer one was announced first
    (``_take_over``'s rule)."""
    wire = _Wire((_start[0] + t, table.token))
    if table.superseded(client_id, wire.stamp):
        return None
    table.register(client_id, wire, wire.stamp)  # type: ignore[arg-type]  # a fake wire
    return wire


def test_a_newer_connect_elsewhere_closes_the_older_one_and_an_older_notice_closes_nothing() -> None:
    a, b, sent = _pair()
    old = _register(a, "c", 100)
    new = _register(b, "c", 200)
    _deliver(sent)
    assert old.session.ended == [Disconnect.NORMAL]
    assert new.session.ended == []
    assert a.taken_over == 1 and b.taken_over == 0


def test_racing_connects_leave_the_newer_whatever_the_order_of_their_notices() -> None:
    for newer_first in (True, False):
        a, b, sent = _pair()
        # The newer CONNECT (on b) is announced to a before a's own, older CONNECT registers.
        first = _register(b, "c", 200) if newer_first else None
        _deliver(sent)
        older = _register(a, "c", 100)
        if not newer_first:
            first = _register(b, "c", 200)
        _deliver(sent)
        assert first is not None and first.session.ended == []
        # The older either never registered (the notice came first) or was closed by it.
        assert older is None or older.session.ended == [Disconnect.NORMAL]
        assert (older is None) == newer_first


def test_notices_of_other_ids_or_that_do_not_decode_change_nothing() -> None:
    a, b, sent = _pair()
    mine = _register(a, "c", 100)
    _register(b, "other", 200)
    _deliver(sent)
    a._notices.received("mqtt.takeover", b"\xc1 not msgpack")
    a._notices.received("mqtt.takeover", b"\x92\xa1c\x01")  # two items, not three
    assert mine.session.ended == []
    assert not a.superseded("c", mine.stamp)
