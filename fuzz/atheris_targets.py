"""Coverage-guided fuzz targets (atheris/libFuzzer) for every codec and HTTP parser, with a fallback.

Each target takes raw bytes and asserts the STYLE.md item 3 property: the input is accepted, or rejected
with a documented error (a :class:`hubbub.errors.HubbubError` whose code is in :data:`hubbub.errors.CODES`;
for configuration parsers a ``ValueError``). Anything else (another exception, a wrong round trip) is a
crash. The targets reuse the checks of the hypothesis fuzzers beside this file (``fuzz_native.py``,
``fuzz_ivy.py``, ``fuzz_guble.py``).

=================  ==============================================================================
target             what it feeds
=================  ==============================================================================
native_json        ``NativeCodec("json").decode``, as bytes and as text
native_msgpack     ``NativeCodec("msgpack").decode``
native_stream      a raw TCP stream, chunked as the bytes say: ``NativeStreamDecoder`` (and its
                   publish runs against each frame decoded alone)
native_http        the HTTP API's parsers: ``Last-Event-ID``, publish fields (content type, tags,
                   ``Hubbub-Header-*``, idempotency key), route channels and patterns
ivy                ``IvyCodec.decode`` (two limits), ``ivyesc``, the log path, count and Range parsers
guble              ``GubleCodec.decode`` (two limits), header lines, REST publish headers, Go integers
channels           ``canonical``, ``parse_pattern``, separator-dialect names, and pattern matching
client_framing     ``hubbub.client.bulk``'s framing of server bytes (native TCP length prefixes and WebSocket
                   frames), chunked as the bytes say, with two limits
qpubs              ``QrpcConnection.feed`` (auth on and off, a small line limit), listen topics with
                   their patterns, alias queries
mist2015_lines     ``Mist2015Connection`` (auth off and on, small limits) fed the bytes whole and in 7-byte
                   pieces: the same outputs; replies are documented lines; publishes render
mist2015_ws        ``Mist2015WsConnection.receive_frame`` (text and binary): one documented JSON reply,
                   or close 1009
mist1_stream       ``Mist1Connection`` (auth off and on) fed the bytes whole and in 7-byte pieces: the same
                   outputs; every reply is one JSON object and a newline
mist1_ws           ``Mist1WsConnection.receive_frame``: JSON replies with a newline, or close 1009
qrpc_framing       a qrpc byte stream built from the bytes (calls of every handler with good and bad
                   fields, garbage, blank and over-long lines: ``fuzz_qrpc.py``), fed whole, in
                   chunks and byte by byte to ``QrpcConnection`` with the same outputs; every line the
                   server renders decodes as the stock npm qrpc client decodes it
mqtt               raw bytes through the MQTT ``PacketReader``; then an MQTT stream built from the bytes
                   (a CONNECT, packets of every type with good and bad fields, garbage: ``fuzz_mqtt.py``)
                   fed whole, in 7-byte pieces and byte by byte to ``MqttConnection``, answered as the
                   binding does: the same actions; every reply whole server packets; a close is last
wearscript         ``decode_frame`` and a hub with two connections fed the bytes as one frame, then as
                   frames cut at NUL bytes (announcements, data, test-handler commands); a data message
                   renders back to the frame it came in
auth               ``Authenticator.authenticate`` on arbitrary tokens (JWT-shaped or not, HS256 and
                   RS256 keys configured) and ``parse_static_tokens`` on arbitrary JSON
cluster_wire       ``hubbub.cluster.wire.decode`` (messages between the nodes of a cluster), and the
                   re-encoding of what decodes
federation_link    what a federation link parses: frames from the node above through its own
                   ``ClientProtocol`` (msgpack, events by ``federation.wire.decode_event``), whole and as a
                   ``batch``, after the hello; the handshake headers (node id, ids above), the
                   hop headers (origin, hops, publisher) and a saved cursor
http_heads         raw bytes a client sends the HTTP listener, cut into reads at NUL bytes, through its
                   per-socket protocol (``HttpConnection``) and a small application: every answer says
                   ``Server: hubbub`` without versions, a refused request gets exactly ``400 bad request``
ws_client_frames   a client's WebSocket byte stream through the server's ``FrameParser`` (two limits), whole,
                   in 7-byte pieces and byte by byte: the same messages and the same end each way
webhook_responses  what a webhook receiver answers, through the webhooks' ``ResponseReader``, whole and
                   byte by byte (then the end of the connection): the same response or ``BadResponse``
event_renderings   an event the log can hold (any dialect's publisher, payloads of every content type,
                   odd msgpack, pseudo-headers, tags with separators) through every dialect's event
                   encoder: native JSON/msgpack frames, publish replies, deliver items, SSE, log pages;
                   guble, ivy, WearScript, mist 2015 (TCP, WS) and 1.x, qpubs, MQTT (``fuzz_replies.py``)
replies_native     native frames decoded and answered (errors with the ids they carry, past 64 bits
                   included; each command's replies), and every native reply encoder given drawn values
replies_dialects   each input one of: guble frames decoded and answered, notices, ``#connected``, errors of
                   every code; ivy frames decoded and answered (``#<ack>#@…``, the intro, events of
                   publishes); the mist registry answers, ``listall``/``who``, refusals of both
                   generations; the WearScript hub's test-handler replies on any channel; qrpc items,
                   results, errors and ends, and stored qpubs values, for any call id and value
=================  ==============================================================================

The ``event_renderings``, ``replies_native`` and ``replies_dialects`` targets check what the server writes:
the only assertion is "encodes, or raises the documented error" (the documented errors are listed in
``fuzz_replies.py``).

Run one target (corpus in ``fuzz/corpus/<target>/``, crashes written to ``fuzz/crashes/``)::

    python fuzz/atheris_targets.py native_json --seconds 600
    python fuzz/atheris_targets.py all --runs 500 --work /tmp/fuzz-work    # each target in turn (CI)
    python fuzz/atheris_targets.py all --seconds 600 --work /tmp/fuzz-work # the long run, 10 min each

Without atheris (``pip install atheris``; it needs a libFuzzer-capable build) the same targets run under
hypothesis on random bytes, after the corpus. ``tests/property/test_fuzz_targets.py`` replays every corpus
file (the ``regression-*`` files are the crashes found so far) and then runs each target on a fixed number
of inputs (``--runs``: under hypothesis the same inputs on every run, a smoke check that costs the same
CPU on any machine, where a budget in seconds takes what the cores have), with new inputs going to a
scratch directory, so the kept corpus changes only when someone copies inputs in.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import msgpack
import orjson

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus"
CRASHES = HERE / "crashes"

try:
    import atheris
except ImportError:  # the hypothesis fallback below
    atheris = None

#: Modules whose coverage guides the fuzzer: hubbub, its checks beside this file, and PyJWT (token parsing).
#: Not hypothesis, which the checks import and which would only slow the start-up of every run.
INSTRUMENTED = [
    "hubbub",
    "jwt",
    "fuzz_guble",
    "fuzz_http",
    "fuzz_ivy",
    "fuzz_mqtt",
    "fuzz_native",
    "fuzz_qrpc",
    "fuzz_replies",
]

with atheris.instrument_imports(include=INSTRUMENTED) if atheris is not None else contextlib.nullcontext():
    try:
        import hubbub  # noqa: F401
    except ImportError:  # run from a checkout without installing
        sys.path.insert(0, str(HERE.parent / "src"))
    sys.path.insert(0, str(HERE))
    import fuzz_guble
    import fuzz_http
    import fuzz_ivy
    import fuzz_mqtt
    import fuzz_native
    import fuzz_qrpc
    import fuzz_replies

    from hubbub import channels as chn
    from hubbub import federation as fed
    from hubbub.auth import Authenticator, Identity, load_keys, parse_static_tokens
    from hubbub.client import framing as client_framing_mod
    from hubbub.client import positions as client_positions
    from hubbub.client import protocol as client_protocol
    from hubbub.cluster import wire as cw
    from hubbub.dialects import guble as gc
    from hubbub.dialects import mist as md
    from hubbub.dialects import native as nc
    from hubbub.dialects import qpubs as qpd
    from hubbub.dialects import wearscript as wsd
    from hubbub.disconnect import Disconnect
    from hubbub.errors import CODES, HubbubError
    from hubbub.events import Event, Publisher
    from hubbub.federation import wire as fw
    from hubbub.transports import webhook_http as wh

__all__ = ["TARGETS", "main", "replay_corpus", "run_target"]


def _pieces(data: bytes, n: int) -> list[bytes]:
    """``data`` cut at its first ``n - 1`` NUL bytes into ``n`` pieces (missing pieces empty)."""
    parts = data.split(b"\x00", n - 1)
    return parts + [b""] * (n - len(parts))


def _text(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


def _header(line: str) -> tuple[str, str]:
    """A ``name:value`` line as a dialect's header pair (no colon: the whole line, no value)."""
    name, _, value = line.partition(":")
    return name, value


