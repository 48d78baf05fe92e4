"""Fuzz checks of the reply encoders (STYLE.md item 3, turned around: what the server writes, not what it
reads), shared by the atheris targets ``event_renderings``, ``replies_native`` and ``replies_dialects``
(fuzz/atheris_targets.py) and the hypothesis tests (tests/property/test_reply_encoders.py).

Every reply encoder of every dialect that has one (native JSON and msgpack, native HTTP, guble, ivy, mist
2015 and 1.x, WearScript, qpubs, MQTT's PUBLISH) is fed the values a connection hands it: the fields of
decoded commands (commands decoded here from arbitrary frames, and values of the same types drawn
directly), the errors the decoders raise, and events the log can hold, published by any dialect. The only
assertion: it encodes (``bytes``; ``b""`` or ``None`` where the encoder documents "nothing to send"), or
raises the documented error. The documented errors are few:

* native: none. ``encode_error`` leaves out an ``id`` that neither encoding can carry (an integer past 64
  bits from a JSON frame), so an error frame always goes out; the other encoders are given the ids of
  decoded commands (0 .. 2^31-1). ``render_log`` raises ``BadRequest`` (4001) for an unknown format.
* every event renderer of every dialect: none. An event renders, or is ``b""`` where the dialect documents
  it is not sent (mist 2015 TCP: a tag holding ``,`` or a space, docs/dialects/mist.md; MQTT: the root and a
  channel holding U+0000, which have no topic name, docs/dialects/mqtt.md); an MQTT PUBLISH reads back
  whole, to the event's channel and payload.
* guble, ivy, mist, WearScript, qpubs: none.

Values: texts are any Unicode without lone surrogates (no decoder lets one through: every wire text is
UTF-8), integers are unbounded where a decoder can produce them (JSON ids), payloads any bytes, including
JSON and msgpack values of any depth the strategies reach.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import msgpack
import orjson
from hypothesis import strategies as st

from hubbub import channels as chn
from hubbub.dialects import guble as gc
from hubbub.dialects import ivy as ivd
from hubbub.dialects import mist as md
from hubbub.dialects import mqtt as mqd
from hubbub.dialects import mqtt_codec
from hubbub.dialects import native as nc
from hubbub.dialects import qpubs as qpd
from hubbub.dialects import wearscript as wsd
from hubbub.errors import CODES, BadRequest, HubbubError
from hubbub.events import Event, Position, Publisher

__all__ = [
    "EVENT_RENDERERS",
    "check_dialect",
    "check_event",
    "check_guble",
    "check_ivy",
    "check_mist",
    "check_native",
    "check_qpubs",
    "check_wearscript",
    "dialect_cases",
    "events",
    "guble_cases",
    "ivy_cases",
    "mist_cases",
    "native_cases",
    "qpubs_cases",
    "wearscript_cases",
]

JSON_CODEC = nc.NativeCodec("json")
MSGPACK_CODEC = nc.NativeCodec("msgpack")
VERBOSE_CODEC = nc.NativeCodec("json", send_detail=True)
GUBLE = gc.GubleCodec(node_id=3)
IVY = ivd.IvyCodec(large_event_bytes=64)

# -- values -------------------------------------------------------------------------------------------------

#: Texts with the characters that wire formats treat specially (separators, quotes, escapes, line ends).
texts = st.text(max_size=12) | st.sampled_from(
    ["", " ", ",", "\n", "\r\n", "%", ":", "/", '"', "\\", "\x00", "\u2028", "é", "\U0001f600", "a b,c"]
)
#: Integers as a JSON decoder gives them: any size.
big_ints = st.sampled_from(
    [0, -1, 2**31 - 1, 2**31, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63) - 1, 10**40]
) | (st.integers())
u63 = st.integers(0, 2**63 - 1)
u64 = st.integers(0, 2**64 - 1)
request_ids = st.integers(0, 2**31 - 1)
codes = st.sampled_from(sorted(CODES))
positions = st.builds(Position, u63, texts)

_leaves = st.none() | st.booleans() | big_ints | st.floats(allow_nan=True) | texts | st.binary(max_size=8)
#: Anything a decoder could hand on (JSON, msgpack: bytes, big integers, NaN), nested.
any_values = st.recursive(
    _leaves,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=16,
)
#: JSON values as orjson reads them (what qpubs and mist decode): 64-bit integers, finite floats.
_finite = st.floats(allow_nan=False, allow_infinity=False)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | _finite | texts,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=16,
)  # fmt: skip


def _json_payload(v: Any) -> bytes:
    return json.dumps(v, default=lambda b: b.hex(), allow_nan=True).encode()


def _msgpack_payload(v: Any) -> bytes:
    try:
        out: bytes = msgpack.packb(v, use_bin_type=True)
    except (OverflowError, ValueError, TypeError):
        return b"\xc1"  # never used in msgpack: a payload that does not decode
    return out


#: msgpack values no Python value packs to: maps keyed by an array, a map, bin or nil; deep nesting; ext.
_ODD_MSGPACK = [
    b"\x81\x91\x01\x02",
    b"\x81\x80\x01",
    b"\x92\x81\xc4\x01a\x01\x81\xc0\x02",
    b"\x91" * 3000 + b"\xc0",
    b"\x81" * 2000 + b"\xc0" * 2001,
    b"\xc7\x01\x05x",
    b"\xdd\xff\xff\xff\xff",
]

_plain_types = st.sampled_from(["text/plain; charset=utf-8", "application/octet-stream", ""])
_payloads = (
    st.tuples(st.binary(max_size=40), _plain_types)
    | st.tuples(any_values.map(_json_payload), st.just("application/json"))
    | st.tuples(any_values.map(_msgpack_payload), st.sampled_from(["application/msgpack", wsd.CONTENT_TYPE]))
    | st.tuples(st.binary(max_size=40), st.sampled_from(["application/json", "application/msgpack", "x/y;;"]))
    | st.tuples(st.sampled_from(_ODD_MSGPACK), st.sampled_from(["application/msgpack", wsd.CONTENT_TYPE]))
)  # fmt: skip


def _channel(segments: list[str]) -> str:
    try:
        return chn.canonical("/" + "/".join(chn.enc(s) for s in segments))
    except HubbubError:
        return "/fallback"


channels = st.lists(texts, max_size=4).map(_channel) | st.sampled_from(["/", "/mist", "/a/b", "/a:b/c"])
_header_keys = (
    st.sampled_from(
        [
            ":guble.header",
            ":filter.user",
            ":mist.replica",
            ":fed.origin",
            ":fed.hops",
            mqd.QOS_HEADER,
            mqd.RETAIN_HEADER,
            wsd.HEAD_HEADER,
            ":x",
            "k",
        ]
    )
    | texts
)
publishers = st.builds(
    Publisher,
    st.sampled_from(["native", "ivy", "guble", "wearscript", "mist2015", "mist1", "qpubs", "mqtt", ""])
    | texts,
    texts,
    texts,
    texts,
)


@st.composite
def events(draw: st.DrawFn) -> Event:
    """An event as the log holds it: a canonical channel, 63-bit seq, 64-bit time, sorted distinct tags."""
    payload, content_type = draw(_payloads)
    return Event(
        draw(channels),
        draw(u63),
        draw(st.sampled_from(["", "k3j2a9x1"]) | texts),
        draw(u64),
        draw(publishers),
        payload,
        content_type,
        draw(st.dictionaries(_header_keys, texts, max_size=4)),
        tuple(sorted(set(draw(st.lists(texts, max_size=5))))),
    )


# -- event renderings: every dialect ----------------------------------------------------------------------


def _qpubs_item(ev: Event) -> bytes:
    return orjson.dumps(qpd.render_item(ev, "."))


EVENT_RENDERERS: dict[str, Any] = {
    "native.json": lambda ev: JSON_CODEC.encode_event(ev, ("s1", "s2"), replay=True),
    "native.msgpack": lambda ev: MSGPACK_CODEC.encode_event(ev, ["s1"]),
    "native.json.publish_reply": lambda ev: JSON_CODEC.encode_publish_reply(7, ev, True),
    "native.msgpack.publish_reply": lambda ev: MSGPACK_CODEC.encode_publish_reply(7, ev),
    "native.sse": lambda ev: nc.render_sse_event(ev, replay=True),
    "native.http_publish": nc.render_http_publish,
    "native.log.json": lambda ev: nc.render_log(ev.channel, ev.epoch, 1, ev.seq, False, [ev, ev], "json")[0],
    "native.log.jsonl": lambda ev: nc.render_log(ev.channel, ev.epoch, 1, ev.seq, True, [ev], "jsonl")[0],
    "native.log.msgpack": lambda ev: nc.render_log(ev.channel, ev.epoch, 0, 0, False, [ev], "msgpack")[0],
    "guble": GUBLE.render_event,
    "ivy.live": IVY.encode_event,
    "ivy.log": lambda ev: ivd.render_log_line(ev).encode(),
    "wearscript": lambda ev: wsd.render_event(wsd.name_of(ev.channel), ev),
    "mist2015.tcp": md.render_event_tcp,
    "mist2015.ws": md.render_event_ws,
    "mist1": md.render_event,
    "qpubs.item": _qpubs_item,
    "qpubs.qrpc": lambda ev: qpd.render_stream_item("c1", qpd.render_item(ev, "::")),
    "mqtt.qos0": lambda ev: mqd.render_event(ev, 0),
    "mqtt.qos2": lambda ev: mqd.render_event(ev, 2, 65535, retain=True),
}


@dataclass(frozen=True, slots=True)
class _Item:
    """A durable consumer's delivery item, as the native ``deliver`` frame takes it."""

    pos: int
    attempts: int
    event: Event


