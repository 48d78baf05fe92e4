"""Conformance-vector runner: runs the step language of ``protocols/vectors/README.md`` against a server.

Two layers live here.

* **Pure parts** (no sockets, no event loop), unit-tested in ``tests/unit/test_vector_runner.py``:
  placeholders (:func:`compile_pattern`, :func:`expand`, :func:`match_text`), JSON/msgpack matching
  (:func:`match_value`, :func:`expand_json`), stream framing (:class:`LineSplitter`, :class:`Len32Splitter`,
  :class:`SseParser`), step validation (:func:`validate_step`, :func:`lint_case`) and the dialects a case
  touches (:func:`dialects_touched`).
* **I/O parts**: one client class per connection kind (:class:`WsClient`, :class:`TcpClient`,
  :class:`HttpStreamClient`) and :class:`CaseRunner`, which runs one case against a server it starts itself.

Concurrency contract: everything runs on one event loop (the caller uses ``asyncio.run`` per case). Each
client owns one reader task that moves received units into the client's buffer, so expectations and quiet
windows only ever look at buffers. :meth:`CaseRunner.run` closes every client, the HTTP session and the server
before it returns, whether the case passed or not, so no task, socket or session outlives a case.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import json
import re
import struct
import urllib.parse
from collections import ChainMap, deque
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
import msgpack
from multidict import CIMultiDictProxy
from yarl import URL

__all__ = [
    "DIALECTS",
    "STEP_KEYS",
    "TOKENS",
    "CaseFailure",
    "CaseRunner",
    "Closed",
    "HasPorts",
    "Len32Splitter",
    "LineSplitter",
    "Mismatch",
    "SseEvent",
    "SseParser",
    "Unit",
    "VectorError",
    "compile_pattern",
    "dialects_touched",
    "expand",
    "expand_json",
    "lint_case",
    "match_text",
    "match_value",
    "run_case",
    "validate_case",
    "validate_step",
]

DIALECTS = ("ivy", "guble", "wearscript", "mist", "qpubs", "native")
DEFAULT_TIMEOUT_MS = 2000
DEFAULT_WINDOW_MS = 300
CONNECT_TIMEOUT_S = 10.0
HTTP_TIMEOUT_S = 10.0
CLOSE_TIMEOUT_S = 5.0
MAX_UNIT = (
    64 * 1024 * 1024
)  # a bound on any one buffered line or frame, far above every limit the vectors use


class VectorError(Exception):
    """The vector itself is malformed: an unknown step key or placeholder, an unknown variable..."""


class Mismatch(AssertionError):
    """A received value does not match an expectation. ``path`` locates the difference inside JSON values."""

    def __init__(self, reason: str, path: str = "") -> None:
        super().__init__(f"{path}: {reason}" if path else reason)
        self.reason = reason
        self.path = path


class CaseFailure(AssertionError):
    """A case failed. The message names the step index, the step, the reason and what was received."""


# ------------------------------------------------------------------------------------------------------------
# Placeholders

TOKENS: dict[str, str] = {
    "TS": r"\d{10}\.\d{9}",
    "SID": r"[0-9a-f]{16}",
    "XID": r"[0-9a-v]{20}",
    "INT": r"-?\d+",
    "UINT": r"\d+",
    "T": r"\d{10}",
    "NS": r"\d{19}",
    "EPOCH": r"[0-9a-z]{8}",
    "RFC3339": r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)",
    "HTTPDATE": r"[A-Z][a-z]{2}, \d\d [A-Z][a-z]{2} \d{4} \d\d:\d\d:\d\d GMT",
    "HEX": r"[0-9a-f]+",
    "ANY": r"[\s\S]*",
}
JSON_ONLY_TOKENS = frozenset({"ANYVAL"})  # only as a whole JSON string leaf in an expectation

_PLACEHOLDER = re.compile(r"\{\{(.*?)\}\}", re.S)
_REPEAT = re.compile(r"REPEAT (.) (\d+)", re.S)
_TOKEN = re.compile(r"([A-Z0-9]+)(?::([A-Za-z_][A-Za-z0-9_]*))?")
_REF = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")

Vars = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Placeholder:
    """One parsed ``{{…}}``: a token (with an optional capture name), a reference, or a REPEAT generator."""

    kind: str  # "token" | "ref" | "repeat"
    token: str = ""
    name: str = ""
    text: str = ""


def parse_placeholder(body: str) -> Placeholder:
    """Parse the inside of one ``{{…}}``. Raises :class:`VectorError` for what the README does not define."""
    if m := _REF.fullmatch(body):
        return Placeholder("ref", name=m.group(1))
    if m := _REPEAT.fullmatch(body):
        return Placeholder("repeat", text=m.group(1) * int(m.group(2)))
    if (m := _TOKEN.fullmatch(body)) and (m.group(1) in TOKENS or m.group(1) in JSON_ONLY_TOKENS):
        return Placeholder("token", token=m.group(1), name=m.group(2) or "")
    raise VectorError(f"unknown placeholder {{{{{body}}}}}")


def _pieces(text: str) -> Iterator[str | Placeholder]:
    pos = 0
    for m in _PLACEHOLDER.finditer(text):
        if m.start() > pos:
            yield text[pos : m.start()]
        yield parse_placeholder(m.group(1))
        pos = m.end()
    if pos < len(text):
        yield text[pos:]


def _as_text(value: Any) -> str:
    """How a stored variable is written into a string: strings literally, anything else as compact JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _lookup(name: str, vars: Vars) -> Any:
    try:
        return vars[name]
    except KeyError:
        known = ", ".join(sorted(vars)) or "none"
        raise VectorError(f"reference to unknown variable ${name} (captured so far: {known})") from None


def expand(text: str, vars: Vars) -> str:
    """Resolve references and REPEAT in something to be sent. Matching tokens cannot be sent."""
    out: list[str] = []
    for piece in _pieces(text):
        if isinstance(piece, str):
            out.append(piece)
        elif piece.kind == "ref":
            out.append(_as_text(_lookup(piece.name, vars)))
        elif piece.kind == "repeat":
            out.append(piece.text)
        else:
            raise VectorError(f"placeholder {{{{{piece.token}}}}} can only be used in an expectation")
    return "".join(out)


@dataclass(frozen=True, slots=True)
class Pattern:
    """A compiled string expectation: ``regex`` must match the whole text, ``groups`` maps group -> var."""

    source: str
    regex: re.Pattern[str]
    groups: tuple[tuple[str, str], ...]

    def match(self, text: str) -> dict[str, str] | None:
        m = self.regex.fullmatch(text)
        if m is None:
            return None
        return {var: m.group(group) for group, var in self.groups}


def compile_pattern(text: str, vars: Vars) -> Pattern:
    """Compile a string expectation into a regex. Literal text is escaped, references match literally."""
    parts: list[str] = []
    groups: list[tuple[str, str]] = []
    for piece in _pieces(text):
        if isinstance(piece, str):
            parts.append(re.escape(piece))
        elif piece.kind == "repeat":
            parts.append(re.escape(piece.text))
        elif piece.kind == "ref":
            earlier = [g for g, var in groups if var == piece.name]
            if earlier:  # captured earlier in this same pattern: a back-reference
                parts.append(f"(?P={earlier[-1]})")
            else:
                parts.append(re.escape(_as_text(_lookup(piece.name, vars))))
        elif piece.token in JSON_ONLY_TOKENS:
            raise VectorError(f"{{{{{piece.token}}}}} is only valid as a whole JSON value")
        elif piece.name:
            group = f"g{len(groups)}"
            groups.append((group, piece.name))
            parts.append(f"(?P<{group}>{TOKENS[piece.token]})")
        else:
            parts.append(f"(?:{TOKENS[piece.token]})")
    return Pattern(text, re.compile("".join(parts)), tuple(groups))


