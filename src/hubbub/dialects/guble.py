"""The guble dialect (protocols/guble.md): a sans-I/O codec.

:meth:`GubleCodec.decode` turns one WebSocket message (text or binary) into a :data:`Command`;
the ``encode_*`` methods turn notifications and events into the bytes of one (binary) frame. The REST
helpers map ``X-Guble-*`` headers and ``filter*`` query parameters (guble.md §4, mapping.md §6).

Message layout (guble.md §1): ``<name>[ <arg>]\\n<header line>\\n<body>``, split at the first two ``\\n``.

Invariants:

* ``decode`` returns a fully validated command or raises a :class:`~hubbub.errors.ProtocolError`:
  :class:`~hubbub.errors.FrameTooLarge` (the transport closes with 1009) or one whose ``detail`` is guble's
  exact error text (:class:`~hubbub.errors.BadRequest`, :class:`~hubbub.errors.UnknownOp`,
  :class:`~hubbub.errors.BadChannel`), sent as ``!error-bad-request <detail>``. Nothing else escapes.
* Every read is bounded by ``max_frame`` and ``max_channel_bytes``; a message is parsed in one piece, so
  there is no chunking to depend on.
* An event is rendered once per fan-out (``cache``): the line does not depend on the receiving connection.

Concurrency contract: a codec holds only its settings; it is safe to share between connections and threads.
"""

from __future__ import annotations

import base64
import os
import secrets
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, TypeAlias

import orjson

from hubbub.channels import MAX_CHANNEL_BYTES, canonical
from hubbub.config import Config, ConfigError, DialectSection, Secret
from hubbub.disconnect import Disconnect
from hubbub.errors import BadChannel, BadRequest, FrameTooLarge, HubbubError, ProtocolError, UnknownOp
from hubbub.events import Event

from .guble_fetch import (
    CatchUpStep,
    LiveMark,
    catch_up_steps,
    render_path,
    subtree_pattern,
)
from .guble_receivers import GubleFrames, GubleReceivers, Receiver
from .spec import DialectSpec

__all__ = [
    "DEFAULT_MAX_FRAME",
    "FILTER_PREFIX",
    "GUBLE_HEADER",
    "SPEC",
    "Cancel",
    "CatchUpStep",
    "Command",
    "GubleCodec",
    "GubleConfig",
    "GubleFrames",
    "GubleReceivers",
    "LiveMark",
    "Receive",
    "Receiver",
    "Send",
    "canonical_mime_key",
    "catch_up_steps",
    "error_text",
    "filter_name",
    "go_quote",
    "header_line_headers",
    "new_xid",
    "parse_go_int",
    "render_path",
    "rest_publish_headers",
    "subtree_pattern",
    "user_id_from_path",
    "wire_close",
]

DEFAULT_MAX_FRAME: Final = 1 << 20
GUBLE_HEADER: Final = ":guble.header"
FILTER_PREFIX: Final = ":filter."
CONNECTED_TEXT: Final = "You are connected to the server."
_INT64_MAX: Final = (1 << 63) - 1
_UINT64_MAX: Final = (1 << 64) - 1


# -- commands -----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Send:
    """``> <path>[ <msgId>]\\n<header>\\n<body>``. ``header`` is the header line exactly as received."""

    channel: str
    msg_id: str
    header: str
    body: bytes


@dataclass(frozen=True, slots=True)
class Receive:
    """``+ <path>[ <startId>[ <maxCount>]]``. ``start_id`` None: live only. ``max_count`` None: then live."""

    channel: str
    start_id: int | None = None
    max_count: int | None = None

    @property
    def subscribes(self) -> bool:
        """Whether a live receiver follows (no ``maxCount`` given)."""
        return self.max_count is None

    @property
    def fetches(self) -> bool:
        return self.start_id is not None


@dataclass(frozen=True, slots=True)
class Cancel:
    """``- <path>``."""

    channel: str


Command: TypeAlias = Send | Receive | Cancel


# -- Go-compatible helpers (error texts quote tokens the way Go's %q and strconv do) ----------------------


def _raw(s: str) -> bytes:
    return s.encode("utf-8", "surrogateescape")


def _show(s: str) -> str:
    """Text of a token for an error message: invalid UTF-8 bytes become U+FFFD."""
    return _raw(s).decode("utf-8", "replace")