def check_event(ev: Event) -> None:
    """Every dialect's rendering of ``ev`` encodes (mist 2015 TCP: ``b""`` for a tag it cannot carry)."""
    for name, render in EVENT_RENDERERS.items():
        out = render(ev)
        assert isinstance(out, bytes), (name, out)
        if name == "mist2015.tcp":
            # Nothing to send exactly when no 2015 line can carry the tags (a 2015 client splits on them).
            assert (not out) == (not ev.tags or any("," in t or " " in t for t in ev.tags)), (out, ev.tags)
        if name.startswith("mqtt.") and mqd.channel_topic(ev.channel) is None:
            assert out == b"", out  # the root, and channels holding U+0000, have no topic name
        elif name.startswith("mqtt."):
            # One whole PUBLISH that reads back to the event's topic and payload.
            reader = mqtt_codec.PacketReader(mqtt_codec.MAX_REMAINING)
            reader.feed(out)
            packet = reader.next()
            assert isinstance(packet, mqtt_codec.PublishPacket) and reader.buffered == 0, out
            assert mqd.topic_channel(packet.topic, 1 << 30) == ev.channel or "%2F" in ev.channel, packet
            assert packet.payload == ev.payload
    for codec in (JSON_CODEC, MSGPACK_CODEC):
        assert isinstance(codec.encode_deliver("jobs", 1, [_Item(1, 0, ev), _Item(2**40, 3, ev)]), bytes)


