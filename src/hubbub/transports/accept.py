"""What every listener (the HTTP listener, ``transports/http_listener.py``, and the byte-stream listeners,
``transports/stream_listener.py``) shares about the sockets it accepts: how long a refused socket is kept
and how many at most, how bad input seen before any dialect reads a socket is counted and logged, the
descriptors kept free for what is already served (:class:`OpenFiles`), and whether the process shares its
ports with the other workers of its node (:func:`share_ports`).

**Open files.** Every accepted socket is a file descriptor, and so are what the connections already
served need more of: the log store's files (SQLite opens a reader connection per thread that reads), the
outbound connections (webhooks, federation, PostgreSQL, Redis), a TLS socket's hand-over. A flood of
connections must not take the last of them: a socket accepted while fewer than :func:`reserve` descriptors
are left under the soft ``RLIMIT_NOFILE`` is closed at once (the HTTP listener answers it ``503`` first),
counted in ``hubbub_limit_refusals_total{limit="open_files"}`` and logged as a warning at most once per
:data:`WARN_EVERY_S` per listener; accepting goes on as usual once descriptors are free again. The kernel
gives each new descriptor the lowest free number, so the accepted socket's own number tells, at no cost,
that every descriptor below it is taken.

Concurrency contract: everything here runs on the event loop thread.
"""

from __future__ import annotations

import logging
import resource
import time
from typing import Any, Final, Protocol, final

from hubbub.core.api import Core

__all__ = [
    "REFUSALS_LINGERING_MAX",
    "REFUSAL_LINGER_S",
    "WARN_EVERY_S",
    "BadInputLog",
    "OpenFiles",
    "Throttle",
    "peer_name",
    "reserve",
    "reuse_port",
    "share_ports",
]

#: Seconds a refused socket is kept, its answer sent and its write side shut, for the peer to read the
#: answer and close; then it is aborted.
REFUSAL_LINGER_S: Final = 2.0
#: Refused sockets kept that way at most, per listener; beyond, a refused socket is closed right after its
#: answer.
REFUSALS_LINGERING_MAX: Final = 64
#: Seconds between two warnings of one kind about bad input on a listener (the rest are counted).
WARN_EVERY_S: Final = 10.0


def peer_name(peername: object) -> str:
    """A socket's ``peername`` (``get_extra_info("peername")``) as ``ip:port`` (``[ip]:port`` for IPv6),
    "" when there is none (a Unix socket, a closed transport)."""
    if not isinstance(peername, tuple) or len(peername) < 2:
        return ""
    host, port = peername[0], peername[1]
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


#: Whether this process is one worker of a multi-worker node (``server.workers``): see :func:`share_ports`.
_shared_ports = False


def share_ports() -> None:
    """Make every listener of this process bind its port with ``SO_REUSEPORT``, beside the other workers of
    its node, which bind the same ports: the kernel spreads the connections over the workers. A property of
    the process (a worker serves nothing alone), set once by a worker before its server starts."""
    global _shared_ports
    _shared_ports = True


def reuse_port() -> bool | None:
    """``loop.create_server``'s ``reuse_port`` for this process's listeners (:func:`share_ports`; None:
    the default, off)."""
    return True if _shared_ports else None


@final
class Throttle:
    """At most one log record per ``interval`` seconds; those held back are counted into the next one."""

    __slots__ = ("held", "interval", "next_at")

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.next_at = 0.0
        self.held = 0

    def ready(self) -> int | None:
        """``None``: hold this record back. Else log it, with the number held back since the last one."""
        now = time.monotonic()
        if now < self.next_at:
            self.held += 1
            return None
        self.next_at = now + self.interval
        held, self.held = self.held, 0
        return held


@final
class BadInputLog:
    """A listener's bad input: each piece counted in ``hubbub_bad_input_total{dialect}`` and logged as a
    warning, at most once per :data:`WARN_EVERY_S` per kind (with the number held back since the last
    one), so that no client can fill the log."""

    __slots__ = ("_log", "_throttles", "dialect", "node")

    def __init__(self, node: Core, dialect: str, logger: logging.Logger) -> None:
        self.node = node
        self.dialect = dialect
        self._log = logger
        self._throttles: dict[str, Throttle] = {}

    def warn(self, kind: str, msg: str, *args: object) -> None:
        """Count one piece of bad input, and log ``msg % args`` unless a warning of the same ``kind`` was
        logged less than :data:`WARN_EVERY_S` ago."""
        self.node.metrics.count_bad_input(self.dialect)
        throttle = self._throttles.get(kind)
        if throttle is None:
            throttle = self._throttles[kind] = Throttle(WARN_EVERY_S)
        held = throttle.ready()
        if held is None:
            return
        if held:
            msg += f" ({held} more since the last such warning)"
        self._log.warning(msg, *args)


def reserve(limit: int) -> int:
    """Descriptors kept free under a soft limit of ``limit`` (module docstring, "Open files"): an eighth of
    it, at least 8 and at most 256 (a few threads' store readers and a node's outbound links)."""
    return max(8, min(256, limit // 8))


@final
class OpenFiles:
    """One listener's guard of the descriptors kept free (module docstring, "Open files").

    Concurrency contract: called from the event loop only, once per accepted socket."""

    __slots__ = ("_log", "_node", "_throttle", "dialect")

    def __init__(self, node: Core, dialect: str, logger: logging.Logger) -> None:
        self._node = node
        self.dialect = dialect
        self._log = logger
        self._throttle = Throttle(WARN_EVERY_S)

    def short(self, transport: _HasExtraInfo, ip: str) -> bool:
        """Whether the socket of ``transport``, just accepted, leaves fewer than :func:`reserve` descriptors
        free; if so it is counted and logged (throttled), and the caller closes it without serving it."""
        sock = transport.get_extra_info("socket")
        if sock is None:
            return False
        fd = sock.fileno()
        # Read at each accept (one system call): an operator may change a running process's limit (prlimit).
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if limit == resource.RLIM_INFINITY or fd < limit - reserve(limit):
            return False
        self._node.limiter.refused("open_files", self.dialect)
        held = self._throttle.ready()
        if held is not None:
            more = f" ({held} more since the last such warning)" if held else ""
            self._log.warning(
                "open files near the limit (descriptor %d of %d, %d kept free): connection from %s on the "
                "%s listener refused%s; raise the hard limit (LimitNOFILE=) or lower limits.max_connections",
                fd, limit, reserve(limit), ip, self.dialect, more,
            )  # fmt: skip
        return True


class _HasExtraInfo(Protocol):
    def get_extra_info(self, name: str, default: Any = None) -> Any: ...
