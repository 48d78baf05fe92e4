"""What every listener (the HTTP listener, ``transports/http_listener.py``, and the byte-stream listeners,
``transports/stream_listener.py``) shares about the sockets it accepts: how long a refused socket is kept
and how many at most, how bad input seen before any dialect reads a socket is counted and logged, and
whether the process shares its ports with the other workers of its node (:func:`share_ports`).

Concurrency contract: everything here runs on the event loop thread.
"""

from __future__ import annotations

import logging
import time
from typing import Final, final

from hubbub.core.api import Core

__all__ = [
    "REFUSALS_LINGERING_MAX",
    "REFUSAL_LINGER_S",
    "WARN_EVERY_S",
    "BadInputLog",
    "Throttle",
    "peer_name",
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