def match_text(pattern: str, received: str, vars: Vars) -> dict[str, str] | None:
    """Whole-string match of ``received`` against ``pattern``. Returns the captures, or None on a mismatch."""
    return compile_pattern(pattern, vars).match(received)


# ------------------------------------------------------------------------------------------------------------
# JSON and msgpack values


def _is_bin(value: Any) -> bool:
    return isinstance(value, dict) and value.keys() == {"$bin"} and isinstance(value["$bin"], str)


def _whole_placeholder(value: str) -> Placeholder | None:
    m = _PLACEHOLDER.fullmatch(value)
    if m is None or "}}" in m.group(1):  # "{{A}}x{{B}}" is two placeholders, not a whole one
        return None
    return parse_placeholder(m.group(1))


def expand_json(value: Any, vars: Vars, *, allow_bin: bool = True) -> Any:
    """Resolve a JSON value to send: ``"{{$name}}"`` leaves keep the captured type, ``$bin`` becomes bytes."""
    if isinstance(value, dict):
        if _is_bin(value):
            if not allow_bin:
                raise VectorError("$bin cannot be sent as JSON")
            return bytes.fromhex(expand(value["$bin"], vars))
        return {expand(k, vars): expand_json(v, vars, allow_bin=allow_bin) for k, v in value.items()}
    if isinstance(value, list):
        return [expand_json(v, vars, allow_bin=allow_bin) for v in value]
    if isinstance(value, str):
        whole = _whole_placeholder(value)
        if whole is not None and whole.kind == "ref":
            return _lookup(whole.name, vars)
        return expand(value, vars)
    return value


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bytes):
        return "bytes"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list | tuple):
        return "array"
    return type(value).__name__