_GO_ESCAPES: Final = {7: "\\a", 8: "\\b", 12: "\\f", 10: "\\n", 13: "\\r", 9: "\\t", 11: "\\v"}


def go_quote(s: str) -> str:
    """Go's ``strconv.Quote`` (``%q``): printable runes as they are, ``\\"``, ``\\\\``, C escapes, ``\\xNN``
    for control bytes and invalid UTF-8, ``\\uNNNN``/``\\UNNNNNNNN`` for other non-printable runes."""
    raw = _raw(s)
    out = ['"']
    i = 0
    n = len(raw)
    while i < n:
        b = raw[i]
        if b < 0x80:
            c = chr(b)
            if c in '"\\':
                out.append("\\" + c)
            elif b in _GO_ESCAPES:
                out.append(_GO_ESCAPES[b])
            elif b < 0x20 or b == 0x7F:
                out.append(f"\\x{b:02x}")
            else:
                out.append(c)
            i += 1
            continue
        width = 2 if 0xC2 <= b <= 0xDF else 3 if 0xE0 <= b <= 0xEF else 4 if 0xF0 <= b <= 0xF4 else 0
        try:
            ch = raw[i : i + width].decode("utf-8") if width else ""
        except UnicodeDecodeError:
            ch = ""
        if len(ch) != 1:
            out.append(f"\\x{b:02x}")
            i += 1
            continue
        cp = ord(ch)
        if ch.isprintable():
            out.append(ch)
        elif cp < 0x10000:
            out.append(f"\\u{cp:04x}")
        else:
            out.append(f"\\U{cp:08x}")
        i += width
    out.append('"')
    return "".join(out)


def parse_go_int(token: str, fn: str) -> int:
    """Go's ``strconv.ParseInt(token, 10, 64)`` (``fn`` names the function in the error text, ``ParseInt``
    or ``Atoi``). Raises ``ValueError`` with Go's error text. Digits are scanned left to right and overflow is
    reported as soon as it happens, as Go does."""
    s = token
    if s[:1] in ("+", "-"):
        neg = s[0] == "-"
        s = s[1:]
    else:
        neg = False
    if not s:
        raise ValueError(f"strconv.{fn}: parsing {go_quote(token)}: invalid syntax")
    n = 0
    for c in s:
        if not "0" <= c <= "9":
            raise ValueError(f"strconv.{fn}: parsing {go_quote(token)}: invalid syntax")
        n = n * 10 + (ord(c) - 48)
        if n > _UINT64_MAX:
            break
    if (not neg and n > _INT64_MAX) or (neg and n > _INT64_MAX + 1):
        raise ValueError(f"strconv.{fn}: parsing {go_quote(token)}: value out of range")
    return -n if neg else n


# -- paths, ids ---------------------------------------------------------------------------------------------


def _gmeta(s: str) -> str:
    if "," in s or "\r" in s or "\n" in s:
        return s.replace(",", "%2C").replace("\r", "%0D").replace("\n", "%0A")
    return s


def user_id_from_path(raw_path: str) -> str:
    """The userId of a ``/stream/…`` upgrade: the raw text after the first ``/user/`` up to the end of the
    path (query excluded, not percent-decoded), else ``""`` (guble.md §1)."""
    path = raw_path.split("?", 1)[0]
    _, sep, rest = path.partition("/user/")
    return rest if sep else ""


_XID_COUNTER = [secrets.randbelow(1 << 24)]
_XID_LOCK = threading.Lock()
_XID_MACHINE = secrets.token_bytes(3)


def new_xid() -> str:
    """A new xid (``[0-9a-v]{20}``): 4 bytes of Unix seconds, 3 of machine id, 2 of pid, 3 of counter,
    in lower-case base32hex without padding, like github.com/rs/xid."""
    with _XID_LOCK:
        _XID_COUNTER[0] = (_XID_COUNTER[0] + 1) & 0xFFFFFF
        count = _XID_COUNTER[0]
    raw = (
        int(time.time()).to_bytes(4, "big")
        + _XID_MACHINE
        + (os.getpid() & 0xFFFF).to_bytes(2, "big")
        + count.to_bytes(3, "big")
    )
    return base64.b32hexencode(raw).decode("ascii")[:20].lower()


