"""Mist 2015 (protocols/mist.md §2-§3, §8-§9): sans-I/O connection state machines.

:class:`Mist2015Connection` is the TCP line protocol; :class:`Mist2015WsConnection` the JSON commands of
``/mist/ws``. Both are fed input and return :data:`~.mist_common.Output` lists (see :mod:`.mist_common` for
the outputs, the commands and what the wiring answers).

Invariants:

* Per-connection state lives here: the reference-counted tag sets (:class:`~.mist_common.Subscriptions`,
  first-subscribed order), the auth state and the replication flag. A :class:`~.mist_common.Subscribe` is
  emitted only when a set's count goes 0 → 1, an :class:`~.mist_common.Unsubscribe` only when it goes
  1 → 0, so the core holds at most one subscription per distinct set.
* Every read is bounded: a TCP line by ``max_frame`` (the newline excluded), a WebSocket message by
  ``max_frame``, tags by ``max_tags``/``max_tag_bytes``, subscriptions by ``max_subscriptions``. Going over
  raises a typed error from :mod:`hubbub.errors` internally, answered with mist's own reply: ``error Line
  too long`` + close (:class:`~hubbub.errors.FrameTooLarge`), ``error Invalid tags``
  (:class:`~hubbub.errors.BadRequest`), ``error Too many subscriptions``
  (:class:`~hubbub.errors.LimitExceeded`). After a fatal error ``failed`` is set, ``error`` holds it, the
  buffer is dropped and later input is ignored.
* TCP parsing does not depend on chunking: the same bytes in any split give the same outputs.
* After an :class:`~.mist_common.Authenticate` the connection reads nothing more until ``auth_result``.

Legal states of the TCP connection (``auth_required``)::

    state            input                      next state        outputs
    -----            -----                      ----------        -------
    AUTH_FIRST       "auth <token>"             AUTH_WAIT         Authenticate
    AUTH_FIRST       any other line             FAILED            error Unauthorized, Close
    AUTH_WAIT        auth_result(grant)         OPEN              (resumes the buffered input)
    AUTH_WAIT        auth_result(None)          FAILED            error Unauthorized, Close
    OPEN             a line                     OPEN              the command table below
    any              a line over max_frame      FAILED            error Line too long, Close

Without ``auth_required`` the connection starts OPEN (``auth <token>`` is then a no-op).

Concurrency contract: a connection object belongs to one connection and is called from the event loop only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import orjson

from hubbub.disconnect import Disconnect
from hubbub.errors import AuthError, BadRequest, FrameTooLarge, HubbubError, LimitExceeded, UnknownOp
from hubbub.events import Event

from .mist_common import (
    DEFAULT_CHANNEL,
    DEFAULT_MAX_FRAME,
    DEFAULT_MAX_SUBSCRIPTIONS,
    DEFAULT_MAX_TAG_BYTES,
    DEFAULT_MAX_TAGS,
    Authenticate,
    Close,
    Command,
    MistGrant,
    Output,
    Publish,
    Register,
    RegistryCommand,
    Send,
    SetTags,
    Subscribe,
    Subscriptions,
    TokenTags,
    Unregister,
    UnsetTags,
    Unsubscribe,
    check_tags,
    delivers,
    text,
)

__all__ = [
    "ARGUMENTS",
    "Mist2015Connection",
    "Mist2015WsConnection",
    "render_event_tcp",
    "render_event_ws",
]

#: Commands of the TCP line protocol and their argument counts (mist.md §2): a line is split on single
#: spaces into at most 3 fields, and the field count must be 1 + this.
ARGUMENTS: Final[dict[bytes, int]] = {
    b"ping": 0,
    b"subscribe": 1,
    b"unsubscribe": 1,
    b"publish": 2,
    b"list": 0,
    b"enable-replication": 0,
    b"register": 2,
    b"unregister": 1,
    b"set": 2,
    b"unset": 2,
    b"tags": 1,
    b"auth": 1,
}

_PONG: Final = Send(b"pong\n")
_INVALID_TAGS: Final = Send(b"error Invalid tags\n")
_TOO_MANY: Final = Send(b"error Too many subscriptions\n")
_UNAUTHORIZED: Final = Send(b"error Unauthorized\n")
_LINE_TOO_LONG: Final = Send(b"error Line too long\n")
_ACCESS_DENIED: Final = Send(b"error Access denied\n")
_NOT_FOUND: Final = b"error Token not found\n"


def _token(raw: bytes) -> str:
    # Tokens are text; bytes that are not UTF-8 are replaced (U+FFFD) so every token can be stored as JSON.
    return raw.decode("utf-8", "replace")


def _join_tags(tags: tuple[str, ...] | list[str]) -> bytes:
    return _escape_lf(",".join(tags))


def _escape_lf(joined: str) -> bytes:
    # An LF inside a tag (possible from other dialects) would end the line early: written as "\n".
    out = joined.encode()
    return out.replace(b"\n", b"\\n") if b"\n" in out else out


def render_event_tcp(event: Event) -> bytes:
    """``publish <tags ascending, joined by ,> <payload with LF as \\n>\\n`` (mapping.md §5.2), or ``b""``
    (not sent) for an event with a tag that holds a ``,`` or a space.

    A 2015 client splits the line on its first two spaces and the tags on commas, so no line carries such a
    tag (``x`` and ``y z`` would reach it as the tags ``x,y`` and data starting with ``z``). 1.x and native
    publishers may use any tag, and 2015 WebSocket and 1.x subscribers get those events as they are; a 2015
    TCP subscriber, which can never name such a tag itself, does not get them (docs/dialects/mist.md).
    """
    joined = ",".join(event.tags)
    if " " in joined or joined.count(",") != len(event.tags) - 1:  # a space, or a comma inside a tag
        return b""
    payload = event.payload
    if b"\n" in payload:
        payload = payload.replace(b"\n", b"\\n")
    return b"publish " + _escape_lf(joined) + b" " + payload + b"\n"


def render_event_ws(event: Event) -> bytes:
    """``{"tags":[tags ascending],"data":text(payload)}`` (mist.md §3)."""
    return orjson.dumps({"tags": list(event.tags), "data": text(event.payload)})


def _cached(key: str, render: Callable[[Event], bytes], event: Event, cache: dict[Any, Any] | None) -> bytes:
    """Render once per fan-out: the rendering depends on the event only."""
    if cache is None:
        return render(event)
    hit = cache.get(key)
    if hit is not None and hit[0] is event:
        return hit[1]  # type: ignore[no-any-return]
    data = render(event)
    cache[key] = (event, data)
    return data


class _Base:
    """State both 2015 transports share."""

    #: mist-2015 delivers to the publishing connection (README §3).
    echo: Final = True
    generation: Final = "mist2015"

    def __init__(
        self,
        *,
        max_frame: int,
        max_subscriptions: int,
        max_tags: int,
        max_tag_bytes: int,
        channel: str,
    ) -> None:
        self.max_frame = max_frame
        self.max_tags = max_tags
        self.max_tag_bytes = max_tag_bytes
        self.channel = channel
        #: The reference-counted tag sets, first subscribed first.
        self.subscriptions = Subscriptions(max_subscriptions, counted=True)
        #: Set by ``enable-replication`` (TCP only).
        self.replica = False
        self.failed = False
        #: The fatal error, once ``failed``.
        self.error: HubbubError | None = None

    @property
    def subscribed(self) -> bool:
        """Whether the connection holds at least one subscription (counted by ``who``)."""
        return bool(len(self.subscriptions))

    def accepts(self, event: Event) -> bool:
        """Whether this connection may receive ``event`` (tagged; not a replica event for a replica peer)."""
        return delivers(event, self.replica)

    def _tags(self, items: list[bytes] | list[str]) -> frozenset[str]:
        return check_tags(items, self.max_tags, self.max_tag_bytes)

    def _fail(self, exc: HubbubError) -> None:
        self.failed = True
        self.error = exc


class Mist2015Connection(_Base):
    """The TCP line protocol (mist.md §2). Feed bytes with :meth:`receive_data`."""

    def __init__(
        self,
        *,
        max_frame: int = DEFAULT_MAX_FRAME,
        max_subscriptions: int = DEFAULT_MAX_SUBSCRIPTIONS,
        max_tags: int = DEFAULT_MAX_TAGS,
        max_tag_bytes: int = DEFAULT_MAX_TAG_BYTES,
        channel: str = DEFAULT_CHANNEL,
        auth_required: bool = False,
    ) -> None:
        super().__init__(
            max_frame=max_frame,
            max_subscriptions=max_subscriptions,
            max_tags=max_tags,
            max_tag_bytes=max_tag_bytes,
            channel=channel,
        )
        self.auth_required = auth_required
        #: The accepted grant: ``MistGrant()`` when auth is off, None until ``auth_result`` accepts one.
        self.grant: MistGrant | None = None if auth_required else MistGrant()
        #: True between an :class:`Authenticate` output and :meth:`auth_result`.
        self.awaiting_auth = False
        #: Complete lines taken from the input so far, whatever became of them (the listener's first-message
        #: timeout stops at the first).
        self.messages = 0
        self._buf = bytearray()
        self._scanned = 0  # bytes of _buf known to hold no newline
        self._handlers: dict[bytes, Callable[[list[bytes], list[Output]], None]] = {
            b"ping": self._ping,
            b"subscribe": self._subscribe,
            b"unsubscribe": self._unsubscribe,
            b"publish": self._publish,
            b"list": self._list,
            b"enable-replication": self._enable_replication,
            b"register": self._register,
            b"unregister": self._unregister,
            b"set": self._set,
            b"unset": self._unset,
            b"tags": self._token_tags,
            b"auth": self._auth,
        }
        assert self._handlers.keys() == ARGUMENTS.keys()

    @property
    def buffered(self) -> int:
        """Bytes held for an incomplete line (or read ahead while awaiting auth)."""
        return len(self._buf)

    # -- input --------------------------------------------------------------------------------------------

    def receive_data(self, data: bytes | bytearray | memoryview) -> list[Output]:
        """Add received bytes; return the outputs of every line they complete, in order."""
        if self.failed:
            return []
        self._buf += data
        out: list[Output] = []
        if self.awaiting_auth:
            # The transport kept reading while authentication was pending: bound what is held. (Only what
            # arrives meanwhile: input that came with the auth line waits whatever its size, so the outputs
            # do not depend on where the reads split it.)
            if len(self._buf) > self.max_frame:
                self._fatal(FrameTooLarge(f"line over {self.max_frame} bytes"), _LINE_TOO_LONG, out)
            return out
        self._process(out)
        return out

    def auth_result(self, grant: MistGrant | None) -> list[Output]:
        """The wiring's answer to :class:`Authenticate`: a grant (accepted) or None (refused). Resumes
        reading the input buffered meanwhile."""
        if not self.awaiting_auth:
            raise RuntimeError("no authentication is pending")
        self.awaiting_auth = False
        out: list[Output] = []
        if grant is None:
            self._refuse(out)
            return out
        self.grant = grant
        self._process(out)
        return out

    def _process(self, out: list[Output]) -> None:
        buf = self._buf
        while not self.awaiting_auth and not self.failed:
            nl = buf.find(b"\n", self._scanned)
            if nl < 0:
                if len(buf) > self.max_frame:
                    self._fatal(FrameTooLarge(f"line over {self.max_frame} bytes"), _LINE_TOO_LONG, out)
                else:
                    self._scanned = len(buf)
                return
            if nl > self.max_frame:
                self._fatal(FrameTooLarge(f"line over {self.max_frame} bytes"), _LINE_TOO_LONG, out)
                return
            line = bytes(buf[:nl])
            del buf[: nl + 1]
            self._scanned = 0
            self.messages += 1
            self._line(line, out)

    def _fatal(self, exc: HubbubError, reply: Send, out: list[Output]) -> None:
        out.append(reply)
        out.append(Close())
        self._fail(exc)
        self._buf.clear()
        self._scanned = 0

    def _refuse(self, out: list[Output]) -> None:
        self._fatal(AuthError("unauthorized"), _UNAUTHORIZED, out)

    def _line(self, line: bytes, out: list[Output]) -> None:
        fields = line.split(b" ", 2)
        name = fields[0]
        if self.grant is None:
            # mist.md §8: with auth on, the first line must be "auth <token>".
            if name == b"auth" and len(fields) == 2:
                self.awaiting_auth = True
                out.append(Authenticate(_token(fields[1])))
            else:
                self._refuse(out)
            return
        nargs = ARGUMENTS.get(name)
        if nargs is None:
            out.append(Send(b"error Unknown command '[" + line + b"]'\n"))
        elif len(fields) != nargs + 1:
            out.append(Send(b"error Incorrect number of arguments for '[" + line + b"]'\n"))
        else:
            self._handlers[name](fields, out)

    # -- the command table (mist.md §2) -------------------------------------------------------------------

    def _ping(self, fields: list[bytes], out: list[Output]) -> None:
        out.append(_PONG)

    def _parse_tags(self, raw: bytes, out: list[Output]) -> frozenset[str] | None:
        try:
            return self._tags(raw.split(b","))
        except BadRequest:
            out.append(_INVALID_TAGS)
            return None

    def _subscribe(self, fields: list[bytes], out: list[Output]) -> None:
        tags = self._parse_tags(fields[1], out)
        if tags is None:
            return
        try:
            new = self.subscriptions.add(tags)
        except LimitExceeded:
            out.append(_TOO_MANY)
            return
        if new:
            out.append(Subscribe(tags))

    def _unsubscribe(self, fields: list[bytes], out: list[Output]) -> None:
        tags = self._parse_tags(fields[1], out)
        if tags is not None and self.subscriptions.remove(tags):
            out.append(Unsubscribe(tags))

    def _publish(self, fields: list[bytes], out: list[Output]) -> None:
        tags = self._parse_tags(fields[1], out)
        if tags is not None:
            out.append(Publish(self.channel, tuple(sorted(tags)), fields[2], self.replica))

    def _list(self, fields: list[bytes], out: list[Output]) -> None:
        subs = [_join_tags(sorted(s, reverse=True)) for s in self.subscriptions]
        out.append(Send(b"list " + b" ".join(subs) + b"\n"))

    def _enable_replication(self, fields: list[bytes], out: list[Output]) -> None:
        self.replica = True

    def _register(self, fields: list[bytes], out: list[Output]) -> None:
        tags = self._parse_tags(fields[1], out)
        if tags is not None:
            out.append(Register(_token(fields[2]), tags))

    def _unregister(self, fields: list[bytes], out: list[Output]) -> None:
        out.append(Unregister(_token(fields[1])))

    def _set(self, fields: list[bytes], out: list[Output]) -> None:
        tags = self._parse_tags(fields[1], out)
        if tags is not None:
            out.append(SetTags(_token(fields[2]), tags))

    def _unset(self, fields: list[bytes], out: list[Output]) -> None:
        tags = self._parse_tags(fields[1], out)
        if tags is not None:
            out.append(UnsetTags(_token(fields[2]), tags))

    def _token_tags(self, fields: list[bytes], out: list[Output]) -> None:
        out.append(TokenTags(_token(fields[1])))

    def _auth(self, fields: list[bytes], out: list[Output]) -> None:
        """Already authenticated, or auth is off: nothing to do (mist.md §2)."""

    # -- answers from the core ----------------------------------------------------------------------------

    def reply_registry(self, cmd: RegistryCommand, result: bool | frozenset[str] | None) -> bytes | None:
        """The reply to a registry command, given the registry's answer (see each command), or None."""
        if isinstance(cmd, Register):
            return None if result else b"error already exists\n"
        if isinstance(cmd, SetTags | UnsetTags):
            return None if result else _NOT_FOUND
        if isinstance(cmd, TokenTags):
            if not isinstance(result, frozenset):
                return _NOT_FOUND
            return b"tags " + cmd.token.encode() + b" " + _join_tags(sorted(result)) + b"\n"
        return None  # Unregister: never answered

    def reply_error(self, cmd: Command, exc: HubbubError) -> list[Output]:
        """The outputs answering the core's refusal of ``cmd``: ``error Access denied`` for a publish the
        token may not make (4102), ``error Too many subscriptions`` (4007); anything else (storage, shutdown)
        has no mist reply and closes the connection."""
        if isinstance(exc, AuthError) and exc.code == 4102:
            return [_ACCESS_DENIED]
        if isinstance(exc, LimitExceeded):
            return [_TOO_MANY]
        self._fail(exc)
        return [Close(Disconnect.INTERNAL_ERROR)]

    # -- events -------------------------------------------------------------------------------------------

    def encode_event(self, event: Event, cache: dict[Any, Any] | None = None) -> bytes:
        """The event line (:func:`render_event_tcp`), rendered once per fan-out through ``cache``."""
        return _cached("mist2015.tcp", render_event_tcp, event, cache)