def _documented(exc: HubbubError) -> None:
    assert exc.code in CODES, f"undocumented error code {exc.code}: {exc!r}"


# -- targets ----------------------------------------------------------------------------------------------


def native_json(data: bytes) -> None:
    for name in ("json", "json-small"):
        codec = fuzz_native.CODECS[name]
        fuzz_native.check_decode(codec, data)
        with contextlib.suppress(UnicodeDecodeError):
            fuzz_native.check_decode(codec, data.decode("utf-8"))


def _structured(strategy: Any, check: Callable[[Any], None]) -> Callable[[bytes], None]:
    """A target that turns libFuzzer's bytes into a value of a hypothesis ``strategy`` (hypothesis's
    ``fuzz_one_input``) and checks it: the fuzzer then mutates the *structure* of commands (fields, types,
    nesting, framing), where a target fed raw bytes mostly stops at the JSON or msgpack syntax, which is
    parsed in C and so gives the fuzzer no coverage to learn from."""
    from hypothesis import HealthCheck, given, settings

    @settings(database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(strategy)
    def run(value: Any) -> None:
        check(value)

    fuzz_one: Callable[[bytes], None] = run.hypothesis.fuzz_one_input
    return fuzz_one


def _check_frame(kind_and_frame: tuple[str, bytes]) -> None:
    kind, frame = kind_and_frame
    (native_json if kind == "json" else native_msgpack)(frame)


def _check_stream(chunks_and_limit: tuple[list[bytes], int]) -> None:
    chunks, max_frame = chunks_and_limit
    fuzz_native.check_stream(chunks, max_frame)
    fuzz_native.check_stream_runs(chunks, max_frame)


def native_commands(data: bytes) -> None:
    """Command-shaped native frames, JSON and msgpack, with plausible and implausible fields and byte-level
    mutations (the strategies of fuzz_native.py), through every native codec."""
    global _NATIVE_COMMANDS
    if _NATIVE_COMMANDS is None:
        from hypothesis import strategies as st

        frames = st.tuples(st.just("json"), fuzz_native.json_frames()) | st.tuples(
            st.just("msgpack"), fuzz_native.msgpack_frames()
        )
        _NATIVE_COMMANDS = _structured(frames, _check_frame)
    _NATIVE_COMMANDS(data)


def native_command_streams(data: bytes) -> None:
    """Streams of command-shaped frames (JSON lines or length-prefixed msgpack, publish runs among them)
    split into chunks, through the stream decoder, against each frame decoded alone."""
    global _NATIVE_STREAMS
    if _NATIVE_STREAMS is None:
        _NATIVE_STREAMS = _structured(fuzz_native.stream_inputs(), _check_stream)
    _NATIVE_STREAMS(data)


_NATIVE_COMMANDS: Callable[[bytes], None] | None = None
_NATIVE_STREAMS: Callable[[bytes], None] | None = None


def native_msgpack(data: bytes) -> None:
    for name in ("msgpack", "msgpack-small"):
        fuzz_native.check_decode(fuzz_native.CODECS[name], data)


def native_stream(data: bytes) -> None:
    if not data:
        return
    max_frame = (64, fuzz_native.SMALL_FRAME, 1 << 20)[data[0] % 3]
    body = data[1:]
    # Cut points from the body's own bytes: the chunking changes with the input, as on a real socket.
    cuts = sorted({b * len(body) // 256 for b in body[:8]})
    chunks = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    fuzz_native.check_stream(chunks, max_frame)
    fuzz_native.check_stream_runs(chunks, max_frame)


def native_http(data: bytes) -> None:
    last_id, ctype, tags, headers, idem, path = map(_text, _pieces(data, 6))
    try:
        t, _epoch, seq, channel = nc.parse_sse_last_event_id(last_id)
        assert 0 <= t < 1 << 64 and 0 <= seq < 1 << 64 and chn.is_canonical(channel)
    except HubbubError as exc:
        _documented(exc)
    header_items = [_header(h) for h in headers.split("\n")]
    try:
        nc.http_publish_fields(ctype or None, tags.split("&"), header_items, idem, max_tags=4, max_headers=4)
    except HubbubError as exc:
        _documented(exc)
    for fn in (chn.route_channel, lambda p: chn.parse_pattern("/" + p)):
        try:
            fn(path)
        except HubbubError as exc:
            _documented(exc)


def ivy_target(data: bytes) -> None:
    frame, http, payload = _pieces(data, 3)
    for codec in fuzz_ivy.CODECS.values():
        fuzz_ivy.check_decode(codec, frame)
        with contextlib.suppress(UnicodeDecodeError):
            fuzz_ivy.check_decode(codec, frame.decode("utf-8"))
    fuzz_ivy.check_ivyesc(payload)
    text = _text(http)
    with contextlib.suppress(UnicodeEncodeError):
        text.encode("utf-8")
        fuzz_ivy.check_http(text, len(payload))
        fuzz_ivy.check_at_range(text[:12], [int.from_bytes(payload[:8].ljust(8, b"\0"), "big") % 10**19])


def _go_int(text: str) -> None:
    try:
        n = gc.parse_go_int(text, "Atoi")
    except ValueError as exc:  # Go's error text is the documented rejection
        assert str(exc).startswith("strconv.Atoi: parsing "), exc
        return
    assert -(1 << 63) <= n < 1 << 63, n


def guble_target(data: bytes) -> None:
    frame, line, extra = _pieces(data, 3)
    for codec in fuzz_guble.CODECS.values():
        fuzz_guble.check_decode(codec, frame)
        with contextlib.suppress(UnicodeDecodeError):
            fuzz_guble.check_decode(codec, frame.decode("utf-8"))
    text = _text(line)
    for fn in (
        lambda: gc.header_line_headers(text, 4, 64),
        lambda: _go_int(text),
        lambda: gc.rest_publish_headers(
            [_header(h) for h in _text(extra).split("\n")],
            [("filterUserId", text)],
            4,
            64,
        ),
    ):
        try:
            fn()
        except HubbubError as exc:
            _documented(exc)
        except UnicodeEncodeError:
            pass  # lone surrogates from non-UTF-8 input: a WebSocket text frame or header never has them


def channels_target(data: bytes) -> None:
    path, other = (_text(p) for p in _pieces(data, 2))
    canon: str | None = None
    try:
        canon = chn.canonical(path)
        assert chn.is_canonical(canon), canon
        assert chn.canonical(canon) == canon
    except HubbubError as exc:
        _documented(exc)
    try:
        pat = chn.parse_pattern(other)
        assert chn.parse_pattern(pat.text) == pat, pat
        if canon is not None:
            pat.matches(canon)
    except HubbubError as exc:
        _documented(exc)
    for sep in (":", "."):
        try:
            ch = chn.from_separated(path, sep)
            chn.to_separated(ch, sep)
        except HubbubError as exc:
            _documented(exc)


def _framing_kind(first: int) -> client_framing_mod.FramingKind:
    """Bit 0: WebSocket, else length-prefixed; bit 2: JSON lines instead (the seeds predate lines)."""
    return "lines" if first & 4 else "ws" if first & 1 else "length"


def _chunks(body: bytes) -> list[bytes]:
    """``body`` cut where its first bytes say (the same input in pieces)."""
    cuts = sorted({b * len(body) // 256 for b in body[:8]})
    return [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]


def client_framing(data: bytes) -> None:
    if not data:
        return
    kind, max_frame = _framing_kind(data[0]), (64, 1 << 20)[(data[0] >> 1) & 1]
    body = data[1:]
    whole = client_framing_mod.Framing(kind, max_frame)
    pieces = client_framing_mod.Framing(kind, max_frame)
    try:
        got = whole.feed(body)
    except HubbubError as exc:
        _documented(exc)
        return
    out: list[bytes] = []
    for c in _chunks(body):
        out += pieces.feed(c)  # the same input in pieces: the same messages (no error: whole had none)
    assert all(len(m) <= max_frame + (kind == "lines") for m in got), "a message over the limit"
    assert out == got, "framing depends on chunking"


def _client_protocol(kind: client_framing_mod.FramingKind) -> Any:
    """A native client protocol past its hello, with a subscription ``s1`` and requests 2..4 in flight."""
    codec: Literal["json", "msgpack"] = "json" if kind == "lines" else "msgpack"
    proto: Any = client_protocol.ClientProtocol(codec, client_framing_mod.Framing(kind, 1 << 16))
    proto.hello()
    welcome = {"op": "reply", "id": 1, "session": "x", "limits": {"max_frame": 1 << 16}}
    body = orjson.dumps(welcome) if codec == "json" else msgpack.packb(welcome)
    proto.framing = None
    assert isinstance(proto.receive_data(body)[0], client_protocol.Welcome)
    proto.framing = client_framing_mod.Framing(kind, 1 << 16)
    proto.subscribe("s1", "/**", (), client_positions.SubscriptionPositions(), "sub")
    for token in ("a", "b", "c"):
        proto.request({"op": "ping"}, token)
    return proto


def _comparable(event: Any) -> Any:
    """An event with its error (exceptions compare by identity) as its type, code and text."""
    err = getattr(event, "error", None)
    if err is None:
        return event
    return (type(event).__name__, type(err).__name__, err.code, str(err), getattr(event, "frame", None))


def client_protocol_target(data: bytes) -> None:
    """The native client protocol fed the server's side of a connection: events, or FrameTooLarge/BadFrame
    (documented); the same events whatever the chunking; only requests in flight are answered, once."""
    if not data:
        return
    kind = _framing_kind(data[0])
    body = data[1:]
    whole, pieces = _client_protocol(kind), _client_protocol(kind)
    try:
        got = whole.receive_data(body)
        whole.take_outgoing()
    except HubbubError as exc:
        _documented(exc)
        return
    out: list[Any] = []
    for c in _chunks(body):
        out += pieces.receive_data(c)
    assert list(map(_comparable, out)) == list(map(_comparable, got)), "events depend on chunking"
    answered = [e.token for e in got if isinstance(e, client_protocol.Refused)]
    answered += [t for e in got if isinstance(e, client_protocol.Replies) for t, _ in e.answers]
    assert len(answered) == len(set(answered)) and set(answered) <= {"sub", "a", "b", "c"}, answered
    for e in got:
        if isinstance(e, client_protocol.Delivered):
            assert e.sub == "s1" and isinstance(e.event, Event)


def _rsa_public_pem() -> str:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048).public_key()
    return key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode()


FUZZ_SECRET = "fuzz-secret-of-thirty-two-bytes!"
_AUTH = Authenticator(
    parse_static_tokens({"static-token": {"user": "u", "publish": ["/a/**"]}}),
    load_keys([FUZZ_SECRET, _rsa_public_pem()]),
    leeway=5,
)


def auth_target(data: bytes) -> None:
    token, doc = _pieces(data, 2)
    try:
        ident = _AUTH.authenticate(_text(token))
        assert isinstance(ident, Identity)
    except HubbubError as exc:
        assert exc.code in (4100, 4101, 4103), exc
        if len(token) >= 8:
            assert _text(token) not in str(exc), "the token leaked into the error"
    try:
        table = json.loads(doc)
    except (ValueError, RecursionError):
        return
    if isinstance(table, dict):
        with contextlib.suppress(ValueError):
            parse_static_tokens(table)


def wearscript_target(data: bytes) -> None:
    try:
        f = wsd.decode_frame(data, max_frame=4096)
    except wsd.BadFrame as exc:
        assert exc.code in (1007, 1009), exc.code
    else:
        assert f.args_bytes[:1] and isinstance(f.name, str)
    hub = wsd.WearscriptHub(hub_channels=["x"])
    a = wsd.WearscriptConnection(hub, max_frame=4096, max_channels=8)
    b = wsd.WearscriptConnection(hub, max_frame=4096, max_channels=8)
    for piece in [data, *data.split(b"\x00")]:
        for out in a.on_binary(piece):
            if isinstance(out, wsd.Close):
                assert out.code in (1007, 1008, 1009), out
            elif isinstance(out, wsd.Forward):
                assert set(out.targets) <= {a.id, b.id}
            elif isinstance(out, wsd.Exists):
                a.reply_exists(out.resp, True)
            elif isinstance(out, wsd.Publish):
                # What is published goes out to WearScript connections as it came (mapping.md §5.2).
                headers = {wsd.HEAD_HEADER: out.head} if out.head else {}
                ev = Event(out.channel, 1, "e0000000", 1, Publisher("wearscript"), out.payload,
                           wsd.CONTENT_TYPE, headers)  # fmt: skip
                assert wsd.render_event(wsd.name_of(out.channel), ev) == piece
    a.on_close()
    assert hub.connections() == [b.id]


def _mist_run(conn: Any, pieces: list[bytes]) -> list[Any]:
    """Feed a mist TCP connection, answering each authentication with a grant; all outputs in order."""
    out: list[Any] = []
    for piece in pieces:
        got = conn.receive_data(piece)
        while got:
            out += got
            got = conn.auth_result(md.MistGrant()) if conn.awaiting_auth else []
    return out


def _mist_check_publish(out: Any) -> None:
    assert out.tags and list(out.tags) == sorted(set(out.tags)), out
    ev = Event("/mist", 1, "e0000000", 1, Publisher("mist2015"), out.payload, md.CONTENT_TYPE, {}, out.tags)
    line = md.render_event_tcp(ev)
    if any("," in t or " " in t for t in out.tags):
        assert line == b"", line  # no 2015 line can carry the tag: not sent to 2015 TCP subscribers
    else:
        assert line.endswith(b"\n") and line.count(b"\n") == 1
        # As a 2015 client reads it: the line split on its first two spaces, the tags on commas.
        name, tags, _data = line[:-1].split(b" ", 2)
        want = [t.replace("\n", "\\n").encode() for t in out.tags]
        assert name == b"publish" and tags.split(b",") == want, (line, out.tags)
    assert json.loads(md.render_event(ev))["command"] == "publish"
    assert json.loads(md.render_event_ws(ev))["tags"] == list(out.tags)


_MIST2015_REPLIES = (b"pong\n", b"list ", b"error ")


def mist2015_lines(data: bytes) -> None:
    for auth in (False, True):
        whole = md.Mist2015Connection(max_frame=128, max_subscriptions=4, max_tags=8, auth_required=auth)
        cut = md.Mist2015Connection(max_frame=128, max_subscriptions=4, max_tags=8, auth_required=auth)
        outs = _mist_run(whole, [data])
        assert outs == _mist_run(cut, [data[i : i + 7] for i in range(0, len(data), 7)]), "chunking matters"
        for i, out in enumerate(outs):
            if isinstance(out, md.Send):
                assert out.data.startswith(_MIST2015_REPLIES) and out.data.endswith(b"\n"), out
            elif isinstance(out, md.Close):
                assert whole.failed and i == len(outs) - 1, outs
            elif isinstance(out, md.Publish):
                _mist_check_publish(out)
            elif isinstance(out, md.Subscribe | md.Unsubscribe):
                assert out.tags and len(out.tags) <= 8
        assert len(whole.subscriptions) <= 4 and whole.buffered <= 129


def mist2015_ws(data: bytes) -> None:
    conn = md.Mist2015WsConnection(max_frame=256, max_subscriptions=4, max_tags=8)
    for piece in [data, *data.split(b"\x00")]:
        for binary in (False, True):
            for out in conn.receive_frame(piece, binary=binary):
                if isinstance(out, md.Send):
                    reply = json.loads(out.data)
                    assert isinstance(reply, dict) and isinstance(reply.get("success", True), bool), reply
                elif isinstance(out, md.Close):
                    assert out.code == 1009 and len(piece) > 256
                    return
                else:
                    assert isinstance(out, md.Subscribe | md.Unsubscribe) and out.tags


def _mist1_check(outs: list[Any], conn: Any) -> None:
    for i, out in enumerate(outs):
        if isinstance(out, md.Send):
            assert out.data.endswith(b"\n") and out.data.count(b"\n") == 1, out
            assert isinstance(json.loads(out.data)["command"], str)
        elif isinstance(out, md.Close):
            assert conn.failed and i == len(outs) - 1 and out.code in (1000, 1009), outs
        elif isinstance(out, md.Publish):
            _mist_check_publish(out)
        elif isinstance(out, md.ListAll | md.Who):
            assert isinstance(conn.reply_who(md.Who(out.echo), 1, 0), bytes)


def mist1_stream(data: bytes) -> None:
    for auth in (False, True):
        whole = md.Mist1Connection(max_frame=128, max_subscriptions=4, max_tags=8, auth_required=auth)
        cut = md.Mist1Connection(max_frame=128, max_subscriptions=4, max_tags=8, auth_required=auth)
        outs = _mist_run(whole, [data])
        assert outs == _mist_run(cut, [data[i : i + 7] for i in range(0, len(data), 7)]), "chunking matters"
        _mist1_check(outs, whole)
        assert len(whole.subscriptions) <= 4


def mist1_ws(data: bytes) -> None:
    conn = md.Mist1WsConnection(max_frame=256, max_subscriptions=4, max_tags=8, auth_required=True)
    for piece in [data, *data.split(b"\x00")]:
        outs = conn.receive_frame(piece)
        if outs and isinstance(outs[-1], md.Close):
            assert outs == [md.Close(Disconnect.MESSAGE_TOO_BIG)] and len(piece) > 256
            return
        _mist1_check(outs, conn)


def cluster_wire_target(data: bytes) -> None:
    """A Redis message between nodes: decoded, or refused with BadMessage; what decodes re-encodes to the same
    message."""
    try:
        m = cw.decode(data)
    except cw.BadMessage:
        return
    if m.events:
        again = [cw.decode(b) for b in cw.encode_events(m.node, m.events)]
        assert [e for x in again for e in x.events] == m.events
    else:
        assert cw.decode(cw.encode_tops(m.node, m.tops)) == m


def qpubs_target(data: bytes) -> None:
    for auth in (False, True):
        conn = qpd.QrpcConnection(auth_required=auth, max_line=256, max_calls=4)
        for piece in (data[: len(data) // 2], data[len(data) // 2 :]):
            batch = conn.feed(piece)
            while batch:
                for out in batch:
                    if isinstance(out, qpd.Send):
                        assert out.data.endswith(b"\n") and json.loads(out.data)["s"] == "end"
                    elif isinstance(out, qpd.Auth):
                        conn.authenticated()
                batch = conn.resume()
    text = _text(data)
    with contextlib.suppress(UnicodeEncodeError):
        text.encode("utf-8")  # the checks below take text as the wire gives it: valid UTF-8
        for sep in (".", "::"):
            try:
                topic = qpd.parse_topic(text, sep)
            except qpd.QpubsError as exc:
                assert exc.code == "EBADTOPIC"
                continue
            with contextlib.suppress(HubbubError):
                pattern = topic.pattern()
                channel = qpd.emit_channel(text.strip("*"), sep)
                if pattern is not None and not topic.filtered:
                    assert pattern.matches(channel) is topic.matches(qpd.topic_name(channel, sep))
    qpd.alias_topic(text)
    with contextlib.suppress(qpd.QpubsError):
        qpd.alias_emit(text)


def qrpc_framing(data: bytes) -> None:
    fuzz_qrpc.check_stream(data)
    text = _text(data)
    with contextlib.suppress(UnicodeEncodeError):
        text.encode("utf-8")  # call ids and messages come off the wire as valid UTF-8
        fuzz_qrpc.check_renderers(text[:24], {"topic": text, "value": [text]}, text)


def mqtt_target(data: bytes) -> None:
    fuzz_mqtt.check_reader(data)
    fuzz_mqtt.check_stream(fuzz_mqtt.stream_from_bytes(data))


def federation_link_target(data: bytes) -> None:
    """Frames from above (as the link's protocol reads them) decode or raise BadFrame (4000), malformed ones
    are BadInput (4000); header and cursor parsers answer ``None``/``ValueError``, and what they accept is
    well formed and round-trips."""
    proto: client_protocol.ClientProtocol[int] = client_protocol.ClientProtocol(
        "msgpack", echo=False, batch=True, event_decoder=fw.decode_event
    )
    proto.hello()
    welcome = proto.receive(msgpack.packb({"op": "reply", "id": 1, "session": "s"}))
    assert isinstance(welcome[0], client_protocol.Welcome)
    with contextlib.suppress(ValueError, OverflowError, TypeError):
        doc = msgpack.unpackb(data, raw=False, strict_map_key=False)
        if type(doc) is dict and doc.get("op") != "batch":  # the same frame in a batch: the same events
            batch = msgpack.packb({"op": "batch", "frames": [doc]}, use_bin_type=True)
            assert [type(e) for e in proto.receive(batch)] == [type(e) for e in proto.receive(data)]
    try:
        events = proto.receive(data)
    except HubbubError as exc:
        assert exc.code == 4000, exc
    else:
        for ev in events:
            if isinstance(ev, client_protocol.Received):
                it = ev.value
                assert isinstance(it, fw.LinkEvent)
                assert isinstance(it.payload, bytes) and it.seq >= 0 and it.time_ns >= 0
            elif isinstance(ev, client_protocol.BadInput):
                assert ev.error.code == 4000, ev
    node, above, origin, hops, pub = (_text(p) for p in _pieces(data, 5))
    n = fw.parse_node(node)
    assert n is None or fed.valid_node_id(n)
    ids = fw.parse_above(above)
    if ids is not None:
        assert all(fed.valid_node_id(i) for i in ids)
        assert fw.parse_above(fw.render_above(ids)) == tuple(sorted(set(ids)))
    user, fh, publisher = fw.split_link_headers(
        {fw.LINK_ORIGIN: origin, fw.LINK_HOPS: hops, fw.LINK_PUBLISHER: pub, "k": "v"}
    )
    assert user == {"k": "v"} and publisher == pub
    if fh is not None:
        o = fed.origin_of(fh)
        assert o is not None and fed.hops_of(fh)
        fed.accepts("X", fh)
        assert fed.idempotency_key(o).startswith("fed:")
        stamped, o2 = fed.stamp("X", fh, "e", 1)
        assert o2 == o and fed.hops_of(stamped)[-1] == "X"
    p = fw.parse_publisher(pub)
    if p is not None:
        with contextlib.suppress(UnicodeEncodeError):
            assert fw.parse_publisher(fw.render_publisher(*p)) == p
    with contextlib.suppress(ValueError, RecursionError):
        doc = json.loads(data)
        if isinstance(doc, dict):
            cursor = fed.Cursor.from_json(doc)
            assert fed.Cursor.from_json(cursor.to_json()) == cursor


def http_heads(data: bytes) -> None:
    fuzz_http.check_heads(data.split(b"\x00"))


def ws_client_frames(data: bytes) -> None:
    fuzz_http.check_frames(data)


def _read_response(pieces: list[bytes]) -> object:
    reader = wh.ResponseReader()
    try:
        got = None
        for p in pieces:
            got = reader.feed(p) or got
        return got or reader.eof()
    except wh.BadResponse:
        return wh.BadResponse


def webhook_responses(data: bytes) -> None:
    whole = _read_response([data])
    assert whole == _read_response([data[i : i + 1] for i in range(len(data))]), data


_REPLY_CHECKS: dict[str, tuple[Callable[[], Any], Callable[[Any], None]]] = {
    "event_renderings": (fuzz_replies.events, fuzz_replies.check_event),
    "replies_native": (fuzz_replies.native_cases, fuzz_replies.check_native),
    "replies_dialects": (fuzz_replies.dialect_cases, fuzz_replies.check_dialect),
}
_REPLY_BUILT: dict[str, Callable[[bytes], None]] = {}


def _reply_target(name: str) -> Callable[[bytes], None]:
    """A structured target over ``fuzz_replies``'s strategy and check of ``name``, built on first use."""

    def run(data: bytes) -> None:
        fn = _REPLY_BUILT.get(name)
        if fn is None:
            strategy, check = _REPLY_CHECKS[name]
            fn = _REPLY_BUILT[name] = _structured(strategy(), check)
        fn(data)

    return run


TARGETS: dict[str, Callable[[bytes], None]] = {
    "native_json": native_json,
    "native_msgpack": native_msgpack,
    "native_stream": native_stream,
    "native_commands": native_commands,
    "native_command_streams": native_command_streams,
    "native_http": native_http,
    "ivy": ivy_target,
    "guble": guble_target,
    "channels": channels_target,
    "client_framing": client_framing,
    "client_protocol": client_protocol_target,
    "auth": auth_target,
    "wearscript": wearscript_target,
    "mist2015_lines": mist2015_lines,
    "mist2015_ws": mist2015_ws,
    "mist1_stream": mist1_stream,
    "mist1_ws": mist1_ws,
    "cluster_wire": cluster_wire_target,
    "qpubs": qpubs_target,
    "qrpc_framing": qrpc_framing,
    "mqtt": mqtt_target,
    "federation_link": federation_link_target,
    "http_heads": http_heads,
    "ws_client_frames": ws_client_frames,
    "webhook_responses": webhook_responses,
    "event_renderings": _reply_target("event_renderings"),
    "replies_native": _reply_target("replies_native"),
    "replies_dialects": _reply_target("replies_dialects"),
}


# -- running ----------------------------------------------------------------------------------------------


def corpus_files(name: str) -> Iterator[Path]:
    d = CORPUS / name
    if d.is_dir():
        yield from sorted(p for p in d.iterdir() if p.is_file())


def replay_corpus(name: str) -> int:
    """Feed every corpus file of a target to it; returns how many (an assertion fails on a regression)."""
    fn = TARGETS[name]
    n = 0
    for p in corpus_files(name):
        fn(p.read_bytes())
        n += 1
    return n


def _hypothesis(name: str, seconds: float, runs: int | None) -> int:
    """Random inputs for ``name`` under hypothesis: rounds of 500 until ``seconds`` have passed, or, with
    ``runs``, exactly that many inputs from a fixed seed (the same inputs on every run and machine)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    fn = TARGETS[name]
    per_round = 500 if runs is None else runs

    @settings(
        max_examples=per_round,
        deadline=None,
        database=None,
        derandomize=runs is not None,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.binary(max_size=2048))
    def prop(data: bytes) -> None:
        fn(data)

    if runs is not None:
        prop()
        return runs
    deadline = time.monotonic() + seconds
    rounds = 0
    while True:
        prop()
        rounds += 1
        if time.monotonic() >= deadline:
            return rounds * per_round


def run_target(name: str, seconds: float, work: Path | None = None, runs: int | None = None) -> int:
    """Fuzz one target for ``seconds``, or, with ``runs``, for that many inputs after the whole corpus (a
    budget that costs the same CPU on any machine: the test suite's smoke run). With atheris this process
    becomes libFuzzer's and exits with its status (non-zero on a crash, the input saved under
    ``fuzz/crashes/``). New inputs go to ``work`` when given (a long run's scratch corpus, read after the
    kept one), else into the kept corpus."""
    n = replay_corpus(name)
    if atheris is None:
        examples = _hypothesis(name, seconds, runs)
        print(f"{name}: corpus {n} files, then hypothesis (no atheris): {examples} inputs, no failure")
        return 0
    corpus = CORPUS / name
    corpus.mkdir(parents=True, exist_ok=True)
    CRASHES.mkdir(exist_ok=True)
    args = [
        sys.argv[0],
        f"-max_total_time={max(1, int(seconds))}",
        *([f"-runs={runs}"] if runs is not None else []),
        "-max_len=4096",
        "-rss_limit_mb=2048",
        "-print_final_stats=1",
        f"-artifact_prefix={CRASHES}/{name}-",
        *([str(work)] if work is not None else []),
        str(corpus),
    ]
    if work is not None:
        work.mkdir(parents=True, exist_ok=True)
    atheris.Setup(args, TARGETS[name])
    atheris.Fuzz()
    return 0  # pragma: no cover - atheris.Fuzz exits


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Fuzz hubbub's codecs and parsers (atheris, else hypothesis).")
    ap.add_argument("target", choices=[*TARGETS, "all"])
    ap.add_argument("--seconds", type=float, default=60.0, help="how long to fuzz (each, with all)")
    ap.add_argument("--work", type=Path, default=None, help="scratch corpus for new inputs (long runs)")
    ap.add_argument(
        "--runs", type=int, default=None, help="stop after this many inputs (a fixed seed without atheris)"
    )
    args = ap.parse_args(argv)
    if args.target != "all":
        return run_target(args.target, args.seconds, args.work, args.runs)
    # libFuzzer owns its process: one child per target.
    failed = []
    for name in TARGETS:
        work = ["--work", str(args.work / name)] if args.work is not None else []
        runs = ["--runs", str(args.runs)] if args.runs is not None else []
        r = subprocess.run(
            [sys.executable, __file__, name, "--seconds", str(args.seconds), *work, *runs],
            env=os.environ,
            check=False,
        )
        if r.returncode:
            failed.append(name)
    print("failed: " + ", ".join(failed) if failed else f"all {len(TARGETS)} targets ran without a failure")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
