"""The ``hubbub`` command line: ``serve`` and the client commands (``pub``, ``sub``, ``log``).

Every ``serve`` option is also settable as ``HUBBUB_<KEY>`` in the environment or in a TOML file given
with ``--config``; the command line wins, then the environment, then the file, then the defaults.
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import sys
from collections.abc import Sequence

from hubbub import __version__
from hubbub.config import ConfigError, env_name, flag_name
from hubbub.errors import StorageError
from hubbub.server_config import ALIAS_FLAGS, DIALECT_SECTIONS, KEYS, load_config

__all__ = ["HELP", "build_parser", "default_text", "main"]

#: Keys given once per value on the command line (``--upstream A --upstream B``).
REPEATABLE = frozenset({"upstream"})

#: Each key's line of ``hubbub serve --help``: the core's here, each dialect's from its section.
HELP = {
    "data_dir": "directory for the log store and small state files",
    "durability": "when a publish is acknowledged: fsync (after fsync; survives power loss), "
    "commit (after the commit; survives a process crash), none (once sequenced; promises nothing)",
    "store": "log engine: sqlite (in data_dir), sqlite:///FILE, memory (nothing survives a restart), "
    "or postgresql://USER@HOST:PORT/DB (shared by the nodes of a cluster)",
    "broker": "redis://HOST:PORT[/DB]: fan out across the nodes of a cluster sharing a postgresql:// store "
    "(docs/cluster.md)",
    "cluster.node_id": (
        "this node's id in the cluster (default: host-pid-random, unique per process); the workers of a node"
        " of several are the members <id>/w0, <id>/w1, …"
    ),
    "cluster.redis_channel": "the Redis pub/sub channel the nodes of one cluster share",
    "cluster.gap_wait_s": "how long a node waits for a missing event from another node before reading it "
    "from the log",
    "cluster.poll_interval_s": "while Redis is away, how often a node delivers other nodes' events "
    "from the log",
    "cluster.presence_ttl_s": "how long a node's roster entries (guble's subscribers) outlive its last "
    "heartbeat in Redis; a dead node leaves the rosters after this",
    "http.listen": "HTTP and WebSocket listener, HOST:PORT (port 0 picks a free port)",
    "http.head_timeout_s": "seconds an HTTP connection may take to send a request's head (or its TLS "
    "handshake) before it is closed",
    "tcp.first_message_timeout_s": "seconds a connection to a TCP listener (native, mist, qrpc) may take to "
    "finish its TLS handshake and send its first complete message before it is closed",
    "native.tcp_listen": "native raw TCP listener, HOST:PORT",
    "native.enabled": "serve the native protocol (true/false)",
    "native.ping_interval_s": "seconds of silence before the server pings a native connection",
    "native.idempotency_window_s": "seconds during which a repeated idempotency key is not appended again",
    "native.max_recovery": "deprecated, ignored: recovery has no limit",
    "limits.max_frame": "largest WebSocket message, TCP frame or line, and HTTP body, in bytes",
    "limits.max_channel_bytes": "longest canonical channel path, in UTF-8 bytes",
    "limits.max_tags": "tags per event",
    "limits.max_tag_bytes": "bytes per tag",
    "limits.max_headers": "headers per event",
    "limits.max_header_bytes": "total bytes of header keys and values per event",
    "limits.max_subscriptions": "subscriptions per connection",
    "limits.send_queue": "outbound frames queued per connection before the slow-consumer policy applies",
    "limits.send_queue_bytes": "the same, in bytes",
    "limits.write_timeout_s": "seconds a TCP write waits for a peer that reads nothing before aborting it",
    "log.retention.max_age_s": "trim events older than this many seconds (0: keep)",
    "log.retention.max_events": "keep at most this many events per channel (0: unlimited)",
    "log.retention.max_bytes": "keep at most this many bytes per channel (0: unlimited)",
    "log.retention.max_total_bytes": "size cap for the whole log; oldest events go first (0: unlimited)",
    "auth.mode": "off (everyone may publish and subscribe) or token (docs/security.md)",
    "auth.tokens": "static tokens, JSON: {TOKEN: {user, publish: [patterns], subscribe: [patterns], admin}}",
    "auth.jwt_keys": "JSON list of JWT keys: HS256 secrets, RS256 public keys (PEM), or file:PATH",
    "auth.jwks_file": "a JSON Web Key Set file of JWT keys (RSA and oct, by kid); reloaded on SIGHUP",
    "auth.jwt_leeway_s": "clock-skew allowance for the exp and nbf claims, in seconds",
    "auth.jwt_audience": "when set, JWTs must carry this aud",
    "auth.jwt_issuer": "when set, JWTs must carry this iss",
    "tls.cert": "PEM certificate chain: serve every listener (HTTP/WebSocket, native, mist and qrpc TCP) "
    "over TLS (reloaded on SIGHUP)",
    "tls.key": "PEM private key of tls.cert",
    "limits.publish_rate": "publishes per second per connection (token bucket; 0: unlimited)",
    "limits.publish_burst": "publishes a connection may send at once above the rate (0: one second's worth)",
    "limits.max_connections": "open connections in all, every accepted HTTP socket included (0: unlimited)",
    "limits.max_connections_per_ip": "the same per client address (0: unlimited)",
    "limits.max_consumers": "durable consumers in all, each journaling what it matches (0: unlimited)",
    "limits.consumer_memory": "bytes of journal items durable consumers hold in memory beyond 10000 each "
    "(an item counts as its event's size plus 400), so one that falls behind need not read them back",
    "cors_origin": "CORS for browsers on other origins: *, an origin, a JSON list of origins, or empty (off)",
    "upstream": "ws:// URL of a hubbub node to link up to (repeatable; ?token=… or federation.token)",
    "federation.node_id": "this node's id in the federation (default: one kept in DATA_DIR/federation)",
    "federation.token": "the token an upstream link presents when its URL has no ?token=",
    "federation.token_file": "a file holding that token, read at each connection (for renewed tokens)",
    "federation.accept": "take federation links from hubbub nodes below this one (true/false)",
    "server.workers": "worker processes serving connections on the same ports, one log between them "
    "(0: one per core this process may use; 1: one process, no workers)",
    "webhooks.hooks": "webhooks, JSON or TOML tables: {NAME: {url, pattern, secret, tags}}; each POSTs every "
    "event matching its pattern to its url, durably (docs/connectors.md)",
    "dashboard.enabled": "the operators' web page at /ui/ and its admin API /api/v1/admin/: auto (on when "
    "http.listen is a loopback address or auth.mode is token), true or false",
    "webhooks.workers": "requests the webhooks may have in flight at once, over all hooks",
    "webhooks.timeout_s": "seconds a webhook request may take before it is retried",
    "webhooks.retry_base_s": "first backoff between tries of a webhook request, doubled at each try",
    "webhooks.retry_max_s": "longest backoff between tries of a webhook request",
    "webhooks.retry_after_max_s": "longest wait a receiver's Retry-After may ask for",
    "webhooks.retry_after_min_s": "shortest wait a receiver's Retry-After may ask for "
    "(Retry-After: 0 waits this)",
    "webhooks.max_attempts": "tries of one event before it goes to the dead-letter channel (0: no limit)",
    "webhooks.max_retry_s": "seconds one event is tried before it goes to the dead-letter channel "
    "(0: no limit)",
    "webhooks.dead_letter": "channel prefix of refused events: PREFIX/webhook/HOOK",
    "log_level": "debug, info, warning or error",
    "log_format": "text or json (one JSON object per line)",
}
HELP.update({key: k.help for key, k in KEYS.items() if k.help})


def default_text(key: str) -> str:
    """``key``'s default as an operator writes it on the command line or in the environment: ``true``,
    ``[]`` and ``{}`` (JSON), ``""`` for an empty string (docs/operations.md shows the same text)."""
    value = KEYS[key].default()
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | tuple):
        return json.dumps(dict(value) if isinstance(value, dict) else list(value))
    if isinstance(value, str):
        return value or '""'
    return str(value)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hubbub",
        description="hubbub: a pub/sub server that speaks many dialects over one channel tree and one "
        "durable log.",
    )
    parser.add_argument("--version", action="version", version=f"hubbub {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = sub.add_parser(
        "serve",
        help="run the server",
        description="Run a hubbub server. Every option can also be set in the environment "
        "(HUBBUB_<KEY>) or in a TOML file (--config); the command line wins. docs/operations.md "
        "'Configuration reference' lists the same keys.",
    )
    serve.add_argument(
        "--config", metavar="FILE", help="TOML config file with dotted keys or tables", default=None
    )
    for key in KEYS:
        serve.add_argument(
            flag_name(key),
            dest=key,
            metavar="VALUE",
            default=None,
            action="append" if key in REPEATABLE else "store",
            help=f"{HELP.get(key, key)} [env {env_name(key)}; default {default_text(key)}]",
        )
    for section in DIALECT_SECTIONS:
        variables = {key: var for var, key in section.ENV_ALIASES.items()}
        for flag, key in section.FLAG_ALIASES.items():
            # guble's switches (--fcm) are given alone: a bool alias takes an optional value.
            switch = {"nargs": "?", "const": "true"} if KEYS[key].type is bool else {}
            serve.add_argument(
                flag,
                dest=flag,
                metavar="VALUE",
                default=None,
                **switch,  # type: ignore[arg-type]
                help=f"{section.SECTION}'s name for {flag_name(key)} "
                f"[env {variables[key]}; the hubbub names win]",
            )
    serve.add_argument(
        "--workers",
        dest="workers",
        metavar="N",
        default=None,
        help=f"the same as {flag_name('server.workers')}",
    )
    serve.set_defaults(func=_serve)
    try:
        from hubbub.cli_client import add_client_commands
    except ImportError:  # pragma: no cover - the client ships with the package
        pass
    else:
        add_client_commands(sub)
    from hubbub.pipeline.cli import add_pipeline_commands  # imports no Spark until a job runs

    add_pipeline_commands(sub)
    from hubbub.bench_cli import add_bench_command  # the suite itself lives in bench/ of a checkout

    add_bench_command(sub)
    return parser


def _raise_open_files() -> None:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit, before any worker is forked (they inherit
    it): every connection is a file descriptor, and the usual soft limit (1024, systemd's default too)
    would refuse connections past about a thousand while the hard limit (systemd: 524288) allows far more.
    Servers written in Go (NATS) get the same from their runtime; Redis raises it for ``maxclients``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (OSError, ValueError) as exc:  # e.g. an unlimited hard limit some kernels refuse as a soft one
        logging.getLogger(__name__).warning("open files stay at %d: %s", soft, exc)
        return
    logging.getLogger(__name__).info("open files raised from %d to the hard limit %d", soft, hard)


def _serve(args: argparse.Namespace) -> int:
    from hubbub.logs import setup_logging
    from hubbub.server import run

    cli = {key: getattr(args, key) for key in KEYS}
    cli.update({flag: getattr(args, flag) for flag in ALIAS_FLAGS})
    if args.workers is not None and cli["server.workers"] is None:
        cli["server.workers"] = args.workers
    try:
        cfg = load_config(cli, config_file=args.config)
    except ConfigError as exc:
        print(f"hubbub serve: {exc}", file=sys.stderr)
        return 2
    setup_logging(cfg.logging.level, cfg.logging.format)
    _raise_open_files()
    try:
        if cfg.server.workers != 1:
            from hubbub.server_workers import run_workers

            run_workers(cfg)
        else:
            run(cfg, lambda: load_config(cli, config_file=args.config))
    except (OSError, StorageError, ConfigError) as exc:
        # One line, as for a port in use: a log held by another server (a second ``hubbub serve`` on the
        # same data_dir) or a database that cannot be reached is the operator's to fix, not a bug.
        print(f"hubbub serve: {exc}", file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        return 130
