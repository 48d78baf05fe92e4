"""Server configuration: one frozen dataclass per section, composed by :class:`Config`, loaded once by the
composition root (``hubbub.server_config``, for ``server.py``/``cli.py``).

Keys are the dotted names of protocols README §2. Precedence: command line, then ``HUBBUB_*`` environment
variables, then a TOML config file, then the defaults below. Secrets are masked in ``repr``.

A section (:class:`Section`) is a frozen, slotted dataclass whose fields are its keys: ``<SECTION>.<field>``
(a field's ``metadata={"key": …}`` names a key outside the section, such as ``data_dir``, or none with
``""``). A field's type is its key's: ``str``, ``bool``, ``int``, ``float``, :class:`Secret` (a masked
string), ``tuple[str, ...]`` (a JSON list) or :class:`SecretMap` (a JSON object). A section parses its
values (:meth:`Section.parse`) and checks them (:meth:`Section.validate`), naming the key in each error.

The core's sections are this module's. A dialect's section is a :class:`DialectSection` that lives with the
dialect and is named by its ``DialectSpec``; this module never imports a dialect (it is a leaf), so the
loader is given the dialects' sections by the composition root (:func:`load_config` ``dialects=``).

Concurrency contract: values only; :func:`load_config` reads the environment and a file, once, at start and
on reload.
"""

from __future__ import annotations

import difflib
import json
import logging
import os
import re
import tomllib
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Self, TypeVar

from hubbub.config_values import (
    ConfigError,
    Secret,
    SecretMap,
    check_webhook,
    parse_cors_origin,
    parse_listen,
)

__all__ = [
    "DASHBOARD_MODES",
    "DEFAULT_HTTP_LISTEN",
    "DEFAULT_NATIVE_TCP_LISTEN",
    "DURABILITY_MODES",
    "LISTEN_OVERRIDE",
    "OTHER_ENV",
    "AuthConfig",
    "ClusterConfig",
    "Config",
    "ConfigError",
    "DashboardConfig",
    "DialectSection",
    "FederationConfig",
    "HttpConfig",
    "Key",
    "Limits",
    "LoggingConfig",
    "NativeConfig",
    "Retention",
    "Secret",
    "SecretMap",
    "Section",
    "ServerConfig",
    "StorageConfig",
    "TcpConfig",
    "TlsConfig",
    "WebhooksConfig",
    "alias_flags",
    "check_webhook",
    "config_keys",
    "env_name",
    "flag_name",
    "listen_field",
    "load_config",
    "member_node",
    "parse_cors_origin",
    "parse_listen",
    "section_keys",
    "worker_member_id",
]

DURABILITY_MODES = ("fsync", "commit", "none")
#: The core listeners' shipped defaults (a dialect's are its section's: qpubs.qrpc_listen, mist.tcp_listen).
DEFAULT_HTTP_LISTEN = "127.0.0.1:8080"
DEFAULT_NATIVE_TCP_LISTEN = "127.0.0.1:7400"
#: When set, every listener's default (a :func:`listen_field`) is this address instead of its shipped one:
#: a test run moves every server it starts off the fixed ports (tests/conftest.py), so that a server left
#: running on the defaults does not fail the tests. Read when a section is made.
LISTEN_OVERRIDE = ""


def listen_field(default: str) -> Any:
    """The field of a ``HOST:PORT`` listener key: ``default`` is its shipped address (but see
    :data:`LISTEN_OVERRIDE`), or "" for a listener that is off unless configured (and stays off in tests)."""
    return field(
        default_factory=lambda: (LISTEN_OVERRIDE or default) if default else "", metadata={"listen": default}
    )


# -- sections ---------------------------------------------------------------------------------------------


