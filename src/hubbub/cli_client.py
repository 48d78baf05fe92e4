"""The client side of the ``hubbub`` command line: ``pub``, ``sub``, ``consume`` and ``log``.

``pub``, ``sub`` and ``consume`` speak the native protocol through :class:`hubbub.client.AsyncClient`;
``log`` pages through the HTTP log API. Every command takes ``--url`` (env ``HUBBUB_URL``) and ``--token``
(env ``HUBBUB_TOKEN``). Exit codes: 0 success, 1 a connection or server error (one line on stderr), 2 bad
arguments, 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import os
import re
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TextIO
from urllib.parse import quote, urlsplit

import aiohttp
import msgpack
import orjson
import yarl

from hubbub.client import (
    AsyncClient,
    CannotConnect,
    Gap,
    PublishAck,
    error_from_frame,
    event_as_dict,
    event_from_dict,
)
from hubbub.errors import HubbubError
from hubbub.events import Event, Position

__all__ = ["add_client_commands", "payload_text"]

DEFAULT_URL = "ws://127.0.0.1:8080"
LOG_PAGE = 1000  # the server counts larger limits as 1000
PUB_WINDOW = 256  # publishes in flight at once with --lines
MAX_LOG_LINE = 64 << 20
_OUTPUT_HELP = (
    "output format: text ('CHANNEL SEQ PAYLOAD', one event per line: a text payload with \\\\, \\n, \\r, "
    "\\t and \\xNN escapes for backslashes, control characters and bytes that are not UTF-8; a JSON payload "
    "as compact JSON; an application/msgpack payload as 'msgpack:' and its value in JSON, bin as "
    '{"b64": …}) or json (one event object per line, as the native protocol sends it)'
)


class _UsageError(ValueError):
    """A bad argument value: exit code 2."""


def add_client_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``pub``, ``sub``, ``consume`` and ``log`` on the ``hubbub`` command's subparsers."""
    pub = subparsers.add_parser(
        "pub",
        help="publish events",
        description="Publish DATA (or standard input) to CHANNEL and print each acknowledgement as "
        "'SEQ EPOCH'. Without DATA and --lines, all of standard input is one event.",
    )
    _common(pub)
    pub.add_argument("channel", metavar="CHANNEL", help="the channel to publish to, such as /chat/lobby")
    pub.add_argument("data", metavar="DATA", nargs="?", help="the payload (text, or JSON with --json)")
    pub.add_argument("--lines", action="store_true", help="publish each line of standard input as an event")
    pub.add_argument("--json", action="store_true", help="the payload is JSON (published as a JSON value)")
    pub.add_argument("--content-type", metavar="TYPE", help="content type (default from the payload kind)")
    pub.add_argument("--tag", action="append", default=[], metavar="TAG", help="a tag (repeatable)")
    pub.add_argument("--header", action="append", default=[], metavar="K=V", help="a header (repeatable)")
    pub.add_argument(
        "--idem", metavar="KEY", help="idempotency key (with --lines, '-N' is appended for line N)"
    )
    pub.add_argument("--no-ack", action="store_true", help="do not wait for acknowledgements")
    pub.add_argument("--output", choices=("text", "json"), default="text", help="ack format (default text)")
    pub.set_defaults(func=_cmd_pub, _command="pub")

    sub = subparsers.add_parser(
        "sub",
        help="follow a channel or pattern",
        description="Subscribe to PATTERN and print events as they arrive: 'CHANNEL SEQ PAYLOAD' per "
        "line, or one JSON event object per line with --output json. Gaps are reported on stderr. "
        "Reconnects on its own and resumes without gaps or duplicates.",
    )
    _common(sub)
    sub.add_argument(
        "pattern", metavar="PATTERN", help="a channel, or a pattern with * (one segment) and ** (any depth)"
    )
    replay = sub.add_mutually_exclusive_group()
    replay.add_argument("--since", metavar="SEQ:EPOCH", help="resume an exact channel after this position")
    replay.add_argument("--last", type=int, metavar="N", help="replay the last N events first")
    replay.add_argument("--from-time", type=int, metavar="NS", help="replay events from this time (ns)")
    sub.add_argument("--tag", action="append", default=[], metavar="TAG", help="required tag (repeatable)")
    sub.add_argument("--count", type=int, metavar="N", help="exit after N events")
    sub.add_argument("--output", choices=("text", "json"), default="text", help=_OUTPUT_HELP)
    sub.set_defaults(func=_cmd_sub, _command="sub")

    con = subparsers.add_parser(
        "consume",
        help="read a durable consumer, acknowledging what it prints",
        description="Open the durable consumer NAME (created on PATTERN when it does not exist; "
        "docs/native.md 'Durable consumers') and print its events as they arrive, 'CHANNEL SEQ PAYLOAD' "
        "per line or one JSON object per line with --output json (the event, with its journal position "
        "'pos' and 'attempts'). Each batch is acknowledged once printed, so an event printed is never "
        "delivered again; events not yet acknowledged when the command stops are delivered again later "
        "(at least once). Reconnects on its own.",
    )
    _common(con)
    con.add_argument("name", metavar="NAME", help="the consumer's name (1-128 of A-Z a-z 0-9 . _ -)")
    con.add_argument("pattern", metavar="PATTERN", help="the channel or pattern it journals (on creation)")
    con.add_argument("--shared", action="store_true", help="join it as a work queue member")
    con.add_argument("--max", type=int, default=0, metavar="N", help="at most N events per batch")
    con.add_argument("--tag", action="append", default=[], metavar="TAG", help="required tag (repeatable)")
    con.add_argument(
        "--count", type=int, metavar="N", help="exit after the batch that brings the events printed to N"
    )
    con.add_argument("--no-create", action="store_true", help="fail (4204) when it does not exist")
    con.add_argument("--output", choices=("text", "json"), default="text", help=_OUTPUT_HELP)
    con.set_defaults(func=_cmd_consume, _command="consume")

    logp = subparsers.add_parser(
        "log",
        help="print a channel's history",
        description="Print the events of CHANNEL from its log (HTTP log API), oldest first.",
    )
    _common(logp)
    logp.add_argument("channel", metavar="CHANNEL", help="the channel whose log to print (not a pattern)")
    logp.add_argument("--since", type=int, default=0, metavar="SEQ", help="start after this seq (default 0)")
    logp.add_argument("--limit", type=int, metavar="N", help="print at most N events (default: all)")
    logp.add_argument("--output", choices=("text", "json"), default="text", help=_OUTPUT_HELP)
    logp.set_defaults(func=_cmd_log, _command="log")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--url",
        default=os.environ.get("HUBBUB_URL") or DEFAULT_URL,
        help=f"server URL: ws://HOST:PORT, http://HOST:PORT or tcp://HOST:PORT [env HUBBUB_URL; default "
        f"{DEFAULT_URL}]",
    )
    p.add_argument(
        "--token", default=os.environ.get("HUBBUB_TOKEN") or None, help="access token [env HUBBUB_TOKEN]"
    )


