"""When a connector tries a push again, and when it stops (docs/connectors.md "Retries"): the pure schedule
of one item (:class:`RetryPolicy`), the reading of ``Retry-After`` (:func:`parse_retry_after`), and the
connector-wide pause while a provider refuses the connector's own credentials (:class:`CredentialPause`).

The schedule follows what the webhook services users know do (Svix: about a day of tries, Stripe: three
days, then the message is marked failed and the next goes): an item a target keeps failing (5xx, 429, no
answer) is tried again with a doubling backoff, at most ``max_attempts`` times (0: no count) and for at most
``max_retry_s`` from its first try on the node delivering it (0: no bound), then dead-lettered with its last
failure's reason so that delivery goes on. A provider's ``Retry-After`` is honoured, but never sooner than
``retry_after_min_s`` (``Retry-After: 0`` would otherwise make a loop of requests) nor later than
``retry_after_max_s``.

A refusal of the connector's credentials (FCM's or APNs's 401 and 403, Vonage's bad credentials) is no
fault of the item or of its device: every subscription of the connector would fail the same way until an
operator fixes the key. Dead-lettering after the bound would turn that configuration mistake into every
device's messages going to the dead-letter channel, and retrying each subscription on its own would send
one request per subscription per backoff to a provider that refuses them all. So the connector pauses
instead: it logs at error once (and once more every ``LOG_EVERY_S`` while paused), shows ``paused`` with
the reason in ``GET /api/v1/connectors`` and ``hubbub_connector_paused`` in ``/metrics``, and sends one
probe at a time (the item that was refused, or the next one due), ``first_s`` after the refusal, doubling up
to ``max_s``; a probe the provider does not refuse for its credentials resumes every subscription. Events go
on being journaled meanwhile (the durable consumers hold the backlog), and the time paused does not count
toward an item's ``max_retry_s``.

Concurrency contract: :class:`CredentialPause` is used on the event loop thread only.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import random
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Final

__all__ = ["LOG_EVERY_S", "CredentialPause", "RetryPolicy", "parse_retry_after"]

log = logging.getLogger("hubbub.connectors")

#: While paused, the error is logged again this often.
LOG_EVERY_S: Final = 300.0


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """The schedule of one item's tries (module docstring): the backoff ``base_s * 2**attempt``, at most
    ``max_s``, with up to 10 % random added so that many subscriptions do not retry in step; a provider's
    ``Retry-After`` instead, within ``[retry_after_min_s, retry_after_max_s]``; at most ``max_attempts``
    tries (0: no count) and ``max_retry_s`` seconds (0: no bound), then the item is dead-lettered."""

    base_s: float = 0.2
    max_s: float = 30.0
    retry_after_max_s: float = 300.0
    max_attempts: int = 0
    #: A day: about Svix's schedule (Stripe's is three days).
    max_retry_s: float = 86400.0
    retry_after_min_s: float = 1.0

    def delay(self, attempt: int, after_s: float | None) -> float:
        """The wait before try ``attempt + 1`` (``after_s``: the provider's ``Retry-After``)."""
        if after_s is not None:
            return min(max(after_s, self.retry_after_min_s), self.retry_after_max_s)
        d: float = min(self.base_s * 2.0 ** min(attempt, 30), self.max_s)
        return d + d * 0.1 * random.random()

    def next_delay(self, attempts: int, after_s: float | None, elapsed_s: float) -> float | None:
        """The wait before the next try of an item tried ``attempts`` times over ``elapsed_s`` seconds, or
        None when it is spent (the count reached, or the next try would come past ``max_retry_s``)."""
        if self.max_attempts and attempts >= self.max_attempts:
            return None
        d = self.delay(attempts - 1, after_s)
        if self.max_retry_s and elapsed_s + d > self.max_retry_s:
            return None
        return d


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """An HTTP ``Retry-After`` (RFC 9110 §10.2.3) as seconds from ``now``: delta-seconds or an HTTP date;
    ``None`` when absent or unreadable (the backoff applies then)."""
    if not value:
        return None
    v = value.strip()
    if v.isdigit():
        return float(int(v))
    try:
        when = email.utils.parsedate_to_datetime(v)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


class CredentialPause:
    """A connector's pause while its provider refuses its credentials (module docstring). ``name``: the
    connector's, for the log."""

    def __init__(self, name: str, first_s: float = 1.0, max_s: float = 60.0) -> None:
        self.name = name
        self.first_s = first_s
        self.max_s = max_s
        #: The refusal's reason while paused, else "".
        self.reason = ""
        #: When the pause began (seconds since the epoch), and the probes sent since.
        self.since = 0.0
        self.probes = 0
        self._delay = first_s
        #: The probes counted when the delay last doubled: refusals of pushes already in flight when the
        #: pause began do not double it, only a probe's.
        self._doubled_at = 0
        self._logged = 0.0
        self._probing = asyncio.Lock()

    @property
    def active(self) -> bool:
        return bool(self.reason)

    def refused(self, reason: str) -> None:
        """The provider refused the connector's credentials: pause (or stay paused, backing off)."""
        now = time.monotonic()
        if not self.active:
            self.reason, self.since, self.probes, self._delay = reason, time.time(), 0, self.first_s
            self._doubled_at = 0
            self._logged = now
            log.error(
                "connector %s: the provider refuses its credentials (%s): every subscription is paused "
                "until it accepts them again (fix the key or certificate; nothing is dropped)",
                self.name,
                reason,
            )
            return
        self.reason = reason
        if self.probes > self._doubled_at:
            self._doubled_at = self.probes
            self._delay = min(self._delay * 2.0, self.max_s)
        if now - self._logged >= LOG_EVERY_S:
            self._logged = now
            log.error(
                "connector %s: still paused, the provider refuses its credentials (%s) since %s",
                self.name,
                reason,
                time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.since)),
            )

    def accepted(self) -> None:
        """The provider took a push (or refused it for another cause than the credentials): resume."""
        if self.active:
            log.warning(
                "connector %s: the provider accepts its credentials again after %.0f s: resumed",
                self.name,
                time.time() - self.since,
            )
            self.reason = ""

    @asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        """A push's turn to go: at once when not paused; while paused, one push at a time, each a probe sent
        after the current backoff."""
        if not self.active:
            yield
            return
        async with self._probing:
            if self.active:
                await asyncio.sleep(self._delay)
                self.probes += 1
            yield

    def status(self) -> dict[str, Any] | None:
        if not self.active:
            return None
        return {"reason": self.reason, "since": self.since, "probes": self.probes}