def error_text(exc: HubbubError) -> bytes:
    """The notification answering an error: ``!error-bad-request <text>`` for bad input,
    ``!error-server-internal <text>`` otherwise (the text is the public message, never internals)."""
    if exc.code == 4102:  # guble.md §3: a send the token does not allow
        return b"!error-bad-request access denied"
    if isinstance(exc, ProtocolError) or exc.code in (4001, 4004, 4007, 4008):
        return b"!error-bad-request " + (exc.detail or exc.message).encode("utf-8", "replace")
    return b"!error-server-internal " + exc.message.encode()


# -- headers and filters ------------------------------------------------------------------------------------


def header_line_headers(line: str, max_headers: int = 64, max_header_bytes: int = 8192) -> dict[str, str]:
    """User headers from a header line (mapping.md §6): members of a JSON object, strings as they are and
    other values as compact JSON. Anything else (or a mapping over the header limits) gives none."""
    if not line or line.lstrip()[:1] != "{":
        return {}
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        return {}
    if not isinstance(obj, dict) or len(obj) > max_headers:
        return {}
    out: dict[str, str] = {}
    total = 0
    for k, v in obj.items():
        if k.startswith(":"):
            continue  # pseudo-headers are hubbub's own
        val = v if isinstance(v, str) else orjson.dumps(v).decode()
        total += len(k.encode()) + len(val.encode())
        if total > max_header_bytes:
            return {}
        out[k] = val
    return out


def canonical_mime_key(key: str) -> str:
    """Go's ``textproto.CanonicalMIMEHeaderKey``: ``foo-bar`` → ``Foo-Bar``; keys with a space or a
    character outside the token set are returned unchanged."""
    for c in key:
        if not (c.isascii() and (c.isalnum() or c in "!#$%&'*+-.^_`|~")):
            return key
    out = []
    upper = True
    for c in key:
        out.append(c.upper() if upper else c.lower())
        upper = c == "-"
    return "".join(out)


def filter_name(param_suffix: str) -> str:
    """``filter<Name>`` → filter name: the first letter lower-cased, each later upper-case letter becomes
    ``_`` + its lower case (``UserId`` → ``user_id``)."""
    out = []
    for i, c in enumerate(param_suffix):
        if "A" <= c <= "Z":
            out.append(("_" if i else "") + c.lower())
        else:
            out.append(c)
    return "".join(out)


def rest_publish_headers(
    request_headers: Iterable[tuple[str, str]],
    query: Iterable[tuple[str, str]],
    max_headers: int = 64,
    max_header_bytes: int = 8192,
) -> dict[str, str]:
    """Event headers of a REST publish (guble.md §4): ``X-Guble-<Name>`` → user header ``<Name>`` in canonical
    MIME form (first value wins, as Go's ``Header.Get``), ``:guble.header`` = their compact JSON with sorted
    keys (``{}`` when none), and ``filter<Name>=<v>`` → ``:filter.<name>`` (first value wins). Raises
    :class:`BadRequest` over the header limits."""
    user: dict[str, str] = {}
    for k, v in request_headers:
        ck = canonical_mime_key(k)
        if ck.startswith("X-Guble-") and len(ck) > len("X-Guble-"):
            user.setdefault(ck[len("X-Guble-") :], v)
    size = sum(len(k.encode()) + len(v.encode()) for k, v in user.items())
    if len(user) > max_headers or size > max_header_bytes:
        raise BadRequest("too many X-Guble headers")
    headers = dict(user)
    headers[GUBLE_HEADER] = orjson.dumps(dict(sorted(user.items()))).decode()
    for k, v in query:
        if k.startswith("filter"):
            headers.setdefault(FILTER_PREFIX + filter_name(k[len("filter") :]), v)
    return headers


# -- the codec ----------------------------------------------------------------------------------------------


