"""The Ivy dialect (protocols/ivy.md): a sans-I/O codec for one-line WebSocket commands and the HTTP log.

:class:`IvyCodec` turns one WebSocket text frame into a :data:`Command` and renders events, timestamp
replies and the session-id pseudo-event as frames. The module-level functions handle the HTTP side: the ivy
path rules for ``POST`` (:func:`ivy_path`), log-read globs (:func:`parse_log_path`), the ``n`` and ``at``
query parameters (:func:`parse_count`, :func:`at_range`), log lines (:func:`render_log_line`) and the
pieces of HTTP caching (:func:`parse_range`, :func:`immutable_at`).

Invariants:

* ``decode`` returns a fully validated command or raises a :class:`~hubbub.errors.ProtocolError`:
  :class:`~hubbub.errors.FrameTooLarge` (4003) for a frame over ``max_frame`` (the transport closes 1009),
  and :class:`~hubbub.errors.BadFrame`, :class:`~hubbub.errors.UnknownOp` or
  :class:`~hubbub.errors.BadChannel` for everything Ivy calls an invalid command (close 1002). Nothing else
  escapes. Every frame is one whole command, so there is no buffering and chunking cannot matter.
* Every read is bounded: by ``max_frame`` and by ``max_channel_bytes`` for paths.
* Output is always valid UTF-8 text: payload bytes that are not UTF-8 are written as ``%XX``
  (:func:`ivyesc`), so every frame can go out as a WebSocket text frame.
* An event is rendered once per fan-out (``cache``), whatever the number of ivy subscribers.

Concurrency contract: a codec belongs to one connection and is called from one thread (the event loop). The
module-level functions are pure and thread-safe.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Final, TypeAlias
from urllib.parse import unquote

from hubbub.channels import MAX_CHANNEL_BYTES, Pattern, canonical, dec, enc
from hubbub.config import Config, ConfigError, DialectSection
from hubbub.disconnect import Disconnect
from hubbub.errors import (
    AuthError,
    BadChannel,
    BadFrame,
    BadRequest,
    FrameTooLarge,
    HubbubError,
    LimitExceeded,
    ProtocolError,
    ShuttingDown,
    UnknownOp,
)
from hubbub.events import Event

from . import actions
from .actions import Close, Send
from .spec import DialectSpec

__all__ = [
    "CONTENT_TYPE",
    "DEFAULT_LARGE_EVENT_BYTES",
    "DEFAULT_MAX_FRAME",
    "SPEC",
    "SUBPROTOCOL",
    "Command",
    "IvyCodec",
    "IvyConfig",
    "IvyConnection",
    "LogPath",
    "Publish",
    "Subscribe",
    "TimeRequest",
    "Unsubscribe",
    "at_range",
    "close_reason",
    "immutable_at",
    "ivy_path",
    "ivyesc",
    "parse_count",
    "parse_log_path",
    "parse_range",
    "publish_path",
    "render_event",
    "render_log_line",
    "render_path",
    "subscription_pattern",
    "ts",
    "wire_close",
]

SUBPROTOCOL: Final = "ivy1"
DEFAULT_MAX_FRAME: Final = 1 << 20
DEFAULT_LARGE_EVENT_BYTES: Final = 65536
#: The content type of every ivy publish (mapping.md §4).
CONTENT_TYPE: Final = "text/plain; charset=utf-8"

_WS: Final = " \t\n\v\f\r"
_IVY_PATH = re.compile(r"/[0-9a-z./-]+")
_SURROGATE = re.compile("[\udc80-\udcff]")
_TS_MIN: Final = "0000000000.000000000"
_TS_MAX: Final = "9999999999.999999999"


# -- commands ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Subscribe:
    """``+<path>``: the canonical channel; the subscription covers it and everything below it."""

    channel: str
    ack: str | None = None


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    """``-<path>``: drop the subscription to exactly this channel (unknown ones are ignored)."""

    channel: str
    ack: str | None = None


@dataclass(frozen=True, slots=True)
class Publish:
    """``:<path>:<data>``: the payload is the UTF-8 of everything after the second ``:``."""

    channel: str
    payload: bytes
    ack: str | None = None


@dataclass(frozen=True, slots=True)
class TimeRequest:
    """``@``: answered ``#<ack>#@<ts(now)>`` (``##@…`` without a key)."""

    ack: str | None = None


