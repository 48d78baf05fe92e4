"""The WearScript dialect's codec, hub state and connection state machine (protocols/wearscript.md)."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hubbub.channels import parse_pattern
from hubbub.dialects import wearscript as ws
from hubbub.events import Event, Publisher
from tests.hypothesis_budget import examples


def frame(*items: Any) -> bytes:
    out: bytes = msgpack.packb(list(items), use_bin_type=True)
    return out


def lenient(data: bytes) -> Any:
    """Decode as the dialect does: raw and str alike, ext as bytes."""
    return msgpack.unpackb(
        data,
        raw=False,
        unicode_errors="surrogateescape",
        strict_map_key=False,
        ext_hook=lambda c, d: bytes(d),
    )


def unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False)


# -- §2 matching ---------------------------------------------------------------------------------------------

TABLE = [
    ("", "a", False),
    ("", "", True),
    ("a", "a", True),
    ("a", "a:b", True),
    ("b", "a:b", False),
    ("a:", "a", False),
    ("a:", "a:b", False),
    ("a:", "a::b", True),
    ("a:b", "a", False),
    ("a:b", "a:b", True),
    ("a:b", "a:bc", False),
    ("a:b", "a:b:c", True),
]


@pytest.mark.parametrize(("sub", "chan", "expected"), TABLE)
def test_the_matching_table(sub: str, chan: str, expected: bool) -> None:
    assert ws.matches(ws.channel_of(sub), ws.channel_of(chan)) is expected
    hub = ws.WearscriptHub(test_handler=False)
    conn = ws.WearscriptConnection(hub)
    conn.on_binary(frame("subscriptions", "phone:A", [sub]))
    assert hub.matching(ws.channel_of(chan)) == ((conn.id,) if expected else ())


names = st.text(alphabet="ab:", max_size=6)


@given(names, names)
def test_matching_is_the_name_rule(sub: str, chan: str) -> None:
    by_name = chan == sub if sub == "" else chan == sub or chan.startswith(sub + ":")
    assert ws.matches(ws.channel_of(sub), ws.channel_of(chan)) is by_name


def test_listen_patterns_select_what_matches() -> None:
    for sub in ("", "a", "a:", "a:b"):
        pats = [parse_pattern(p) for p in ws.listen_patterns(ws.channel_of(sub))]
        for chan in ("", "a", "a:b", "a::b", "a:bc", "a:b:c", "b"):
            c = ws.channel_of(chan)
            assert any(p.matches(c) for p in pats) is ws.matches(ws.channel_of(sub), c), (sub, chan)


def test_names_and_channels() -> None:
    assert ws.channel_of("a:b:c") == "/a/b/c"
    assert ws.channel_of("") == "/"
    assert ws.channel_of("img/jpeg:x") == "/img%2Fjpeg/x"
    assert ws.name_of("/img%2Fjpeg/x") == "img/jpeg:x"
    assert ws.name_of("/chat/room") == "chat:room"


@pytest.mark.parametrize(
    ("pattern", "name"),
    [("/a/b", "a:b"), ("/a/*/c", "a"), ("/a/b/**", "a:b"), ("/**", ""), ("/", ""), ("/*", "")],
)
def test_advertised_names(pattern: str, name: str) -> None:
    assert ws.advertised_name(parse_pattern(pattern)) == name


# -- §1 frames -----------------------------------------------------------------------------------------------


def test_a_frame_keeps_its_argument_bytes() -> None:
    # A new-spec str8 argument and a map: the stored payload is the arguments exactly as received.
    data = frame("x:y", "s" * 40, {"k": [1, 2.5]}, b"\x00\xff")
    f = ws.decode_frame(data)
    assert f.name == "x:y" and f.args == ("s" * 40, {"k": [1, 2.5]}, b"\x00\xff")
    assert f.args_bytes == b"\x93" + data[1 + 4 :]
    assert unpack(f.args_bytes) == list(f.args)


def test_old_spec_raw_strings_decode_leniently() -> None:
    data = msgpack.packb(["chan", b"\xc3\xa9t\xe9"], use_bin_type=False)  # raw, the last one not UTF-8
    f = ws.decode_frame(data)
    assert f.name == "chan" and f.args[0] == "ét\udce9"
    assert f.args_bytes == b"\x91" + data[6:]


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xc1",  # never used
        msgpack.packb({"a": 1}),
        msgpack.packb([]),
        msgpack.packb([1, 2]),
        msgpack.packb(["a"]) + b"\x01",
        b"\x92\xa1a",  # cut short
        b"\x91" + b"\x91" * 70 + b"\x90",  # element 0 nested too deep
        frame("a", [[[[1]]]])[:-1],
    ],
)
def test_bad_frames_close_1007(data: bytes) -> None:
    with pytest.raises(ws.BadFrame) as caught:
        ws.decode_frame(data)
    assert caught.value.code == 1007


def test_depth_is_limited_to_64() -> None:
    def nested(depth: int) -> Any:
        v: Any = 1
        for _ in range(depth):
            v = [v]
        return v

    ws.decode_frame(frame("a", nested(63)))  # the frame's own array is level 1
    with pytest.raises(ws.BadFrame):
        ws.decode_frame(frame("a", nested(64)))


def test_an_oversized_frame_closes_1009() -> None:
    with pytest.raises(ws.BadFrame) as caught:
        ws.decode_frame(frame("a", "x" * 100), max_frame=64)
    assert caught.value.code == 1009


@given(st.binary(max_size=200))
@settings(max_examples=examples(500))
def test_any_bytes_decode_or_close(data: bytes) -> None:
    try:
        f = ws.decode_frame(data)
    except ws.BadFrame as exc:
        assert exc.code in (1007, 1009)
        return
    assert isinstance(f.name, str)
    assert lenient(f.args_bytes) == list(f.args)


def test_the_hub_packs_old_spec() -> None:
    out = ws.pack(["c" * 40, b"\x00\x01", 1.5, 300])
    assert b"\xd9" not in out and b"\xc4" not in out  # never str8, never bin
    assert out[1:4] == b"\xda\x00\x28"  # raw16 for a 40-byte string
    assert b"\xcb" in out  # float64


msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.text(max_size=40)
    | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=12,
)


@given(st.text(alphabet="abc:", min_size=1, max_size=8), st.lists(msgpack_values, max_size=5))
def test_a_wearscript_event_goes_out_as_it_came(name: str, args: list[Any]) -> None:
    data = ws.pack([name, *args])
    f = ws.decode_frame(data)
    ev = event(ws.channel_of(name), f.args_bytes, ws.CONTENT_TYPE)
    assert ws.render_event(ws.name_of(ev.channel), ev) == data


def event(channel: str, payload: bytes, content_type: str) -> Event:
    return Event(channel, 1, "e0000000", 1, Publisher("native"), payload, content_type)


@pytest.mark.parametrize(
    ("payload", "content_type", "args"),
    [
        (b"hi 5%", "text/plain", ["hi 5%"]),
        (b"\xff\x00", "application/octet-stream", ["\udcff\x00"]),  # raw bytes, read back leniently
        (msgpack.packb([1, "two"]), ws.CONTENT_TYPE, [1, "two"]),
        (msgpack.packb({"k": 1}), ws.CONTENT_TYPE, [{"k": 1}]),
        (b"\xc1", ws.CONTENT_TYPE, ["\udcc1"]),  # not msgpack after all: one raw argument
        (msgpack.packb([1]) + b"\x01", ws.CONTENT_TYPE, ["\udc91\x01\x01"]),
        (b"", "text/plain", [""]),
    ],
)
def test_events_of_other_dialects(payload: bytes, content_type: str, args: list[Any]) -> None:
    out = ws.render_event("chat:room", event("/chat/room", payload, content_type))
    assert b"\xc4" not in out[:2]  # old-spec: no bin header
    got = ws.decode_frame(out)
    assert got.name == "chat:room" and list(got.args) == args


# -- §3 the hub and its connections -------------------------------------------------------------------------


def sends(outs: list[ws.Output]) -> list[Any]:
    return [unpack(o.data) for o in outs if isinstance(o, ws.Send)]


def test_greeting_lists_the_hub_and_the_known_devices() -> None:
    hub = ws.WearscriptHub()
    a = ws.WearscriptConnection(hub)
    assert sends(a.greeting()) == [["subscriptions", "server:0", ["test:server:0"]]]
    a.on_binary(frame("subscriptions", "phone:A", ["chan", "x:y"]))
    a.on_binary(frame("subscriptions", "watch:A", ["w"]))
    a.on_binary(frame("subscriptions", "gone:A", []))
    b = ws.WearscriptConnection(hub)
    b.on_binary(frame("subscriptions", "phone:B", ["b"]))
    c = ws.WearscriptConnection(hub)
    assert sends(c.greeting()) == [
        ["subscriptions", "server:0", ["test:server:0"]],
        ["subscriptions", "phone:A", ["chan", "x:y"]],
        ["subscriptions", "watch:A", ["w"]],
        ["subscriptions", "phone:B", ["b"]],
    ]


def test_subscriptions_are_forwarded_identical_and_replace_the_list() -> None:
    hub = ws.WearscriptHub()
    a, b = ws.WearscriptConnection(hub), ws.WearscriptConnection(hub)
    raw = frame("subscriptions", "phone:A", ["chan", "x:y"])
    outs = a.on_binary(raw)
    assert outs == [ws.ListenChanged(("/chan", "/x/y")), ws.Forward(raw, (b.id,))]
    outs = a.on_binary(frame("subscriptions", "phone:A", ["z"]))
    assert outs[0] == ws.ListenChanged(("/z",))
    assert hub.matching("/chan") == () and hub.matching("/z/1") == (a.id,)
    assert hub.matching("/z", exclude=a.id) == ()


def test_a_connection_speaks_for_several_devices() -> None:
    hub = ws.WearscriptHub()
    a = ws.WearscriptConnection(hub)
    a.on_binary(frame("subscriptions", "phone:A", ["p"]))
    assert a.on_binary(frame("subscriptions", "watch:A", ["w"]))[-1] == ws.ListenChanged(("/p", "/w"))
    assert a.on_binary(frame("subscriptions", "phone:A", []))[-1] == ws.ListenChanged(("/w",))


def test_a_device_named_in_raw_bytes_that_are_not_utf8() -> None:
    # Found by fuzzing: the departure notice of such a device could not be packed.
    hub = ws.WearscriptHub()
    a, b = ws.WearscriptConnection(hub), ws.WearscriptConnection(hub)
    raw = msgpack.packb(["subscriptions", b"ph\xffne:A", [b"x"]], use_bin_type=False)
    assert a.on_binary(raw)[1] == ws.Forward(raw, (b.id,))
    c = ws.WearscriptConnection(hub)
    assert c.greeting()[1] == ws.Send(raw)
    assert [o.data for o in a.on_close() if isinstance(o, ws.Forward)] == [
        msgpack.packb(["subscriptions", b"ph\xffne:A", []], use_bin_type=False)
    ]


def test_departure_notices_in_announcement_order() -> None:
    hub = ws.WearscriptHub()
    a, b = ws.WearscriptConnection(hub), ws.WearscriptConnection(hub)
    a.on_binary(frame("subscriptions", "phone:A", ["p"]))
    a.on_binary(frame("subscriptions", "watch:A", ["w"]))
    outs = a.on_close()
    assert [(unpack(o.data), o.targets) for o in outs if isinstance(o, ws.Forward)] == [
        (["subscriptions", "phone:A", []], (b.id,)),
        (["subscriptions", "watch:A", []], (b.id,)),
    ]
    assert a.on_close() == [] and hub.connections() == [b.id]


@pytest.mark.parametrize(
    "bad",
    [
        frame("subscriptions"),
        frame("subscriptions", "gd"),
        frame("subscriptions", 5, ["a"]),
        frame("subscriptions", "gd", "a"),
        frame("subscriptions", "gd", ["a", 1]),
        frame("subscriptions", "gd", ["\udcff"[:0] + "a", b"b"]),
    ],
)
def test_bad_subscriptions_close_1007(bad: bytes) -> None:
    conn = ws.WearscriptConnection(ws.WearscriptHub())
    (close,) = conn.on_binary(bad)
    assert isinstance(close, ws.Close) and close.code == 1007


def test_too_many_channels_close_1008() -> None:
    hub = ws.WearscriptHub()
    conn = ws.WearscriptConnection(hub, max_channels=3)
    conn.on_binary(frame("subscriptions", "a:1", ["a", "b"]))
    outs = conn.on_binary(frame("subscriptions", "a:2", ["c", "d"]))
    assert len(outs) == 1 and isinstance(outs[0], ws.Close) and outs[0].code == 1008
    assert hub.matching("/c") == () and hub.matching("/a") == (conn.id,)


def test_text_frames_close_1003() -> None:
    out = ws.WearscriptConnection(ws.WearscriptHub()).on_text()[0]
    assert isinstance(out, ws.Close) and out.code == 1003


def test_a_data_message_is_published_with_its_argument_bytes() -> None:
    conn = ws.WearscriptConnection(ws.WearscriptHub())
    raw = frame("x:y", 1, "two")
    assert conn.on_binary(raw) == [ws.Publish("/x/y", b"\x92" + raw[5:])]


# -- §5 the test handler -------------------------------------------------------------------------------------


def asker() -> tuple[ws.WearscriptHub, ws.WearscriptConnection]:
    hub = ws.WearscriptHub()
    conn = ws.WearscriptConnection(hub)
    conn.on_binary(frame("subscriptions", "phone:A", ["resp"]))
    return hub, conn


def reply(conn: ws.WearscriptConnection, *items: Any) -> Any:
    outs = conn.on_binary(frame("test:server:0", *items))
    fwd = [o for o in outs if isinstance(o, ws.Forward)]
    if not fwd:
        return None
    assert fwd[0].targets == (conn.id,)
    return unpack(fwd[0].data)


@pytest.mark.parametrize(
    ("items", "expected"),
    [
        (("group", "resp"), ["resp", "server"]),
        (("device", "resp"), ["resp", "0"]),
        (("groupDevice", "resp"), ["resp", "server:0"]),
        (("channelsInternal", "resp"), ["resp", ["test:server:0"]]),
        (("channelsExternal", "resp"), ["resp", {"phone:A": ["resp"]}]),
        (("channel", "resp", "p1", "p2"), ["resp", "p1:p2"]),
        (("subchannel", "resp", "x"), ["resp", "x:server:0"]),
        (("ackchannel", "resp", "x"), ["resp", "x:ACK"]),
        (("publish", "resp", 1, [2]), ["resp", 1, [2]]),
        (("nonsense", "resp"), None),
        ((5, "resp"), None),
        (("group", 5), None),
        (("group", "nobody"), None),  # nobody listens on the reply channel
    ],
)
def test_test_handler_commands(items: tuple[Any, ...], expected: Any) -> None:
    _, conn = asker()
    assert reply(conn, *items) == expected


def test_exists_asks_the_core() -> None:
    _, conn = asker()
    outs = conn.on_binary(frame("test:server:0", "exists", "resp", "a:b"))
    assert outs == [ws.Exists("/a/b", "resp")]
    fwd = conn.reply_exists("resp", True)
    assert [unpack(o.data) for o in fwd if isinstance(o, ws.Forward)] == [["resp", True]]


def test_subscribe_binds_a_channel_and_changes_the_hub_list() -> None:
    hub, conn = asker()
    assert conn.on_binary(frame("test:server:0", "subscribe", "resp", "ctl")) == [ws.HubListChanged()]
    assert hub.hub_list() == ["ctl", "test:server:0"]
    assert reply(conn, "x") is None  # a frame without a command on a bound channel is ignored
    assert conn.on_binary(frame("ctl:sub", "group", "resp"))  # bound: a control message, not a publish
    assert conn.on_binary(frame("test:server:0", "unsubscribe", "resp", "ctl")) == [ws.HubListChanged()]
    assert conn.on_binary(frame("ctl", "group", "resp")) == [ws.Publish("/ctl", frame("group", "resp"))]


def test_foreign_subscriptions_are_advertised_once() -> None:
    hub = ws.WearscriptHub(hub_channels=["extra"])
    p = parse_pattern("/chat/*/x")
    assert hub.foreign_added(p) is True
    assert hub.foreign_added(parse_pattern("/chat/**")) is False
    assert hub.hub_list() == ["chat", "extra", "test:server:0"]
    assert hub.foreign_removed(p) is False
    assert hub.foreign_removed(parse_pattern("/chat/**")) is True
    assert hub.hub_list() == ["extra", "test:server:0"]
    quiet = ws.WearscriptHub(advertise_foreign=False, test_handler=False)
    assert quiet.foreign_added(p) is False and quiet.hub_list() == []


# -- fixes: the root subscription and frame heads ------------------------------------------------------------


def test_the_root_subscription_does_not_match_a_name_starting_with_the_separator() -> None:
    """``""`` is the root ([""]), a segment prefix of ``:a`` (["", "a"]); §2: it matches only ``""``."""
    hub = ws.WearscriptHub(test_handler=False)
    a = ws.WearscriptConnection(hub)
    a.on_binary(frame("subscriptions", "phone:A", [""]))
    assert hub.matching(ws.channel_of(":a")) == ()
    assert hub.matching(ws.channel_of("")) == (a.id,)
    b = ws.WearscriptConnection(hub)
    b.on_binary(frame("subscriptions", "phone:B", [":"]))
    assert hub.matching(ws.channel_of("::x")) == (b.id,)


def _event_of(out: list[ws.Output]) -> Event:
    pub = next(o for o in out if isinstance(o, ws.Publish))
    headers = {ws.HEAD_HEADER: pub.head} if pub.head else {}
    return Event(
        pub.channel, 1, "abcdefgh", 1, Publisher("wearscript"), pub.payload, ws.CONTENT_TYPE, headers
    )


@pytest.mark.parametrize(
    "data",
    [
        msgpack.packb(["n" * 40, 1, "two"], use_bin_type=True),  # a str8 name (new-spec packers)
        b"\xdc\x00\x02" + msgpack.packb("chan") + msgpack.packb([5])[1:],  # a 16-bit array header
        b"\x92\xda\x00\x04chan\x01",  # a str16 name of four bytes
    ],
)
def test_a_frame_head_written_otherwise_still_goes_out_as_it_came(data: bytes) -> None:
    hub = ws.WearscriptHub(test_handler=False)
    conn = ws.WearscriptConnection(hub)
    out = conn.on_binary(data)
    pub = next(o for o in out if isinstance(o, ws.Publish))
    assert pub.head
    ev = _event_of(out)
    assert ws.render_event(ws.name_of(ev.channel), ev) == data


def test_a_usual_frame_keeps_no_head() -> None:
    hub = ws.WearscriptHub(test_handler=False)
    out = ws.WearscriptConnection(hub).on_binary(ws.pack(["chan", 1, "x"]))
    assert next(o for o in out if isinstance(o, ws.Publish)).head == ""


def test_a_head_that_does_not_fit_the_event_is_ignored() -> None:
    ev = Event(
        "/chan", 1, "abcdefgh", 1, Publisher("wearscript"), ws.pack([1]), ws.CONTENT_TYPE,
        {ws.HEAD_HEADER: (b"\x93" + ws.pack("other")).hex()},
    )  # fmt: skip
    assert ws.render_event("chan", ev) == ws.pack(["chan", 1])
    bad = Event("/chan", 1, "abcdefgh", 1, Publisher("wearscript"), ws.pack([1]), ws.CONTENT_TYPE,
                {ws.HEAD_HEADER: "zz"})  # fmt: skip
    assert ws.render_event("chan", bad) == ws.pack(["chan", 1])


def test_close_reasons_are_disconnect_members() -> None:
    from hubbub.disconnect import Disconnect

    hub = ws.WearscriptHub()
    conn = ws.WearscriptConnection(hub)
    (close,) = conn.on_binary(b"\xc1")
    assert isinstance(close, ws.Close) and close.code is Disconnect.INVALID_PAYLOAD
    assert conn.on_text() == [ws.Close(Disconnect.UNSUPPORTED_DATA, "text frames are not WearScript")]


# -- properties of the connection state machine -------------------------------------------------------------


def _wide(items: list[Any]) -> bytes:
    """The frame with a 16-bit array header and str16 strings at the top level (a packer that does not pick
    the smallest forms)."""
    out = b"\xdc" + len(items).to_bytes(2, "big")
    for x in items:
        if isinstance(x, str):
            b = x.encode()
            out += b"\xda" + len(b).to_bytes(2, "big") + b
        else:
            out += msgpack.packb(x, use_bin_type=True)
    return out


@given(
    st.text(alphabet=st.sampled_from("ab:%/é\x01"), min_size=1, max_size=40),
    st.lists(msgpack_values, max_size=20),
    st.sampled_from(["old", "new", "wide"]),
)
@settings(max_examples=examples(300))
def test_every_published_frame_goes_out_byte_identical(name: str, args: list[Any], style: str) -> None:
    """Whatever packer a peer uses, a data message is rendered back to the very frame that came in: the
    Publish output, stored as an event, renders to it (mapping.md §5.2)."""
    items = [name, *args]
    data = _wide(items) if style == "wide" else msgpack.packb(items, use_bin_type=style == "new")
    out = ws.WearscriptConnection(ws.WearscriptHub(test_handler=False)).on_binary(data)
    (pub,) = out
    assert isinstance(pub, ws.Publish) and pub.channel == ws.channel_of(name)
    headers = {ws.HEAD_HEADER: pub.head} if pub.head else {}
    ev = Event(pub.channel, 1, "e0000000", 1, Publisher("wearscript"), pub.payload, ws.CONTENT_TYPE, headers)
    assert ws.render_event(ws.name_of(ev.channel), ev) == data


lists_of_names = st.lists(st.text(alphabet="ab:", max_size=4), max_size=4)


@given(
    st.lists(
        st.tuples(st.integers(0, 2), st.sampled_from(["d:0", "d:1"]), lists_of_names),
        max_size=12,
    ),
    st.text(alphabet="ab:", max_size=5),
)
def test_matching_follows_the_announced_lists(steps: list[tuple[int, str, list[str]]], chan: str) -> None:
    """After any announcements, a connection matches a channel exactly when a name in the union of its
    devices' current lists matches it (§2, §3), and the forwarded frames reach only the others."""
    hub = ws.WearscriptHub(test_handler=False)
    conns = [ws.WearscriptConnection(hub) for _ in range(3)]
    lists: dict[int, dict[str, list[str]]] = {c.id: {} for c in conns}
    for i, gd, names in steps:
        outs = conns[i].on_binary(frame("subscriptions", gd, names))
        fwd = [o for o in outs if isinstance(o, ws.Forward)]
        assert [o.targets for o in fwd] == [tuple(c.id for c in conns if c is not conns[i])]
        if names:
            lists[conns[i].id][gd] = names
        else:
            lists[conns[i].id].pop(gd, None)
    c = ws.channel_of(chan)
    want = tuple(
        cid
        for cid, devices in lists.items()
        if any(ws.matches(ws.channel_of(n), c) for ns in devices.values() for n in ns)
    )
    assert hub.matching(c) == want