def _short(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"… ({len(text)} chars)"


def match_value(
    expected: Any,
    actual: Any,
    vars: Vars,
    caps: MutableMapping[str, Any],
    *,
    mode: str = "exact",
    path: str = "$",
) -> None:
    """Match a received JSON (or decoded msgpack) value. Raises :class:`Mismatch`; captures go into ``caps``.

    ``mode`` is ``exact`` or ``subset`` (objects may carry extra keys, recursively). Arrays always match
    element by element. ``caps`` fills as matching proceeds: the caller commits it only if everything matched.
    """
    scope: Vars = ChainMap(caps, dict(vars))
    if _is_bin(expected):
        want = bytes.fromhex(expand(expected["$bin"], scope))
        got = actual.encode("utf-8", "surrogateescape") if isinstance(actual, str) else actual
        if not isinstance(got, bytes) or got != want:
            raise Mismatch(f"expected bytes {want.hex()}, got {_short(actual)}", path)
        return
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            raise Mismatch(f"expected an object, got {_kind(actual)} {_short(actual)}", path)
        keys = {expand(k, scope): v for k, v in expected.items()}
        missing = [k for k in keys if k not in actual]
        if missing:
            raise Mismatch(f"missing key(s) {', '.join(map(repr, missing))} in {_short(actual)}", path)
        if mode == "exact":
            extra = [k for k in actual if k not in keys]
            if extra:
                raise Mismatch(f"unexpected key(s) {', '.join(map(repr, extra))}", path)
        for k, v in keys.items():
            match_value(v, actual[k], vars, caps, mode=mode, path=f"{path}.{k}")
        return
    if isinstance(expected, list):
        if not isinstance(actual, list | tuple):
            raise Mismatch(f"expected an array, got {_kind(actual)} {_short(actual)}", path)
        if len(actual) != len(expected):
            raise Mismatch(f"expected {len(expected)} element(s), got {len(actual)}: {_short(actual)}", path)
        for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
            match_value(e, a, vars, caps, mode=mode, path=f"{path}[{i}]")
        return
    if isinstance(expected, str):
        whole = _whole_placeholder(expected)
        if whole is not None and whole.kind == "token" and whole.token == "INT":
            if not isinstance(actual, int) or isinstance(actual, bool):
                raise Mismatch(f"expected an integer, got {_kind(actual)} {_short(actual)}", path)
            if whole.name:
                caps[whole.name] = actual
            return
        if whole is not None and whole.kind == "token" and whole.token == "ANYVAL":
            if whole.name:
                caps[whole.name] = actual
            return
        if whole is not None and whole.kind == "ref":
            want = _lookup(whole.name, scope)
            if not _same(want, actual):
                raise Mismatch(f"expected ${whole.name} = {_short(want)}, got {_short(actual)}", path)
            return
        if not isinstance(actual, str):
            raise Mismatch(
                f"expected a string matching {expected!r}, got {_kind(actual)} {_short(actual)}", path
            )
        got = compile_pattern(expected, scope).match(actual)
        if got is None:
            raise Mismatch(f"{_short(actual)} does not match {expected!r}", path)
        caps.update(got)
        return
    if not _same(expected, actual):
        raise Mismatch(
            f"expected {_kind(expected)} {_short(expected)}, got {_kind(actual)} {_short(actual)}", path
        )


def _same(expected: Any, actual: Any) -> bool:
    """Equality that keeps JSON types apart: ``true`` is not ``1``, and an integer is not ``1.0``."""
    if isinstance(expected, bool) or isinstance(actual, bool):
        return type(expected) is type(actual) and expected == actual
    if isinstance(expected, int):
        return isinstance(actual, int) and expected == actual
    if isinstance(expected, float):
        return isinstance(actual, int | float) and expected == actual
    if isinstance(expected, str) and isinstance(actual, bytes):
        return expected.encode("utf-8", "surrogateescape") == actual
    if isinstance(expected, dict):
        return (
            isinstance(actual, dict)
            and expected.keys() == actual.keys()
            and all(_same(v, actual[k]) for k, v in expected.items())
        )
    if isinstance(expected, list):
        return (
            isinstance(actual, list | tuple)
            and len(expected) == len(actual)
            and all(_same(e, a) for e, a in zip(expected, actual, strict=True))
        )
    return type(expected) is type(actual) and bool(expected == actual)


def dumps_compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def unpack_msgpack(data: bytes) -> Any:
    """Decode one msgpack object, raw strings as str (invalid UTF-8 survives as surrogates, see ``$bin``)."""
    return msgpack.unpackb(data, raw=False, strict_map_key=False, unicode_errors="surrogateescape")


# ------------------------------------------------------------------------------------------------------------
# Stream framing (sans-I/O)


class LineSplitter:
    """Bytes in, lines out (without the newline). ``ndjson=True`` drops a final CR and skips empty lines."""

    def __init__(self, *, ndjson: bool = False, max_line: int = MAX_UNIT) -> None:
        self._buf = bytearray()
        self._ndjson = ndjson
        self._max = max_line

    def feed(self, data: bytes) -> list[bytes]:
        self._buf += data
        out: list[bytes] = []
        start = 0
        while (nl := self._buf.find(b"\n", start)) >= 0:
            out.append(bytes(self._buf[start:nl]))
            start = nl + 1
        del self._buf[:start]
        if len(self._buf) > self._max:
            raise ValueError(f"line longer than {self._max} bytes")
        return self._filter(out)

    def end(self) -> list[bytes]:
        """At EOF: a last line without its newline still counts (as for a bufio.Scanner or readline)."""
        rest, self._buf = bytes(self._buf), bytearray()
        return self._filter([rest]) if rest else []

    def _filter(self, lines: list[bytes]) -> list[bytes]:
        if not self._ndjson:
            return lines
        lines = [ln[:-1] if ln.endswith(b"\r") else ln for ln in lines]
        return [ln for ln in lines if ln]


class Len32Splitter:
    """Bytes in, frames out: a 4-byte big-endian length, then that many bytes."""

    def __init__(self, *, max_frame: int = MAX_UNIT) -> None:
        self._buf = bytearray()
        self._max = max_frame

    def feed(self, data: bytes) -> list[bytes]:
        self._buf += data
        out: list[bytes] = []
        while len(self._buf) >= 4:
            (size,) = struct.unpack_from(">I", self._buf)
            if size > self._max:
                raise ValueError(f"len32 frame of {size} bytes is over the runner's bound")
            if len(self._buf) < 4 + size:
                break
            out.append(bytes(self._buf[4 : 4 + size]))
            del self._buf[: 4 + size]
        return out

    def leftover(self) -> int:
        return len(self._buf)


@dataclass(frozen=True, slots=True)
class SseEvent:
    """One dispatched server-sent event. ``event`` is ``message`` when the block had no ``event`` field."""

    event: str
    data: str
    id: str | None


class SseParser:
    """A ``text/event-stream`` parser (WHATWG rules for lines and fields). Bytes in, events out.

    A block (lines up to a blank line) becomes an event when it has a ``data``, ``event`` or ``id`` field.
    Blocks of only comments or only ``retry`` are skipped, as the vector README asks.
    """

    def __init__(self, *, max_line: int = MAX_UNIT) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._buf = ""
        self._started = False
        self._max = max_line
        self._reset()

    def _reset(self) -> None:
        self._data: list[str] = []
        self._event: str | None = None
        self._id: str | None = None
        self._has_fields = False

    def feed(self, data: bytes, *, final: bool = False) -> list[SseEvent]:
        self._buf += self._decoder.decode(data, final)
        if not self._started and self._buf:
            self._started = True
            self._buf = self._buf.removeprefix("\ufeff")
        out: list[SseEvent] = []
        pos = 0
        while True:
            cr = self._buf.find("\r", pos)
            lf = self._buf.find("\n", pos)
            ends = [i for i in (cr, lf) if i >= 0]
            if not ends:
                break
            end = min(ends)
            if end == cr and end == len(self._buf) - 1 and not final:
                break  # a lone \r at the end may be the first half of \r\n
            line = self._buf[pos:end]
            pos = end + (2 if self._buf.startswith("\r\n", end) else 1)
            if (event := self._line(line)) is not None:
                out.append(event)
        self._buf = self._buf[pos:]
        if len(self._buf) > self._max:
            raise ValueError(f"SSE line longer than {self._max} characters")
        return out

    def _line(self, line: str) -> SseEvent | None:
        if line == "":
            event = None
            if self._has_fields:
                event = SseEvent(self._event or "message", "\n".join(self._data), self._id)
            self._reset()
            return event
        if line.startswith(":"):
            return None
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
            self._has_fields = True
        elif name == "event":
            self._event = value
            self._has_fields = True
        elif name == "id":
            self._id = value
            self._has_fields = True
        # retry and unknown fields are ignored
        return None


# ------------------------------------------------------------------------------------------------------------
# Step validation and dialect detection

_CLIENT_OPTS = frozenset({"timeout_ms"})
STEP_KEYS: dict[str, frozenset[str]] = {
    "connect": frozenset(
        {
            "client",
            "connect",
            "subprotocols",
            "headers",
            "expect_subprotocol",
            "expect_status",
            "expect_headers",
            "send_body",
            "mode",
            "timeout_ms",
        }
    ),
    "close": frozenset({"client", "close"}),
    "send": frozenset({"client", "send"}),
    "send_binary": frozenset({"client", "send_binary"}),
    "send_hex": frozenset({"client", "send_hex"}),
    "send_json": frozenset({"client", "send_json"}),
    "send_msgpack": frozenset({"client", "send_msgpack", "bin_type"}),
    "expect": frozenset({"client", "expect", "frame"}) | _CLIENT_OPTS,
    "expect_hex": frozenset({"client", "expect_hex"}) | _CLIENT_OPTS,
    "expect_json": frozenset({"client", "expect_json", "match"}) | _CLIENT_OPTS,
    "expect_msgpack": frozenset({"client", "expect_msgpack", "match"}) | _CLIENT_OPTS,
    "expect_sse": frozenset({"client", "expect_sse", "match"}) | _CLIENT_OPTS,
    "expect_unordered": frozenset({"client", "expect_unordered", "match"}) | _CLIENT_OPTS,
    "expect_close": frozenset({"client", "expect_close"}) | _CLIENT_OPTS,
    "expect_none": frozenset({"client", "expect_none", "within_ms"}),
    "http": frozenset(
        {
            "http",
            "headers",
            "send_body",
            "form",
            "multipart",
            "status",
            "body",
            "expect_headers",
            "absent_headers",
            "expect_json",
            "match",
            "timeout_ms",
        }
    ),
    "server": frozenset({"server"}),
    "sleep_ms": frozenset({"sleep_ms"}),
    "all": frozenset({"all", "within_ms"}),
}
# Which key names a step's kind, in priority order ("http" and "connect" steps also carry expect_* keys).
_KIND_ORDER = ("connect", "http", "server", "all", "sleep_ms", "close", "send", "send_binary", "send_hex",
               "send_json", "send_msgpack", "expect_close", "expect_none", "expect_unordered", "expect_sse",
               "expect_msgpack", "expect_json", "expect_hex", "expect")  # fmt: skip
CASE_KEYS = frozenset({"id", "describe", "config", "requires", "steps", "expect"})
REQUIREMENTS = frozenset({"restart"})
SSE_FIELDS = frozenset({"id", "event", "data", "data_json"})


def validate_step(step: Mapping[str, Any]) -> str:
    """Return the step's kind, or raise :class:`VectorError` if the runner does not understand every key."""
    if not isinstance(step, Mapping):
        raise VectorError(f"a step must be an object, got {step!r}")
    kind = next((k for k in _KIND_ORDER if k in step), None)
    if kind is None:
        raise VectorError(f"step has no known kind key: {sorted(step)}")
    unknown = set(step) - STEP_KEYS[kind]
    if unknown:
        raise VectorError(f"unknown key(s) {sorted(unknown)} for a {kind!r} step")
    if kind in ("server", "all", "sleep_ms", "http"):
        if "client" in step:
            raise VectorError(f"a {kind!r} step takes no client")
    elif not isinstance(step.get("client"), str):
        raise VectorError(f"a {kind!r} step needs a client name")
    if step.get("match", "exact") not in ("exact", "subset"):
        raise VectorError(f"match must be 'exact' or 'subset', got {step['match']!r}")
    if kind == "connect":
        scheme, _, rest = str(step["connect"]).partition(":")
        if scheme not in ("ws", "http", "tcp") or not rest:
            raise VectorError(
                f"connect must be ws:/path, http:METHOD /path or tcp:listener, got {step['connect']!r}"
            )
        if step.get("mode", "lines") not in ("lines", "len32"):
            raise VectorError(f"mode must be 'lines' or 'len32', got {step['mode']!r}")
    elif kind == "http":
        if "status" not in step:
            raise VectorError("an http step needs an expected status")
        if sum(k in step for k in ("send_body", "form", "multipart")) > 1:
            raise VectorError("at most one of send_body, form and multipart")
        _split_request(step["http"])
    elif kind == "server" and step["server"] != "restart":
        raise VectorError(f"unknown server action {step['server']!r}")
    elif kind == "all" and step["all"] != "quiet":
        raise VectorError(f"unknown all-clients assertion {step['all']!r}")
    elif kind == "expect" and step.get("frame", "text") not in ("text", "binary"):
        raise VectorError(f"frame must be 'text' or 'binary', got {step['frame']!r}")
    elif kind == "expect_sse":
        spec = step["expect_sse"]
        if not isinstance(spec, Mapping) or not set(spec) <= SSE_FIELDS or {"data", "data_json"} <= set(spec):
            raise VectorError(f"expect_sse takes id, event and one of data/data_json, got {spec!r}")
    elif kind == "expect_unordered" and not isinstance(step["expect_unordered"], list):
        raise VectorError("expect_unordered takes a list")
    return kind


def validate_case(case: Mapping[str, Any]) -> None:
    """Check a case's shape and every step. Raises :class:`VectorError`."""
    unknown = set(case) - CASE_KEYS
    if unknown:
        raise VectorError(f"unknown case key(s) {sorted(unknown)}")
    for key in ("id", "describe", "steps", "expect"):
        if key not in case:
            raise VectorError(f"case lacks {key!r}")
    requires = set(case.get("requires", []))
    if not requires <= REQUIREMENTS:
        raise VectorError(f"unknown requirement(s) {sorted(requires - REQUIREMENTS)}")
    for phase in ("steps", "expect"):
        for i, step in enumerate(case[phase]):
            try:
                kind = validate_step(step)
            except VectorError as exc:
                raise VectorError(f"{phase}[{i}]: {exc}") from None
            if kind == "server" and "restart" not in requires:
                raise VectorError(f"{phase}[{i}]: a server restart needs requires: ['restart']")


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield k
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def lint_case(case: Mapping[str, Any]) -> list[str]:
    """Static problems of a case: shape, unknown placeholders, references to names not captured before."""
    try:
        validate_case(case)
    except VectorError as exc:
        return [str(exc)]
    problems: list[str] = []
    captured: set[str] = set()
    for phase in ("steps", "expect"):
        for i, step in enumerate(case[phase]):
            for text in _strings(dict(step)):
                for m in _PLACEHOLDER.finditer(text):
                    try:
                        ph = parse_placeholder(m.group(1))
                    except VectorError as exc:
                        problems.append(f"{phase}[{i}]: {exc}")
                        continue
                    if ph.kind == "ref" and ph.name not in captured:
                        problems.append(f"{phase}[{i}]: ${ph.name} is used before it is captured")
                    elif ph.kind == "token" and ph.name:
                        captured.add(ph.name)
    return problems


def _split_request(spec: str) -> tuple[str, str]:
    method, _, target = spec.strip().partition(" ")
    if not method.isalpha() or not target.startswith("/"):
        raise VectorError(f"expected 'METHOD /path?query', got {spec!r}")
    return method.upper(), target.strip()


# Route prefixes per dialect, README §1. Longest prefix wins; "=" marks an exact path.
_ROUTES: tuple[tuple[str, str], ...] = (
    ("/ws/hubbub", "native"), ("/api/v1/", "native"), ("=/healthz", "native"), ("=/metrics", "native"),
    ("=/ws", "ivy"), ("/events/", "ivy"), ("/log/", "ivy"),
    ("/stream/", "guble"), ("=/stream", "guble"), ("/api/message/", "guble"), ("/api/subscribers/", "guble"),
    ("/admin/", "guble"),
    ("/wearscript/", "wearscript"),
    ("/mist/", "mist"),
    ("/qpubs/", "qpubs"), ("=/listen", "qpubs"), ("=/once", "qpubs"), ("=/ignore", "qpubs"),
    ("=/emit", "qpubs"),
)  # fmt: skip
_LISTENERS = {"mist": "mist", "qrpc": "qpubs", "native": "native"}


def dialect_of_path(path: str) -> str | None:
    """The dialect that serves an HTTP path (query ignored), or None for a path no dialect owns."""
    path = path.split("?", 1)[0]
    best: tuple[int, str] | None = None
    for prefix, dialect in _ROUTES:
        if prefix.startswith("="):
            hit = path == prefix[1:]
        else:
            hit = path.startswith(prefix) or path == prefix.rstrip("/")
        if hit and (best is None or len(prefix) > best[0]):
            best = (len(prefix), dialect)
    return best[1] if best else None


def dialects_touched(case: Mapping[str, Any]) -> set[str]:
    """Every dialect whose routes or listeners the case's steps use."""
    out: set[str] = set()
    for step in [*case.get("steps", []), *case.get("expect", [])]:
        dialect: str | None = None
        if "connect" in step:
            scheme, _, rest = str(step["connect"]).partition(":")
            if scheme == "tcp":
                dialect = _LISTENERS.get(rest, rest)
            elif scheme == "ws":
                dialect = dialect_of_path(rest)
            elif scheme == "http":
                dialect = dialect_of_path(rest.strip().partition(" ")[2])
        elif "http" in step:
            dialect = dialect_of_path(str(step["http"]).strip().partition(" ")[2])
        if dialect:
            out.add(dialect)
    return out


# ------------------------------------------------------------------------------------------------------------
# Units and clients


@dataclass(frozen=True, slots=True)
class Unit:
    """One received unit: a WebSocket data frame (``binary`` set), a TCP line or frame, an NDJSON line, or an
    SSE event (``sse`` set, ``data`` is its data as UTF-8)."""

    data: bytes
    binary: bool | None = None
    sse: SseEvent | None = None

    def describe(self, limit: int = 600) -> str:
        if self.sse is not None:
            what = f"SSE event {self.sse.event!r} id={self.sse.id!r} data="
        elif self.binary is None:
            what = ""
        else:
            what = "binary frame " if self.binary else "text frame "
        try:
            text = self.data.decode("utf-8")
        except UnicodeDecodeError:
            text = ""
            shown = f"hex {self.data[: limit // 2].hex()}" + ("…" if len(self.data) > limit // 2 else "")
            with contextlib.suppress(Exception):
                shown += f" (msgpack {_short(unpack_msgpack(self.data), limit)})"
            return what + shown
        if self.binary:
            with contextlib.suppress(Exception):
                return what + f"msgpack {_short(unpack_msgpack(self.data), limit)}"
        shown = repr(text if len(text) <= limit else text[:limit]) + ("…" if len(text) > limit else "")
        return what + shown + (f" ({len(self.data)} bytes)" if len(text) > limit else "")


@dataclass(frozen=True, slots=True)
class Closed:
    """The end of a connection: a WebSocket close (``code``), TCP EOF, or the end of an HTTP stream."""

    code: int | None
    reason: str

    def describe(self) -> str:
        code = f"code {self.code}" if self.code is not None else "no close code"
        return f"connection closed ({code}{', ' + self.reason if self.reason else ''})"


Item = Unit | Closed


class Client:
    """One connection with a reader task that fills a buffer. Called from the event loop only."""

    kind = "?"

    def __init__(self, name: str) -> None:
        self.name = name
        self._items: deque[Item] = deque()
        self._arrived = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.closed_by_step = False
        self.closed_seen: Closed | None = None
        self.history: deque[str] = deque(maxlen=5)
        self.notes: list[str] = []

    def _start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._reader(), name=f"vector-client-{self.name}")

    async def _reader(self) -> None:
        raise NotImplementedError

    def _push(self, item: Item) -> None:
        self._items.append(item)
        self._arrived.set()

    def buffered(self) -> list[Item]:
        return list(self._items)

    def is_open(self) -> bool:
        return (
            not self.closed_by_step
            and self.closed_seen is None
            and not any(isinstance(i, Closed) for i in self._items)
        )

    async def next(self, wait_s: float) -> Item | None:
        """The next unconsumed item, waiting up to ``wait_s`` seconds. Once the close was consumed, it is
        returned again at once. None on timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while not self._items:
            if self.closed_seen is not None:
                return self.closed_seen
            self._arrived.clear()
            remaining = deadline - loop.time()
            if remaining <= 0:
                return None
            try:
                await asyncio.wait_for(self._arrived.wait(), remaining)
            except TimeoutError:
                return None
        item = self._items.popleft()
        if isinstance(item, Closed):
            self.closed_seen = item
        self.history.append(item.describe())
        return item

    async def wait_arrival(self) -> None:
        """Return once something is buffered."""
        while not self._items:
            self._arrived.clear()
            await self._arrived.wait()

    async def wait_closed(self, wait_s: float) -> bool:
        """Wait until the connection's end is buffered and consume it (data units before it stay)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            for item in self._items:
                if isinstance(item, Closed):
                    self._items.remove(item)
                    self.closed_seen = item
                    return True
            if self.closed_seen is not None or self.closed_by_step:
                return True
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), remaining)

    async def send(self, kind: str, data: bytes) -> None:
        """``kind`` is text, binary, json (compact JSON, text) or msgpack; see README §3.2."""
        raise NotImplementedError

    async def close(self) -> None:
        """Close from the client side (the ``close`` step and the end of the case). Idempotent."""
        raise NotImplementedError

    async def _stop_reader(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


class WsClient(Client):
    kind = "ws"

    def __init__(self, name: str, ws: aiohttp.ClientWebSocketResponse[Any]) -> None:
        super().__init__(name)
        self.ws = ws
        self._start()

    async def _reader(self) -> None:
        ws = self.ws
        try:
            while True:
                msg = await ws.receive()
                if msg.type is aiohttp.WSMsgType.TEXT:
                    data = msg.data if isinstance(msg.data, bytes) else str(msg.data).encode()
                    self._push(Unit(data, binary=False))
                elif msg.type is aiohttp.WSMsgType.BINARY:
                    self._push(Unit(bytes(msg.data), binary=True))
                elif msg.type is aiohttp.WSMsgType.CLOSE:
                    self._push(Closed(int(msg.data), str(msg.extra or "")))
                    return
                elif msg.type is aiohttp.WSMsgType.CLOSING:  # our own close() is under way
                    return
                elif msg.type is aiohttp.WSMsgType.ERROR:  # a protocol error: no close code was received
                    self._push(Closed(None, f"WebSocket error: {msg.data!r}"))
                    return
                else:
                    # CLOSED: the TCP connection ended without a close frame. aiohttp reports 1000 for that;
                    # RFC 6455 §7.1.5 calls it 1006, which is what a test must see.
                    self._push(Closed(1006, "the TCP connection ended without a close frame"))
                    return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._push(Closed(None, f"reader failed: {exc!r}"))

    async def send(self, kind: str, data: bytes) -> None:
        try:
            if kind in ("text", "json"):
                await self.ws.send_str(data.decode("utf-8", "surrogatepass"))
            else:
                await self.ws.send_bytes(data)
        except (ConnectionError, aiohttp.ClientError, RuntimeError) as exc:
            # The server may close first (a frame over the limit); expect_close judges that, not the send.
            self.notes.append(f"send failed: {exc!r}")

    async def close(self) -> None:
        if not self.ws.closed:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.ws.close(code=1000), CLOSE_TIMEOUT_S)
        await self._stop_reader()


