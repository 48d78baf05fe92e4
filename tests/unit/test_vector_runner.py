"""The pure parts of the conformance-vector runner: placeholders, matching, framing, validation. No server."""

from __future__ import annotations

import struct
from typing import Any

import msgpack
import pytest

from tests.conformance.runner import (
    DIALECTS,
    STEP_KEYS,
    Len32Splitter,
    LineSplitter,
    Mismatch,
    MqttSplitter,
    SseEvent,
    SseParser,
    Unit,
    VectorError,
    assign_unordered,
    check_unit,
    compile_pattern,
    dialect_of_path,
    dialects_touched,
    expand,
    expand_json,
    lint_case,
    match_text,
    match_value,
    validate_case,
    validate_step,
)
from tests.conformance.test_vectors import CASES, vectors_dir

# -- placeholders --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "good", "bad"),
    [
        ("{{TS}}", "1795313749.574424198", "1795313749.57442419"),
        ("{{SID}}", "a1b2c3d4e5f60718", "A1B2C3D4E5F60718"),
        ("{{XID}}", "9m4e2mr0ui3e8a215n4g", "9m4e2mr0ui3e8a215n4w"),
        ("{{INT}}", "-12", "1.5"),
        ("{{UINT}}", "12", "-12"),
        ("{{T}}", "1795313749", "179531374"),
        ("{{NS}}", "1795313749574424198", "179531374957442419"),
        ("{{EPOCH}}", "k3j2a9x1", "K3j2a9x1"),
        ("{{RFC3339}}", "2026-11-22T03:23:00.123+01:00", "2026-11-22 03:23:00Z"),
        ("{{RFC3339}}", "2026-11-22T03:23:00Z", "2026-11-22T03:23:00"),
        ("{{HTTPDATE}}", "Sun, 01 Jan 2090 00:00:00 GMT", "Sun, 1 Jan 2090 00:00:00 GMT"),
        ("{{HEX}}", "00ff", ""),
        ("{{ANY}}", "any\nthing", None),
        ("@{{TS}}:~/sid:{{SID}}", "@1795313749.574424198:~/sid:a1b2c3d4e5f60718", "@1:~/sid:x"),
    ],
)
def test_tokens_match_whole_text(pattern: str, good: str, bad: str | None) -> None:
    assert match_text(pattern, good, {}) == {}
    if bad is not None:
        assert match_text(pattern, bad, {}) is None
    assert match_text(pattern, good + "x", {}) is None or pattern.endswith("{{ANY}}")


def test_literal_text_is_escaped() -> None:
    assert match_text("a.b*c+(d)[e]", "a.b*c+(d)[e]", {}) == {}
    assert match_text("a.b", "axb", {}) is None
    assert compile_pattern("x{{HEX}}y", {}).regex.pattern == r"x(?:[0-9a-f]+)y"


def test_any_spans_lines_and_matches_empty() -> None:
    assert match_text("{{ANY}}hubbub_connections{{ANY}}", "# HELP\nhubbub_connections 1\n", {}) == {}
    assert match_text("a{{ANY}}b", "ab", {}) == {}


def test_capture_stores_matched_text() -> None:
    assert match_text("@{{TS}}:~/sid:{{SID:sid}}", "@1795313749.574424198:~/sid:a1b2c3d4e5f60718", {}) == {
        "sid": "a1b2c3d4e5f60718"
    }
    assert match_text("{{INT:a}},{{INT:b}}", "1,-2", {}) == {"a": "1", "b": "-2"}


def test_reference_matches_literally() -> None:
    vars = {"e": "k3j2a9x1", "dot": "a.b"}
    assert match_text("epoch {{$e}}", "epoch k3j2a9x1", vars) == {}
    assert match_text("epoch {{$e}}", "epoch k3j2a9x2", vars) is None
    assert match_text("{{$dot}}", "axb", vars) is None  # the value is escaped, not a regex


def test_reference_to_capture_in_same_pattern_is_a_backreference() -> None:
    assert match_text("{{HEX:h}}-{{$h}}", "ab-ab", {}) == {"h": "ab"}
    assert match_text("{{HEX:h}}-{{$h}}", "ab-cd", {}) is None


