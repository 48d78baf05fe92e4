"""Mist 1.x (protocols/mist.md §4, §8-§9): sans-I/O connection state machines for the JSON protocol.

:class:`Mist1Connection` reads the TCP stream (JSON values separated by any whitespace or by nothing, split
by :class:`JsonValueSplitter`); :class:`Mist1WsConnection` reads ``/mist/v1/ws`` frames (one JSON object
each, text or binary). Both return :data:`~.mist_common.Output` lists (see :mod:`.mist_common`). Every reply
and event is one compact JSON object followed by ``\\n`` (over WebSocket too, as upstream).

Message shape: ``{"command":…,"tags":[…],"data":"…"}``; unknown fields are ignored, ``null`` counts as
absent. Replies write ``command`` always and leave ``tags``, ``data`` and ``error`` out when empty.

Invariants:

* Per-connection state lives here: the subscription **set** (1.x does not count references; first
  subscribed first) and the auth state. A :class:`~.mist_common.Subscribe`/``Unsubscribe`` is emitted only
  when the set changes.
* Every read is bounded: one JSON value by ``max_frame`` bytes (its leading whitespace excluded), tags by
  ``max_tags``/``max_tag_bytes``, subscriptions by ``max_subscriptions``. Errors are typed
  (:mod:`hubbub.errors`) and answered with mist's replies (mist.md §9): over ``max_frame`` → ``Message too
  large`` and close (WebSocket: close 1009); a JSON syntax error → ``Invalid JSON`` and close on TCP (the
  stream cannot resync), stays open on WebSocket; a valid value of the wrong shape → ``Invalid message``;
  bad tags → ``Invalid tags``; too many subscriptions → ``Too many subscriptions``.
* TCP parsing does not depend on chunking: the same bytes in any split give the same outputs.
* Registry commands are served only on an authenticated connection (``auth_required`` and a token
  accepted); elsewhere they are unknown commands, as upstream.

Legal states of the TCP connection with ``auth_required``::

    state        input                        next state   outputs
    -----        -----                        ----------   -------
    AUTH_FIRST   a message of the right shape AUTH_WAIT    Authenticate(its data)
    AUTH_FIRST   a message of the wrong shape FAILED       Close (no reply)
    AUTH_WAIT    auth_result(grant)           OPEN         that first message's outputs, then the rest
    AUTH_WAIT    auth_result(None)            FAILED       Close (no reply)
    OPEN         a message                    OPEN         the command table of mist.md §4
    any          a syntax error / too large   FAILED       the error reply, Close

Concurrency contract: a connection object belongs to one connection and is called from the event loop only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

import orjson

from hubbub.disconnect import Disconnect
from hubbub.errors import AuthError, BadFrame, BadRequest, FrameTooLarge, HubbubError, LimitExceeded
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
    ListAll,
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
    Who,
    check_tags,
    delivers,
    text,
)

__all__ = [
    "ADMIN_COMMANDS",
    "JsonValueSplitter",
    "Mist1Connection",
    "Mist1WsConnection",
    "render_event",
    "render_reply",
]

#: Registry commands: served on authenticated connections only (mist.md §7).
ADMIN_COMMANDS: Final = frozenset({"register", "unregister", "set", "unset", "tags"})

#: The wire name of each command the core may refuse (for the ``Access denied`` reply).
_COMMAND_NAMES: Final[dict[type, str]] = {
    Publish: "publish",
    Subscribe: "subscribe",
    Register: "register",
    Unregister: "unregister",
    SetTags: "set",
    UnsetTags: "unset",
    TokenTags: "tags",
}

_INVALID_JSON: Final = b'{"command":"","error":"Invalid JSON"}\n'
_TOO_LARGE: Final = b'{"command":"","error":"Message too large"}\n'
_PONG: Final = Send(b'{"command":"ping","data":"pong"}\n')


def render_reply(command: str, tags: Iterable[str] | None = None, data: str = "", error: str = "") -> bytes:
    """One reply: ``command`` always, ``tags``/``data``/``error`` only when non-empty, then ``\\n``."""
    msg: dict[str, Any] = {"command": command}
    if tags:
        msg["tags"] = list(tags)
    if data:
        msg["data"] = data
    if error:
        msg["error"] = error
    return orjson.dumps(msg) + b"\n"


def render_event(event: Event) -> bytes:
    """``{"command":"publish","tags":[ascending],"data":text(payload)}`` + ``\\n`` (mapping.md §5.2)."""
    return render_reply("publish", event.tags, text(event.payload))


# -- stream splitting -------------------------------------------------------------------------------------

_STRING_STOP = re.compile(rb'["\\\x00-\x1f]')
_NUMBER_CHARS = re.compile(rb"[-+.eE0-9]*")
_NUMBER = re.compile(rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_HEX4 = re.compile(rb"[0-9a-fA-F]{4}")
_ESCAPES: Final = frozenset(b'"\\/bfnrt')
_LITERALS: Final = {0x74: b"true", 0x66: b"false", 0x6E: b"null"}
_WHITESPACE: Final = b" \t\r\n"

# Scanner states: what the next significant byte may be. The order matters: see the ``<=`` tests in _scan.
_VALUE = 0  # a value
_VALUE_OR_CLOSE = 1  # a value or ] (right after [)
_KEY = 2  # a key string (after a comma in an object)
_KEY_OR_CLOSE = 3  # a key string or } (right after {)
_COLON = 4
_COMMA_OR_CLOSE = 5  # after a value inside a container
_STRING = 6  # inside a string
_NUMBER_RUN = 7  # inside a number
_LITERAL = 8  # inside true, false or null


class JsonValueSplitter:
    """Splits a byte stream into JSON values, as Go's ``json.Decoder`` reads them: values separated by any
    whitespace or by nothing, a syntax error reported as soon as the byte that makes it arrives.

    An incremental syntax scanner (a state table over structural bytes, with a container stack) finds
    where each value ends; string contents are skipped with one regex search, so the per-byte Python work
    is only for structure. The caller parses each complete value (and so checks its UTF-8).

    :meth:`next` returns the bytes of the next complete value, or None when more input is needed; it raises
    :class:`~hubbub.errors.BadFrame` at the first byte that cannot continue valid JSON, and
    :class:`~hubbub.errors.FrameTooLarge` once a value passes ``max_frame`` bytes (bytes beyond that are not
    looked at, so an oversized value is reported as such even if it is also malformed). A top-level number
    ends only at the next non-number byte (``1`` then ``2`` is ``12``). Scanning resumes where it stopped,
    so a value fed one byte at a time costs linear time.
    """

    __slots__ = ("_key", "_lit", "_lit_i", "_num_start", "_pos", "_stack", "_state", "buf", "max_frame")

    def __init__(self, max_frame: int) -> None:
        self.max_frame = max_frame
        self.buf = bytearray()
        self._reset()

    def _reset(self) -> None:
        self._state = _VALUE
        self._stack: list[int] = []
        self._pos = 0  # scan position in buf (the value starts at 0)
        self._key = False  # the string being read is an object key
        self._lit = b""
        self._lit_i = 0
        self._num_start = 0

    def next(self) -> bytes | None:
        buf = self.buf
        if self._pos == 0 and self._state == _VALUE:
            stripped = len(buf) - len(buf.lstrip(_WHITESPACE))
            if stripped:
                del buf[:stripped]
            if not buf:
                return None
        end = self._scan()
        if end < 0:
            if len(buf) > self.max_frame:
                raise FrameTooLarge(f"JSON value over {self.max_frame} bytes")
            return None
        if end > self.max_frame:
            raise FrameTooLarge(f"JSON value over {self.max_frame} bytes")
        value = bytes(buf[:end])
        del buf[:end]
        self._reset()
        return value

    def _scan(self) -> int:
        """The end of the current value, or -1 (the scan state is kept for the next call)."""
        buf = self.buf
        # Look no further than max_frame + 1 bytes: a value not ended by then is too large, whatever follows.
        n = min(len(buf), self.max_frame + 1)
        pos = self._pos
        state = self._state
        stack = self._stack
        done = False  # a value (scalar or container) just ended
        while pos < n:
            if state == _STRING:
                m = _STRING_STOP.search(buf, pos, n)
                if m is None:
                    pos = n
                    break
                j = m.start()
                c = buf[j]
                if c == 0x22:  # closing quote
                    pos = j + 1
                    if self._key:
                        state = _COLON
                    else:
                        done = True
                elif c == 0x5C:  # backslash: an escape, resumed here while incomplete
                    if j + 1 >= n:
                        pos = j
                        break
                    e = buf[j + 1]
                    if e == 0x75:  # \uXXXX
                        if j + 6 > n:
                            if _HEX4.match(buf[j + 2 : n] + b"0000") is None:
                                raise BadFrame("invalid \\u escape")
                            pos = j
                            break
                        if _HEX4.fullmatch(buf, j + 2, j + 6) is None:
                            raise BadFrame("invalid \\u escape")
                        pos = j + 6
                    elif e in _ESCAPES:
                        pos = j + 2
                    else:
                        raise BadFrame("invalid escape")
                else:
                    raise BadFrame("control character in a string")
            elif state == _NUMBER_RUN:
                m = _NUMBER_CHARS.match(buf, pos, n)
                assert m is not None  # the pattern matches the empty string
                pos = m.end()
                if pos >= n:
                    break  # the number may go on
                if _NUMBER.fullmatch(buf, self._num_start, pos) is None:
                    raise BadFrame("invalid number")
                done = True
            elif state == _LITERAL:
                lit = self._lit
                k = self._lit_i
                while k < len(lit) and pos < n:
                    if buf[pos] != lit[k]:
                        raise BadFrame("invalid literal")
                    k += 1
                    pos += 1
                self._lit_i = k
                if k < len(lit):
                    break
                done = True
            else:
                c = buf[pos]
                if c in _WHITESPACE:
                    pos += 1
                    continue
                if state <= _VALUE_OR_CLOSE:  # _VALUE or _VALUE_OR_CLOSE
                    if c == 0x5D and state == _VALUE_OR_CLOSE:  # ] of an empty array
                        stack.pop()
                        pos += 1
                        done = True
                    elif c == 0x7B:  # {
                        stack.append(c)
                        state = _KEY_OR_CLOSE
                        pos += 1
                    elif c == 0x5B:  # [
                        stack.append(c)
                        state = _VALUE_OR_CLOSE
                        pos += 1
                    elif c == 0x22:
                        state = _STRING
                        self._key = False
                        pos += 1
                    elif c == 0x2D or 0x30 <= c <= 0x39:
                        state = _NUMBER_RUN
                        self._num_start = pos
                    elif c in _LITERALS:
                        state = _LITERAL
                        self._lit = _LITERALS[c]
                        self._lit_i = 0
                    else:
                        raise BadFrame("invalid character looking for the beginning of a value")
                elif state <= _KEY_OR_CLOSE:  # _KEY or _KEY_OR_CLOSE
                    if c == 0x22:
                        state = _STRING
                        self._key = True
                        pos += 1
                    elif c == 0x7D and state == _KEY_OR_CLOSE:  # } of an empty object
                        stack.pop()
                        pos += 1
                        done = True
                    else:
                        raise BadFrame("invalid character looking for an object key")
                elif state == _COLON:
                    if c != 0x3A:
                        raise BadFrame("invalid character after an object key")
                    state = _VALUE
                    pos += 1
                else:  # _COMMA_OR_CLOSE
                    top = stack[-1]
                    if c == 0x2C:
                        state = _KEY if top == 0x7B else _VALUE
                        pos += 1
                    elif (c == 0x7D and top == 0x7B) or (c == 0x5D and top == 0x5B):
                        stack.pop()
                        pos += 1
                        done = True
                    else:
                        raise BadFrame("invalid character after a value")
            if done:
                if not stack:
                    return pos
                state = _COMMA_OR_CLOSE
                done = False
        self._pos = pos
        self._state = state
        return -1


# -- messages -------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Message:
    command: str
    tags: list[str]
    data: str


class _WrongShape(Exception):
    """Valid JSON, wrong shape: answered ``Invalid message`` with the command when it was a string."""

    def __init__(self, command: str) -> None:
        super().__init__(command)
        self.command = command


def _message(obj: object) -> _Message:
    if not isinstance(obj, dict):
        raise _WrongShape("")
    command = obj.get("command")
    if command is None:
        command = ""
    elif not isinstance(command, str):
        raise _WrongShape("")
    tags = obj.get("tags")
    if tags is None:
        tags = []
    elif not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise _WrongShape(command)
    data = obj.get("data")
    if data is None:
        data = ""
    elif not isinstance(data, str):
        raise _WrongShape(command)
    return _Message(command, tags, data)


class _Base:
    """The command table both 1.x transports share."""

    #: 1.x never delivers to the publishing connection (README §3).
    echo: Final = False
    generation: Final = "mist1"
    #: Whether unknown commands echo the request's tags and data (TCP) or not (WebSocket).
    _echo_unknown = True

    def __init__(
        self,
        *,
        max_frame: int,
        max_subscriptions: int,
        max_tags: int,
        max_tag_bytes: int,
        channel: str,
        auth_required: bool,
        grant: MistGrant | None,
    ) -> None:
        self.max_frame = max_frame
        self.max_tags = max_tags
        self.max_tag_bytes = max_tag_bytes
        self.channel = channel
        self.auth_required = auth_required
        #: The accepted grant (``MistGrant()`` with auth off); None until a token is accepted.
        self.grant = grant
        #: The subscription set, first subscribed first.
        self.subscriptions = Subscriptions(max_subscriptions, counted=False)
        self.failed = False
        #: The fatal error, once ``failed``.
        self.error: HubbubError | None = None

    @property
    def authenticated(self) -> bool:
        """A token was required and accepted: the registry commands are served."""
        return self.auth_required and self.grant is not None

    @property
    def subscribed(self) -> bool:
        """Whether the connection holds at least one subscription (counted by ``who``)."""
        return bool(len(self.subscriptions))

    def accepts(self, event: Event) -> bool:
        """Whether this connection may receive ``event`` (it has tags)."""
        return delivers(event, False)

    def _fail(self, exc: HubbubError) -> None:
        self.failed = True
        self.error = exc

    def _execute(self, msg: _Message, out: list[Output]) -> None:
        """Run one well-shaped message (mist.md §4)."""
        c = msg.command
        try:
            tags = check_tags(msg.tags, self.max_tags, self.max_tag_bytes) if msg.tags else frozenset()
        except BadRequest:
            out.append(Send(render_reply(c, error="Invalid tags")))
            return
        if c == "ping":
            out.append(_PONG)
        elif c == "subscribe":
            if tags:
                try:
                    if self.subscriptions.add(tags):
                        out.append(Subscribe(tags))
                except LimitExceeded:
                    out.append(Send(render_reply("subscribe", error="Too many subscriptions")))
        elif c == "unsubscribe":
            if tags and self.subscriptions.remove(tags):
                out.append(Unsubscribe(tags))
        elif c == "publish":
            if tags:
                out.append(Publish(self.channel, tuple(sorted(tags)), msg.data.encode()))
        elif c == "list":
            data = " ".join(",".join(sorted(s)) for s in self.subscriptions)
            out.append(Send(render_reply("list", msg.tags, data)))
        elif c == "listall":
            out.append(ListAll(tuple(msg.tags)))
        elif c == "who":
            out.append(Who(tuple(msg.tags)))
        elif c == "auth":
            pass  # the first-message token (mist.md §8); a no-op afterwards and with auth off
        elif c in ADMIN_COMMANDS and self.authenticated:
            out.append(self._admin(c, tags, msg.data))
        elif self._echo_unknown:
            out.append(Send(render_reply(c, msg.tags, msg.data, "Unknown Command")))
        else:
            out.append(Send(render_reply(c, error="Unknown Command")))

    @staticmethod
    def _admin(c: str, tags: frozenset[str], token: str) -> RegistryCommand:
        if c == "register":
            return Register(token, tags)
        if c == "unregister":
            return Unregister(token)
        if c == "set":
            return SetTags(token, tags)
        if c == "unset":
            return UnsetTags(token, tags)
        return TokenTags(token)

    # -- answers from the core ----------------------------------------------------------------------------

    def reply_listall(self, cmd: ListAll, tags: Iterable[str]) -> bytes:
        """``listall``: the distinct tags of every mist subscription on the server, ascending."""
        return render_reply("listall", cmd.echo, " ".join(sorted(set(tags))))

    def reply_who(self, cmd: Who, lifetime: int, subscribers: int) -> bytes:
        """``who``: mist connections accepted since start, open mist connections with a subscription."""
        data = f"Lifetime  connections: {lifetime}\nSubscribers connected: {subscribers}"
        return render_reply("who", cmd.echo, data)

    def reply_registry(self, cmd: RegistryCommand, result: bool | frozenset[str] | None) -> bytes | None:
        """The reply to a registry command given the registry's answer (see each command), or None."""
        if isinstance(cmd, Register):
            return None if result else render_reply("register", error="Token already exists\n")
        if isinstance(cmd, SetTags):
            return None if result else render_reply("set", error="Token not found\n")
        if isinstance(cmd, UnsetTags):
            return None if result else render_reply("unset", error="Token not found\n")
        if isinstance(cmd, TokenTags):
            if not isinstance(result, frozenset):
                return render_reply("tags", error="Token not found\n")
            return render_reply("tags", sorted(result))
        return None

    def reply_error(self, cmd: Command, exc: HubbubError) -> list[Output]:
        """The outputs answering the core's refusal of ``cmd``: ``Access denied`` (with the command's name)
        for a publish or registry command the token may not make (4102), ``Too many subscriptions`` (4007);
        anything else closes (1011)."""
        if isinstance(exc, AuthError) and exc.code == 4102:
            return [Send(render_reply(_COMMAND_NAMES.get(type(cmd), "publish"), error="Access denied"))]
        if isinstance(exc, LimitExceeded):
            return [Send(render_reply("subscribe", error="Too many subscriptions"))]
        self._fail(exc)
        return [Close(Disconnect.INTERNAL_ERROR)]

    def encode_event(self, event: Event, cache: dict[Any, Any] | None = None) -> bytes:
        """The event frame (:func:`render_event`), rendered once per fan-out through ``cache``."""
        if cache is None:
            return render_event(event)
        hit = cache.get("mist1")
        if hit is not None and hit[0] is event:
            return hit[1]  # type: ignore[no-any-return]
        data = render_event(event)
        cache["mist1"] = (event, data)
        return data