class TcpClient(Client):
    kind = "tcp"

    def __init__(
        self, name: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, mode: str
    ) -> None:
        super().__init__(name)
        self.reader = reader
        self.writer = writer
        self.mode = mode
        self._start()

    async def _reader(self) -> None:
        lines = LineSplitter() if self.mode == "lines" else None
        frames = Len32Splitter() if self.mode == "len32" else None
        try:
            while True:
                data = await self.reader.read(65536)
                if not data:
                    if lines is not None:
                        for unit in lines.end():
                            self._push(Unit(unit))
                    rest = (
                        f", {frames.leftover()} bytes of an incomplete frame"
                        if frames and frames.leftover()
                        else ""
                    )
                    self._push(Closed(None, "EOF" + rest))
                    return
                units = lines.feed(data) if lines is not None else frames.feed(data) if frames else []
                for unit in units:
                    self._push(Unit(unit))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._push(Closed(None, f"connection error: {exc!r}"))

    async def send(self, kind: str, data: bytes) -> None:
        if kind == "json":
            data += b"\n"
        elif kind == "msgpack":
            data = struct.pack(">I", len(data)) + data
        try:
            self.writer.write(data)
            await self.writer.drain()
        except ConnectionError as exc:
            self.notes.append(f"send failed: {exc!r}")

    async def close(self) -> None:
        await self._stop_reader()
        if not self.writer.is_closing():
            self.writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.writer.wait_closed(), CLOSE_TIMEOUT_S)