Command: TypeAlias = Subscribe | Unsubscribe | Publish | TimeRequest


# -- helpers (mapping.md §5.1) ----------------------------------------------------------------------------


def ts(time_ns: int) -> str:
    """Ivy's timestamp: ``%010d.%09d`` of seconds and nanoseconds."""
    s, ns = divmod(time_ns, 1_000_000_000)
    return f"{s:010d}.{ns:09d}"


def ivyesc(payload: bytes) -> str:
    """Valid UTF-8 is copied with ``%`` → ``%25`` and LF → ``%0A``; every other byte becomes ``%XX``."""
    text = payload.decode("utf-8", "surrogateescape")
    if "%" in text:
        text = text.replace("%", "%25")
    if "\n" in text:
        text = text.replace("\n", "%0A")
    if not text.isascii() and _SURROGATE.search(text) is not None:
        # surrogateescape maps each byte outside a valid sequence to U+DC80..U+DCFF, one per byte.
        text = _SURROGATE.sub(lambda m: f"%{ord(m.group()) - 0xDC00:02X}", text)
    return text


def render_path(channel: str) -> str:
    """The ivy rendering of a canonical channel: ``:`` → ``%3A`` (mapping.md §2.5)."""
    return channel.replace(":", "%3A") if ":" in channel else channel


def render_log_line(event: Event) -> str:
    """The full form, as the log read always uses it: ``@<ts>:<path>:<ivyesc(payload)>``."""
    return f"@{ts(event.time_ns)}:{render_path(event.channel)}:{ivyesc(event.payload)}"


def render_event(event: Event, large_event_bytes: int = DEFAULT_LARGE_EVENT_BYTES) -> str:
    """The live form: the full line, or ``@<ts>:<path>.`` for a payload of ``large_event_bytes`` or more."""
    if len(event.payload) >= large_event_bytes:
        return f"@{ts(event.time_ns)}:{render_path(event.channel)}."
    return render_log_line(event)


def ivy_path(text: str, max_channel_bytes: int = MAX_CHANNEL_BYTES) -> str:
    """Apply the ivy path rules (ivy.md §3) and return the canonical channel. Raises :class:`BadChannel`.

    Strip whitespace, prepend ``/`` if missing, drop one trailing ``/`` (not from the root), then require
    ``/`` or ``^/[0-9a-z./-]+$``. Such a path is already canonical (it has no ``%`` and no controls).
    """
    p = text.strip(_WS)
    if not p:
        raise BadChannel("empty path")
    if not p.startswith("/"):
        p = "/" + p
    if len(p) > 1 and p.endswith("/"):
        p = p[:-1]
    if p != "/" and _IVY_PATH.fullmatch(p) is None:
        raise BadChannel("path must match ^/[0-9a-z./-]+$")
    if len(p) > max_channel_bytes:
        raise BadChannel(f"channel longer than {max_channel_bytes} bytes")
    return p


def subscription_pattern(channel: str) -> Pattern:
    """The pattern of an ivy subscription: the channel and everything below it, segment by segment."""
    if channel == "/":
        return Pattern((), True, "/**")
    parts = tuple(channel[1:].split("/"))
    return Pattern(parts, True, channel + "/**")


# -- the WebSocket codec ----------------------------------------------------------------------------------