class Mist1Connection(_Base):
    """The 1.x TCP stream (mist.md §4). Feed bytes with :meth:`receive_data`. With ``auth_required``, the
    first message's ``data`` is the token (mist.md §8)."""

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
            auth_required=auth_required,
            grant=None if auth_required else MistGrant(),
        )
        self._split = JsonValueSplitter(max_frame)
        #: True between an :class:`Authenticate` output and :meth:`auth_result`.
        self.awaiting_auth = False
        #: Complete JSON values taken from the input so far, whatever became of them (the listener's
        #: first-message timeout stops at the first).
        self.messages = 0
        self._pending: _Message | None = None

    @property
    def buffered(self) -> int:
        """Bytes held for an incomplete value (or read ahead while awaiting auth)."""
        return len(self._split.buf)

    def receive_data(self, data: bytes | bytearray | memoryview) -> list[Output]:
        """Add received bytes; return the outputs of every JSON value they complete, in order."""
        if self.failed:
            return []
        self._split.buf += data
        out: list[Output] = []
        if self.awaiting_auth:
            # The transport kept reading while authentication was pending: bound what is held. (Only what
            # arrives meanwhile: input that came with the first message waits whatever its size, so the
            # outputs do not depend on where the reads split it.)
            if len(self._split.buf) > self.max_frame:
                self._fatal(FrameTooLarge("input over max_frame while authenticating"), _TOO_LARGE, out)
            return out
        self._process(out)
        return out

    def auth_result(self, grant: MistGrant | None) -> list[Output]:
        """The wiring's answer to :class:`Authenticate`. Accepted: the first message runs, then the input
        buffered meanwhile. Refused: the connection closes without a reply."""
        if not self.awaiting_auth or self._pending is None:
            raise RuntimeError("no authentication is pending")
        self.awaiting_auth = False
        msg, self._pending = self._pending, None
        out: list[Output] = []
        if grant is None:
            self._close_silently(out)
            return out
        self.grant = grant
        self._execute(msg, out)
        self._process(out)
        return out

    def _close_silently(self, out: list[Output]) -> None:
        self._fail(AuthError("unauthorized"))
        self._split.buf.clear()
        out.append(Close())

    def _fatal(self, exc: HubbubError, reply: bytes, out: list[Output]) -> None:
        out.append(Send(reply))
        out.append(Close(Disconnect.MESSAGE_TOO_BIG if isinstance(exc, FrameTooLarge) else Disconnect.NORMAL))
        self._fail(exc)
        self._split.buf.clear()

    def _process(self, out: list[Output]) -> None:
        split = self._split
        while not self.awaiting_auth and not self.failed:
            try:
                raw = split.next()
                if raw is None:
                    break
                self.messages += 1
                obj = orjson.loads(raw)
            except FrameTooLarge as exc:
                self._fatal(exc, _TOO_LARGE, out)
                return
            except (BadFrame, orjson.JSONDecodeError):
                self._fatal(BadFrame("invalid JSON"), _INVALID_JSON, out)
                return
            try:
                msg = _message(obj)
            except _WrongShape as exc:
                if self.grant is None:
                    self._close_silently(out)  # the first message must carry the token
                    return
                out.append(Send(render_reply(exc.command, error="Invalid message")))
                continue
            if self.grant is None:
                self._pending = msg
                self.awaiting_auth = True
                out.append(Authenticate(msg.data))
                break
            self._execute(msg, out)