# -- native ------------------------------------------------------------------------------------------------


@st.composite
def native_cases(draw: st.DrawFn) -> tuple[str, bytes, list[Any]]:
    """(encoding, a frame, drawn values for the direct calls)."""
    import fuzz_native  # beside this file: its command-shaped frames

    encoding = draw(st.sampled_from(["json", "msgpack"]))
    frame = draw(fuzz_native.json_frames() if encoding == "json" else fuzz_native.msgpack_frames())
    values = [
        draw(codes | st.integers(0, 5000)),
        draw(st.none() | big_ints),
        draw(texts),
        draw(st.dictionaries(texts, any_values, max_size=3)),
        draw(request_ids),
        draw(st.none() | positions),
        draw(st.none() | u64),
        draw(events()),
        draw(st.lists(u63, max_size=3)),
        draw(st.floats(0.001, 1e6)),
        draw(st.lists(texts, max_size=3)),
    ]
    return encoding, frame, values


def _safe_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """Reply fields as the wiring builds them: JSON and msgpack scalars within 64 bits, no NaN."""
    return json.loads(orjson.dumps(fields, default=lambda _: None).decode()) if _orjson_ok(fields) else {}


def _orjson_ok(v: Any) -> bool:
    try:
        orjson.dumps(v)
    except TypeError:
        return False
    return True