class HttpStreamClient(Client):
    kind = "http"

    def __init__(self, name: str, resp: aiohttp.ClientResponse) -> None:
        super().__init__(name)
        self.resp = resp
        self.sse = resp.headers.get("Content-Type", "").lower().startswith("text/event-stream")
        self._start()

    async def _reader(self) -> None:
        sse = SseParser() if self.sse else None
        lines = LineSplitter(ndjson=True)
        try:
            async for chunk in self.resp.content.iter_any():
                self._emit(sse.feed(chunk) if sse else lines.feed(chunk))
            self._emit(sse.feed(b"", final=True) if sse else lines.end())
            self._push(Closed(None, "end of stream"))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._push(Closed(None, f"stream error: {exc!r}"))

    def _emit(self, units: Sequence[SseEvent | bytes]) -> None:
        for u in units:
            self._push(Unit(u.data.encode(), sse=u) if isinstance(u, SseEvent) else Unit(u))

    async def send(self, kind: str, data: bytes) -> None:
        raise VectorError("an HTTP stream client cannot send")

    async def close(self) -> None:
        await self._stop_reader()
        self.resp.close()


# ------------------------------------------------------------------------------------------------------------
# Unit expectations (pure given a Unit)


def _unit_text(unit: Unit) -> str:
    try:
        return unit.data.decode("utf-8")
    except UnicodeDecodeError:
        raise Mismatch("the unit is not valid UTF-8") from None