# -- running --------------------------------------------------------------------------------------------


def _run(args: argparse.Namespace, main: Callable[[argparse.Namespace], Awaitable[int]]) -> int:
    """Run one command: errors become one line on stderr and an exit code; Ctrl-C exits with 130."""
    prog = f"hubbub {getattr(args, '_command', '')}".rstrip()
    try:
        return asyncio.run(_guard(main(args)))
    except KeyboardInterrupt:
        return 130
    except _UsageError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    except CannotConnect:
        print(f"{prog}: cannot connect to {args.url}: is `hubbub serve` running?", file=sys.stderr)
        return 1
    except HubbubError as exc:
        detail = f": {exc.detail}" if exc.detail and exc.detail != exc.message else ""
        print(f"{prog}: {exc.message} ({exc.code}){detail}", file=sys.stderr)
        return 1
    except (aiohttp.ClientConnectorError, ConnectionRefusedError):
        print(f"{prog}: cannot connect to {args.url}: is `hubbub serve` running?", file=sys.stderr)
        return 1
    except (OSError, aiohttp.ClientError, ValueError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1


async def _guard(coro: Awaitable[int]) -> int:
    try:
        return await coro
    except BrokenPipeError:
        # The reader went away (``hubbub sub ... | head``): stop quietly; keep Python's own flush at exit
        # from complaining too.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 0


def _write(out: TextIO, line: str) -> None:
    out.write(line + "\n")
    out.flush()


def _connect(args: argparse.Namespace, *, reconnect: bool) -> Any:
    try:
        return AsyncClient.connect(args.url, token=args.token, reconnect=reconnect)
    except ValueError as exc:
        raise _UsageError(str(exc)) from None


# -- pub ------------------------------------------------------------------------------------------------


def _cmd_pub(args: argparse.Namespace) -> int:
    return _run(args, _pub)


def _payload(text: str, as_json: bool) -> Any:
    if not as_json:
        return text
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise _UsageError(f"not valid JSON: {exc}") from None


def _ack_line(ack: PublishAck, output: str) -> str:
    if output == "json":
        return orjson.dumps(
            {
                "channel": ack.channel,
                "seq": ack.seq,
                "epoch": ack.epoch,
                "time": str(ack.time),
                "duplicate": ack.duplicate,
            }
        ).decode()
    return f"{ack.seq} {ack.epoch}"


async def _pub(args: argparse.Namespace) -> int:
    headers: dict[str, str] = {}
    for h in args.header:
        k, sep, v = h.partition("=")
        if not sep or not k:
            raise _UsageError(f"--header expects KEY=VALUE, got {h!r}")
        headers[k] = v
    if args.data is not None and args.lines:
        raise _UsageError("give DATA or --lines, not both")
    payloads: list[Any]
    if args.data is not None:
        payloads = [_payload(args.data, args.json)]
    elif args.lines:
        lines = sys.stdin.read().splitlines()
        payloads = [_payload(line, args.json) for line in lines]
    else:
        raw = sys.stdin.buffer.read()
        if args.json:
            payloads = [_payload(raw.decode("utf-8", "replace"), True)]
        else:
            try:
                payloads = [raw.decode("utf-8")]
            except UnicodeDecodeError:
                payloads = [raw]
    ack = not args.no_ack
    async with _connect(args, reconnect=False) as client:
        pending: collections.deque[asyncio.Task[PublishAck | None]] = collections.deque()

        async def flush(keep: int) -> None:
            while len(pending) > keep:
                result = await pending.popleft()
                if result is not None:
                    _write(sys.stdout, _ack_line(result, args.output))

        try:
            for n, data in enumerate(payloads, 1):
                idem = args.idem if args.idem is None or not args.lines else f"{args.idem}-{n}"
                # Several publishes in flight keep --lines fast; acks are printed in input order.
                pending.append(
                    asyncio.create_task(
                        client.publish(
                            args.channel,
                            data,
                            content_type=args.content_type,
                            headers=headers or None,
                            tags=args.tag,
                            idem=idem,
                            ack=ack,
                        )
                    )
                )
                await flush(PUB_WINDOW - 1)
            await flush(0)
        finally:
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
    return 0


# -- sub ------------------------------------------------------------------------------------------------


def _cmd_sub(args: argparse.Namespace) -> int:
    return _run(args, _sub)


def _parse_since(text: str) -> Position:
    seq, sep, epoch = text.partition(":")
    if not sep or not seq.isdigit():
        raise _UsageError(f"--since expects SEQ:EPOCH, got {text!r}")
    return Position(int(seq), epoch)


def _event_text(event: Event) -> str:
    return f"{event.channel} {event.seq} {payload_text(event.payload, event.content_type)}"


# What would break "one event per line" or hide what a payload holds: the backslash itself, C0 and C1
# controls and DEL, the Unicode line and paragraph separators, and the bytes that are not UTF-8 (decoded with
# surrogateescape as U+DC80-U+DCFF).
_SPECIAL = re.compile(r"[\\\x00-\x1f\x7f-\x9f\u2028\u2029\udc80-\udcff]")
#: The same in JSON text, where orjson already escaped the backslash and C0 (and strings hold no lone bytes).
_SPECIAL_JSON = re.compile(r"[\x7f-\x9f\u2028\u2029]")
_SHORT = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(m: re.Match[str]) -> str:
    ch = m.group()
    o = ord(ch)
    if ch in _SHORT:
        return _SHORT[ch]
    if o < 0x80:  # C0 and DEL: the character and its byte are the same
        return f"\\x{o:02x}"
    if 0xDC80 <= o <= 0xDCFF:  # a byte that is not UTF-8
        return f"\\x{o - 0xDC00:02x}"
    return f"\\u{o:04x}"  # C1, U+2028, U+2029: characters, written as such


def _text(payload: bytes) -> str:
    """The payload as one line of text: ``\\xNN`` is always the byte NN, ``\\uXXXX`` a character."""
    text = payload.decode("utf-8", "surrogateescape")
    return _SPECIAL.sub(_escape, text) if _SPECIAL.search(text) else text


def _json_line(value: Any) -> str:
    # orjson escapes C0 in strings and writes C1, DEL and U+2028/9 as they are (valid JSON either way).
    out = orjson.dumps(value).decode()
    return _SPECIAL_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", out) if _SPECIAL_JSON.search(out) else out


def _jsonable(obj: Any) -> Any:
    """A decoded msgpack value as JSON can hold it: bin as ``{"b64": …}``, an extension type as ``{"ext": N,
    "b64": …}``, a map key that is not a string as its JSON text."""
    if isinstance(obj, dict):
        return {
            k if isinstance(k, str) else orjson.dumps(_jsonable(k)).decode(): _jsonable(v)
            for k, v in obj.items()
        }
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, bytes):
        return {"b64": base64.b64encode(obj).decode()}
    if isinstance(obj, msgpack.ExtType):
        return {"ext": obj.code, "b64": base64.b64encode(obj.data).decode()}
    if isinstance(obj, msgpack.Timestamp):
        return {"ext": -1, "b64": base64.b64encode(obj.to_bytes()).decode()}
    return obj


