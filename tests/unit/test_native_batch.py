"""``publish_batch`` (docs/native.md "Batched publishes"): decoding in both encodings, the whole frame refused
for any bad row (with the row named and the request id kept), the row bound, the reply's bytes, and the
protocol's accounting of rows in flight. Over a real server: tests/integration/test_publish_batch.py."""

from __future__ import annotations

import base64
from typing import Any

import msgpack
import orjson
import pytest

from hubbub.dialects import native as nc
from hubbub.dialects.native_batch import MAX_BATCH_ROWS, max_rows
from hubbub.disconnect import Disconnect
from hubbub.errors import BadChannel, BadRequest, HubbubError, LimitExceeded, StorageError
from hubbub.events import Event, Publisher

JSON = nc.NativeCodec("json")
MP = nc.NativeCodec("msgpack")


def mdec(obj: dict[str, Any], codec: nc.NativeCodec = MP) -> nc.Command:
    return codec.decode(msgpack.packb(obj, use_bin_type=True))


def jdec(obj: dict[str, Any]) -> nc.Command:
    return JSON.decode(orjson.dumps(obj))


def test_msgpack_batch_decodes_every_column() -> None:
    cmd = mdec(
        {
            "op": "publish_batch",
            "id": 9,
            "channels": ["/a/b", "/c", "/a/b"],
            "payloads": [b"x", "y", b""],
            "content_types": [None, "text/plain", None],
            "headers": [{"k": "v"}, None, {"m": "ü", "n": "1"}],
            "tags": [["b", "a", "b"], None, []],
            "idems": ["k1", None, "k3"],
            "ack": True,
        }
    )
    assert cmd == nc.PublishBatch(
        9,
        ["/a/b", "/c", "/a/b"],
        [b"x", b"y", b""],
        ["application/octet-stream", "text/plain", "application/octet-stream"],
        [{"k": "v"}, {}, {"m": "ü", "n": "1"}],
        [("a", "b"), (), ()],
        ["k1", "", "k3"],
        True,
    )
    assert len(cmd) == 3


def test_one_channel_and_content_type_for_every_row() -> None:
    cmd = mdec(
        {"op": "publish_batch", "id": 1, "channel": "/x", "payloads": [b"1", b"2"], "content_type": "a/b"}
    )
    assert isinstance(cmd, nc.PublishBatch)
    assert cmd.channels == ["/x", "/x"] and cmd.content_types == ["a/b", "a/b"]
    assert cmd.idems == ["", ""] and cmd.headers == [{}, {}] and cmd.tags == [(), ()] and not cmd.ack


def test_json_texts_and_b64s() -> None:
    cmd = jdec({"op": "publish_batch", "id": 1, "channel": "/x", "texts": ["hé", ""], "ack": True})
    assert isinstance(cmd, nc.PublishBatch)
    assert cmd.payloads == ["hé".encode(), b""]
    assert cmd.content_types == ["text/plain; charset=utf-8"] * 2
    cmd = jdec(
        {"op": "publish_batch", "id": 2, "channel": "/x", "b64s": [base64.b64encode(b"\x00\xff").decode()]}
    )
    assert isinstance(cmd, nc.PublishBatch)
    assert cmd.payloads == [b"\x00\xff"] and cmd.content_types == ["application/octet-stream"]


