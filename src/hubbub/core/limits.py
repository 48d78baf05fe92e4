"""Abuse limits shared by every dialect: publish rate per connection, connections in all and per address.

The node owns one :class:`Limiter`; transports ask it to admit a connection (:meth:`Limiter.admit`) and
release it when the connection ends, and the node takes a token from the connection's
:class:`TokenBucket` for each publish. Every refusal is counted by limit and dialect for ``/metrics``
(``hubbub_limit_refusals_total``).

The connection limits are the node's: on a node of several worker processes the composition root gives the
limiter the workers' shared counts (:class:`SharedCounts`, ``workers/admission.py``), which decide every
admission for the whole node; the limiter then keeps only its own process's record for releases.

Concurrency contract: called from the event loop thread only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Final, Protocol, final

__all__ = ["LIMIT_NAMES", "LimitSettings", "Limiter", "SharedCounts", "TokenBucket"]

#: The label values of ``hubbub_limit_refusals_total``.
LIMIT_NAMES: Final = (
    "publish_rate",
    "max_connections",
    "max_connections_per_ip",
    "max_subscriptions",
    "max_frame",
    "max_consumers",
    "open_files",  # a socket accepted while the process is short of descriptors (transports/accept.py)
)


@dataclass(frozen=True, slots=True)
class LimitSettings:
    """``limits.publish_rate`` (publishes per second per connection) and ``limits.publish_burst`` (the
    bucket's size; 0 means one second's worth), ``limits.max_connections`` and
    ``limits.max_connections_per_ip``. 0 turns a limit off."""

    publish_rate: int = 0
    publish_burst: int = 0
    max_connections: int = 0
    max_connections_per_ip: int = 0


@final
class TokenBucket:
    """A token bucket: ``rate`` tokens a second, holding at most ``burst``. Starts full."""

    __slots__ = ("burst", "rate", "stamp", "tokens")

    def __init__(self, rate: float, burst: float) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.stamp = time.monotonic()

    def take(self, n: int = 1) -> bool:
        """Take ``n`` tokens if there are that many (after refilling); False, and take none, if not."""
        tokens = self.tokens
        if tokens < n:
            now = time.monotonic()
            tokens = min(self.burst, tokens + (now - self.stamp) * self.rate)
            self.stamp = now
            if tokens < n:
                self.tokens = tokens
                return False
        self.tokens = tokens - n
        return True


class SharedCounts(Protocol):
    """Connection counts several processes share (a multi-worker node's), with the limits in them."""

    def admit(self, ip: str) -> str | None:
        """Take a place for a connection from ``ip``: ``None``, or the name of the limit the node is at."""

    def release(self, ip: str) -> None:
        """Give back a place :meth:`admit` took."""


@final
class Limiter:
    """The node's limits. :meth:`admit` and :meth:`release` count connections; :meth:`bucket` makes a
    connection's publish bucket (``None`` when the rate is unlimited); :meth:`refused` counts a refusal."""

    __slots__ = ("_by_ip", "_total", "refusals", "settings", "shared")

    def __init__(self, settings: LimitSettings | None = None) -> None:
        self.settings = settings or LimitSettings()
        self._total = 0
        self._by_ip: dict[str, int] = {}
        #: The node's counts shared with its other processes (None: this process is the node).
        self.shared: SharedCounts | None = None
        #: (limit name, dialect) -> refusals
        self.refusals: dict[tuple[str, str], int] = {}

    def refused(self, limit: str, dialect: str) -> None:
        key = (limit, dialect)
        self.refusals[key] = self.refusals.get(key, 0) + 1

    def admit(self, ip: str, dialect: str) -> str | None:
        """Count a new connection from ``ip``; returns ``None`` when admitted (then :meth:`release` it once
        it ends), else the name of the limit it is over (counted; nothing to release)."""
        s = self.settings
        n = self._by_ip.get(ip, 0)
        if self.shared is not None:
            over = self.shared.admit(ip)
            if over is not None:
                self.refused(over, dialect)
                return over
        elif s.max_connections and self._total >= s.max_connections:
            self.refused("max_connections", dialect)
            return "max_connections"
        elif s.max_connections_per_ip and n >= s.max_connections_per_ip:
            self.refused("max_connections_per_ip", dialect)
            return "max_connections_per_ip"
        self._total += 1
        self._by_ip[ip] = n + 1
        return None

    def release(self, ip: str) -> None:
        n = self._by_ip.get(ip, 0)
        if n <= 0:
            return
        if self.shared is not None:
            self.shared.release(ip)
        self._total -= 1
        if n == 1:
            del self._by_ip[ip]
        else:
            self._by_ip[ip] = n - 1

    def bucket(self) -> TokenBucket | None:
        s = self.settings
        if not s.publish_rate:
            return None
        return TokenBucket(s.publish_rate, s.publish_burst or s.publish_rate)

    @property
    def connections(self) -> int:
        return self._total