class Section:
    """The base of a configuration section: subclasses are frozen, slotted dataclasses whose fields are
    keys (see the module docstring)."""

    __slots__ = ()

    #: The prefix of the section's keys (``guble`` for ``guble.enabled``); "" for keys at the top level.
    SECTION: ClassVar[str] = ""
    #: One line of help per key, by field name (``hubbub serve --help``; the core's keys have theirs in
    #: ``cli.py``).
    HELP: ClassVar[Mapping[str, str]] = {}

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> Self:
        """The section from raw values by field name (TOML values, or the text of a flag or a variable),
        each converted to its key's type; the other fields keep their defaults."""
        keys = {k.field: k for k in section_keys(cls)}
        return cls(**{name: keys[name].parse(value) for name, value in raw.items()})

    def validate(self, config: Config) -> None:
        """Raise :class:`ConfigError` naming the key of an invalid value. ``config`` is the whole
        configuration, for the checks that span sections (``mist.channel`` within ``limits``)."""

    def value(self, key: str) -> Any:
        """The value of one of this section's keys, by its dotted name."""
        for k in section_keys(type(self)):
            if k.name == key:
                return getattr(self, k.field)
        raise KeyError(key)


class DialectSection(Section):
    """A dialect's section: ``<section>.enabled`` turns the dialect on, ``<section>.auth`` is its auth mode
    (empty: ``auth.mode``). Subclasses declare both fields and the dialect's own keys, and are named by the
    dialect's ``DialectSpec.config``."""

    __slots__ = ()

    enabled: bool
    auth: str

    #: Another server's names for this dialect's keys, which its users may already set (guble's
    #: ``GUBLE_NODE_ID``, ``--node-id``): variable -> key, flag -> key. They apply over the file; a hubbub
    #: flag or ``HUBBUB_*`` variable always wins.
    ENV_ALIASES: ClassVar[Mapping[str, str]] = {}
    FLAG_ALIASES: ClassVar[Mapping[str, str]] = {}
    #: The prefix of that server's variables: one that is not an alias is ignored, with a warning.
    ENV_PREFIX: ClassVar[str] = ""

    @classmethod
    def alias_value(cls, key: str, value: Any) -> Any:
        """An alias's value as ``key``'s (guble's ``:8080`` listens on every interface)."""
        return value

    def validate(self, config: Config) -> None:
        key = f"{self.SECTION}.auth"
        if self.auth not in ("", "off", "token"):
            raise ConfigError(f"{key}: must be empty (auth.mode), off or token")
        if self.auth == "token" and config.auth.mode != "token":
            # The keys and tokens are those of auth.*: a dialect cannot check tokens on its own.
            raise ConfigError(f"{key} = token needs auth.mode = token")

    def auth_mode(self, config: Config) -> str:
        """This dialect's auth mode: its ``auth`` when set, else ``auth.mode``."""
        return self.auth or config.auth.mode


S = TypeVar("S", bound=Section)


def _positive(section: Section, *names: str) -> None:
    for name in names:
        if getattr(section, name) <= 0:
            raise ConfigError(f"{_key_of(type(section), name)}: must be positive")


@dataclass(frozen=True, slots=True)
class StorageConfig(Section):
    """The log: where (``data_dir``, ``store``) and how durable."""

    data_dir: str = "./hubbub-data"
    durability: str = "commit"
    store: str = "sqlite"
    commit_batch: int = field(default=4096, metadata={"key": ""})  # no key: the writer's batch

    def validate(self, config: Config) -> None:
        if self.durability not in DURABILITY_MODES:
            raise ConfigError(f"durability: must be one of {', '.join(DURABILITY_MODES)}")


@dataclass(frozen=True, slots=True)
class ServerConfig(Section):
    """The node's processes (docs/operations.md "Workers")."""

    SECTION: ClassVar[str] = "server"
    #: Worker processes serving connections (0: one per core this process may use; 1: one process).
    workers: int = 1

    def validate(self, config: Config) -> None:
        if self.workers < 0:
            raise ConfigError("server.workers: must be 0 (one per core) or more")
        postgres = config.storage.store.lower().startswith(("postgresql://", "postgres://"))
        if self.workers != 1 and postgres and not config.cluster.broker:
            # Their workers are members of the cluster, which reach each other through Redis.
            raise ConfigError(
                "server.workers: the workers of a node on a PostgreSQL log are cluster members: set"
                " cluster.broker (docs/cluster.md)"
            )