BAD: list[tuple[dict[str, Any], type[HubbubError], str]] = [
    ({"channel": "/a"}, BadRequest, "payloads"),
    ({"channel": "/a", "payloads": []}, BadRequest, "at least one row"),
    ({"channel": "/a", "payloads": [1]}, BadRequest, "row 0"),
    ({"payloads": [b"x"]}, BadRequest, "channel"),
    ({"channel": "/a", "channels": ["/a"], "payloads": [b"x"]}, BadRequest, "channel"),
    ({"channels": ["/a"], "payloads": [b"x", b"y"]}, BadRequest, "one value per row"),
    ({"channels": [["/a"]], "payloads": [b"x"]}, BadRequest, "strings"),
    ({"channels": ["/a", 5], "payloads": [b"x", b"y"]}, BadRequest, "strings"),
    ({"channels": ["/a", "no-slash"], "payloads": [b"x", b"y"]}, BadChannel, ""),
    ({"channel": "/a", "payloads": [b"x"], "headers": [{":k": "v"}]}, BadRequest, "row 0"),
    ({"channel": "/a", "payloads": [b"x", b"y"], "headers": [None, {"k": 1}]}, BadRequest, "row 1"),
    ({"channel": "/a", "payloads": [b"x"], "headers": [[1]]}, BadRequest, "row 0"),
    ({"channel": "/a", "payloads": [b"x"], "headers": [{"k" * 9000: "v"}]}, LimitExceeded, "row 0"),
    ({"channel": "/a", "payloads": [b"x"], "tags": [[1]]}, BadRequest, "row 0"),
    ({"channel": "/a", "payloads": [b"x"], "tags": ["a"]}, BadRequest, "row 0"),
    ({"channel": "/a", "payloads": [b"x"], "idems": [5]}, BadRequest, "row 0"),
    ({"channel": "/a", "payloads": [b"x"], "idems": ["k" * 129]}, BadRequest, "row 0"),
    ({"channel": "/a", "payloads": [b"x"], "content_types": [[1]]}, BadRequest, "row 0"),
    ({"channel": "/a", "payloads": [b"x"], "content_types": ["a\nb"]}, BadRequest, "row 0"),
    ({"channel": "/a", "payloads": [b"x"], "content_type": "a/b", "content_types": ["a/b"]}, BadRequest, ""),
    ({"channel": "/a", "payloads": [b"x"], "ack": 1}, BadRequest, "ack"),
    ({"channel": "/a", "payloads": [b"x"] * (MAX_BATCH_ROWS + 1)}, LimitExceeded, "rows"),
]


@pytest.mark.parametrize(("fields", "error", "detail"), BAD)
def test_a_bad_row_refuses_the_whole_frame(
    fields: dict[str, Any], error: type[HubbubError], detail: str
) -> None:
    with pytest.raises(error) as info:
        mdec({"op": "publish_batch", "id": 77, **fields})
    assert info.value.request_id == 77
    assert detail in info.value.detail
    assert not info.value.fatal


def test_json_refusals() -> None:
    for fields in ({"channel": "/a", "payloads": ["x"]}, {"channel": "/a", "texts": ["x"], "b64s": ["eA=="]}):
        with pytest.raises(BadRequest):
            jdec({"op": "publish_batch", "id": 1, **fields})
    with pytest.raises(BadRequest, match="row 1"):
        jdec({"op": "publish_batch", "id": 1, "channel": "/a", "b64s": ["eA==", "%%"]})


def test_rows_bounded_by_max_frame_so_the_reply_fits() -> None:
    small = nc.NativeCodec("msgpack", max_frame=64 * 100)
    assert max_rows(64 * 100) == 100
    with pytest.raises(LimitExceeded):
        mdec({"op": "publish_batch", "id": 1, "channel": "/a", "payloads": [b""] * 101}, small)
    batch = mdec({"op": "publish_batch", "id": 1, "channel": "/a", "payloads": [b""] * 100}, small)
    assert isinstance(batch, nc.PublishBatch) and len(batch) == 100


def test_stream_decoder_gives_the_batch_whole_in_any_chunking() -> None:
    bodies = [
        msgpack.packb(
            {"op": "publish_batch", "id": 3, "channel": "/a", "payloads": [b"p%d" % i for i in range(50)]},
            use_bin_type=True,
        ),
        msgpack.packb({"op": "ping", "id": 4}),
    ]
    data = b"".join(len(b).to_bytes(4, "big") + b for b in bodies)
    whole = nc.NativeStreamDecoder().feed(data)
    one = nc.NativeStreamDecoder()
    by_byte: list[Any] = []
    for i in range(len(data)):
        by_byte += one.feed(data[i : i + 1])
    assert whole == by_byte
    assert isinstance(whole[0], nc.PublishBatch) and len(whole[0]) == 50 and whole[1] == nc.Ping(4)
    trailing = nc.NativeStreamDecoder()
    assert trailing.feed(data + b"\x00\x00") == whole and trailing.buffered == 2