class IvyCodec:
    """Decode one frame into a :data:`Command`; render frames. See the module docstring."""

    def __init__(
        self,
        *,
        max_frame: int = DEFAULT_MAX_FRAME,
        max_channel_bytes: int = MAX_CHANNEL_BYTES,
        large_event_bytes: int = DEFAULT_LARGE_EVENT_BYTES,
    ) -> None:
        self.max_frame = max_frame
        self.max_channel_bytes = max_channel_bytes
        self.large_event_bytes = large_event_bytes
        #: Sessions with equal keys share rendered events (the threshold changes the rendering).
        self.key = f"ivy.{large_event_bytes}"

    def decode(self, frame: str | bytes) -> Command:
        """One text frame (``str``, or its UTF-8 bytes) → a command. Raises a ``ProtocolError``."""
        if isinstance(frame, bytes):
            if len(frame) > self.max_frame:
                raise FrameTooLarge(f"frame over {self.max_frame} bytes")
            try:
                text = frame.decode("utf-8")
            except UnicodeDecodeError:
                raise BadFrame("frame is not UTF-8") from None
        else:
            text = frame
            # A str of n code points has between n and 4n UTF-8 bytes: encode only when it could matter.
            if len(text) > self.max_frame or (
                4 * len(text) > self.max_frame and len(text.encode("utf-8", "surrogatepass")) > self.max_frame
            ):
                raise FrameTooLarge(f"frame over {self.max_frame} bytes")
        if not text:
            raise BadFrame("empty frame")
        ack: str | None = None
        if text[0] == "#":
            end = text.find("#", 1)
            if end < 0:
                raise BadFrame("ack key without a closing #")
            ack = text[1:end]
            text = text[end + 1 :]
            if not text:
                raise BadFrame("empty command")
        op = text[0]
        if op == "@":
            return TimeRequest(ack)
        if op == "+":
            return Subscribe(self._path(text[1:]), ack)
        if op == "-":
            return Unsubscribe(self._path(text[1:]), ack)
        if op == ":":
            sep = text.find(":", 1)
            if sep < 0:
                raise BadFrame("publish without a second ':'")
            data = text[sep + 1 :]
            try:
                payload = data.encode("utf-8")
            except UnicodeEncodeError:  # lone surrogates: not text a WebSocket peer can send
                raise BadFrame("data is not valid text") from None
            return Publish(self._path(text[1:sep]), payload, ack)
        raise UnknownOp("unknown command")

    def _path(self, text: str) -> str:
        return ivy_path(text, self.max_channel_bytes)

    # -- output -------------------------------------------------------------------------------------------

    def encode_intro(self, session_id: str, now_ns: int) -> bytes:
        """The session-id pseudo-event sent right after the upgrade (never logged)."""
        return f"@{ts(now_ns)}:~/sid:{session_id}".encode()

    def encode_time(self, ack: str | None, now_ns: int) -> bytes:
        """The reply to ``@``."""
        return f"#{ack or ''}#@{ts(now_ns)}".encode()

    def encode_event(self, event: Event, cache: dict[Any, Any] | None = None) -> bytes:
        """One live event frame, rendered once per fan-out through ``cache``."""
        if cache is not None:
            hit = cache.get(self.key)
            if hit is not None:
                return hit  # type: ignore[no-any-return]
        data = render_event(event, self.large_event_bytes).encode()
        if cache is not None:
            cache[self.key] = data
        return data


# -- the HTTP log read (ivy.md §6) ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LogPath:
    """A log-read path: one exact channel, or a glob (``pattern`` set, with ``*`` slots)."""

    channel: str
    pattern: Pattern | None = None


def parse_log_path(rest: str, max_channel_bytes: int = MAX_CHANNEL_BYTES) -> LogPath:
    """The raw URL text after ``/events/`` or ``/log/`` as a channel or a glob.

    Normalised as in mapping.md §2.3, *without* the ivy path regex (channels of other dialects stay
    readable). Raises :class:`BadRequest` (answered ``400 invalid glob path``) for a ``*`` that is not a
    whole segment, ``**``, a path ending in ``/`` (the bare prefix included), or a path that is not a
    channel (bad UTF-8, over the limit).
    """
    if rest == "" or rest.endswith("/"):
        raise BadRequest("invalid glob path")
    raw = rest.split("/")
    glob = False
    for s in raw:
        if "*" in s:
            if s != "*":
                raise BadRequest("invalid glob path")
            glob = True
    try:
        if not glob:
            return LogPath(canonical("/" + rest, max_channel_bytes))
        parts: list[str | None] = [None if s == "*" else enc(dec(s)) for s in raw]
        text = "/" + "/".join("*" if p is None else p for p in parts)
        if len(text.encode()) > max_channel_bytes:
            raise BadChannel("glob too long")
    except BadChannel:
        raise BadRequest("invalid glob path") from None
    return LogPath(text, Pattern(tuple(parts), False, text))