def test_reference_to_unknown_variable_is_a_vector_error() -> None:
    with pytest.raises(VectorError, match=r"\$nope"):
        match_text("{{$nope}}", "x", {"other": "1"})
    with pytest.raises(VectorError, match=r"\$nope"):
        expand("{{$nope}}", {})


def test_unknown_placeholder_is_a_vector_error() -> None:
    with pytest.raises(VectorError, match="unknown placeholder"):
        compile_pattern("{{FOO}}", {})
    with pytest.raises(VectorError, match="whole JSON value"):
        compile_pattern("x{{ANYVAL}}", {})


def test_repeat_in_patterns_and_sent_text() -> None:
    assert expand("<{{REPEAT x 5}}>", {}) == "<xxxxx>"
    assert len(expand("{{REPEAT x 70000}}", {})) == 70000
    assert match_text("{{REPEAT . 3}}", "...", {}) == {}
    assert match_text("{{REPEAT . 3}}", "abc", {}) is None  # the character is literal, not a regex dot
    assert expand("{{REPEAT   2}}", {}) == "  "


def test_expand_resolves_references_and_refuses_matching_tokens() -> None:
    assert expand(":/a:{{$v}}!", {"v": "hi"}) == ":/a:hi!"
    assert expand("{{$n}}", {"n": 42}) == "42"
    with pytest.raises(VectorError, match="only be used in an expectation"):
        expand("{{TS}}", {})


# -- JSON values ---------------------------------------------------------------------------------------------


def _match(
    expected: Any, actual: Any, vars: dict[str, Any] | None = None, mode: str = "exact"
) -> dict[str, Any]:
    caps: dict[str, Any] = {}
    match_value(expected, actual, vars or {}, caps, mode=mode)
    return caps


def test_exact_match_ignores_key_order_but_not_extra_keys() -> None:
    assert _match({"a": 1, "b": [1, 2]}, {"b": [1, 2], "a": 1}) == {}
    with pytest.raises(Mismatch, match="unexpected key"):
        _match({"a": 1}, {"a": 1, "b": 2})
    with pytest.raises(Mismatch, match="missing key"):
        _match({"a": 1, "b": 2}, {"a": 1})


def test_subset_match_is_recursive_and_arrays_stay_elementwise() -> None:
    got = {"channel": "/pg", "top": 5, "events": [{"seq": 3, "x": 1}, {"seq": 4, "y": 2}], "more": True}
    assert _match({"channel": "/pg", "events": [{"seq": 3}, {"seq": 4}]}, got, mode="subset") == {}
    with pytest.raises(Mismatch, match="expected 1 element"):
        _match({"events": [{"seq": 3}]}, got, mode="subset")
    with pytest.raises(Mismatch, match=r"\$\.events\[1\]\.seq"):
        _match({"events": [{"seq": 3}, {"seq": 5}]}, got, mode="subset")


def test_scalars_keep_json_types_apart() -> None:
    with pytest.raises(Mismatch):
        _match(1, True)
    with pytest.raises(Mismatch):
        _match(True, 1)
    with pytest.raises(Mismatch):
        _match(1, 1.0)
    with pytest.raises(Mismatch):
        _match(None, 0)
    with pytest.raises(Mismatch):
        _match("1", 1)
    assert _match(1.5, 1.5) == {}
    assert _match(None, None) == {}


def test_string_leaves_are_patterns_over_json_strings_only() -> None:
    assert _match({"time": "{{NS}}"}, {"time": "1795313749574424198"}) == {}
    with pytest.raises(Mismatch, match="expected a string"):
        _match({"time": "{{NS}}"}, {"time": 1795313749574424198})
    with pytest.raises(Mismatch, match="does not match"):
        _match({"s": "{{SID}}"}, {"s": "xyz"})


