"""Server configuration: frozen dataclasses, loaded once by the composition root (``server.py``/``cli.py``).

Keys are the dotted names of protocols README §2. Precedence: command line, then ``HUBBUB_*`` environment
variables, then a TOML config file, then the defaults below. Secrets are masked in ``repr``.
"""

from __future__ import annotations

import difflib
import json
import logging
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from hubbub.channels import canonical
from hubbub.errors import BadChannel

__all__ = [
    "DURABILITY_MODES",
    "OTHER_ENV",
    "Config",
    "ConfigError",
    "Limits",
    "Retention",
    "SecretMap",
    "env_name",
    "flag_name",
    "load_config",
    "parse_cors_origin",
    "parse_listen",
]

DURABILITY_MODES = ("fsync", "commit", "none")
#: The listeners' default addresses (``qpubs.qrpc_listen``'s is qpubs.md §1's). Module values, read when a
#: :class:`Config` is made, so that a test run can move every server it starts off the fixed ports
#: (tests/conftest.py): a server left running on the defaults must not fail the tests.
DEFAULT_HTTP_LISTEN = "127.0.0.1:8080"
DEFAULT_NATIVE_TCP_LISTEN = "127.0.0.1:7400"
DEFAULT_QRPC_LISTEN = "127.0.0.1:1337"
DEFAULT_MIST_TCP_LISTEN = "127.0.0.1:1445"


class ConfigError(ValueError):
    """A configuration value is invalid. The message names the key."""


@dataclass(frozen=True, slots=True)
class Limits:
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
UNLIMITED_AT_ZERO = frozenset(
    {"publish_rate", "publish_burst", "max_connections", "max_connections_per_ip", "max_consumers"}
)


@dataclass(frozen=True, slots=True)
class Retention:
    max_age_s: int = 0
    max_events: int = 0
    max_bytes: int = 0
    max_total_bytes: int = 0