def parse_count(value: str | None) -> int | None:
    """``?n=``: a decimal integer of at least 1, or absent. Raises :class:`BadRequest` otherwise."""
    if value is None:
        return None
    if not value.isascii() or not value.isdigit() or len(value) > 19 or int(value) < 1:
        raise BadRequest("invalid line count")
    return int(value)


def at_range(prefix: str) -> tuple[int, int] | None:
    """``?at=P`` as the half-open range of event times whose ``ts`` string starts with P.

    ``ts`` strings have a fixed width, so their text order is their numeric order and the times sharing a
    prefix form one range. ``None`` when no timestamp can start with P (nothing matches).
    """
    if len(prefix) > len(_TS_MIN):
        return None
    for i, c in enumerate(prefix):
        if (c != ".") if i == 10 else not ("0" <= c <= "9"):
            return None
    lo = prefix + _TS_MIN[len(prefix) :]
    hi = prefix + _TS_MAX[len(prefix) :]
    return _ts_ns(lo), _ts_ns(hi) + 1


def _ts_ns(text: str) -> int:
    return int(text[:10]) * 1_000_000_000 + int(text[11:])


def immutable_at(rng: tuple[int, int] | None, top_time: int) -> bool:
    """Whether an ``?at=`` read can gain no more lines: every time in the range is below ``top_time``, the
    newest commit anywhere in the log, and no later commit gets an earlier time (mapping.md §3). ``top_time``
    must be read *before* the events, so that every event of the range is already visible."""
    return rng is None or rng[1] <= top_time


def parse_range(header: str, total: int) -> tuple[int, int] | bool | None:
    """A ``Range`` header against a body of ``total`` bytes.

    Returns ``(first, last)`` (inclusive) for one satisfiable byte range, ``False`` when the single range is
    unsatisfiable (416), and ``None`` when the header is to be ignored (malformed, several ranges, or another
    unit): the full body is then sent with 200, as RFC 9110 allows.
    """
    unit, _, spec = header.partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        return None
    first_s, dash, last_s = spec.strip().partition("-")
    if not dash:
        return None
    first_s, last_s = first_s.strip(), last_s.strip()
    if not (first_s.isascii() and last_s.isascii()):
        return None
    if first_s == "":
        if not last_s.isdigit():
            return None
        n = int(last_s)
        if n == 0 or total == 0:
            return False
        return max(0, total - n), total - 1
    if not first_s.isdigit() or (last_s and not last_s.isdigit()):
        return None
    a = int(first_s)
    if last_s and int(last_s) < a:
        return None
    if a >= total:
        return False
    return a, min(int(last_s), total - 1) if last_s else total - 1


def publish_path(rest: str, max_channel_bytes: int = MAX_CHANNEL_BYTES) -> str:
    """The channel of ``POST /events/<rest>``: percent-decoded as a whole, then the ivy path rules.
    Raises :class:`BadChannel` (answered ``400 invalid path``)."""
    try:
        text = unquote(rest, errors="strict")
    except UnicodeDecodeError:
        raise BadChannel("path is not UTF-8") from None
    return ivy_path(text, max_channel_bytes)


def close_reason(exc: HubbubError) -> Disconnect:
    """Ivy has no error reply: an error closes the connection, with the WebSocket code for its kind (ivy.md
    §9, protocols README §5). A frame over the limit 1009, any other bad input 1002, a refusal (not allowed,
    too many subscriptions) 1008, the server stopping 1001, anything else (a storage failure) 1011."""
    if isinstance(exc, FrameTooLarge):
        return Disconnect.MESSAGE_TOO_BIG
    if isinstance(exc, ProtocolError):
        return Disconnect.PROTOCOL_ERROR
    if isinstance(exc, AuthError | LimitExceeded):
        return Disconnect.POLICY_VIOLATION
    if isinstance(exc, ShuttingDown):
        return Disconnect.GOING_AWAY
    return Disconnect.INTERNAL_ERROR


def wire_close(reason: Disconnect) -> Disconnect:
    """The close an ivy client sees for a session's end or kick: an expired token closes with 1008 (ivy has
    no error reply; protocols README §7, permission denied), every other reason as it is."""
    return Disconnect.POLICY_VIOLATION if reason == Disconnect.TOKEN_EXPIRED else reason