def payload_text(payload: bytes, content_type: str) -> str:
    """How the text output of ``sub``, ``consume`` and ``log`` shows a payload, always on one line: JSON (a
    JSON content type whose payload parses) as compact JSON; msgpack (``application/msgpack`` whose payload
    decodes) as ``msgpack:`` and its value in JSON; anything else as text, with backslash escapes for the
    backslash, control characters and the bytes that are not UTF-8."""
    base = content_type.split(";", 1)[0].strip().lower()
    try:
        if base == "application/json" or base.endswith("+json"):
            return _json_line(orjson.loads(payload))
        if base == "application/msgpack":
            return "msgpack:" + _json_line(_jsonable(msgpack.unpackb(payload, strict_map_key=False)))
    except (ValueError, TypeError, RecursionError, msgpack.UnpackException):
        pass  # not what its type says: shown as bytes
    return _text(payload)


def _gap_text(gap: Gap) -> str:
    return (
        f"gap on {gap.channel} ({gap.reason}): events after {gap.since.seq}:{gap.since.epoch} up to "
        f"{gap.position.seq}:{gap.position.epoch} are not available"
    )


async def _sub(args: argparse.Namespace) -> int:
    since = _parse_since(args.since) if args.since else None
    if args.last is not None and args.last < 1:
        raise _UsageError("--last must be at least 1")
    if args.count is not None and args.count < 1:
        raise _UsageError("--count must be at least 1")
    seen = 0
    async with (
        _connect(args, reconnect=True) as client,
        client.subscribe(
            args.pattern, tags=args.tag or None, since=since, last=args.last, from_time=args.from_time
        ) as sub,
    ):
        async for item in sub:
            if isinstance(item, Gap):
                _write(sys.stderr, f"hubbub sub: {_gap_text(item)}")
                continue
            if args.output == "json":
                _write(sys.stdout, orjson.dumps(event_as_dict(item)).decode())
            else:
                _write(sys.stdout, _event_text(item))
            seen += 1
            if args.count is not None and seen >= args.count:
                break
    return 0