class _Secret(str):
    """A string whose repr never shows its value."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "'***'" if self else "''"


class SecretMap(dict[str, Any]):
    """A mapping whose keys are secrets (``auth.tokens``): its repr shows only how many entries it has."""

    def __repr__(self) -> str:
        return f"<{len(self)} secret entries>"


@dataclass(frozen=True, slots=True)
class Config:
    data_dir: str = "./hubbub-data"
    durability: str = "commit"
    store: str = "sqlite"
    broker: str = ""
    http_listen: str = field(default_factory=lambda: DEFAULT_HTTP_LISTEN)
    #: Seconds an HTTP connection may take to send a request's head (and a TLS handshake) before it is closed.
    http_head_timeout_s: float = 10.0
    #: Seconds a connection to a TCP listener (native, mist, qrpc) may take to finish its TLS handshake and
    #: send its first complete message before it is closed.
    tcp_first_message_timeout_s: float = 10.0
    native_tcp_listen: str = field(default_factory=lambda: DEFAULT_NATIVE_TCP_LISTEN)
    native_enabled: bool = True
    native_ping_interval_s: float = 25.0
    native_idempotency_window_s: float = 600.0
    #: Deprecated and ignored (recovery has no limit): accepted so that configurations that set it still load.
    native_max_recovery: int = 0
    limits: Limits = field(default_factory=Limits)
    retention: Retention = field(default_factory=Retention)
    auth_mode: str = "off"
    #: ``auth.tokens``: token -> {"user", "publish", "subscribe", "admin"} (README §6); masked in repr.
    auth_tokens: SecretMap = field(default_factory=SecretMap)
    #: ``auth.jwt_keys``: HS256 secrets, RS256 public keys (PEM) or ``file:<path>``; masked in repr.
    auth_jwt_keys: tuple[str, ...] = ()
    auth_jwks_file: str = ""
    auth_jwt_leeway_s: float = 30.0
    auth_jwt_audience: str = ""
    auth_jwt_issuer: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    cors_origin: str = ""
    log_level: str = "info"
    log_format: str = "text"
    commit_batch: int = 4096
    # -- dialect settings: each dialect adds its fields below its own marker --
    # -- guble --
    guble_enabled: bool = True
    guble_node_id: int = 0
    guble_health_endpoint: str = "/admin/healthcheck"
    guble_metrics_endpoint: str = "/admin/metrics"
    guble_auth: str = ""  # "" means auth.mode
    # -- ivy --
    ivy_enabled: bool = True
    ivy_large_event_bytes: int = 65536
    ivy_ping_interval_s: float = 54.0
    ivy_read_timeout_s: float = 60.0
    ivy_max_log_bytes: int = 64 << 20
    ivy_auth: str = ""  # "" means auth.mode
    # -- mist (protocols/mist.md §1; limits are the shared limits.*) --
    mist_enabled: bool = True
    mist_tcp_listen: str = field(default_factory=lambda: DEFAULT_MIST_TCP_LISTEN)
    mist_channel: str = "/mist"
    mist_auth: str = ""  # "" means auth.mode
    mist_token: str = field(default_factory=lambda: _Secret(""))  # an extra master token (upstream --token)
    # -- wearscript (protocols/wearscript.md §1, §7; docs/dialects/wearscript.md) --
    wearscript_enabled: bool = True
    wearscript_group_device: str = "server:0"
    wearscript_test_handler: bool = True
    wearscript_hub_channels: tuple[str, ...] = ()
    wearscript_advertise_foreign: bool = True
    wearscript_auth: str = ""  # "" means auth.mode
    #: A WearScript hub this node links up to (ws://…/wearscript/ws[/<secret>]); masked in repr.
    wearscript_upstream: str = field(default_factory=lambda: _Secret(""))
    # -- qpubs (protocols/qpubs.md §1, §8; docs/dialects/qpubs.md) --
    qpubs_enabled: bool = True
    qpubs_separator: str = "."
    qpubs_qrpc_listen: str = field(default_factory=lambda: DEFAULT_QRPC_LISTEN)
    qpubs_heartbeat_s: float = 15.0
    qpubs_batch_bytes: int = 2_097_152
    qpubs_batch_wait_ms: int = 5
    qpubs_auth: str = ""  # "" means auth.mode
    # -- federation (docs/federation.md) --
    #: hubbub nodes this node links up to (ws://HOST:PORT[/ws/hubbub][?token=…]); masked in repr.
    upstream: tuple[str, ...] = ()
    federation_node_id: str = ""  # "" means an id kept in <data_dir>/federation/node-id
    federation_token: str = field(default_factory=lambda: _Secret(""))
    federation_token_file: str = ""  # read at each connection of a link: a renewed token is used at once
    federation_accept: bool = True
    # -- cluster (docs/cluster.md; used when broker is set) --
    cluster_node_id: str = ""  # "" means host-pid-random, unique per process
    cluster_redis_channel: str = "hubbub.events"
    cluster_gap_wait_s: float = 0.1
    cluster_poll_interval_s: float = 1.0
    cluster_presence_ttl_s: float = 15.0

    def dialect_auth(self, dialect: str) -> str:
        """The auth mode of one dialect: its ``<dialect>.auth`` when set, else ``auth.mode``."""
        return str(getattr(self, f"{dialect}_auth", "") or self.auth_mode)

    def validate(self) -> Config:
        if self.durability not in DURABILITY_MODES:
            raise ConfigError(f"durability: must be one of {', '.join(DURABILITY_MODES)}")
        if self.log_format not in ("text", "json"):
            raise ConfigError("log_format: must be text or json")
        if self.log_level not in ("debug", "info", "warning", "error"):
            raise ConfigError("log_level: must be debug, info, warning or error")
        if self.auth_mode not in ("off", "token"):
            raise ConfigError("auth.mode: must be off or token")
        if self.auth_jwt_leeway_s < 0:
            raise ConfigError("auth.jwt_leeway_s: must not be negative")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("tls.cert and tls.key: give both or neither")
        for key in ("http_listen", "native_tcp_listen"):
            parse_listen(getattr(self, key), key)
        if self.http_head_timeout_s <= 0:
            raise ConfigError("http.head_timeout_s: must be positive")
        if self.tcp_first_message_timeout_s <= 0:
            raise ConfigError("tcp.first_message_timeout_s: must be positive")
        for f in fields(Limits):
            v = getattr(self.limits, f.name)
            if v < 0 or (v == 0 and f.name not in UNLIMITED_AT_ZERO):
                raise ConfigError(f"limits.{f.name}: must be positive")
        for f in fields(Retention):
            if getattr(self.retention, f.name) < 0:
                raise ConfigError(f"log.retention.{f.name}: must be 0 (unlimited) or positive")
        if self.native_ping_interval_s <= 0:
            raise ConfigError("native.ping_interval_s: must be positive")
        if self.native_idempotency_window_s < 0:
            raise ConfigError("native.idempotency_window_s: must be 0 (off) or positive")
        parse_cors_origin(self.cors_origin)
        for key in (
            "ivy_large_event_bytes",
            "ivy_ping_interval_s",
            "ivy_read_timeout_s",
            "ivy_max_log_bytes",
        ):
            if getattr(self, key) <= 0:
                raise ConfigError(f"{key.replace('_', '.', 1)}: must be positive")
        for key in ("guble_auth", "ivy_auth", "wearscript_auth", "mist_auth", "qpubs_auth"):
            if getattr(self, key) not in ("", "off", "token"):
                raise ConfigError(f"{key.replace('_', '.', 1)}: must be empty (auth.mode), off or token")
            if getattr(self, key) == "token" and self.auth_mode != "token":
                # The keys and tokens are those of auth.*: a dialect cannot check tokens on its own.
                raise ConfigError(f"{key.replace('_', '.', 1)} = token needs auth.mode = token")
        parse_listen(self.mist_tcp_listen, "mist.tcp_listen")
        try:
            if canonical(self.mist_channel, self.limits.max_channel_bytes) != self.mist_channel:
                raise BadChannel("not canonical")
        except BadChannel:
            raise ConfigError("mist.channel: must be a canonical channel path such as /mist") from None
        if not self.qpubs_separator or "*" in self.qpubs_separator:
            raise ConfigError("qpubs.separator: must be non-empty and must not contain *")
        parse_listen(self.qpubs_qrpc_listen, "qpubs.qrpc_listen")
        if self.qpubs_heartbeat_s <= 0 or self.qpubs_batch_bytes <= 0:
            raise ConfigError("qpubs.heartbeat_s and qpubs.batch_bytes: must be positive")
        if self.qpubs_batch_wait_ms < 0:
            raise ConfigError("qpubs.batch_wait_ms: must not be negative")
        group, sep, device = self.wearscript_group_device.partition(":")
        if not sep or not group or not device:
            raise ConfigError("wearscript.group_device: expected GROUP:DEVICE, such as server:0")
        up = self.wearscript_upstream
        if up and not up.lower().startswith(("ws://", "wss://")):
            raise ConfigError("wearscript.upstream: expected a ws:// or wss:// URL of a WearScript hub")
        for url in self.upstream:
            if not url.lower().startswith(("ws://", "wss://")):
                raise ConfigError("upstream: expected ws:// or wss:// URLs of hubbub nodes")
        if self.federation_node_id and not _FED_NODE.fullmatch(self.federation_node_id):
            raise ConfigError("federation.node_id: 1 to 64 of A-Z a-z 0-9 . _ -")
        if self.federation_token_file and str(self.federation_token):
            raise ConfigError("federation.token and federation.token_file: give one of them")
        if self.broker:
            scheme = self.broker.split("://", 1)[0].lower() if "://" in self.broker else ""
            if scheme not in ("redis", "rediss", "unix"):
                raise ConfigError("broker: expected redis://HOST:PORT[/DB], rediss://… or unix://PATH")
            if not self.store.lower().startswith(("postgresql://", "postgres://")):
                raise ConfigError("broker: the nodes of a cluster share one log: set store to postgresql://…")
        if (
            self.cluster_gap_wait_s <= 0
            or self.cluster_poll_interval_s <= 0
            or self.cluster_presence_ttl_s <= 0
        ):
            raise ConfigError(
                "cluster.gap_wait_s, cluster.poll_interval_s and cluster.presence_ttl_s: must be positive"
            )
        if not self.cluster_redis_channel:
            raise ConfigError("cluster.redis_channel: must not be empty")
        for key in ("guble_health_endpoint", "guble_metrics_endpoint"):
            if getattr(self, key) and not getattr(self, key).startswith("/"):
                raise ConfigError(f"{key.replace('_', '.', 1)}: must be empty (off) or a path from /")
        return self


def parse_listen(value: str, key: str = "listen") -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"{key}: expected HOST:PORT, got {value!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


_FED_NODE = re.compile(r"[A-Za-z0-9._-]{1,64}")
_ORIGIN = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/\s?#,\"]+")


def parse_cors_origin(value: str) -> tuple[str, ...]:
    """``cors_origin`` (README §2): ``""`` (off) → ``()``, ``*``, one origin, or a JSON list of origins."""
    v = value.strip()
    if v == "":
        return ()
    if v.startswith("["):
        try:
            items = json.loads(v)
        except ValueError:
            raise ConfigError("cors_origin: not a valid JSON list") from None
        if not isinstance(items, list) or not all(isinstance(x, str) for x in items):
            raise ConfigError("cors_origin: expected a JSON list of origins")
    else:
        items = [v]
    for o in items:
        if o != "*" and _ORIGIN.fullmatch(o) is None:
            raise ConfigError(f"cors_origin: {o!r} is not * or an origin such as https://example.com")
    return tuple(items)


# Dotted key -> (path in Config, type). The single table from which flags, env names and TOML keys derive.
KEYS: dict[str, tuple[tuple[str, ...], type]] = {
    "data_dir": (("data_dir",), str),
    "durability": (("durability",), str),
    "store": (("store",), str),
    "broker": (("broker",), str),
    "http.listen": (("http_listen",), str),
    "http.head_timeout_s": (("http_head_timeout_s",), float),
    "tcp.first_message_timeout_s": (("tcp_first_message_timeout_s",), float),
    "native.tcp_listen": (("native_tcp_listen",), str),
    "native.enabled": (("native_enabled",), bool),
    "native.ping_interval_s": (("native_ping_interval_s",), float),
    "native.idempotency_window_s": (("native_idempotency_window_s",), float),
    "native.max_recovery": (("native_max_recovery",), int),
    **{f"limits.{f.name}": (("limits", f.name), int) for f in fields(Limits)},
    **{f"log.retention.{f.name}": (("retention", f.name), int) for f in fields(Retention)},
    "auth.mode": (("auth_mode",), str),
    "auth.tokens": (("auth_tokens",), dict),
    "auth.jwt_keys": (("auth_jwt_keys",), tuple),
    "auth.jwks_file": (("auth_jwks_file",), str),
    "auth.jwt_leeway_s": (("auth_jwt_leeway_s",), float),
    "auth.jwt_audience": (("auth_jwt_audience",), str),
    "auth.jwt_issuer": (("auth_jwt_issuer",), str),
    "tls.cert": (("tls_cert",), str),
    "tls.key": (("tls_key",), str),
    "cors_origin": (("cors_origin",), str),
    "log_level": (("log_level",), str),
    "log_format": (("log_format",), str),
    # -- guble keys --
    "guble.enabled": (("guble_enabled",), bool),
    "guble.node_id": (("guble_node_id",), int),
    "guble.health_endpoint": (("guble_health_endpoint",), str),
    "guble.metrics_endpoint": (("guble_metrics_endpoint",), str),
    "guble.auth": (("guble_auth",), str),
    # -- ivy keys --
    "ivy.enabled": (("ivy_enabled",), bool),
    "ivy.large_event_bytes": (("ivy_large_event_bytes",), int),
    "ivy.ping_interval_s": (("ivy_ping_interval_s",), float),
    "ivy.read_timeout_s": (("ivy_read_timeout_s",), float),
    "ivy.max_log_bytes": (("ivy_max_log_bytes",), int),
    "ivy.auth": (("ivy_auth",), str),
    # -- mist keys --
    "mist.enabled": (("mist_enabled",), bool),
    "mist.tcp_listen": (("mist_tcp_listen",), str),
    "mist.channel": (("mist_channel",), str),
    "mist.auth": (("mist_auth",), str),
    "mist.token": (("mist_token",), str),
    # -- wearscript keys --
    "wearscript.enabled": (("wearscript_enabled",), bool),
    "wearscript.group_device": (("wearscript_group_device",), str),
    "wearscript.test_handler": (("wearscript_test_handler",), bool),
    "wearscript.hub_channels": (("wearscript_hub_channels",), tuple),
    "wearscript.advertise_foreign": (("wearscript_advertise_foreign",), bool),
    "wearscript.auth": (("wearscript_auth",), str),
    "wearscript.upstream": (("wearscript_upstream",), str),
    # -- qpubs keys --
    "qpubs.enabled": (("qpubs_enabled",), bool),
    "qpubs.separator": (("qpubs_separator",), str),
    "qpubs.qrpc_listen": (("qpubs_qrpc_listen",), str),
    "qpubs.heartbeat_s": (("qpubs_heartbeat_s",), float),
    "qpubs.batch_bytes": (("qpubs_batch_bytes",), int),
    "qpubs.batch_wait_ms": (("qpubs_batch_wait_ms",), int),
    "qpubs.auth": (("qpubs_auth",), str),
    # -- federation keys --
    "upstream": (("upstream",), tuple),
    "federation.node_id": (("federation_node_id",), str),
    "federation.token": (("federation_token",), str),
    "federation.token_file": (("federation_token_file",), str),
    "federation.accept": (("federation_accept",), bool),
    # -- cluster keys --
    "cluster.node_id": (("cluster_node_id",), str),
    "cluster.redis_channel": (("cluster_redis_channel",), str),
    "cluster.gap_wait_s": (("cluster_gap_wait_s",), float),
    "cluster.poll_interval_s": (("cluster_poll_interval_s",), float),
    "cluster.presence_ttl_s": (("cluster_presence_ttl_s",), float),
}

#: Keys whose values are masked in ``repr`` and logs.
SECRET_KEYS: frozenset[str] = frozenset({"mist.token", "wearscript.upstream", "federation.token"})


# guble's own option names (guble.md §1). A hubbub flag or HUBBUB_* variable always wins over these.
GUBLE_FLAGS: dict[str, str] = {
    "--http": "http.listen",
    "--storage-path": "data_dir",
    "--health-endpoint": "guble.health_endpoint",
    "--metrics-endpoint": "guble.metrics_endpoint",
    "--node-id": "guble.node_id",
}
GUBLE_ENV: dict[str, str] = {
    "GUBLE_HTTP_LISTEN": "http.listen",
    "GUBLE_STORAGE_PATH": "data_dir",
    "GUBLE_HEALTH_ENDPOINT": "guble.health_endpoint",
    "GUBLE_METRICS_ENDPOINT": "guble.metrics_endpoint",
    "GUBLE_NODE_ID": "guble.node_id",
}


def _guble_aliases(values: dict[str, Any], cli: Mapping[str, Any], env: Mapping[str, str]) -> None:
    """Apply guble's variables, then its flags, over the file (below HUBBUB_* and hubbub flags)."""
    for name, given in [(n, env.get(n)) for n in GUBLE_ENV] + [(f, cli.get(f)) for f in GUBLE_FLAGS]:
        if given is None:
            continue
        key = GUBLE_ENV.get(name) or GUBLE_FLAGS[name]
        # guble's ":8080" listens on every interface
        every = key == "http.listen" and isinstance(given, str) and given.startswith(":")
        values[key] = "0.0.0.0" + given if every else given
    for name in sorted(env):
        if name.startswith("GUBLE_") and name not in GUBLE_ENV:
            logging.getLogger("hubbub.config").warning("ignoring %s: guble option not used by hubbub", name)