@dataclass(frozen=True, slots=True)
class LoggingConfig(Section):
    level: str = field(default="info", metadata={"key": "log_level"})
    format: str = field(default="text", metadata={"key": "log_format"})

    def validate(self, config: Config) -> None:
        if self.format not in ("text", "json"):
            raise ConfigError("log_format: must be text or json")
        if self.level not in ("debug", "info", "warning", "error"):
            raise ConfigError("log_level: must be debug, info, warning or error")


@dataclass(frozen=True, slots=True)
class AuthConfig(Section):
    SECTION: ClassVar[str] = "auth"
    mode: str = "off"
    #: token -> {"user", "publish", "subscribe", "admin"} (README §6); masked in repr.
    tokens: SecretMap = field(default_factory=SecretMap)
    #: HS256 secrets, RS256 public keys (PEM) or ``file:<path>``; masked in repr.
    jwt_keys: tuple[str, ...] = ()
    jwks_file: str = ""
    jwt_leeway_s: float = 30.0
    jwt_audience: str = ""
    jwt_issuer: str = ""

    def validate(self, config: Config) -> None:
        if self.mode not in ("off", "token"):
            raise ConfigError("auth.mode: must be off or token")
        if self.jwt_leeway_s < 0:
            raise ConfigError("auth.jwt_leeway_s: must not be negative")


@dataclass(frozen=True, slots=True)
class TlsConfig(Section):
    SECTION: ClassVar[str] = "tls"
    cert: str = ""
    key: str = ""

    def validate(self, config: Config) -> None:
        if bool(self.cert) != bool(self.key):
            raise ConfigError("tls.cert and tls.key: give both or neither")


@dataclass(frozen=True, slots=True)
class HttpConfig(Section):
    SECTION: ClassVar[str] = "http"
    listen: str = listen_field(DEFAULT_HTTP_LISTEN)
    #: Seconds an HTTP connection may take to send a request's head (and a TLS handshake) before it is closed.
    head_timeout_s: float = 10.0
    cors_origin: str = field(default="", metadata={"key": "cors_origin"})

    def validate(self, config: Config) -> None:
        parse_listen(self.listen, "http.listen")
        _positive(self, "head_timeout_s")
        parse_cors_origin(self.cors_origin)


@dataclass(frozen=True, slots=True)
class TcpConfig(Section):
    SECTION: ClassVar[str] = "tcp"
    #: Seconds a connection to a TCP listener (native, mist, qrpc) may take to finish its TLS handshake and
    #: send its first complete message before it is closed.
    first_message_timeout_s: float = 10.0

    def validate(self, config: Config) -> None:
        _positive(self, "first_message_timeout_s")


@dataclass(frozen=True, slots=True)
class NativeConfig(Section):
    """The native dialect, the node's base: a core section, named by ``native.SPEC`` like a dialect's."""

    SECTION: ClassVar[str] = "native"
    tcp_listen: str = listen_field(DEFAULT_NATIVE_TCP_LISTEN)
    enabled: bool = True
    ping_interval_s: float = 25.0
    idempotency_window_s: float = 600.0
    #: Deprecated and ignored (recovery has no limit): accepted so that configurations that set it still load.
    max_recovery: int = 0

    def validate(self, config: Config) -> None:
        parse_listen(self.tcp_listen, "native.tcp_listen")
        _positive(self, "ping_interval_s")
        if self.idempotency_window_s < 0:
            raise ConfigError("native.idempotency_window_s: must be 0 (off) or positive")