# -- consume --------------------------------------------------------------------------------------------


def _cmd_consume(args: argparse.Namespace) -> int:
    return _run(args, _consume)


async def _consume(args: argparse.Namespace) -> int:
    if args.count is not None and args.count < 1:
        raise _UsageError("--count must be at least 1")
    if args.max < 0:
        raise _UsageError("--max must be at least 0")
    seen = 0
    options: dict[str, Any] = {"max": args.max or None, "tags": args.tag or None}
    if args.shared:
        options["shared"] = True
    if args.no_create:
        options["create"] = False
    async with (
        _connect(args, reconnect=True) as client,
        client.consume(args.name, args.pattern, **options) as consumer,
    ):
        async for batch in consumer:
            for item in batch:
                if args.output == "json":
                    obj = {"pos": item.pos, "attempts": item.attempts, **event_as_dict(item.event)}
                    _write(sys.stdout, orjson.dumps(obj).decode())
                else:
                    _write(sys.stdout, _event_text(item.event))
                seen += 1
            await batch.ack()
            if args.count is not None and seen >= args.count:
                break
    return 0


# -- log ------------------------------------------------------------------------------------------------


def _cmd_log(args: argparse.Namespace) -> int:
    return _run(args, _log)


def _http_base(url: str) -> str:
    parts = urlsplit(url)
    scheme = {"ws": "http", "http": "http", "wss": "https", "https": "https"}.get(parts.scheme.lower())
    if scheme is None:
        raise _UsageError(f"log reads the HTTP API: give an http:// or ws:// URL, not {url!r}")
    return f"{scheme}://{parts.netloc}"