def test_int_and_anyval_leaves() -> None:
    assert _match({"n": "{{INT}}"}, {"n": -3}) == {}
    assert _match({"n": "{{INT:n}}"}, {"n": 7}) == {"n": 7}
    with pytest.raises(Mismatch, match="integer"):
        _match({"n": "{{INT}}"}, {"n": "7"})
    with pytest.raises(Mismatch, match="integer"):
        _match({"n": "{{INT}}"}, {"n": True})
    assert _match({"v": "{{ANYVAL}}"}, {"v": {"deep": [None]}}) == {}
    assert _match({"v": "{{ANYVAL:v}}"}, {"v": [1]}) == {"v": [1]}


def test_captures_in_json_keep_their_type_and_references_compare_typed() -> None:
    caps = _match({"seq": "{{INT:seq}}", "epoch": "{{EPOCH:e}}"}, {"seq": 3, "epoch": "k3j2a9x1"})
    assert caps == {"seq": 3, "e": "k3j2a9x1"}
    assert _match({"seq": "{{$seq}}", "epoch": "{{$e}}"}, {"seq": 3, "epoch": "k3j2a9x1"}, caps) == {}
    with pytest.raises(Mismatch, match=r"\$seq"):
        _match({"seq": "{{$seq}}"}, {"seq": "3"}, caps)
    # a reference inside a longer string is written as text
    assert _match({"id": "{{NS}}:{{$e}}:{{$seq}}"}, {"id": "1795313749574424198:k3j2a9x1:3"}, caps) == {}


def test_capture_and_reference_within_one_value() -> None:
    value = {"epoch": "k3j2a9x1", "position": {"epoch": "k3j2a9x1"}}
    assert _match({"epoch": "{{EPOCH:e}}", "position": {"epoch": "{{$e}}"}}, value) == {"e": "k3j2a9x1"}
    with pytest.raises(Mismatch):
        _match(
            {"epoch": "{{EPOCH:e}}", "position": {"epoch": "{{$e}}"}}, {**value, "position": {"epoch": "x"}}
        )


def test_expand_json_keeps_types_and_builds_bytes() -> None:
    vars = {"seq": 1, "e": "k3j2a9x1"}
    sent = expand_json({"since": {"seq": "{{$seq}}", "epoch": "{{$e}}"}, "t": "{{REPEAT x 3}}"}, vars)
    assert sent == {"since": {"seq": 1, "epoch": "k3j2a9x1"}, "t": "xxx"}
    assert expand_json({"payload": {"$bin": "00ff"}}, {}) == {"payload": b"\x00\xff"}
    with pytest.raises(VectorError, match=r"\$bin"):
        expand_json({"$bin": "00"}, {}, allow_bin=False)


def test_bin_matches_bytes_or_a_str_with_the_same_utf8() -> None:
    assert _match({"p": {"$bin": "00ff"}}, {"p": b"\x00\xff"}) == {}
    assert _match({"$bin": "6869"}, "hi") == {}
    with pytest.raises(Mismatch, match="bytes"):
        _match({"$bin": "00ff"}, b"\x00")
    with pytest.raises(Mismatch, match="bytes"):
        _match({"$bin": "00"}, 0)


# -- units ---------------------------------------------------------------------------------------------------


def test_check_unit_text_frame_and_frame_type() -> None:
    unit = Unit(b"@1795313749.574424198:~/sid:a1b2c3d4e5f60718", binary=False)
    caps = check_unit("expect", {"expect": "@{{TS}}:~/sid:{{SID:s}}", "frame": "text"}, unit, {})
    assert caps == {"s": "a1b2c3d4e5f60718"}
    with pytest.raises(Mismatch, match="binary frame"):
        check_unit("expect", {"expect": "{{ANY}}", "frame": "binary"}, unit, {})
    with pytest.raises(Mismatch, match="WebSocket"):
        check_unit("expect", {"expect": "{{ANY}}", "frame": "text"}, Unit(b"x"), {})


