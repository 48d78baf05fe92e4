"""The qrpc framing's fuzz properties (protocols/qpubs.md §4), shared by the atheris target ``qrpc_framing``
(fuzz/atheris_targets.py) and the hypothesis tests (tests/property/test_qrpc_framing.py).

:func:`stream_from_bytes` turns arbitrary bytes into a qrpc byte stream a client could send: lines of calls
of every handler with fields picked by the bytes (good and bad topics, sub ids, batches, versions, numeric
ids, blobs), raw garbage, blank lines and over-long lines. :func:`check_stream` feeds it to a
:class:`~hubbub.dialects.qpubs.QrpcConnection` whole, in the chunks the bytes pick and one byte at a time,
and asserts:

* parsing does not depend on chunking: the same outputs every way (STYLE item 3);
* every output is a :class:`Send` (a final error line), a :class:`Close` (only for a line over the limit,
  and then nothing after it), or a call naming the id of a line of the stream;
* every line the server renders decodes the way the stock npm ``qrpc`` client decodes it
  (:func:`qrpc_client_decode`, a transcription of ``QrpcMessage.decodeV1``) to the same message as JSON does.
"""

from __future__ import annotations

import json
from typing import Any

from hubbub.dialects import qpubs as qpd

__all__ = ["check_rendering", "check_stream", "qrpc_client_decode", "stream_from_bytes"]

NAMES = (
    "auth", "emit", "listen", "once", "ignore", "listenExclusive", "createSubscription", "openSubscription",
    "closeSubscription", "deleteSubscription", "ack", "nope", "",
)  # fmt: skip
TOPICS: tuple[Any, ...] = ("a.b", "a.*", "*.b", "*", "*.x.*", "a*", "", 5, None, "a::b", "é.*")
SUB_IDS: tuple[Any, ...] = ("s", "s-1.x_Y", "bad id!", "", "x" * 129, 7, None)
VALUES: tuple[Any, ...] = (1, "x", None, [1, {"a": 2}], {"k": "v"}, True, 1.5)
MAX_LINE = 200


def stream_from_bytes(data: bytes) -> bytes:
    """A qrpc stream built from ``data``, three bytes per line."""
    out: list[bytes] = []
    i = 0
    while i + 3 <= len(data):
        a, b, c = data[i], data[i + 1], data[i + 2]
        i += 3
        kind = a % 10
        if kind == 0:  # raw bytes up to the next newline the fuzzer put in
            n = c % 24
            out.append(data[i : i + n].replace(b"\n", b"") + b"\n")
            i += n
            continue
        if kind == 1:
            out.append(b"\n" if c % 2 else b"   \r\n")
            continue
        if kind == 2:  # over the line limit
            out.append(b"{" + b"x" * (MAX_LINE + c) + b"}\n")
            continue
        msg: dict[str, Any] = {}
        if b % 5:
            msg["v"] = 1 if b % 5 != 4 else (2 if c % 2 else "1")
        msg["id"] = (str(c % 6), c % 6, "", None, True)[b % 5] if kind == 3 else str(c % 6)
        msg["n"] = NAMES[(a // 10 + b) % len(NAMES)]
        m: dict[str, Any] = {}
        if c % 3:
            m["topic"] = TOPICS[(b + c) % len(TOPICS)]
        if c % 4:
            m["subId"] = SUB_IDS[(a + c) % len(SUB_IDS)]
        if c % 5:
            m["value"] = VALUES[c % len(VALUES)]
        if b % 3 == 0:
            m["batch"] = (1, 2, "1", True, -1)[c % 5]
        if b % 4 == 0:
            m["group"] = ("g", 1)[c % 2]
        if b % 7 == 0:
            m["token"] = ("t", 5)[c % 2]
        if a % 7 == 0:
            m[("create", "reuse", "delete", "shared")[c % 4]] = (True, False, 1)[b % 3]
        if a % 11 == 0:
            m["error"] = "boom"
        msg["m"] = m if a % 13 else ("not an object", [1], None)[c % 3]
        if a % 17 == 0:
            msg["b"] = 4
        out.append(json.dumps(msg, ensure_ascii=bool(c % 2)).encode() + b"\n")
    return b"".join(out)


def _feed(chunks: list[bytes], auth: bool) -> list[Any]:
    conn = qpd.QrpcConnection(auth_required=auth, max_line=MAX_LINE, max_calls=3)
    outs: list[Any] = []
    for chunk in chunks:
        batch = conn.feed(chunk)
        while batch:
            for out in batch:
                outs.append(out)
                if isinstance(out, qpd.Auth):
                    if out.token != "bad":
                        conn.authenticated()  # the wiring accepts every token but "bad" here
                elif isinstance(out, qpd.Listen) and out.once and out.call_id.endswith("0"):
                    conn.ended(out.call_id)  # some once calls fire at once
            batch = conn.resume()
    return outs


def _chunks(stream: bytes, cuts: bytes) -> list[bytes]:
    """``stream`` cut at offsets picked by ``cuts``."""
    out: list[bytes] = []
    i = 0
    for c in cuts:
        if i >= len(stream):
            break
        n = 1 + c % 37
        out.append(stream[i : i + n])
        i += n
    out.append(stream[i:])
    return out


def check_stream(data: bytes) -> None:
    """The properties of the module docstring for the stream :func:`stream_from_bytes` builds."""
    stream = stream_from_bytes(data)
    ids = set()
    for line in stream.split(b"\n"):
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if isinstance(msg, dict) and isinstance(msg.get("id"), str | int) and not isinstance(msg["id"], bool):
            ids.add(str(msg["id"]))
    for auth in (False, True):
        whole = _feed([stream], auth)
        assert _feed(_chunks(stream, data), auth) == whole
        assert _feed([stream[i : i + 1] for i in range(len(stream))], auth) == whole
        for k, out in enumerate(whole):
            if isinstance(out, qpd.Close):
                assert k == len(whole) - 1, "outputs after a close"
            elif isinstance(out, qpd.Send):
                check_rendering(out.data)
                msg = json.loads(out.data)
                assert msg["s"] == "end" and msg["id"] in ids and msg["e"]["code"].startswith("E")
            else:
                assert out.call_id in ids


def qrpc_client_decode(line: str) -> dict[str, Any]:
    """``QrpcMessage.decodeV1`` of npm ``qrpc`` 1.1 for lines without a blob: ``m`` is cut out at the first
    ``,"m":`` and parsed on its own (to the line's end less the closing brace), the rest parsed without it."""
    m: Any = None
    has_m = False
    start = line.find(',"m":')
    if start > 0:
        try:
            m = json.loads(line[start + 5 : -1])
            has_m = True
            line = line[:start] + "}"
        except ValueError:
            pass
    ret: dict[str, Any] = json.loads(line)
    if has_m:
        ret["m"] = m
    return ret


def check_rendering(data: bytes) -> None:
    """A rendered line is one line of JSON that the stock client decodes to what JSON decodes."""
    assert data.endswith(b"\n") and data.count(b"\n") == 1
    text = data[:-1].decode("utf-8")
    assert qrpc_client_decode(text) == json.loads(text)


def check_renderers(call_id: str, value: Any, message: str) -> None:
    """Every renderer's line, for any call id, item and error message, decodes as the stock client reads."""
    check_rendering(qpd.render_stream_item(call_id, value))
    check_rendering(qpd.render_result(call_id, value))
    check_rendering(qpd.render_error(call_id, qpd.QpubsError(message, "EBADREQ")))
    check_rendering(qpd.render_end(call_id))