#: ``HUBBUB_*`` variables that are not server keys, and so never a typo of one. ``hubbub serve`` refuses
#: any other ``HUBBUB_*`` variable that names no key (as it refuses an unknown key in its file): a misspelt
#: ``HUBBUB_DURABILTY=fsync`` would otherwise start a server with the default durability. docs/operations.md
#: ("Environment variables that are not keys") lists the same.
OTHER_ENV: dict[str, str] = {
    "HUBBUB_URL": "the server URL of the client commands (hubbub pub, sub, consume, log)",
    "HUBBUB_TOKEN": "the access token of the client commands and of the data pipeline's commands",
    "HUBBUB_SPARK_MASTER": "the Spark master of the data pipeline's commands (hubbub pipeline)",
    "HUBBUB_VECTORS_DIR": "the conformance vectors directory of the test suite",
    "HUBBUB_TEST_PG_USER": "the user the test suite runs its own PostgreSQL server as, when run as root",
}


def _check_env_names(env: Mapping[str, str]) -> None:
    """Refuse a ``HUBBUB_*`` variable that is neither a key's nor one of :data:`OTHER_ENV`, naming the
    closest known variable."""
    known = {env_name(key) for key in KEYS} | OTHER_ENV.keys()
    for name in sorted(env):
        if not name.startswith("HUBBUB_") or name in known:
            continue
        # Compared without the common prefix, which would make every name look close to every other.
        close = difflib.get_close_matches(name[7:], [k[7:] for k in known], n=1)
        hint = f" (did you mean HUBBUB_{close[0]}?)" if close else ""
        raise ConfigError(f"unknown environment variable {name}{hint}")