def test_check_unit_msgpack_old_spec_raw_is_str_and_bin_is_bytes() -> None:
    old = Unit(
        msgpack.packb(["subscriptions", "server:0", ["test:server:0"]], use_bin_type=False), binary=True
    )
    check_unit(
        "expect_msgpack", {"expect_msgpack": ["subscriptions", "server:0", ["test:server:0"]]}, old, {}
    )
    new = Unit(msgpack.packb({"op": "event", "payload": b"\x00\xff", "x": 1}, use_bin_type=True), binary=True)
    step = {"expect_msgpack": {"op": "event", "payload": {"$bin": "00ff"}}, "match": "subset"}
    check_unit("expect_msgpack", step, new, {})
    with pytest.raises(Mismatch, match="binary unit"):
        check_unit("expect_msgpack", {"expect_msgpack": 1}, Unit(b"\x01", binary=False), {})
    with pytest.raises(Mismatch, match="msgpack"):
        check_unit("expect_msgpack", {"expect_msgpack": 1}, Unit(b"\x01\x02", binary=True), {})


def test_check_unit_hex_and_json() -> None:
    check_unit("expect_hex", {"expect_hex": "91a176"}, Unit(b"\x91\xa1v", binary=True), {})
    with pytest.raises(Mismatch, match="expected bytes"):
        check_unit("expect_hex", {"expect_hex": "91"}, Unit(b"\x92", binary=True), {})
    with pytest.raises(Mismatch, match="not JSON"):
        check_unit("expect_json", {"expect_json": {}}, Unit(b"{nope"), {})


def test_check_unit_sse_fields_default_event_and_data_json() -> None:
    event = SseEvent(
        "message", '{"channel":"/st/x","seq":1,"text":"v"}', "1795313749574424198:k3j2a9x1:1:/st/x"
    )
    unit = Unit(event.data.encode(), sse=event)
    step = {
        "expect_sse": {"id": "{{NS}}:{{EPOCH:e}}:1:/st/x", "data_json": {"seq": 1, "text": "v"}},
        "match": "subset",
    }
    assert check_unit("expect_sse", step, unit, {}) == {"e": "k3j2a9x1"}
    gap = Unit(b"{}", sse=SseEvent("gap", "{}", None))
    with pytest.raises(Mismatch, match="event 'gap'"):
        check_unit("expect_sse", {"expect_sse": {"data": "{}"}}, gap, {})
    with pytest.raises(Mismatch, match="no 'id'"):
        check_unit("expect_sse", {"expect_sse": {"id": "x", "event": "gap"}}, gap, {})
    with pytest.raises(Mismatch, match="SSE event"):
        check_unit("expect_sse", {"expect_sse": {"data": "{}"}}, Unit(b"{}"), {})


def test_unordered_finds_an_assignment_and_commits_its_captures() -> None:
    units = [Unit(b'{"id":"b","v":2}'), Unit(b'{"id":"a","v":1}')]
    caps = assign_unordered(['{"id":"a","v":{{INT:a}}}', '{"id":"b","v":{{INT:b}}}'], units, {}, "exact")
    assert caps == {"a": "1", "b": "2"}
    # the greedy choice (first pattern takes the first unit) must be undone to find the assignment
    units = [Unit(b"ab"), Unit(b"a")]
    assert assign_unordered(["a{{ANY}}", "ab"], units, {}, "exact") == {}
    with pytest.raises(Mismatch, match="no order"):
        assign_unordered(["a", "a"], [Unit(b"a"), Unit(b"b")], {}, "exact")


# -- framing -------------------------------------------------------------------------------------------------


def _feed_bytewise(feed: Any, data: bytes) -> list[Any]:
    out: list[Any] = []
    for i in range(len(data)):
        out += feed(data[i : i + 1])
    return out


def test_line_splitter_keeps_empty_lines_and_final_partial_line() -> None:
    data = b"pong\n\nlist a b\nerr"
    for chunks in ([data], [data[i : i + 1] for i in range(len(data))]):
        s = LineSplitter()
        out = [line for c in chunks for line in s.feed(c)]
        assert out + s.end() == [b"pong", b"", b"list a b", b"err"]


def test_ndjson_skips_empty_lines_and_strips_cr() -> None:
    s = LineSplitter(ndjson=True)
    assert _feed_bytewise(s.feed, b'{"a":1}\r\n\n\n{"b":2}\n') == [b'{"a":1}', b'{"b":2}']
    assert s.end() == []