class GubleCodec:
    """Decodes client messages and renders notifications and events (see the module docstring)."""

    def __init__(
        self,
        *,
        max_frame: int = DEFAULT_MAX_FRAME,
        max_channel_bytes: int = MAX_CHANNEL_BYTES,
        node_id: int = 0,
    ) -> None:
        self.max_frame = max_frame
        self.max_channel_bytes = max_channel_bytes
        self.node_id = node_id
        self._node = str(node_id)
        self._cache_key = ("guble", node_id)

    # -- decoding ---------------------------------------------------------------------------------------

    def decode(self, data: bytes | str) -> Command:
        """One client message → a command. See the module docstring for the errors."""
        raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
        if len(raw) > self.max_frame:
            raise FrameTooLarge(f"message longer than {self.max_frame} bytes")
        if not raw:
            raise BadRequest("error parsing command. empty command")
        parts = raw.split(b"\n", 2)
        first = parts[0].decode("utf-8", "surrogateescape")
        name, _, arg = first.partition(" ")
        if name == ">":
            return self._send(arg, parts)
        if name == "+":
            return self._receive(arg)
        if name == "-":
            if not arg:
                raise BadRequest("- command requires a path argument, but none given")
            return Cancel(self._path(arg))
        raise UnknownOp(f"unknown command {_show(name)}")

    def _path(self, path: str) -> str:
        try:
            return canonical(path, self.max_channel_bytes)
        except BadChannel:
            raise BadChannel(f"invalid path {_show(path)}") from None

    def _send(self, arg: str, parts: list[bytes]) -> Send:
        if not arg:
            raise BadRequest("send command requires a path argument, but none given")
        path, _, msg_id = arg.partition(" ")
        channel = self._path(path)
        header_raw = parts[1] if len(parts) > 1 else b""
        try:
            header = header_raw.decode("utf-8")
            msg_id.encode("utf-8")
        except UnicodeError:
            raise BadRequest("header line and message id must be valid UTF-8") from None
        return Send(channel, msg_id, header, parts[2] if len(parts) > 2 else b"")

    def _receive(self, arg: str) -> Receive:
        if not arg or arg[0] != "/":
            raise BadRequest("command requires at least a path argument, but non given")
        tokens = arg.split(" ", 2)
        if len(tokens) == 2 and "," in tokens[1]:
            # The README's notation: "+ /foo 0,20" is "+ /foo 0 20".
            tokens = [tokens[0], *tokens[1].split(",", 1)]
        channel = self._path(tokens[0])
        start: int | None = None
        count: int | None = None
        if len(tokens) > 1:
            try:
                start = parse_go_int(tokens[1], "ParseInt")
            except ValueError as exc:
                raise BadRequest(
                    f"startid has to be empty or int, but was {go_quote(tokens[1])}: {exc}"
                ) from None
        if len(tokens) > 2:
            try:
                count = parse_go_int(tokens[2], "Atoi")
            except ValueError as exc:
                raise BadRequest(
                    f"maxCount has to be empty or int, but was {go_quote(tokens[2])}: {exc}"
                ) from None
            if count < 0:
                raise BadRequest(f"maxCount must not be negative, but was {go_quote(tokens[2])}")
        return Receive(channel, start, count)

    # -- encoding ---------------------------------------------------------------------------------------

    @staticmethod
    def encode_connected(app_id: str, user_id: str, now: float | None = None) -> bytes:
        """The first frame of a connection (guble.md §2; the JSON spacing is guble's)."""
        t = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if now is None else now))
        return (
            f"#connected {CONNECTED_TEXT}\n"
            f'{{"ApplicationId": {orjson.dumps(app_id).decode()}, '
            f'"UserId": {orjson.dumps(_show(user_id)).decode()}, "Time": "{t}"}}'
        ).encode()

    @staticmethod
    def encode_notice(name: str, arg: str | None = None) -> bytes:
        """``#<name>[ <arg>]`` (``send``, ``subscribed-to``, ``fetch-start``, ``fetch-end``, ``canceled``)."""
        return f"#{name}".encode() if arg is None else f"#{name} {arg}".encode()

    @staticmethod
    def encode_error(exc: HubbubError) -> bytes:
        return error_text(exc)

    def encode_event(self, event: Event, cache: dict[Any, Any] | None = None) -> bytes:
        """The message line of mapping.md §5.2, through ``cache`` (one ``(event, bytes)`` slot, checked by
        identity, so a cache shared across events stays correct)."""
        if cache is not None:
            hit = cache.get(self._cache_key)
            if hit is not None and hit[0] is event:
                return hit[1]  # type: ignore[no-any-return]
        data = self.render_event(event)
        if cache is not None:
            cache[self._cache_key] = (event, data)
        return data

    def render_event(self, event: Event) -> bytes:
        headers = event.headers
        filters: dict[str, str] = {}
        header: str | None = None
        user: dict[str, str] = {}
        for k, v in headers.items():
            if k.startswith(":"):
                if k == GUBLE_HEADER:
                    header = v
                elif k.startswith(FILTER_PREFIX):
                    filters[k[len(FILTER_PREFIX) :]] = v
            else:
                user[k] = v
        if header is None:
            header = orjson.dumps(dict(sorted(user.items()))).decode() if user else ""
        pub = event.publisher
        meta = ",".join(
            (
                render_path(event.channel),
                str(event.seq),
                _gmeta(pub.user),
                _gmeta(pub.app),
                orjson.dumps(dict(sorted(filters.items()))).decode() if filters else "",
                str(event.time_ns // 1_000_000_000),
                self._node,
            )
        )
        out = meta.encode()
        payload = event.payload
        if header or payload:
            out += b"\n" + header.encode()
        if payload:
            out += b"\n" + payload
        return out


def headers_for_send(cmd: Send, max_headers: int = 64, max_header_bytes: int = 8192) -> Mapping[str, str]:
    """Event headers of a WebSocket publish: the header line's members and ``:guble.header`` (when set)."""
    headers = header_line_headers(cmd.header, max_headers, max_header_bytes)
    if cmd.header:
        headers[GUBLE_HEADER] = cmd.header
    return headers


__all__ += ["headers_for_send"]


def wire_close(reason: Disconnect) -> Disconnect:
    """The close a guble client sees for a session's end or kick: an expired token closes with 1008 (guble
    has no error notice for it; protocols README §7, permission denied), every other reason as it is."""
    return Disconnect.POLICY_VIOLATION if reason == Disconnect.TOKEN_EXPIRED else reason


#: guble as the server wires it: its WebSocket at ``/stream/…`` (its REST and admin routes are a route
#: module), a slow reader caught up from the log, an expired token closed 1008.
@dataclass(frozen=True, slots=True)
class GubleConfig(DialectSection):
    """guble's configuration section (docs/dialects/guble.md), and guble's own option names (guble.md §1)."""

    SECTION: ClassVar[str] = "guble"
    HELP: ClassVar[Mapping[str, str]] = {
        "enabled": "serve the guble dialect: WebSocket /stream/, REST /api/, admin /admin/ (true/false)",
        "node_id": "the node id guble shows as the 7th field of every message",
        "health_endpoint": "path of guble's health check (empty: off)",
        "metrics_endpoint": "path of guble's JSON metrics (empty: off)",
        "auth": "auth for the guble routes; empty means auth.mode",
        "fcm": "serve guble's FCM connector: device subscriptions at guble.fcm_prefix, each topic's messages "
        "pushed to Firebase Cloud Messaging durably (docs/connectors.md)",
        "fcm_api_key": "the FCM legacy server key (guble's --fcm-api-key); unused with fcm_credentials_file",
        "fcm_credentials_file": "a Google service-account JSON file: push with FCM HTTP v1 (OAuth2) "
        "instead of the legacy API",
        "fcm_endpoint": "the FCM legacy send URL, or with fcm_credentials_file the FCM v1 base URL (empty: "
        "Google's)",
        "fcm_prefix": "path prefix of the FCM connector's REST routes",
        "fcm_max_retry_s": "seconds one message is tried before it goes to the dead-letter channel (0: no "
        "limit; refused credentials pause the connector instead)",
        "fcm_workers": "FCM requests in flight at once, over all device subscriptions",
        "apns": "serve guble's APNs connector: device subscriptions at guble.apns_prefix, each topic's "
        "messages pushed to Apple's push service over HTTP/2 durably (docs/connectors.md)",
        "apns_production": "push to Apple's production service (false: the sandbox)",
        "apns_cert_file": "the APNs client certificate: a .p12 file (guble's) or a PEM chain with its key",
        "apns_cert_password": "the password of apns_cert_file",
        "apns_app_topic": "the app's bundle id, sent as apns-topic",
        "apns_prefix": "path prefix of the APNs connector's REST routes",
        "apns_max_retry_s": "seconds one message is tried before it goes to the dead-letter channel (0: no "
        "limit; refused credentials pause the connector instead)",
        "apns_workers": "APNs requests in flight at once, over all device subscriptions",
        "apns_key_file": "a .p8 signing key: authenticate with ES256 provider tokens, not a certificate",
        "apns_key_id": "the key id of apns_key_file",
        "apns_team_id": "the team id that signs the provider tokens",
        "apns_endpoint": "the APNs base URL (empty: Apple's, production or sandbox)",
        "sms": "serve guble's SMS gateway: every message on guble.sms_topic ({to, from, text}) sent through "
        "Vonage (Nexmo) durably (docs/connectors.md)",
        "sms_api_key": "the Vonage API key",
        "sms_api_secret": "the Vonage API secret",
        "sms_topic": "the topic whose messages (and its subtree's) are text messages to send",
        "sms_max_retry_s": "seconds one message is tried before it goes to the dead-letter channel (0: no "
        "limit; refused credentials pause the connector instead)",
        "sms_workers": "accepted for guble's --sms-workers; the gateway sends one message at a time",
        "sms_endpoint": "the Vonage SMS API URL (empty: Vonage's)",
        "apns_ca_file": "more CA certificates to trust for the APNs endpoint (PEM): a private relay's",
    }
    ENV_ALIASES: ClassVar[Mapping[str, str]] = {
        "GUBLE_HTTP_LISTEN": "http.listen",
        "GUBLE_STORAGE_PATH": "data_dir",
        "GUBLE_HEALTH_ENDPOINT": "guble.health_endpoint",
        "GUBLE_METRICS_ENDPOINT": "guble.metrics_endpoint",
        "GUBLE_NODE_ID": "guble.node_id",
        "GUBLE_FCM": "guble.fcm",
        "GUBLE_FCM_API_KEY": "guble.fcm_api_key",
        "GUBLE_FCM_ENDPOINT": "guble.fcm_endpoint",
        "GUBLE_FCM_PREFIX": "guble.fcm_prefix",
        "GUBLE_FCM_WORKERS": "guble.fcm_workers",
        "GUBLE_APNS": "guble.apns",
        "GUBLE_APNS_PRODUCTION": "guble.apns_production",
        "GUBLE_APNS_CERT_FILE": "guble.apns_cert_file",
        "GUBLE_APNS_CERT_PASSWORD": "guble.apns_cert_password",
        "GUBLE_APNS_APP_TOPIC": "guble.apns_app_topic",
        "GUBLE_APNS_PREFIX": "guble.apns_prefix",
        "GUBLE_APNS_WORKERS": "guble.apns_workers",
        "GUBLE_SMS": "guble.sms",
        "GUBLE_SMS_API_KEY": "guble.sms_api_key",
        "GUBLE_SMS_API_SECRET": "guble.sms_api_secret",
        "GUBLE_SMS_TOPIC": "guble.sms_topic",
        "GUBLE_SMS_WORKERS": "guble.sms_workers",
    }
    FLAG_ALIASES: ClassVar[Mapping[str, str]] = {
        "--http": "http.listen",
        "--storage-path": "data_dir",
        "--health-endpoint": "guble.health_endpoint",
        "--metrics-endpoint": "guble.metrics_endpoint",
        "--node-id": "guble.node_id",
        "--fcm": "guble.fcm",
        "--fcm-api-key": "guble.fcm_api_key",
        "--fcm-endpoint": "guble.fcm_endpoint",
        "--fcm-prefix": "guble.fcm_prefix",
        "--fcm-workers": "guble.fcm_workers",
        "--apns": "guble.apns",
        "--apns-production": "guble.apns_production",
        "--apns-cert-file": "guble.apns_cert_file",
        "--apns-cert-password": "guble.apns_cert_password",
        "--apns-app-topic": "guble.apns_app_topic",
        "--apns-prefix": "guble.apns_prefix",
        "--apns-workers": "guble.apns_workers",
        "--sms": "guble.sms",
        "--sms-api-key": "guble.sms_api_key",
        "--sms-api-secret": "guble.sms_api_secret",
        "--sms-topic": "guble.sms_topic",
        "--sms-workers": "guble.sms_workers",
    }
    ENV_PREFIX: ClassVar[str] = "GUBLE_"
    enabled: bool = True
    node_id: int = 0
    health_endpoint: str = "/admin/healthcheck"
    metrics_endpoint: str = "/admin/metrics"
    auth: str = ""  # "" means auth.mode
    fcm: bool = False
    fcm_api_key: Secret = field(default_factory=lambda: Secret(""))
    fcm_credentials_file: str = ""
    fcm_endpoint: str = ""
    fcm_prefix: str = "/fcm/"
    fcm_workers: int = 8
    fcm_max_retry_s: float = 86400.0
    apns: bool = False
    apns_production: bool = False
    apns_cert_file: str = ""
    apns_cert_password: Secret = field(default_factory=lambda: Secret(""))
    apns_app_topic: str = ""
    apns_prefix: str = "/apns/"
    apns_workers: int = 8
    apns_max_retry_s: float = 86400.0
    apns_key_file: str = ""
    apns_key_id: str = ""
    apns_team_id: str = ""
    apns_endpoint: str = ""
    apns_ca_file: str = ""
    sms: bool = False
    sms_api_key: Secret = field(default_factory=lambda: Secret(""))
    sms_api_secret: Secret = field(default_factory=lambda: Secret(""))
    sms_topic: str = "/sms"
    sms_workers: int = 1
    sms_max_retry_s: float = 86400.0
    sms_endpoint: str = ""

    @classmethod
    def alias_value(cls, key: str, value: Any) -> Any:
        # guble's ":8080" listens on every interface
        every = key == "http.listen" and isinstance(value, str) and value.startswith(":")
        return "0.0.0.0" + value if every else value

    def validate(self, config: Config) -> None:
        DialectSection.validate(self, config)
        for name in ("health_endpoint", "metrics_endpoint"):
            if getattr(self, name) and not getattr(self, name).startswith("/"):
                raise ConfigError(f"guble.{name}: must be empty (off) or a path from /")
        if self.fcm:
            if not self.fcm_prefix.startswith("/") or self.fcm_prefix.rstrip("/") in ("", "/api", "/admin"):
                raise ConfigError("guble.fcm_prefix: a path from / of its own, such as /fcm/")
            if self.fcm_workers <= 0:
                raise ConfigError("guble.fcm_workers: must be positive")
            if not self.fcm_credentials_file and not self.fcm_api_key:
                raise ConfigError(
                    "guble.fcm needs guble.fcm_api_key (legacy) or guble.fcm_credentials_file (v1)"
                )
        if min(self.fcm_max_retry_s, self.apns_max_retry_s, self.sms_max_retry_s) < 0:
            raise ConfigError("guble.fcm_max_retry_s, apns_max_retry_s, sms_max_retry_s: not negative")
        if self.apns:
            self._check_apns(config)
        if self.sms:
            if not self.sms_topic.startswith("/") or self.sms_topic == "/":
                raise ConfigError("guble.sms_topic: a topic such as /sms")
            if not (self.sms_api_key and self.sms_api_secret):
                raise ConfigError("guble.sms needs guble.sms_api_key and guble.sms_api_secret")

    def _check_apns(self, config: Config) -> None:
        if not self.apns_prefix.startswith("/") or self.apns_prefix.rstrip("/") in ("", "/api", "/admin"):
            raise ConfigError("guble.apns_prefix: a path from / of its own, such as /apns/")
        if self.fcm and self.apns_prefix.strip("/") == self.fcm_prefix.strip("/"):
            raise ConfigError("guble.apns_prefix: the same as guble.fcm_prefix")
        if self.apns_workers <= 0:
            raise ConfigError("guble.apns_workers: must be positive")
        if not self.apns_app_topic:
            raise ConfigError("guble.apns needs guble.apns_app_topic (the app's bundle id)")
        if bool(self.apns_cert_file) == bool(self.apns_key_file):
            raise ConfigError("guble.apns needs one of guble.apns_cert_file and guble.apns_key_file")
        if self.apns_key_file and not (self.apns_key_id and self.apns_team_id):
            raise ConfigError("guble.apns_key_file needs guble.apns_key_id and guble.apns_team_id")


SPEC: Final = DialectSpec(
    name="guble",
    section="guble",
    config=GubleConfig,
    ws_routes=("/stream/{rest:.*}",),
    overflow="catch_up",
    close_code=wire_close,
    keepalive=False,  # aiohttp's heartbeat, every 30 s
    binding="hubbub.transports.guble:mount",
)