def _check_file_key(key: str, config_file: str) -> None:
    if key not in KEYS:
        close = difflib.get_close_matches(key, KEYS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"config file {config_file}: unknown key {key!r}{hint}")


def flag_name(key: str) -> str:
    return "--" + key.replace(".", "-").replace("_", "-")


def env_name(key: str) -> str:
    return "HUBBUB_" + key.replace(".", "_").upper()


def _coerce(key: str, typ: type, value: Any) -> Any:
    if typ is dict or typ is tuple:
        return _coerce_json(key, typ, value)
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, typ) and not (typ is int and isinstance(value, bool)):
        return value
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)  # TOML's 600 for a float key
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


def _coerce_json(key: str, typ: type, value: Any) -> Any:
    """A map (``dict``) or list (``tuple``) key: a TOML table or array, or JSON text (flags, environment,
    README §2). Maps become a :class:`SecretMap`, lists a tuple of masked strings."""
    if isinstance(value, str) and key == "upstream" and not value.lstrip().startswith("["):
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
    return tuple(_Secret(x) for x in value)


def _flatten(doc: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in doc.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and key not in KEYS:
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def load_config(
    cli: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    config_file: str | None = None,
) -> Config:
    """Build the configuration. ``cli`` maps dotted keys to command-line values (None = unset)."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    if config_file:
        try:
            with open(config_file, "rb") as fh:
                doc = tomllib.load(fh)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"config file {config_file}: {exc}") from None
        for key, v in _flatten(doc).items():
            _check_file_key(key, config_file)
            values[key] = v
    _check_env_names(env)
    _guble_aliases(values, cli or {}, env)
    for key in KEYS:
        if env_name(key) in env:
            values[key] = env[env_name(key)]
    for key, v in (cli or {}).items():
        if v is not None and key not in GUBLE_FLAGS:
            if key not in KEYS:
                raise ConfigError(f"unknown key {key!r}")
            values[key] = v
    cfg = Config()
    limits: dict[str, Any] = {}
    retention: dict[str, Any] = {}
    top: dict[str, Any] = {}
    for key, raw in values.items():
        path, typ = KEYS[key]
        v = _coerce(key, typ, raw)
        if key in SECRET_KEYS:
            v = _Secret(v)
        if path[0] == "limits":
            limits[path[1]] = v
        elif path[0] == "retention":
            retention[path[1]] = v
        else:
            top[path[0]] = v
    cfg = replace(
        cfg, limits=replace(cfg.limits, **limits), retention=replace(cfg.retention, **retention), **top
    )
    return cfg.validate()