def test_line_splitter_is_bounded() -> None:
    with pytest.raises(ValueError, match="longer"):
        LineSplitter(max_line=4).feed(b"12345")


def test_len32_splitter() -> None:
    frames = [b"", b"\x81\xa1a\x01", b"x" * 300]
    data = b"".join(struct.pack(">I", len(f)) + f for f in frames)
    s = Len32Splitter()
    assert _feed_bytewise(s.feed, data) == frames
    assert s.leftover() == 0
    assert Len32Splitter().feed(data + b"\x00\x00") == frames
    with pytest.raises(ValueError, match="over"):
        Len32Splitter(max_frame=10).feed(struct.pack(">I", 11))


def test_mqtt_splitter_cuts_whole_packets_by_their_remaining_length() -> None:
    # PINGRESP (no body), CONNACK (2), a PUBLISH of 200 bytes (Remaining Length 0xc8 0x01: two bytes, least
    # significant first, MQTT 3.1.1 section 2.2.3) and one of 16384 (three bytes: 0x80 0x80 0x01).
    packets = [
        b"\xd0\x00",
        b"\x20\x02\x00\x00",
        b"\x30\xc8\x01" + b"p" * 200,
        b"\x30\x80\x80\x01" + b"q" * 16384,
    ]
    data = b"".join(packets)
    s = MqttSplitter()
    assert _feed_bytewise(s.feed, data) == packets
    assert s.leftover() == 0
    assert MqttSplitter().feed(data + b"\x30\x05\x00") == packets  # an incomplete packet waits
    with pytest.raises(ValueError, match="over 4 bytes"):
        MqttSplitter().feed(b"\x30\xff\xff\xff\xff\x01")
    with pytest.raises(ValueError, match="over"):
        MqttSplitter(max_frame=10).feed(b"\x30\x0b")


SSE_STREAM = (
    b"\xef\xbb\xbfretry: 2000\n\n"
    b": ping\n\n"
    b'id: 1:e:1:/a\ndata: {"a":1}\n\n'
    b"event: gap\r\ndata: line1\r\ndata:line2\r\n\r\n"
    b"data\rid: 7\r\r"
    b"field: ignored\nid\n\n"
    b"data: incomplete"
)
SSE_EVENTS = [
    SseEvent("message", '{"a":1}', "1:e:1:/a"),
    SseEvent("gap", "line1\nline2", None),
    SseEvent("message", "", "7"),
    SseEvent("message", "", ""),
]


def test_sse_parser_blocks_whole() -> None:
    p = SseParser()
    assert p.feed(SSE_STREAM) + p.feed(b"", final=True) == SSE_EVENTS


def test_sse_parser_blocks_bytewise() -> None:
    p = SseParser()
    assert _feed_bytewise(p.feed, SSE_STREAM) + p.feed(b"", final=True) == SSE_EVENTS


def test_sse_parser_skips_comment_and_retry_only_blocks() -> None:
    p = SseParser()
    assert p.feed(b"retry: 10\n\n: c\n: d\n\n\n\n") == []


def test_sse_parser_utf8_split_across_chunks() -> None:
    data = "data: é€\n\n".encode()
    p = SseParser()
    assert _feed_bytewise(p.feed, data) == [SseEvent("message", "é€", None)]


# -- steps, cases, dialects ----------------------------------------------------------------------------------


def test_validate_step_kinds() -> None:
    assert validate_step({"client": "A", "connect": "ws:/ws", "expect_status": 400}) == "connect"
    assert validate_step({"http": "GET /x", "status": 200, "expect_json": {}}) == "http"
    assert validate_step({"all": "quiet", "within_ms": 300}) == "all"
    assert validate_step({"server": "restart"}) == "server"
    assert validate_step({"sleep_ms": 5}) == "sleep_ms"
    assert validate_step({"client": "A", "expect_close": 1002}) == "expect_close"
    assert validate_step({"client": "A", "send_msgpack": [], "bin_type": True}) == "send_msgpack"