@dataclass(frozen=True, slots=True)
class Limits(Section):
    SECTION: ClassVar[str] = "limits"
    max_frame: int = 1 << 20
    max_channel_bytes: int = 1024
    max_tags: int = 64
    max_tag_bytes: int = 256
    max_headers: int = 64
    max_header_bytes: int = 8192
    max_subscriptions: int = 1024
    send_queue: int = 1024
    send_queue_bytes: int = 16 << 20
    #: Seconds a TCP write (native, mist, qrpc) may wait for a peer that reads nothing before the connection
    #: is aborted (``hubbub_write_timeouts_total``).
    write_timeout_s: int = 30
    # The limits below are off at 0 (unlimited): docs/security.md gives values for an exposed server.
    publish_rate: int = 0
    publish_burst: int = 0
    max_connections: int = 0
    max_connections_per_ip: int = 0
    #: Durable consumers in the whole log (each journals a copy of every event it matches).
    max_consumers: int = 10_000
    #: Bytes of journal items the durable consumers may hold in memory together beyond 10 000 items each
    #: (``ConsumerService(held_bytes_max=)``): each item counts as its event's size plus 400 bytes.
    consumer_memory: int = 64 << 20

    #: Limits for which 0 means "unlimited" (every other limit must be positive).
    UNLIMITED_AT_ZERO: ClassVar[frozenset[str]] = frozenset(
        {"publish_rate", "publish_burst", "max_connections", "max_connections_per_ip", "max_consumers"}
    )

    def validate(self, config: Config) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if v < 0 or (v == 0 and f.name not in self.UNLIMITED_AT_ZERO):
                raise ConfigError(f"limits.{f.name}: must be positive")


@dataclass(frozen=True, slots=True)
class Retention(Section):
    SECTION: ClassVar[str] = "log.retention"
    max_age_s: int = 0
    max_events: int = 0
    max_bytes: int = 0
    max_total_bytes: int = 0

    def validate(self, config: Config) -> None:
        for f in fields(self):
            if getattr(self, f.name) < 0:
                raise ConfigError(f"log.retention.{f.name}: must be 0 (unlimited) or positive")


_FED_NODE = re.compile(r"[A-Za-z0-9._-]{1,64}")


@dataclass(frozen=True, slots=True)
class FederationConfig(Section):
    """Links between hubbub nodes (docs/federation.md)."""

    SECTION: ClassVar[str] = "federation"
    #: hubbub nodes this node links up to (ws://HOST:PORT[/ws/hubbub][?token=…]); masked in repr. Given
    #: in ``HUBBUB_UPSTREAM`` as URLs separated by spaces or commas, or a JSON list.
    upstream: tuple[str, ...] = field(default=(), metadata={"key": "upstream", "words": True})
    node_id: str = ""  # "" means an id kept in <data_dir>/federation/node-id
    token: Secret = field(default_factory=lambda: Secret(""))
    token_file: str = ""  # read at each connection of a link: a renewed token is used at once
    accept: bool = True

    def validate(self, config: Config) -> None:
        for url in self.upstream:
            if not url.lower().startswith(("ws://", "wss://")):
                raise ConfigError("upstream: expected ws:// or wss:// URLs of hubbub nodes")
        if self.node_id and not _FED_NODE.fullmatch(self.node_id):
            raise ConfigError("federation.node_id: 1 to 64 of A-Z a-z 0-9 . _ -")
        if self.token_file and str(self.token):
            raise ConfigError("federation.token and federation.token_file: give one of them")


@dataclass(frozen=True, slots=True)
class ClusterConfig(Section):
    """The nodes of a cluster (docs/cluster.md; used when ``broker`` is set)."""

    SECTION: ClassVar[str] = "cluster"
    broker: str = field(default="", metadata={"key": "broker"})
    node_id: str = ""  # "" means host-pid-random, unique per process
    redis_channel: str = "hubbub.events"
    gap_wait_s: float = 0.1
    poll_interval_s: float = 1.0
    presence_ttl_s: float = 15.0

    def validate(self, config: Config) -> None:
        if self.broker:
            scheme = self.broker.split("://", 1)[0].lower() if "://" in self.broker else ""
            if scheme not in ("redis", "rediss", "unix"):
                raise ConfigError("broker: expected redis://HOST:PORT[/DB], rediss://… or unix://PATH")
            if not config.storage.store.lower().startswith(("postgresql://", "postgres://")):
                raise ConfigError("broker: the nodes of a cluster share one log: set store to postgresql://…")
        if self.gap_wait_s <= 0 or self.poll_interval_s <= 0 or self.presence_ttl_s <= 0:
            raise ConfigError(
                "cluster.gap_wait_s, cluster.poll_interval_s and cluster.presence_ttl_s: must be positive"
            )
        if not self.redis_channel:
            raise ConfigError("cluster.redis_channel: must not be empty")