class Mist1WsConnection(_Base):
    """``/mist/v1/ws`` (mist.md §4): one JSON object per client frame, text or binary. The token was checked
    at the upgrade: ``grant`` is what it allowed; with ``auth_required`` the connection is authenticated and
    may use the registry. Unknown commands are answered without echoing tags and data."""

    _echo_unknown = False

    def __init__(
        self,
        *,
        max_frame: int = DEFAULT_MAX_FRAME,
        max_subscriptions: int = DEFAULT_MAX_SUBSCRIPTIONS,
        max_tags: int = DEFAULT_MAX_TAGS,
        max_tag_bytes: int = DEFAULT_MAX_TAG_BYTES,
        channel: str = DEFAULT_CHANNEL,
        auth_required: bool = False,
        grant: MistGrant | None = None,
    ) -> None:
        super().__init__(
            max_frame=max_frame,
            max_subscriptions=max_subscriptions,
            max_tags=max_tags,
            max_tag_bytes=max_tag_bytes,
            channel=channel,
            auth_required=auth_required,
            grant=grant if grant is not None else MistGrant(),
        )

    def receive_frame(self, frame: bytes | str, binary: bool = False) -> list[Output]:
        """One WebSocket data frame → outputs. A frame over ``max_frame`` closes with 1009."""
        if self.failed:
            return []
        size = len(frame) if isinstance(frame, bytes) else len(frame.encode("utf-8", "surrogatepass"))
        if size > self.max_frame:
            self._fail(FrameTooLarge(f"message over {self.max_frame} bytes"))
            return [Close(Disconnect.MESSAGE_TOO_BIG)]
        try:
            obj = orjson.loads(frame)
        except orjson.JSONDecodeError:
            return [Send(_INVALID_JSON)]
        try:
            msg = _message(obj)
        except _WrongShape as exc:
            return [Send(render_reply(exc.command, error="Invalid message"))]
        out: list[Output] = []
        self._execute(msg, out)
        return out