class IvyConnection:
    """One ivy WebSocket's state machine (ivy.md §3-§4, §9), a
    :class:`~hubbub.dialects.spec.FrameConnection`: text frames in, shared actions out.

    Ivy has no error reply: a frame it cannot decode (or any binary frame) closes the connection, with the
    code of :func:`close_reason`; a command becomes a :class:`~hubbub.dialects.actions.Publish`, a
    :class:`~hubbub.dialects.actions.Subscribe` (the subscription's id is its path: one per path) or an
    :class:`~hubbub.dialects.actions.Unsubscribe`; ``@`` is answered at once with ``clock()`` (ns).
    Every close it asks for is bad input (``failed``)."""

    failed: Final = True

    def __init__(self, codec: IvyCodec, clock: Callable[[], int] = time.time_ns) -> None:
        self.codec = codec
        self._clock = clock

    def greeting(self, session_id: str) -> list[object]:
        """The session-id pseudo-event, first thing on the connection (ivy.md §3)."""
        return [Send(self.codec.encode_intro(session_id, self._clock()))]

    def receive_frame(self, frame: bytes | str, binary: bool = False) -> list[object]:
        if binary:
            return [Close(Disconnect.UNSUPPORTED_DATA, "binary frame")]
        try:
            cmd = self.codec.decode(frame)
        except ProtocolError as exc:  # FrameTooLarge included: 1009
            return [Close(close_reason(exc), exc.detail or exc.message)]
        if isinstance(cmd, TimeRequest):
            return [Send(self.codec.encode_time(cmd.ack, self._clock()))]
        if isinstance(cmd, Publish):
            return [actions.Publish(cmd.channel, cmd.payload, CONTENT_TYPE)]
        if isinstance(cmd, Subscribe):
            return [actions.Subscribe(cmd.channel, subscription_pattern(cmd.channel))]
        return [actions.Unsubscribe(cmd.channel)]

    @staticmethod
    def refused(cmd: object, exc: HubbubError) -> list[object]:
        """The core refused ``cmd``: ivy closes (ivy.md §9)."""
        why = "publish not allowed" if isinstance(exc, AuthError) else str(exc)
        if isinstance(exc, LimitExceeded):
            why = "too many subscriptions" if isinstance(cmd, actions.Subscribe) else "publish rate exceeded"
        return [Close(close_reason(exc), why)]


#: ivy as the server wires it: its WebSocket at ``/ws`` (its ``/events/`` and ``/log/`` surfaces are plain
#: HTTP, a route module), a slow reader closed (README §4: ivy has no way to report a gap).
@dataclass(frozen=True, slots=True)
class IvyConfig(DialectSection):
    """ivy's configuration section (docs/dialects/ivy.md)."""

    SECTION: ClassVar[str] = "ivy"
    HELP: ClassVar[Mapping[str, str]] = {
        "auth": "auth for the ivy routes; empty means auth.mode",
        "enabled": "serve the ivy dialect: WebSocket /ws and the log at /events/ and /log/ (true/false)",
        "large_event_bytes": "ivy events with a payload this large or larger are announced in short form",
        "ping_interval_s": "seconds between the server's pings on an ivy WebSocket",
        "read_timeout_s": "close an ivy WebSocket (1001) when nothing arrives for this many seconds",
        "max_log_bytes": "largest ivy log-read body; larger reads get 413 (narrow them with ?n= or ?at=)",
    }
    enabled: bool = True
    large_event_bytes: int = 65536
    ping_interval_s: float = 54.0
    read_timeout_s: float = 60.0
    max_log_bytes: int = 64 << 20
    auth: str = ""  # "" means auth.mode

    def validate(self, config: Config) -> None:
        for name in ("large_event_bytes", "ping_interval_s", "read_timeout_s", "max_log_bytes"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"ivy.{name}: must be positive")
        DialectSection.validate(self, config)


SPEC: Final = DialectSpec(
    name="ivy",
    section="ivy",
    config=IvyConfig,
    ws_routes=("/ws",),
    overflow="disconnect",
    binding="hubbub.transports.ivy:mount",
)