def _unit_json(unit: Unit) -> Any:
    text = _unit_text(unit)
    try:
        return json.loads(text)
    except ValueError as exc:
        raise Mismatch(f"the unit is not JSON: {exc}") from None


def check_unit(kind: str, step: Mapping[str, Any], unit: Unit, vars: Vars) -> dict[str, Any]:
    """Check one received unit against one expectation step. Returns the captures, or raises Mismatch."""
    caps: dict[str, Any] = {}
    mode = step.get("match", "exact")
    if kind == "expect":
        if "frame" in step:
            if unit.binary is None:
                raise Mismatch("'frame' applies to WebSocket clients only")
            got = "binary" if unit.binary else "text"
            if got != step["frame"]:
                raise Mismatch(f"expected a {step['frame']} frame, got a {got} frame")
        got_caps = match_text(step["expect"], _unit_text(unit), vars)
        if got_caps is None:
            raise Mismatch(f"does not match {step['expect']!r}")
        caps.update(got_caps)
    elif kind == "expect_hex":
        want = bytes.fromhex(expand(step["expect_hex"], vars))
        if unit.data != want:
            raise Mismatch(f"expected bytes {want.hex()}, got {unit.data.hex()}")
    elif kind == "expect_json":
        match_value(step["expect_json"], _unit_json(unit), vars, caps, mode=mode)
    elif kind == "expect_msgpack":
        if unit.binary is False or unit.sse is not None:
            raise Mismatch("expected a binary unit")
        try:
            value = unpack_msgpack(unit.data)
        except Exception as exc:
            raise Mismatch(f"not one msgpack value: {exc!r}") from None
        match_value(step["expect_msgpack"], value, vars, caps, mode=mode)
    elif kind == "expect_sse":
        if unit.sse is None:
            raise Mismatch("expected an SSE event (is the response text/event-stream?)")
        spec = step["expect_sse"]
        fields = {"event": spec.get("event", "message"), **{k: spec[k] for k in ("id", "data") if k in spec}}
        for name, pattern in fields.items():
            value = getattr(unit.sse, name)
            if value is None:
                raise Mismatch(f"the event has no {name!r} field")
            got_caps = match_text(pattern, value, ChainMap(caps, dict(vars)))
            if got_caps is None:
                raise Mismatch(f"SSE {name} {value!r} does not match {pattern!r}")
            caps.update(got_caps)
        if "data_json" in spec:
            try:
                value = json.loads(unit.sse.data)
            except ValueError as exc:
                raise Mismatch(f"SSE data is not JSON: {exc}") from None
            match_value(spec["data_json"], value, vars, caps, mode=mode)
    else:  # pragma: no cover - validate_step rules this out
        raise VectorError(f"not a unit expectation: {kind}")
    return caps


def _element_step(element: Any, mode: str) -> tuple[str, dict[str, Any]]:
    if isinstance(element, str):
        return "expect", {"expect": element}
    return "expect_json", {"expect_json": element, "match": mode}


def assign_unordered(elements: Sequence[Any], units: Sequence[Unit], vars: Vars, mode: str) -> dict[str, Any]:
    """Find an assignment of units to expectations (each used once). Returns the captures; raises Mismatch."""
    n = len(elements)
    fits: list[list[dict[str, Any] | None]] = []
    for el in elements:
        kind, step = _element_step(el, mode)
        row: list[dict[str, Any] | None] = []
        for unit in units:
            try:
                row.append(check_unit(kind, step, unit, vars))
            except Mismatch:
                row.append(None)
        fits.append(row)
    used = [False] * n

    def solve(i: int, acc: dict[str, Any]) -> dict[str, Any] | None:
        if i == n:
            return acc
        for j in range(n):
            caps = fits[i][j]
            if not used[j] and caps is not None:
                used[j] = True
                found = solve(i + 1, {**acc, **caps})
                used[j] = False
                if found is not None:
                    return found
        return None

    found = solve(0, {})
    if found is None:
        unmatched = [repr(el) for el, row in zip(elements, fits, strict=True) if all(c is None for c in row)]
        detail = f"; no unit matches {', '.join(unmatched)}" if unmatched else ""
        raise Mismatch(f"the {n} units match the {n} patterns in no order{detail}")
    return found


# ------------------------------------------------------------------------------------------------------------
# The case runner


class HasPorts(Protocol):
    """What the runner needs of a started server: the bound port of each listener."""

    @property
    def ports(self) -> Mapping[str, int]: ...


ServerFactory = Callable[[], AbstractAsyncContextManager[HasPorts]]