def _reply_to(codec: nc.NativeCodec, cmd: Any) -> list[bytes]:
    """The replies the wiring gives a decoded command, from the command's own fields."""
    out = [codec.encode_error(4300, cmd.id, "internal")] if getattr(cmd, "id", None) is not None else []
    if isinstance(cmd, nc.Hello):
        out.append(codec.encode_hello_reply(cmd.id, "a1b2c3d4e5f60718", cmd.client, 25, 1 << 20, 1024, True))
        out.append(codec.encode_error(4006, cmd.id, supported=[1]))
    elif isinstance(cmd, nc.Subscribe):
        out.append(codec.encode_subscribe_reply(cmd.id, cmd.sub, Position(3, "e"), None))
        out.append(codec.encode_subscribe_reply(cmd.id, cmd.sub, None, 2**64 - 1))
        gap = {"channel": "/a", "since": Position(1, "e"), "position": Position(9, "f"), "reason": "trimmed"}
        out.append(codec.encode_push("gap", sub=cmd.sub, **gap))
        out.append(codec.encode_push("recovered", sub=cmd.sub, replayed=5, position=Position(9, "f")))
    elif isinstance(cmd, nc.Publish):
        ev = Event(
            cmd.channel, 1, "e", 1, Publisher("native"), cmd.payload, cmd.content_type, cmd.headers, cmd.tags
        )
        out.append(codec.encode_publish_reply(cmd.id, ev))
        out.append(codec.encode_event(ev, ["s"]))
    elif isinstance(cmd, nc.PublishBatch):
        n = len(cmd.channels)
        out.append(codec.encode_batch_reply(cmd.id, [1] * n, ["e"] * n, [2] * n, [0] if n else []))
    elif isinstance(cmd, nc.Ping) and cmd.id is not None:
        out.append(codec.encode_push("pong", id=cmd.id))
    elif getattr(cmd, "id", None) is not None:
        out.append(codec.encode_reply(cmd.id, {"user": "u"}))
    return out


def check_native(case: tuple[str, bytes, list[Any]]) -> None:
    """Decoded commands and errors answered, and every encoder given drawn values: bytes every time."""
    encoding, frame, v = case
    codec = JSON_CODEC if encoding == "json" else MSGPACK_CODEC
    out: list[bytes] = []
    try:
        cmd = codec.decode(frame)
    except HubbubError as exc:
        assert exc.code in CODES, exc
        out.append(codec.encode_error(exc.code, exc.request_id, exc.detail))
        out.append(VERBOSE_CODEC.encode_error(exc.code, exc.request_id, exc.detail, row=exc.row))
        out.append(nc.render_http_error(exc.code, exc.detail, send_detail=True)[1])
    else:
        out += _reply_to(codec, cmd)
    code, any_id, detail, fields, rid, pos, top, ev, seqs, interval, subs = v
    for c in (codec, VERBOSE_CODEC):
        out.append(c.encode_error(code, any_id, detail))
    out.append(codec.encode_reply(rid, _safe_fields(fields)))
    out.append(codec.encode_subscribe_reply(rid, detail, pos, top))
    out.append(codec.encode_hello_reply(rid, detail, detail, interval, 1 << 20, 1024, bool(seqs)))
    out += codec.encode_publish_replies(
        [(rid, True), (rid, True), (rid, False)], [_Result(ev, False), _Result(ev, True), _Result(ev, False)]
    )
    out.append(codec.encode_batch_reply(rid, seqs, [detail] * len(seqs), seqs, list(range(len(seqs)))))
    out.append(codec.encode_event(ev, tuple(subs), replay=bool(subs), cache={}))
    out.append(codec.encode_batch(out[-3:]))
    if pos is not None:
        out.append(
            codec.encode_push("gap", sub=detail, channel=ev.channel, since=pos, position=pos, reason=detail)
        )
        out.append(nc.render_sse_gap(ev.channel, detail, pos, pos))
    out.append(nc.render_sse_recovered(len(seqs)))
    out.append(nc.render_http_error(code, detail, send_detail=True, position=pos)[1])
    try:
        nc.render_log(ev.channel, ev.epoch, 0, 0, False, [ev], detail)
    except BadRequest as exc:
        assert exc.code == 4001 and detail not in ("json", "jsonl", "msgpack")
    assert all(isinstance(b, bytes) for b in out), out