#: A worker's member id in the cluster: its node's id, ``/w`` and its index.
_WORKER_MEMBER = re.compile(r"(.+)/w[0-9]+")


def worker_member_id(node_id: str, index: int) -> str:
    """The cluster member id of worker ``index`` of node ``node_id`` (``serve --workers`` on a cluster: each
    worker is a member of its own, docs/cluster.md "Nodes of several workers")."""
    return f"{node_id}/w{index}"


def member_node(member_id: str) -> str:
    """The node of a cluster member: ``node_id`` for a :func:`worker_member_id`, else the member itself."""
    m = _WORKER_MEMBER.fullmatch(member_id)
    return m.group(1) if m is not None else member_id


#: ``dashboard.enabled``'s values: ``auto`` serves the page when the HTTP listener is a loopback address or
#: auth is on (docs/dashboard.md).
DASHBOARD_MODES = ("auto", "true", "false")


@dataclass(frozen=True, slots=True)
class DashboardConfig(Section):
    """The operators' web page at ``/ui/`` and its admin API (docs/dashboard.md)."""

    SECTION: ClassVar[str] = "dashboard"
    enabled: str = "auto"

    def validate(self, config: Config) -> None:
        if self.enabled not in DASHBOARD_MODES:
            raise ConfigError("dashboard.enabled: must be auto, true or false")

    def serves(self, config: Config) -> bool:
        """Whether the page is served: ``true``; or ``auto`` with the HTTP listener on a loopback address
        (the shipped default) or auth on (every admin request then needs an admin token)."""
        if self.enabled != "auto":
            return self.enabled == "true"
        host, _ = parse_listen(config.http.listen, "http.listen")
        loopback = host in {"localhost", "::1"} or host.startswith("127.")
        return loopback or config.auth.mode == "token"


@dataclass(frozen=True, slots=True)
class WebhooksConfig(Section):
    """Webhooks: every event matching a hook's pattern POSTed to its URL, durably (docs/connectors.md)."""

    SECTION: ClassVar[str] = "webhooks"
    #: name -> {"url", "pattern", "secret", "tags"}; masked in repr (the secrets sign the requests).
    hooks: SecretMap = field(default_factory=SecretMap)
    workers: int = 8
    timeout_s: float = 10.0
    retry_base_s: float = 0.2
    retry_max_s: float = 30.0
    retry_after_max_s: float = 300.0
    #: The floor under a receiver's Retry-After (``Retry-After: 0`` would make a loop of requests).
    retry_after_min_s: float = 1.0
    max_attempts: int = 0
    #: How long an event is tried before it is dead-lettered (a day, about Svix's schedule; 0: for ever).
    max_retry_s: float = 86400.0
    dead_letter: str = "/hubbub/dead-letter"

    def validate(self, config: Config) -> None:
        _positive(self, "workers", "timeout_s", "retry_base_s", "retry_max_s", "retry_after_max_s")
        if self.max_attempts < 0 or self.max_retry_s < 0:
            raise ConfigError(
                "webhooks.max_attempts and webhooks.max_retry_s: must not be negative (0: no bound)"
            )
        if not 0 <= self.retry_after_min_s <= self.retry_after_max_s:
            raise ConfigError("webhooks.retry_after_min_s: from 0 to webhooks.retry_after_max_s")
        if not self.dead_letter.startswith("/") or self.dead_letter.rstrip("/") == "":
            raise ConfigError("webhooks.dead_letter: a channel prefix such as /hubbub/dead-letter")
        for name, hook in self.hooks.items():
            check_webhook(f"webhooks.hooks.{name}", name, hook)