# -- the WebSocket route ----------------------------------------------------------------------------------

_WS_INVALID_JSON: Final = Send(b'{"success":false,"error":"Invalid json"}')
_WS_BINARY: Final = Send(b'{"success":false,"error":"I don\'t understand binary messages"}')
_WS_UNKNOWN: Final = Send(b'{"success":false,"error":"unknown command"}')
_WS_INVALID_TAGS: Final = Send(b'{"success":false,"error":"Invalid tags"}')
_WS_TOO_MANY: Final = Send(b'{"success":false,"error":"Too many subscriptions"}')
_WS_REFUSED: Final = Send(b'{"success":false,"command":"subscribe"}')
_WS_PING: Final = Send(b'{"success":true,"command":"ping"}')
_WS_SUBSCRIBED: Final = Send(b'{"success":true,"command":"subscribe"}')
_WS_UNSUBSCRIBED: Final = Send(b'{"success":true,"command":"unsubscribe"}')


class Mist2015WsConnection(_Base):
    """``/mist/ws`` (mist.md §3): one JSON command per text frame. Feed frames with :meth:`receive_frame`.

    ``grant`` is what the upgrade's token allowed (``MistGrant()`` with auth off): with ``grant.tags`` set
    (a registry token), each subscribe must share at least one tag with it. There is no publish here.
    """

    def __init__(
        self,
        *,
        max_frame: int = DEFAULT_MAX_FRAME,
        max_subscriptions: int = DEFAULT_MAX_SUBSCRIPTIONS,
        max_tags: int = DEFAULT_MAX_TAGS,
        max_tag_bytes: int = DEFAULT_MAX_TAG_BYTES,
        channel: str = DEFAULT_CHANNEL,
        grant: MistGrant | None = None,
    ) -> None:
        super().__init__(
            max_frame=max_frame,
            max_subscriptions=max_subscriptions,
            max_tags=max_tags,
            max_tag_bytes=max_tag_bytes,
            channel=channel,
        )
        self.grant = grant if grant is not None else MistGrant()

    def receive_frame(self, frame: bytes | str, binary: bool = False) -> list[Output]:
        """One WebSocket data frame (``binary`` for a binary frame) → outputs."""
        if self.failed:
            return []
        size = len(frame) if isinstance(frame, bytes) else len(frame.encode("utf-8", "surrogatepass"))
        if size > self.max_frame:
            self._fail(FrameTooLarge(f"message over {self.max_frame} bytes"))
            return [Close(Disconnect.MESSAGE_TOO_BIG)]
        if binary:
            return [_WS_BINARY]
        try:
            msg = orjson.loads(frame)
        except orjson.JSONDecodeError:
            return [_WS_INVALID_JSON]
        if not isinstance(msg, dict) or not isinstance(msg.get("command"), str):
            return [_WS_INVALID_JSON]
        command = msg["command"]
        try:
            if command == "ping":
                return [_WS_PING]
            if command == "subscribe":
                return self._subscribe(msg.get("tags"))
            if command == "unsubscribe":
                return self._unsubscribe(msg.get("tags"))
            if command == "list":
                subs = [sorted(s, reverse=True) for s in self.subscriptions]
                return [Send(orjson.dumps({"subscriptions": subs, "command": "list", "success": True}))]
            raise UnknownOp("unknown command")
        except UnknownOp:
            return [_WS_UNKNOWN]
        except BadRequest:
            return [_WS_INVALID_TAGS]
        except LimitExceeded:
            return [_WS_TOO_MANY]

    def _tag_list(self, raw: object) -> frozenset[str] | None:
        """``tags`` as a set, or None when missing or not an array of strings (then: success, no effect)."""
        if not isinstance(raw, list) or not raw or not all(isinstance(t, str) for t in raw):
            return None
        return self._tags(raw)

    def _subscribe(self, raw: object) -> list[Output]:
        tags = self._tag_list(raw)
        if tags is None:
            return [_WS_SUBSCRIBED]
        allowed = self.grant.tags
        if allowed is not None and not (tags & allowed):
            return [_WS_REFUSED]
        if self.subscriptions.add(tags):
            return [Subscribe(tags), _WS_SUBSCRIBED]
        return [_WS_SUBSCRIBED]

    def _unsubscribe(self, raw: object) -> list[Output]:
        tags = self._tag_list(raw)
        if tags is not None and self.subscriptions.remove(tags):
            return [Unsubscribe(tags), _WS_UNSUBSCRIBED]
        return [_WS_UNSUBSCRIBED]

    def reply_error(self, cmd: Command, exc: HubbubError) -> list[Output]:
        """The core refused a :class:`Subscribe`: ``Too many subscriptions`` for 4007; else close 1011."""
        if isinstance(exc, LimitExceeded):
            return [_WS_TOO_MANY]
        self._fail(exc)
        return [Close(Disconnect.INTERNAL_ERROR)]

    def encode_event(self, event: Event, cache: dict[Any, Any] | None = None) -> bytes:
        """The event frame (:func:`render_event_ws`), rendered once per fan-out through ``cache``."""
        return _cached("mist2015.ws", render_event_ws, event, cache)