@dataclass(frozen=True, slots=True)
class _Result:
    event: Event
    duplicate: bool


# -- guble, ivy --------------------------------------------------------------------------------------------


@st.composite
def guble_cases(draw: st.DrawFn) -> tuple[bytes, list[Any]]:
    import fuzz_guble

    frame = draw(fuzz_guble.commands() | fuzz_guble.mutated() | st.binary(max_size=64))
    return frame, [draw(texts), draw(st.none() | texts), draw(codes), draw(st.floats(0, 4e9))]


def check_guble(case: tuple[bytes, list[Any]]) -> None:
    frame, (text, arg, code, now) = case
    out = [GUBLE.encode_connected(text, text, now), GUBLE.encode_notice(text, arg)]
    out.append(GUBLE.encode_error(HubbubError(text, code=code)))
    try:
        cmd = GUBLE.decode(frame)
    except HubbubError as exc:
        assert exc.code in CODES, exc
        out.append(GUBLE.encode_error(exc))
    else:
        if isinstance(cmd, gc.Send):
            headers = dict(gc.headers_for_send(cmd))
            pub = Publisher("guble", text, cmd.msg_id, "")
            out.append(GUBLE.render_event(Event(cmd.channel, 1, "e", 1, pub, cmd.body, "", headers)))
            out.append(GUBLE.encode_notice("send", cmd.msg_id))
        else:
            out.append(GUBLE.encode_notice("subscribed-to", gc.render_path(getattr(cmd, "channel", "/"))))
    assert all(isinstance(b, bytes) for b in out), out


@st.composite
def ivy_cases(draw: st.DrawFn) -> tuple[str, list[Any]]:
    prefix = draw(st.sampled_from(["@", "+", "-", ":", "#", ""]))
    return prefix + draw(texts), [draw(texts), draw(st.none() | texts), draw(u64)]


def check_ivy(case: tuple[str, list[Any]]) -> None:
    frame, (session, ack, now) = case
    out = [IVY.encode_intro(session, now), IVY.encode_time(ack, now)]
    try:
        cmd = IVY.decode(frame)
    except HubbubError as exc:
        assert exc.code in CODES, exc
        ivd.close_reason(exc)
    else:
        out.append(IVY.encode_time(cmd.ack, now))
        if isinstance(cmd, ivd.Publish):
            out.append(IVY.encode_event(Event(cmd.channel, 1, "e", now, Publisher("ivy"), cmd.payload, "")))
    assert all(isinstance(b, bytes) for b in out), out


# -- mist --------------------------------------------------------------------------------------------------

_tag_sets = st.frozensets(texts, max_size=4)
_registry_cmds = (
    st.builds(md.Register, texts, _tag_sets)
    | st.builds(md.SetTags, texts, _tag_sets)
    | st.builds(md.UnsetTags, texts, _tag_sets)
    | st.builds(md.TokenTags, texts)
    | st.builds(md.Unregister, texts)
)


