"""What a native federation link carries beyond the native protocol (hubbub.federation.wire), and the rules
that use it (forwards_up, arrived)."""

from __future__ import annotations

import msgpack
import pytest

from hubbub.client.protocol import BadInput, ClientProtocol, Received, Welcome
from hubbub.errors import BadFrame
from hubbub.federation import FROM_HEADER, HOPS_HEADER, ORIGIN_HEADER, Origin, arrived, forwards_up
from hubbub.federation import wire as fw

HEADERS = {"k": "v", fw.LINK_ORIGIN: "A e0 9", fw.LINK_HOPS: "A,B"}
EVENT = {
    "op": "event",
    "subs": ["s1"],
    "channel": "/a",
    "seq": 3,
    "epoch": "e1",
    "time": 17,
    "publisher": {"dialect": "ivy", "user": "u", "app": "x", "msg_id": "m"},
    "headers": HEADERS,
    "tags": ["t"],
    "content_type": "text/plain",
    "payload": b"hi",
}


def test_handshake_headers() -> None:
    assert fw.parse_node("site-3") == "site-3"
    assert fw.parse_node("a b") is None and fw.parse_node(None) is None and fw.parse_node("x" * 65) is None
    assert fw.parse_above(None) == () and fw.parse_above("") == ()
    assert fw.parse_above("B, A") == ("B", "A")
    assert fw.parse_above("A,b c") is None
    assert fw.render_above(["B", "A", "B"]) == "A,B"


def test_hop_headers_split_and_join() -> None:
    user, path, pub = fw.parse_link_headers({"k": "v", fw.LINK_ORIGIN: "A e0 9", fw.LINK_HOPS: "A,B"})
    assert user == {"k": "v"} and pub == "" and path is not None
    assert (path.origin, path.hops) == (Origin("A", "e0", 9), ("A", "B"))
    assert path.arrived("C", True) == {ORIGIN_HEADER: "A e0 9", HOPS_HEADER: "A,B,C", FROM_HEADER: "up"}
    assert path.arrived("C", False) == arrived("C", {ORIGIN_HEADER: "A e0 9", HOPS_HEADER: "A,B"}, False)
    for bad in ({fw.LINK_ORIGIN: "A e0 9"}, {fw.LINK_ORIGIN: "A e0 x", fw.LINK_HOPS: "A"},
                {fw.LINK_ORIGIN: "A e0 9", fw.LINK_HOPS: "A,b c"}):  # fmt: skip
        assert fw.parse_link_headers(bad)[1] is None
    out = fw.link_headers(
        {"k": "v"}, {ORIGIN_HEADER: "A e0 9", HOPS_HEADER: "A"}, fw.render_publisher("n", "u", "", "")
    )
    assert out == {
        "k": "v",
        fw.LINK_ORIGIN: "A e0 9",
        fw.LINK_HOPS: "A",
        fw.LINK_PUBLISHER: '["n","u","",""]',
    }
    assert fw.parse_publisher(out[fw.LINK_PUBLISHER]) == ("n", "u", "", "")
    assert fw.parse_publisher('["n","u"]') is None and fw.parse_publisher("nope") is None


def _link_protocol() -> ClientProtocol[str]:
    """A federation link's protocol, past its hello (as transports/federation_link.py makes it)."""
    proto: ClientProtocol[str] = ClientProtocol(
        "msgpack", echo=False, batch=True, event_decoder=fw.decode_event
    )
    proto.hello()
    assert isinstance(proto.receive(msgpack.packb({"op": "reply", "id": 1, "session": "s"}))[0], Welcome)
    return proto


def test_frames_from_above() -> None:
    proto = _link_protocol()
    assert proto.receive(msgpack.packb(EVENT, use_bin_type=True)) == [
        Received(
            fw.LinkEvent("/a", 3, "e1", 17, ("ivy", "u", "x", "m"), "text/plain", b"hi", HEADERS, ("t",))
        )
    ]
    batch = {
        "op": "batch",
        "frames": [
            EVENT,
            {"op": "recovered", "sub": "s1", "replayed": 0},
            {"op": "gap", "sub": "s1", "channel": "/a", "since": {"seq": 1, "epoch": "x"},
             "position": {"seq": 9, "epoch": "y"}, "reason": "epoch"},
            {"op": "error", "id": 7, "code": 4001, "message": "bad request", "temporary": False},
            {"op": "ping"},
            {"op": "pong"},
        ],
    }  # fmt: skip
    kinds = [type(i).__name__ for i in proto.receive(msgpack.packb(batch, use_bin_type=True))]
    assert kinds == ["Received", "Recovered", "GapNotice", "ServerError"]
    assert len(proto.take_outgoing()) == 1  # the pong
    with pytest.raises(BadFrame):
        proto.receive(b"\xc1")
    malformed = [
        {**EVENT, "seq": -1},
        {**EVENT, "headers": {"k": 1}},
        {**EVENT, "payload": 3},
        {"op": "gap", "sub": "s1", "channel": "/a", "reason": "epoch"},  # no position: the link cannot go on
    ]
    for bad in malformed:
        (got,) = proto.receive(msgpack.packb(bad, use_bin_type=True))
        assert isinstance(got, BadInput) and got.error.code == 4000, bad
    assert proto.receive(msgpack.packb([1])) == []
    assert proto.receive(msgpack.packb({"op": "batch", "frames": 3})) == []


def test_what_goes_up() -> None:
    here: dict[str, str] = {}
    from_below = {ORIGIN_HEADER: "C e 1", HOPS_HEADER: "C,B"}
    from_above = {ORIGIN_HEADER: "A e 1", HOPS_HEADER: "A,B", FROM_HEADER: "up"}
    published_below_came_from_above = {ORIGIN_HEADER: "C e 1", HOPS_HEADER: "C,A,B", FROM_HEADER: "up"}
    assert forwards_up("A", here) and forwards_up("A", from_below)
    assert not forwards_up("X", from_above)  # not sideways
    assert not forwards_up("X", published_below_came_from_above)  # B does not know C is below it
    assert forwards_up("X", published_below_came_from_above, {"C"})  # it does: X still needs it
    assert not forwards_up("A", published_below_came_from_above, {"C"})  # but not to a node on its path