@dataclass(frozen=True, slots=True)
class Config:
    """The whole configuration: the core's sections, and the dialects' by section name."""

    storage: StorageConfig = field(default_factory=StorageConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    tls: TlsConfig = field(default_factory=TlsConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    tcp: TcpConfig = field(default_factory=TcpConfig)
    native: NativeConfig = field(default_factory=NativeConfig)
    limits: Limits = field(default_factory=Limits)
    retention: Retention = field(default_factory=Retention)
    federation: FederationConfig = field(default_factory=FederationConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    webhooks: WebhooksConfig = field(default_factory=WebhooksConfig)
    dashboard: DashboardConfig = field(default_factory=DashboardConfig)
    #: The dialects' sections by ``SECTION`` (those the loader was given).
    dialects: Mapping[str, DialectSection] = field(default_factory=lambda: types.MappingProxyType({}))

    def sections(self) -> tuple[Section, ...]:
        """Every section, the core's first, in the order they are checked."""
        core = tuple(getattr(self, f.name) for f in fields(self) if f.name != "dialects")
        return core + tuple(self.dialects.values())

    def section(self, cls: type[S]) -> S:
        """The section of class ``cls``. A dialect's section that the loader was not given has its
        defaults (a ``Config()`` made in code serves every dialect, as before sections)."""
        for s in self.sections():
            if type(s) is cls:
                return s
        if issubclass(cls, DialectSection):
            return cls()
        raise KeyError(cls.__name__)

    def dialect_auth(self, section: str) -> str:
        """The auth mode of one dialect: its ``<section>.auth`` when set, else ``auth.mode``."""
        s = self.dialects.get(section)
        return s.auth_mode(self) if s is not None else self.auth.mode

    def validate(self) -> Config:
        for section in self.sections():
            section.validate(self)
        return self


# -- keys ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Key:
    """One configuration key: its dotted name, the section field it sets, and its type (``str``, ``bool``,
    ``int``, ``float``, ``tuple`` or ``dict``). Its flag, ``HUBBUB_*`` name and TOML key derive from
    ``name``."""

    name: str
    section: type[Section]
    field: str
    type: type
    #: Masked in ``repr`` and logs.
    secret: bool = False
    #: A list that may also be given as words separated by spaces or commas (``HUBBUB_UPSTREAM``).
    words: bool = False
    #: A listener's shipped ``HOST:PORT`` (see :data:`LISTEN_OVERRIDE`), else "".
    listen_default: str = ""
    #: Its line of ``hubbub serve --help`` when its section gives one (:attr:`Section.HELP`).
    help: str = ""

    def parse(self, value: Any) -> Any:
        """``value`` (a TOML value, or the text of a flag or a variable) as this key's type."""
        v = _coerce(self.name, self.type, value, self.words)
        return Secret(v) if self.secret else v

    def default(self) -> Any:
        return getattr(self.section(), self.field)

    def read(self, config: Config) -> Any:
        return getattr(config.section(self.section), self.field)


def _key_of(cls: type[Section], name: str) -> str:
    """The dotted key of field ``name`` of section ``cls`` ("" for a field with no key)."""
    f = {f.name: f for f in fields(typing.cast(Any, cls))}[name]
    if "key" in f.metadata:
        return str(f.metadata["key"])
    return f"{cls.SECTION}.{name}" if cls.SECTION else name


def _key_type(hint: Any, where: str) -> tuple[type, bool]:
    """A field's annotation as its key's (type, secret)."""
    if hint is Secret:
        return str, True
    if hint is SecretMap:
        return dict, False
    if hint in (str, bool, int, float):
        return typing.cast(type, hint), False
    if typing.get_origin(hint) is tuple:
        return tuple, False
    raise TypeError(f"{where}: a key's type is str, bool, int, float, Secret, tuple[str, ...] or SecretMap")


#: section_keys's, by class (the classes are few and live as long as the process).
_SECTION_KEYS: dict[type[Section], tuple[Key, ...]] = {}


def section_keys(cls: type[Section]) -> tuple[Key, ...]:
    """The keys of a section class, in field order."""
    if cls in _SECTION_KEYS:
        return _SECTION_KEYS[cls]
    hints = typing.get_type_hints(cls)
    keys = []
    for f in fields(typing.cast(Any, cls)):
        name = _key_of(cls, f.name)
        if name:
            typ, secret = _key_type(hints[f.name], f"{cls.__name__}.{f.name}")
            words, listen = bool(f.metadata.get("words")), str(f.metadata.get("listen", ""))
            keys.append(Key(name, cls, f.name, typ, secret, words, listen, cls.HELP.get(f.name, "")))
    if issubclass(cls, DialectSection) and not {"enabled", "auth"} <= {k.field for k in keys}:
        raise TypeError(f"{cls.__name__}: a dialect's section has the fields enabled and auth")
    found = _SECTION_KEYS[cls] = tuple(keys)
    return found


def _core_sections() -> tuple[tuple[str, type[Section]], ...]:
    """The core's sections as (attribute of :class:`Config`, class)."""
    hints = typing.get_type_hints(Config)
    return tuple((f.name, hints[f.name]) for f in fields(Config) if f.name != "dialects")


def config_keys(dialects: Iterable[type[DialectSection]] = ()) -> dict[str, Key]:
    """Every key by dotted name: the core's, then the given dialects' sections'."""
    out: dict[str, Key] = {}
    for cls in [c for _, c in _core_sections()] + list(dialects):
        for key in section_keys(cls):
            if key.name in out:
                raise ValueError(f"{key.name}: a key of {out[key.name].section.__name__} and {cls.__name__}")
            out[key.name] = key
    return out


#: ``HUBBUB_*`` variables that are not server keys, and so never a typo of one. ``hubbub serve`` refuses
#: any other ``HUBBUB_*`` variable that names no key (as it refuses an unknown key in its file): a misspelt
#: ``HUBBUB_DURABILTY=fsync`` would otherwise start a server with the default durability. docs/operations.md
#: ("Environment variables that are not keys") lists the same.
OTHER_ENV: dict[str, str] = {
    "HUBBUB_URL": "the server URL of the client commands (hubbub pub, sub, consume, log)",
    "HUBBUB_TOKEN": "the access token of the client commands and of the data pipeline's commands",
    "HUBBUB_SPARK_MASTER": "the Spark master of the data pipeline's commands (hubbub pipeline)",
    "HUBBUB_VECTORS_DIR": "the conformance vectors directory of the test suite",
    "HUBBUB_VECTORS_WORKERS": "the conformance vectors the tests run on two workers (all, sample, none)",
    "HUBBUB_TEST_PG_USER": "the user the test suite runs its own PostgreSQL server as, when run as root",
}


def _check_env_names(keys: Mapping[str, Key], env: Mapping[str, str]) -> None:
    """Refuse a ``HUBBUB_*`` variable that is neither a key's nor one of :data:`OTHER_ENV`, naming the
    closest known variable."""
    known = {env_name(key) for key in keys} | OTHER_ENV.keys()
    for name in sorted(env):
        if not name.startswith("HUBBUB_") or name in known:
            continue
        # Compared without the common prefix, which would make every name look close to every other.
        close = difflib.get_close_matches(name[7:], [k[7:] for k in known], n=1)
        hint = f" (did you mean HUBBUB_{close[0]}?)" if close else ""
        raise ConfigError(f"unknown environment variable {name}{hint}")


def _check_file_key(keys: Mapping[str, Key], key: str, config_file: str) -> None:
    if key not in keys:
        close = difflib.get_close_matches(key, keys, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"config file {config_file}: unknown key {key!r}{hint}")


def flag_name(key: str) -> str:
    return "--" + key.replace(".", "-").replace("_", "-")


def env_name(key: str) -> str:
    return "HUBBUB_" + key.replace(".", "_").upper()


def _coerce(key: str, typ: type, value: Any, words: bool = False) -> Any:
    if typ is dict or typ is tuple:
        return _coerce_json(key, typ, value, words)
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)  # TOML's 600 for a float key
    if isinstance(value, typ) and not (typ is int and isinstance(value, bool)):
        return value
    if not isinstance(value, str):
        raise ConfigError(f"{key}: expected {typ.__name__}, got {value!r}")
    try:
        if typ is bool:
            if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(value)
            return value.lower() in ("true", "1", "yes")
        if typ is int:
            return int(value)
        if typ is float:
            return float(value)
    except ValueError:
        raise ConfigError(f"{key}: expected {typ.__name__}, got {value!r}") from None
    return value


def _coerce_json(key: str, typ: type, value: Any, words: bool) -> Any:
    """A map (``dict``) or list (``tuple``) key: a TOML table or array, or JSON text (flags, environment,
    README §2). Maps become a :class:`SecretMap`, lists a tuple of masked strings."""
    if isinstance(value, str) and words and not value.lstrip().startswith("["):
        value = [u for u in re.split(r"[\s,]+", value) if u]  # HUBBUB_UPSTREAM="ws://a ws://b"
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise ConfigError(f"{key}: not valid JSON") from None
    if typ is dict:
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            raise ConfigError(f"{key}: expected a JSON object")
        return SecretMap(value)
    if not isinstance(value, list | tuple) or not all(isinstance(x, str) for x in value):
        raise ConfigError(f"{key}: expected a JSON list of strings")
    return tuple(Secret(x) for x in value)


def _flatten(keys: Mapping[str, Key], doc: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in doc.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and key not in keys:
            out.update(_flatten(keys, v, key + "."))
        else:
            out[key] = v
    return out


def alias_flags(dialects: Iterable[type[DialectSection]]) -> dict[str, str]:
    """Every command-line alias of the dialects (``--node-id`` for ``guble.node_id``), flag -> key."""
    return {flag: key for cls in dialects for flag, key in cls.FLAG_ALIASES.items()}


def _aliases(
    values: dict[str, Any],
    dialects: Iterable[type[DialectSection]],
    cli: Mapping[str, Any],
    env: Mapping[str, str],
) -> None:
    """Apply each dialect's aliases (:attr:`DialectSection.ENV_ALIASES`, then its flags) over the file
    (below ``HUBBUB_*`` and hubbub's flags)."""
    for cls in dialects:
        given = [(var, cls.ENV_ALIASES[var], env.get(var)) for var in cls.ENV_ALIASES]
        given += [(flag, cls.FLAG_ALIASES[flag], cli.get(flag)) for flag in cls.FLAG_ALIASES]
        for _, key, value in given:
            if value is not None:
                values[key] = cls.alias_value(key, value)
        if cls.ENV_PREFIX:
            for name in sorted(env):
                if name.startswith(cls.ENV_PREFIX) and name not in cls.ENV_ALIASES:
                    logging.getLogger("hubbub.config").warning(
                        "ignoring %s: %s option not used by hubbub", name, cls.SECTION
                    )


def load_config(
    cli: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    config_file: str | None = None,
    dialects: Iterable[type[DialectSection]] = (),
) -> Config:
    """Build the configuration of the core's sections and ``dialects``' (the composition root gives the
    registry's: ``hubbub.server_config.load_config``). ``cli`` maps dotted keys (and the dialects' alias
    flags) to command-line values (None = unset)."""
    env = os.environ if env is None else env
    dialects = tuple(dialects)
    keys = config_keys(dialects)
    values: dict[str, Any] = {}
    if config_file:
        try:
            with open(config_file, "rb") as fh:
                doc = tomllib.load(fh)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"config file {config_file}: {exc}") from None
        for key, v in _flatten(keys, doc).items():
            _check_file_key(keys, key, config_file)
            values[key] = v
    _check_env_names(keys, env)
    _aliases(values, dialects, cli or {}, env)
    for key in keys:
        if env_name(key) in env:
            values[key] = env[env_name(key)]
    aliases = alias_flags(dialects)
    for key, v in (cli or {}).items():
        if v is not None and key not in aliases:
            if key not in keys:
                raise ConfigError(f"unknown key {key!r}")
            values[key] = v
    raw: dict[type[Section], dict[str, Any]] = {}
    for key, v in values.items():
        raw.setdefault(keys[key].section, {})[keys[key].field] = v
    core: dict[str, Any] = {name: cls.parse(raw.get(cls, {})) for name, cls in _core_sections()}
    sections = {cls.SECTION: cls.parse(raw.get(cls, {})) for cls in dialects}
    return Config(**core, dialects=types.MappingProxyType(sections)).validate()