@st.composite
def mist_cases(draw: st.DrawFn) -> list[Any]:
    return [
        draw(_registry_cmds),
        draw(st.none() | st.booleans() | _tag_sets),
        draw(st.lists(texts, max_size=4)),
        draw(texts),
        draw(st.integers(0, 2**63)),
        draw(codes),
    ]


def check_mist(v: list[Any]) -> None:
    """Registry answers, ``listall``/``who``, refusals and the 1.x reply shape, for both generations."""
    cmd, result, tags, text, n, code = v
    echo = tuple(tags)
    conns: list[Any] = [
        md.Mist2015Connection(),
        md.Mist1Connection(),
        md.Mist2015WsConnection(),
        md.Mist1WsConnection(),
    ]
    out: list[Any] = []
    for conn in conns:
        if hasattr(conn, "reply_registry"):
            out.append(conn.reply_registry(cmd, result))
        out += conn.reply_error(md.Publish("/mist", tuple(tags), b""), HubbubError(text, code=code))
    for conn in conns[1::2]:
        out.append(conn.reply_listall(md.ListAll(echo), tags))
        out.append(conn.reply_who(md.Who(echo), n, n))
    out.append(md.render_reply(text, tags, text, text))
    for o in out:
        assert o is None or isinstance(o, bytes | md.Send | md.Close), o


# -- WearScript, qpubs -------------------------------------------------------------------------------------


@st.composite
def wearscript_cases(draw: st.DrawFn) -> list[Any]:
    return [draw(texts), draw(st.booleans()), draw(st.lists(texts, max_size=3))]


def check_wearscript(v: list[Any]) -> None:
    """The hub's replies to the test handler (on any channel, to connections listening there)."""
    resp, exists, channels_ = v
    hub = wsd.WearscriptHub(hub_channels=["x"])
    conn = wsd.WearscriptConnection(hub, max_frame=4096, max_channels=8)
    for ch in channels_:
        conn.on_binary(msgpack.packb(["subscriptions", "phone:a", [ch, resp]]))
    for out in conn.reply_exists(resp, exists):
        assert isinstance(out, wsd.Forward) and isinstance(out.data, bytes), out
        assert msgpack.unpackb(out.data) == [resp, exists]


@st.composite
def qpubs_cases(draw: st.DrawFn) -> list[Any]:
    return [draw(texts), draw(json_values), draw(texts), draw(texts), draw(st.integers(100, 599))]


def check_qpubs(v: list[Any]) -> None:
    """Emitted values stored, and every qrpc renderer and HTTP reply, for any call id and value."""
    call_id, value, message, code, status = v
    out = [
        qpd.encode_value(value),
        qpd.render_stream_item(call_id, value),
        qpd.render_result(call_id, value),
        qpd.render_error(call_id, qpd.QpubsError(message, code, status)),
        qpd.render_end(call_id),
        orjson.dumps({"ok": False, "error": message}),
    ]
    assert all(isinstance(b, bytes) for b in out), out


# -- the other dialects, one target -----------------------------------------------------------------------

_OTHERS: dict[str, tuple[Any, Any]] = {
    "guble": (guble_cases, check_guble),
    "ivy": (ivy_cases, check_ivy),
    "mist": (mist_cases, check_mist),
    "wearscript": (wearscript_cases, check_wearscript),
    "qpubs": (qpubs_cases, check_qpubs),
}


def dialect_cases() -> st.SearchStrategy[tuple[str, Any]]:
    """(dialect, its case) for guble, ivy, mist, WearScript and qpubs: one fuzz target for the five."""
    return st.one_of([st.tuples(st.just(name), cases()) for name, (cases, _check) in _OTHERS.items()])


def check_dialect(case: tuple[str, Any]) -> None:
    name, value = case
    _OTHERS[name][1](value)