def _event(seq: int, epoch: str = "e1") -> Event:
    return Event("/a", seq, epoch, 1000 + seq, Publisher("native"), b"", "text/plain", {}, ())


class _R:
    def __init__(self, event: Event, duplicate: bool = False) -> None:
        self.event = event
        self.duplicate = duplicate


@pytest.mark.parametrize("codec", [JSON, MP], ids=["json", "msgpack"])
def test_reply_columns(codec: nc.NativeCodec) -> None:
    out = codec.encode_batch_reply(5, [1, 2, 7], ["e1", "e1", "e0"], [11, 12, 3], [2])
    obj = orjson.loads(out) if codec is JSON else msgpack.unpackb(out)

    def t(v: int) -> int | str:
        return str(v) if codec is JSON else v

    assert obj == {
        "op": "reply",
        "id": 5,
        "count": 3,
        "seqs": [1, 2, 7],
        "epochs": ["e1", "e1", "e0"],
        "times": [t(11), t(12), t(3)],
        "duplicates": [2],
    }
    assert list(obj) == ["op", "id", "count", "seqs", "epochs", "times", "duplicates"]
    none = codec.encode_batch_reply(6, [1], ["e"], [1])
    assert "duplicates" not in (orjson.loads(none) if codec is JSON else msgpack.unpackb(none))


def _proto(frames: list[bytes], rooms: list[int], max_inflight: int = 10) -> nc.NativeProtocol:
    return nc.NativeProtocol(
        MP,
        emit=frames.append,
        end=lambda reason: None,
        room=lambda: rooms.append(1),
        max_frame=1 << 20,
        max_subscriptions=10,
        max_inflight=max_inflight,
        ping_interval=25,
    )


def test_protocol_counts_a_batch_as_its_rows_in_flight() -> None:
    frames: list[bytes] = []
    rooms: list[int] = []
    proto = _proto(frames, rooms)
    assert proto.batch_room(50)  # nothing in flight: even a batch over max_inflight goes, alone
    proto.batch_submitted(6)
    assert proto.inflight == 6 and proto.batch_room(4) and not proto.batch_room(5)
    out = proto.batch_committed(3, True, [_R(_event(1)), _R(_event(9, "e0"), True), _R(_event(2))])
    assert out is not None
    assert msgpack.unpackb(out)["duplicates"] == [1] and msgpack.unpackb(out)["seqs"] == [1, 9, 2]
    assert proto.inflight == 3 and rooms  # below half: the transport may read again
    assert proto.batch_committed(4, False, [_R(_event(3))] * 3) is None and proto.inflight == 0
    proto.batch_submitted(2)
    proto.batch_failed(5, 2, StorageError("disk"))
    assert proto.inflight == 0
    err = msgpack.unpackb(frames[-1])
    assert err["op"] == "error" and err["id"] == 5 and err["code"] == StorageError.code
    assert Disconnect.of(err["code"]) is not None


@pytest.mark.parametrize(
    ("fields", "row"),
    [
        ({"channels": ["/a", "/a", "bad"], "payloads": [b"x"] * 3}, 2),
        ({"channels": ["/a", 7], "payloads": [b"x"] * 2}, 1),
        ({"channel": "/a", "payloads": [b"x", 1]}, 1),
        ({"channel": "/a", "payloads": [b"x"] * 3, "headers": [None, None, {":p": "v"}]}, 2),
        ({"channel": "/a", "payloads": [b"x"] * 2, "idems": ["k", "k" * 200]}, 1),
        ({"channel": "bad", "payloads": [b"x"] * 2}, None),  # every row's channel: no one row
    ],
)
def test_the_error_frame_names_the_bad_row(fields: dict[str, Any], row: int | None) -> None:
    frames: list[bytes] = []
    proto = _proto(frames, [])
    with pytest.raises(HubbubError) as info:
        mdec({"op": "publish_batch", "id": 8, **fields})
    assert info.value.row == row
    proto.failed(info.value, info.value.request_id)
    err = msgpack.unpackb(frames[-1])
    assert err["id"] == 8 and err.get("row") == row
    assert ("row" in err) == (row is not None)