class _StepFailed(Exception):
    def __init__(self, reason: str, received: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.received = received


def _percent_encode_raw(target: str) -> str:
    """Keep the path and query exactly as written, except bytes that cannot appear on an HTTP request line."""
    return "".join(ch if 0x20 < ord(ch) < 0x7F else urllib.parse.quote(ch, safe="") for ch in target)


class CaseRunner:
    """Runs one case: a fresh server from ``start_server``, the steps, the final expectations, cleanup."""

    def __init__(
        self, case: Mapping[str, Any], start_server: ServerFactory, *, host: str = "127.0.0.1"
    ) -> None:
        self.case = case
        self.start_server = start_server
        self.host = host
        self.vars: dict[str, Any] = {}
        self.clients: dict[str, Client] = {}
        self.ports: dict[str, int] = {}
        self._server_cm: AbstractAsyncContextManager[HasPorts] | None = None
        self._session: aiohttp.ClientSession | None = None

    # -- lifecycle

    async def run(self) -> None:
        validate_case(self.case)
        failure: BaseException | None = None
        try:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(force_close=True),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S),
            )
            await self._start()
            for phase in ("steps", "expect"):
                for i, step in enumerate(self.case[phase]):
                    await self._run_step(phase, i, step)
        except BaseException as exc:
            failure = exc
            raise
        finally:
            await self._cleanup(failure)

    async def _run_step(self, phase: str, index: int, step: Mapping[str, Any]) -> None:
        __tracebackhide__ = True  # pytest: the CaseFailure message says it all
        try:
            await self._step(step)
        except _StepFailed as exc:
            raise CaseFailure(self._report(phase, index, step, exc.reason, exc.received)) from None
        except (VectorError, Mismatch) as exc:
            raise CaseFailure(self._report(phase, index, step, str(exc), "")) from None
        except (OSError, aiohttp.ClientError, TimeoutError) as exc:
            raise CaseFailure(self._report(phase, index, step, f"{type(exc).__name__}: {exc}", "")) from exc

    def _report(self, phase: str, index: int, step: Mapping[str, Any], reason: str, received: str) -> str:
        lines = [
            f"{self.case['id']}: {phase}[{index}] failed",
            f"  step:     {_short_json(step)}",
            f"  reason:   {reason}",
        ]
        if received:
            lines.append(f"  received: {received}")
        name = step.get("client")
        client = self.clients.get(name) if isinstance(name, str) else None
        if client is not None:
            if client.history:
                lines.append(f"  client {name}, last units consumed: " + " | ".join(client.history))
            for note in client.notes:
                lines.append(f"  client {name}: {note}")
        return "\n".join(lines)

    async def _start(self) -> None:
        cm = self.start_server()
        try:
            server = await cm.__aenter__()
        except Exception as exc:
            raise CaseFailure(f"{self.case['id']}: the server did not start: {exc!r}") from exc
        self._server_cm = cm
        self.ports = dict(server.ports)

    async def _stop(self) -> None:
        cm, self._server_cm = self._server_cm, None
        if cm is not None:
            await cm.__aexit__(None, None, None)

    async def _cleanup(self, failure: BaseException | None) -> None:
        errors: list[BaseException] = []
        for client in self.clients.values():
            try:
                await client.close()
            except Exception as exc:
                errors.append(exc)
        self.clients.clear()
        if self._session is not None:
            await self._session.close()
            self._session = None
        try:
            await self._stop()
        except Exception as exc:
            errors.append(exc)
        if errors and failure is None:
            raise CaseFailure(f"{self.case['id']}: cleanup failed: {errors[0]!r}") from errors[0]

    # -- dispatch

    async def _step(self, step: Mapping[str, Any]) -> None:
        kind = validate_step(step)
        if kind == "connect":
            await self._connect(step)
        elif kind == "http":
            await self._http(step)
        elif kind == "server":
            await self._restart()
        elif kind == "sleep_ms":
            await asyncio.sleep(float(step["sleep_ms"]) / 1000)
        elif kind == "all":
            await self._quiet(float(step.get("within_ms", DEFAULT_WINDOW_MS)) / 1000)
        elif kind == "close":
            client = self._client(step["client"])
            await client.close()
            client.closed_by_step = True
        elif kind.startswith("send"):
            await self._send(kind, step)
        elif kind == "expect_none":
            await self._expect_none(step)
        elif kind == "expect_close":
            await self._expect_close(step)
        elif kind == "expect_unordered":
            await self._expect_unordered(step)
        else:
            await self._expect_unit(kind, step)

    def _client(self, name: str) -> Client:
        client = self.clients.get(name)
        if client is None:
            raise VectorError(f"no client {name!r} (connected: {', '.join(sorted(self.clients)) or 'none'})")
        if client.closed_by_step:
            raise VectorError(f"client {name!r} was closed by an earlier step")
        return client

    def _port(self, listener: str) -> int:
        port = self.ports.get(listener)
        if port is None:
            raise _StepFailed(f"the server has no {listener!r} listener (ports: {self.ports})")
        return port

    def _url(self, target: str, scheme: str = "http") -> URL:
        target = _percent_encode_raw(expand(target, self.vars))
        return URL(f"{scheme}://{self.host}:{self._port('http')}{target}", encoded=True)

    def _headers(self, step: Mapping[str, Any]) -> dict[str, str]:
        return {expand(k, self.vars): expand(str(v), self.vars) for k, v in step.get("headers", {}).items()}

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None
        return self._session

    # -- connections

    async def _connect(self, step: Mapping[str, Any]) -> None:
        name = step["client"]
        old = self.clients.pop(name, None)
        if old is not None:
            await old.close()
        scheme, _, rest = str(step["connect"]).partition(":")
        timeout = float(step.get("timeout_ms", CONNECT_TIMEOUT_S * 1000)) / 1000
        if scheme == "ws":
            client: Client | None = await self._connect_ws(name, rest, step, timeout)
        elif scheme == "tcp":
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self._port(rest), limit=MAX_UNIT), timeout
            )
            client = TcpClient(name, reader, writer, step.get("mode", "lines"))
        else:
            client = await self._connect_http(name, rest, step, timeout)
        if client is not None:
            self.clients[name] = client

    async def _connect_ws(
        self, name: str, path: str, step: Mapping[str, Any], wait_s: float
    ) -> WsClient | None:
        want_status = step.get("expect_status")
        try:
            ws = await asyncio.wait_for(
                self.session.ws_connect(
                    self._url(path, "ws"),
                    protocols=[expand(p, self.vars) for p in step.get("subprotocols", [])],
                    headers=self._headers(step),
                    autoping=True,
                    autoclose=True,
                    max_msg_size=0,
                    decode_text=False,
                    timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=CLOSE_TIMEOUT_S),
                ),
                wait_s,
            )
        except aiohttp.WSServerHandshakeError as exc:
            if want_status is not None and exc.status == want_status:
                return None  # refused as expected: no client is created
            expected = f", expected {want_status}" if want_status is not None else ""
            raise _StepFailed(f"upgrade refused with status {exc.status} ({exc.message}){expected}") from None
        client = WsClient(name, ws)
        if want_status is not None:
            await client.close()
            raise _StepFailed(
                f"upgrade accepted (101, subprotocol {ws.protocol!r}), expected status {want_status}"
            )
        if "expect_subprotocol" in step:
            # aiohttp hides a subprotocol the client did not offer, so read the raw header.
            response = getattr(ws, "_response", None)
            raw = response.headers.get("Sec-WebSocket-Protocol") if response is not None else ws.protocol
            got = raw.strip() if raw is not None else None
            want = step["expect_subprotocol"]
            if got != want:
                await client.close()
                raise _StepFailed(f"negotiated subprotocol {got!r}, expected {want!r}")
        return client

    async def _connect_http(
        self, name: str, spec: str, step: Mapping[str, Any], wait_s: float
    ) -> HttpStreamClient:
        method, target = _split_request(spec)
        body = expand(step["send_body"], self.vars).encode() if "send_body" in step else None
        headers = self._headers(step)
        resp = await asyncio.wait_for(
            self.session.request(
                method, self._url(target), headers=headers, data=body, allow_redirects=False,
                skip_auto_headers=() if body is None or _has(headers, "Content-Type") else ("Content-Type",),
            ),
            wait_s,
        )  # fmt: skip
        want_status = int(step.get("expect_status", 200))
        try:
            if resp.status != want_status:
                text = await _read_some(resp)
                raise _StepFailed(f"status {resp.status}, expected {want_status}", f"body {text!r}")
            self._commit(self._check_headers(step, resp.headers))
        except BaseException:
            resp.close()
            raise
        return HttpStreamClient(name, resp)

    async def _restart(self) -> None:
        open_clients = [c for c in self.clients.values() if c.is_open()]
        await self._stop()
        for client in open_clients:
            if not await client.wait_closed(CLOSE_TIMEOUT_S):
                raise _StepFailed(
                    f"client {client.name} did not see its connection close when the server stopped"
                )
        await self._start()

    # -- sending

    async def _send(self, kind: str, step: Mapping[str, Any]) -> None:
        client = self._client(step["client"])
        value = step[kind]
        if kind == "send":
            await client.send("text", expand(value, self.vars).encode("utf-8", "surrogatepass"))
        elif kind == "send_binary":
            await client.send("binary", expand(value, self.vars).encode("utf-8", "surrogatepass"))
        elif kind == "send_hex":
            await client.send("binary", bytes.fromhex(expand(value, self.vars)))
        elif kind == "send_json":
            await client.send("json", dumps_compact(expand_json(value, self.vars, allow_bin=False)).encode())
        else:
            packed = msgpack.packb(
                expand_json(value, self.vars), use_bin_type=bool(step.get("bin_type", False))
            )
            await client.send("msgpack", packed)

    # -- expectations on clients

    def _commit(self, caps: Mapping[str, Any]) -> None:
        self.vars.update(caps)

    async def _next(self, client: Client, step: Mapping[str, Any]) -> Item:
        timeout_ms = float(step.get("timeout_ms", DEFAULT_TIMEOUT_MS))
        item = await client.next(timeout_ms / 1000)
        if item is None:
            raise _StepFailed(
                f"timed out after {timeout_ms:g} ms waiting for the next unit from client {client.name}"
            )
        return item

    async def _next_unit(self, client: Client, step: Mapping[str, Any]) -> Unit:
        item = await self._next(client, step)
        if isinstance(item, Closed):
            raise _StepFailed(f"expected a unit from client {client.name}, but the {item.describe()}")
        return item

    async def _expect_unit(self, kind: str, step: Mapping[str, Any]) -> None:
        client = self._client(step["client"])
        unit = await self._next_unit(client, step)
        try:
            self._commit(check_unit(kind, step, unit, self.vars))
        except Mismatch as exc:
            raise _StepFailed(str(exc), unit.describe(4000)) from None

    async def _expect_unordered(self, step: Mapping[str, Any]) -> None:
        client = self._client(step["client"])
        units = [await self._next_unit(client, step) for _ in step["expect_unordered"]]
        try:
            self._commit(
                assign_unordered(step["expect_unordered"], units, self.vars, step.get("match", "exact"))
            )
        except Mismatch as exc:
            raise _StepFailed(str(exc), " | ".join(u.describe() for u in units)) from None

    async def _expect_close(self, step: Mapping[str, Any]) -> None:
        client = self._client(step["client"])
        want = step["expect_close"]
        item = await self._next(client, step)
        if isinstance(item, Unit):
            raise _StepFailed(f"expected client {client.name}'s connection to close, but a unit came first",
                              item.describe(4000))  # fmt: skip
        if want is True or client.kind != "ws":
            return  # any close; TCP EOF and the end of an HTTP stream carry no code
        if item.code != want:
            raise _StepFailed(f"expected close code {want}, got {item.describe()}")

    async def _expect_none(self, step: Mapping[str, Any]) -> None:
        client = self._client(step["client"])
        window = float(step.get("within_ms", DEFAULT_WINDOW_MS)) / 1000
        if not client.buffered():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(client.wait_arrival(), window)
        items = client.buffered()
        if items:
            raise _StepFailed(f"client {client.name} received something within {window * 1000:g} ms",
                              " | ".join(i.describe() for i in items))  # fmt: skip

    async def _quiet(self, window: float) -> None:
        watched = [c for c in self.clients.values() if not c.closed_by_step]
        if not any(c.buffered() for c in watched) and watched:
            waits = [asyncio.ensure_future(c.wait_arrival()) for c in watched]
            try:
                await asyncio.wait(waits, timeout=window, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
                await asyncio.gather(*waits, return_exceptions=True)
        noisy = [
            f"{c.name}: " + " | ".join(i.describe() for i in c.buffered()) for c in watched if c.buffered()
        ]
        if noisy:
            raise _StepFailed(
                f"expected every client to stay quiet for {window * 1000:g} ms", "; ".join(noisy)
            )

    # -- plain HTTP requests

    def _check_headers(self, step: Mapping[str, Any], headers: CIMultiDictProxy[str]) -> dict[str, Any]:
        """``expect_headers`` (names case-insensitive; a repeated header may match one value or all joined)
        and ``absent_headers``. Returns the captures."""
        caps: dict[str, Any] = {}
        for name, pattern in step.get("expect_headers", {}).items():
            values: list[str] = headers.getall(name, [])
            if not values:
                raise _StepFailed(f"response lacks header {name!r}", _headers_text(headers))
            candidates = [*values, ", ".join(values)] if len(values) > 1 else values
            scope = ChainMap(caps, self.vars)
            got = next((c for v in candidates if (c := match_text(pattern, v, scope)) is not None), None)
            if got is None:
                raise _StepFailed(
                    f"header {name}: {values} does not match {pattern!r}", _headers_text(headers)
                )
            caps.update(got)
        for name in step.get("absent_headers", []):
            if name in headers:
                raise _StepFailed(
                    f"header {name!r} must be absent, got {headers[name]!r}", _headers_text(headers)
                )
        return caps

    async def _http(self, step: Mapping[str, Any]) -> None:
        method, target = _split_request(step["http"])
        headers = self._headers(step)
        data: bytes | aiohttp.MultipartWriter | None = None
        if "send_body" in step:
            data = expand(step["send_body"], self.vars).encode("utf-8", "surrogatepass")
        elif "form" in step:
            form = {expand(k, self.vars): expand(str(v), self.vars) for k, v in step["form"].items()}
            data = urllib.parse.urlencode(form).encode()
            if not _has(headers, "Content-Type"):
                headers["Content-Type"] = "application/x-www-form-urlencoded"
        elif "multipart" in step:
            mp = aiohttp.MultipartWriter("form-data")
            for k, v in step["multipart"].items():
                part = mp.append(expand(str(v), self.vars))
                part.set_content_disposition("form-data", name=expand(k, self.vars))
            data = mp
        timeout = float(step.get("timeout_ms", HTTP_TIMEOUT_S * 1000)) / 1000
        # Send exactly the headers the step names: no Content-Type is invented for a raw body.
        skip = ("Content-Type",) if isinstance(data, bytes) and not _has(headers, "Content-Type") else ()
        async with asyncio.timeout(timeout):
            async with self.session.request(
                method,
                self._url(target),
                headers=headers,
                data=data,
                allow_redirects=False,
                skip_auto_headers=skip,
            ) as resp:
                raw = await resp.read()
                status, resp_headers = resp.status, resp.headers
        text = raw.decode("utf-8", "surrogateescape")
        shown = f"status {status}, body {_clip(text)!r}"
        if status != int(step["status"]):
            raise _StepFailed(f"status {status}, expected {step['status']}", shown)
        caps = self._check_headers(step, resp_headers)
        if "body" in step:
            got = match_text(step["body"], text, ChainMap(caps, self.vars))
            if got is None:
                raise _StepFailed(f"body does not match {step['body']!r}", shown)
            caps.update(got)
        if "expect_json" in step:
            try:
                value = json.loads(text)
            except ValueError as exc:
                raise _StepFailed(f"body is not JSON: {exc}", shown) from None
            try:
                match_value(
                    step["expect_json"],
                    value,
                    ChainMap(caps, self.vars),
                    caps,
                    mode=step.get("match", "exact"),
                )
            except Mismatch as exc:
                raise _StepFailed(str(exc), shown) from None
        self._commit(caps)


def _has(headers: Mapping[str, str], name: str) -> bool:
    return any(k.lower() == name.lower() for k in headers)


def _clip(text: str, limit: int = 2000) -> str:
    return text if len(text) <= limit else text[:limit] + f"… ({len(text)} chars)"


def _short_json(value: Any, limit: int = 1000) -> str:
    return _clip(dumps_compact(value), limit)


def _headers_text(headers: CIMultiDictProxy[str]) -> str:
    return "headers " + ", ".join(f"{k}: {v}" for k, v in headers.items())


async def _read_some(resp: aiohttp.ClientResponse, limit: int = 4000) -> str:
    with contextlib.suppress(Exception):
        async with asyncio.timeout(1.0):
            data = await resp.content.read(limit)
            return data.decode("utf-8", "replace")
    return ""


async def run_case(case: Mapping[str, Any], start_server: ServerFactory) -> None:
    """Run one case against fresh servers made by ``start_server`` (called again for each restart)."""
    await CaseRunner(case, start_server).run()
