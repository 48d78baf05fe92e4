"""The webhooks' HTTP/1.1 response reader (sans-I/O, ``transports/webhook_http.py``): every response fed
whole, one byte at a time and with trailing data; the bounds; the request line and Host of a URL."""

from __future__ import annotations

import pytest

from hubbub.transports.webhook_http import (
    MAX_BODY,
    MAX_HEAD,
    BadResponse,
    Response,
    ResponseReader,
    target_of,
)

CASES: list[tuple[bytes, Response]] = [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", Response(200, None, True)),
    (b"HTTP/1.1 204 No Content\r\n\r\n", Response(204, None, True)),
    (b"HTTP/1.1 429 Slow\r\nretry-after: 7\r\ncontent-length: 0\r\n\r\n", Response(429, "7", True)),
    (
        b"HTTP/1.1 503 Busy\r\nRetry-After: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"3;ext=1\r\nabc\r\n10\r\n" + b"x" * 16 + b"\r\n0\r\nTrailer: v\r\n\r\n",
        Response(503, "3", True),
    ),
    (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", Response(200, None, True)),
    (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\nx", Response(200, None, False)),
    (b"HTTP/1.0 410 Gone\r\nContent-Length: 0\r\n\r\n", Response(410, None, False)),
]


def read(pieces: list[bytes]) -> Response:
    r = ResponseReader()
    got = None
    for p in pieces:
        got = r.feed(p) or got
    return got or r.eof()


@pytest.mark.parametrize(("raw", "want"), CASES)
def test_whole_byte_by_byte_and_with_trailing_data(raw: bytes, want: Response) -> None:
    assert read([raw]) == want
    assert read([raw[i : i + 1] for i in range(len(raw))]) == want
    with pytest.raises(BadResponse):
        read([raw + b"HTTP/1.1 200 OK\r\n"])  # nothing was asked for more
    with pytest.raises(BadResponse):
        read([raw, b"x"])


def test_a_body_to_the_end_of_the_connection() -> None:
    raw = b"HTTP/1.1 500 Oops\r\n\r\nsome text"
    for pieces in ([raw], [raw[:20], raw[20:]]):
        r = ResponseReader()
        assert all(r.feed(p) is None for p in pieces)
        assert r.eof() == Response(500, None, False)


@pytest.mark.parametrize(
    "raw",
    [
        b"HTTP/2 200 OK\r\n\r\n",
        b"HTTP/1.1 abc OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nab\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (MAX_BODY + 1),
        b"HTTP/1.1 200 OK\r\nX: " + b"y" * MAX_HEAD + b"\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab",  # cut: the connection ended
    ],
)
def test_what_is_refused(raw: bytes) -> None:
    for pieces in ([raw], [raw[i : i + 1] for i in range(len(raw))]):
        with pytest.raises(BadResponse):
            read(pieces)


def test_bodies_to_the_end_are_bounded() -> None:
    r = ResponseReader()
    r.feed(b"HTTP/1.1 200 OK\r\n\r\n")
    with pytest.raises(BadResponse):
        for _ in range(MAX_BODY // 4096 + 2):
            r.feed(b"z" * 4096)


def test_targets() -> None:
    t = target_of("http://example.com/hooks/a b?x=1&y=é")
    assert t.key == ("http", "example.com", 80)
    assert t.start == b"POST /hooks/a%20b?x=1&y=%C3%A9 HTTP/1.1\r\nHost: example.com\r\n"
    assert target_of("https://h:8443").start == b"POST / HTTP/1.1\r\nHost: h:8443\r\n"
    assert target_of("https://h").key == ("https", "h", 443)
    assert target_of("http://[::1]:9/x").start == b"POST /x HTTP/1.1\r\nHost: [::1]:9\r\n"
    with pytest.raises(ValueError):
        target_of("ftp://h/")