@pytest.mark.parametrize(
    "step",
    [
        {"client": "A", "send": "x", "frame": "text"},
        {"client": "A", "expect_json": {}, "match": "fuzzy"},
        {"client": "A", "connect": "udp:x"},
        {"client": "A", "connect": "tcp:mist", "mode": "len16"},
        {"http": "GET /x"},
        {"http": "GET /x", "status": 200, "form": {}, "send_body": ""},
        {"http": "nonsense", "status": 200},
        {"server": "reboot"},
        {"all": "loud"},
        {"expect": "x"},
        {"client": "A", "expect_sse": {"data": "x", "data_json": {}}},
        {"nothing": 1},
    ],
)
def test_validate_step_rejects(step: dict[str, Any]) -> None:
    with pytest.raises(VectorError):
        validate_step(step)


def test_validate_case_needs_restart_requirement() -> None:
    case = {"id": "x.y", "describe": "", "steps": [{"server": "restart"}], "expect": []}
    with pytest.raises(VectorError, match="restart"):
        validate_case(case)
    validate_case({**case, "requires": ["restart"]})
    with pytest.raises(VectorError, match="requirement"):
        validate_case({**case, "requires": ["teleport"]})


def test_lint_finds_unknown_placeholders_and_early_references() -> None:
    case = {
        "id": "x.y",
        "describe": "",
        "steps": [
            {"client": "A", "expect": "{{$later}} {{BOGUS}}"},
            {"client": "A", "expect": "{{SID:later}}"},
            {"client": "A", "expect": "{{$later}}"},
        ],
        "expect": [],
    }
    problems = lint_case(case)
    assert len(problems) == 2
    assert "steps[0]" in problems[0]


@pytest.mark.parametrize(
    ("path", "dialect"),
    [
        ("/ws", "ivy"),
        ("/ws?x=1", "ivy"),
        ("/ws/hubbub", "native"),
        ("/events/a/b", "ivy"),
        ("/log/a", "ivy"),
        ("/stream/user/alice", "guble"),
        ("/api/message/x", "guble"),
        ("/admin/healthcheck", "guble"),
        ("/wearscript/ws/secret", "wearscript"),
        ("/mist/v1/ws", "mist"),
        ("/qpubs/emit?topic=a", "qpubs"),
        ("/listen?foo.bar", "qpubs"),
        ("/emit?foo.bar,42", "qpubs"),
        ("/api/v1/stream/st/**", "native"),
        ("/healthz", "native"),
        ("/metrics", "native"),
        ("/nowhere", None),
    ],
)
def test_dialect_of_path(path: str, dialect: str | None) -> None:
    assert dialect_of_path(path) == dialect


def test_dialects_touched() -> None:
    case = {
        "steps": [
            {"client": "A", "connect": "ws:/ws/hubbub"},
            {"client": "M", "connect": "tcp:mist"},
            {"client": "Q", "connect": "tcp:qrpc"},
            {"client": "L", "connect": "http:GET /qpubs/listen?topic=a"},
            {"http": "POST /events/x", "status": 200},
        ],
        "expect": [{"all": "quiet"}],
    }
    assert dialects_touched(case) == {"native", "mist", "qpubs", "ivy"}


# -- the vector files themselves -----------------------------------------------------------------------------

needs_vectors = pytest.mark.skipif(vectors_dir() is None, reason="no conformance vectors found")


@needs_vectors
@pytest.mark.parametrize(("dialect", "case"), [pytest.param(d, c, id=c["id"]) for d, c in CASES])
def test_every_vector_case_is_understood(dialect: str, case: dict[str, Any]) -> None:
    assert lint_case(case) == []


@needs_vectors
def test_runner_knows_every_step_key_in_every_file() -> None:
    known = set().union(*STEP_KEYS.values())
    seen: set[str] = set()
    assert {d for d, _ in CASES} == set(DIALECTS)  # every dialect's file, shared or kept with the tests
    for _dialect, case in CASES:
        for step in [*case["steps"], *case["expect"]]:
            seen |= set(step)
    assert seen - known == set()
