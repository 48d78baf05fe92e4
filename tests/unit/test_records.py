from __future__ import annotations

import dataclasses
import threading
from types import MappingProxyType

import msgpack
import pytest

from hubbub.events import Event, Publisher
from hubbub.log.records import (
    RECORD_COLUMNS,
    RECORD_SCHEMA,
    RECORD_SCHEMA_VERSION,
    SPARK_DDL,
    RecordError,
    decode_headers,
    decode_tags,
    encode_headers,
    encode_tags,
    event_columns,
    event_size,
    event_to_record,
    record_to_event,
)

EVENT = Event(
    channel="/chat/ünï",
    seq=7,
    epoch="abc123xy",
    time_ns=1_700_000_000_123_456_789,
    publisher=Publisher("native", "alice", "app", "m-1"),
    payload=b"\x00\xffdata",
    content_type="application/octet-stream",
    headers={"x-trace": "t", ":pseudo": "p", "ü": "ÿ"},
    tags=("a", "b"),
)


def test_schema_is_the_documented_contract() -> None:
    assert RECORD_SCHEMA_VERSION == 1
    assert RECORD_COLUMNS == (
        "channel",
        "seq",
        "epoch",
        "time",
        "publisher_dialect",
        "publisher_user",
        "publisher_app",
        "publisher_msg_id",
        "headers",
        "tags",
        "payload",
        "content_type",
    )
    types = {c.name: c.type for c in RECORD_SCHEMA}
    assert types["seq"] == types["time"] == "int64"
    assert types["headers"] == "map<string,string>"
    assert types["tags"] == "list<string>"
    assert types["payload"] == "binary"
    assert all(types[n] == "string" for n in ("channel", "epoch", "content_type", "publisher_user"))
    assert SPARK_DDL.startswith("channel STRING NOT NULL, seq BIGINT NOT NULL, ")
    assert "headers MAP<STRING, STRING> NOT NULL" in SPARK_DDL
    assert SPARK_DDL.count("NOT NULL") == len(RECORD_COLUMNS)
    assert all(c.doc for c in RECORD_SCHEMA)


def test_record_round_trip() -> None:
    rec = event_to_record(EVENT)
    assert tuple(rec) == RECORD_COLUMNS
    assert rec["time"] == EVENT.time_ns and rec["publisher_msg_id"] == "m-1"
    assert rec["tags"] == ["a", "b"] and rec["headers"] == dict(EVENT.headers)
    assert record_to_event(rec) == EVENT


def test_record_to_event_accepts_spark_shapes() -> None:
    rec = event_to_record(EVENT)
    rec["headers"] = list(EVENT.headers.items())  # a map column as key/value pairs
    rec["payload"] = bytearray(EVENT.payload)
    assert record_to_event(rec) == EVENT


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("seq", "7"),
        ("time", 1.5),
        ("channel", b"/a"),
        ("headers", {"k": 1}),
        ("headers", 5),
        ("tags", [1]),
        ("payload", 3.0),
        ("content_type", None),
    ],
)
def test_record_to_event_rejects_mistyped_columns(column: str, value: object) -> None:
    rec = event_to_record(EVENT)
    rec[column] = value
    with pytest.raises(RecordError):
        record_to_event(rec)


def test_record_to_event_rejects_missing_columns() -> None:
    rec = event_to_record(EVENT)
    del rec["epoch"]
    with pytest.raises(RecordError, match="epoch"):
        record_to_event(rec)


def test_column_codec_round_trip() -> None:
    assert encode_headers({}) == b"" and encode_tags(()) == b""
    assert decode_headers(b"") == {} and decode_headers(None) == {}
    assert decode_tags(b"") == () and decode_tags(None) == ()
    h = {"b": "2", "a": "1", ":p": "ü"}
    enc = encode_headers(h)
    assert msgpack.unpackb(enc, raw=False) == h
    assert decode_headers(enc) == h and list(decode_headers(enc)) == ["b", "a", ":p"]  # order kept
    assert decode_headers(encode_headers(MappingProxyType(h))) == h
    assert decode_tags(encode_tags(("x", "ÿ"))) == ("x", "ÿ")
    assert decode_tags(encode_tags(["x"])) == ("x",)


def test_column_codec_is_compact() -> None:
    assert len(encode_headers({"k": "v"})) == 5  # fixmap, fixstr k, fixstr v
    assert len(encode_tags(("t",))) == 3


@pytest.mark.parametrize(
    "data",
    [
        b"\xc1",  # never used in MessagePack
        msgpack.packb([1, 2]),
        msgpack.packb({"k": 1}),
        msgpack.packb({"k": b"bytes"}, use_bin_type=True),
        msgpack.packb({"a": "b"}) + b"\x00",  # trailing data
        b"\x81\xa1k\xa2\xff\xfe",  # invalid UTF-8
    ],
)
def test_decode_headers_rejects(data: bytes) -> None:
    with pytest.raises(RecordError):
        decode_headers(data)


@pytest.mark.parametrize(
    "data", [msgpack.packb({"a": "b"}), msgpack.packb([1]), msgpack.packb("s"), b"\x92\xa1"]
)
def test_decode_tags_rejects(data: bytes) -> None:
    with pytest.raises(RecordError):
        decode_tags(data)


def test_encoders_reject_non_strings() -> None:
    with pytest.raises(RecordError):
        encode_headers({"k": 1})  # type: ignore[dict-item]  # the wrong type, refused
    with pytest.raises(RecordError):
        encode_tags((b"t",))  # type: ignore[arg-type]  # the wrong type, refused


def test_event_size_matches_event() -> None:
    assert event_size(EVENT.payload, EVENT.headers, EVENT.tags) == EVENT.size
    assert event_size(b"abc", {}, ()) == 3
    ev = dataclasses.replace(EVENT, headers={"k": "v"}, tags=("ascii", "ünï", "\U0001f600"))
    assert event_size(ev.payload, ev.headers, ev.tags) == ev.size == 6 + 2 + 5 + 5 + 4


def test_codec_from_many_threads() -> None:
    """Each thread packs with its own Packer: concurrent encodes never mix their output."""
    errors: list[str] = []

    def work(i: int) -> None:
        h = {f"k{i}": f"v{j}" for j in range(3)}
        for _ in range(2000):
            if decode_headers(encode_headers(h)) != h or decode_tags(encode_tags((f"t{i}",))) != (f"t{i}",):
                errors.append(f"thread {i}")
                return

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


@pytest.mark.parametrize(
    ("headers", "tags"),
    [
        ({}, ()),
        ({"hubbub-source": "/b/c#e:1"}, ()),
        ({"k": "vé"}, ()),
        ({"ké": "v"}, ()),
        ({"a": "1", "b": "2"}, ()),
        ({"a": "1", "b": "é"}, ()),
        ({"a": "1"}, ("t",)),
        ({}, ("t", "ü")),
        (MappingProxyType({"a": "1"}), ()),
    ],
)
def test_event_columns_is_the_three_encoders(headers: dict[str, str], tags: tuple[str, ...]) -> None:
    payload = b"payload"
    want = (event_size(payload, headers, tags), encode_headers(headers), encode_tags(tags))
    assert event_columns(payload, headers, tags) == want
    assert event_columns(payload, headers, tags, msgpack.Packer(use_bin_type=True)) == want


def test_event_columns_rejects_non_strings() -> None:
    with pytest.raises(RecordError):
        event_columns(b"", {"a": 1}, ())  # type: ignore[dict-item]  # the wrong type, refused