def _log_url(base: str, channel: str) -> str:
    if not channel.startswith("/"):
        channel = "/" + channel
    # Canonical channels carry their own %XX escapes; quote the rest so the path survives as written.
    return base + "/api/v1/log" + quote(channel, safe="/%!$&'()*+,;=:@")


async def _http_error(resp: aiohttp.ClientResponse) -> HubbubError:
    body = await resp.read()
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        obj = None
    if isinstance(obj, dict) and isinstance(obj.get("error"), dict):
        return error_from_frame(obj["error"])
    text = body.decode("utf-8", "replace").strip()[:200]
    return HubbubError(f"HTTP {resp.status} {text}".strip())


async def _log(args: argparse.Namespace) -> int:
    if args.since < 0:
        raise _UsageError("--since must be 0 or more")
    if args.limit is not None and args.limit < 1:
        raise _UsageError("--limit must be at least 1")
    url = _log_url(_http_base(args.url), args.channel)
    headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}
    since = args.since
    remaining: int | None = args.limit
    epoch: str | None = None
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=60)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        while remaining is None or remaining > 0:
            page = LOG_PAGE if remaining is None else min(LOG_PAGE, remaining)
            params = {"since": str(since), "limit": str(page), "format": "jsonl"}
            if epoch:
                # Paging within one epoch: a reset log between pages answers 409 instead of mixing epochs.
                params["epoch"] = epoch
            async with http.get(yarl.URL(url, encoded=True).with_query(params), headers=headers) as resp:
                if resp.status != 200:
                    raise await _http_error(resp)
                epoch = resp.headers.get("Hubbub-Epoch", "")
                top = int(resp.headers.get("Hubbub-Top", "0") or 0)
                if since == args.since and resp.headers.get("Hubbub-Trimmed", "").lower() == "true":
                    first = resp.headers.get("Hubbub-First", "?")
                    print(
                        f"hubbub log: events after {args.since} before {first} were trimmed by retention",
                        file=sys.stderr,
                    )
                n = 0
                async for line in _lines(resp):
                    obj = orjson.loads(line)
                    event = event_from_dict(obj)
                    since = max(since, event.seq)
                    n += 1
                    if args.output == "json":
                        _write(sys.stdout, line.decode())
                    else:
                        _write(sys.stdout, _event_text(event))
            if remaining is not None:
                remaining -= n
            if n < page or since >= top or not epoch:
                break
    return 0


async def _lines(resp: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    """The non-empty lines of a JSON-lines body, each bounded by ``MAX_LOG_LINE``."""
    buf = bytearray()
    async for chunk in resp.content.iter_chunked(1 << 16):
        buf += chunk
        start = 0
        while (i := buf.find(b"\n", start)) >= 0:
            line = bytes(buf[start:i]).rstrip(b"\r")
            start = i + 1
            if line:
                yield line
        del buf[:start]
        if len(buf) > MAX_LOG_LINE:
            raise HubbubError(f"log line over {MAX_LOG_LINE} bytes")
    if buf.strip():
        yield bytes(buf.strip())
