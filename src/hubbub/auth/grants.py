"""Identities and their permissions: who a connection is, and which channels it may publish to and read.

A :class:`Grant` is a set of native patterns (native.md §4). An :class:`Identity` is what a verified token
gives: the user, a publish grant, a subscribe grant and the admin flag, and when it expires.

Concurrency contract: identities and grants are immutable as far as callers can see; a grant's answer cache
is a plain dict filled from the event loop thread only (``allows`` may be called from other threads, which
then at worst recompute an answer).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from hubbub.channels import Pattern, parse_pattern

__all__ = ["ANONYMOUS", "EVERYTHING", "NOTHING", "Grant", "Identity", "covers"]

#: Answers a grant keeps (channel -> allowed); cleared when full.
GRANT_CACHE: Final = 1024


def covers(outer: Pattern, inner: Pattern) -> bool:
    """Whether every channel ``inner`` matches is also matched by ``outer`` (exact, not approximate: the
    pattern language has only one-segment slots and a trailing subtree)."""
    op, ip = outer.parts, inner.parts
    if outer.subtree:
        if len(ip) < len(op):
            return False
    elif inner.subtree or len(ip) != len(op):
        return False
    # A ``*`` of inner is covered only by a ``*`` of outer; a literal of inner by ``*`` or the same literal.
    return all(o is None or o == i for o, i in zip(op, ip, strict=False))


class Grant:
    """Permission patterns. ``allows(channel)`` answers whether any pattern matches the channel;
    ``covers(pattern)`` whether one pattern alone covers everything ``pattern`` can match (then a
    subscription needs no per-event check)."""

    __slots__ = ("_cache", "everything", "patterns")

    def __init__(self, patterns: Iterable[Pattern]) -> None:
        self.patterns: tuple[Pattern, ...] = tuple(patterns)
        #: True when the grant holds ``/**``: every channel, with no lookup at all.
        self.everything = any(p.subtree and not p.parts for p in self.patterns)
        self._cache: dict[str, bool] = {}

    @classmethod
    def parse(cls, texts: Iterable[str]) -> Grant:
        """Raises :class:`~hubbub.errors.BadChannel` for an invalid pattern."""
        return cls(parse_pattern(t) for t in texts)

    def allows(self, channel: str) -> bool:
        if self.everything:
            return True
        hit = self._cache.get(channel)
        if hit is None:
            hit = any(p.matches(channel) for p in self.patterns)
            if len(self._cache) >= GRANT_CACHE:
                self._cache.clear()
            self._cache[channel] = hit
        return hit

    def covers(self, pattern: Pattern) -> bool:
        return self.everything or any(covers(p, pattern) for p in self.patterns)

    @property
    def texts(self) -> list[str]:
        return [p.text for p in self.patterns]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Grant) and self.patterns == other.patterns

    def __hash__(self) -> int:
        return hash(self.patterns)

    def __repr__(self) -> str:
        return f"Grant({self.texts!r})"


EVERYTHING: Final = Grant.parse(["/**"])
NOTHING: Final = Grant(())


@dataclass(frozen=True, slots=True)
class Identity:
    """A verified principal. ``expires`` is the Unix time (seconds) after which the token no longer holds,
    the clock-skew allowance included, or ``None``. ``via`` says how it was established: ``static``,
    ``jwt`` or ``anonymous``. Never holds the token itself."""

    user: str
    publish: Grant = field(default=EVERYTHING)
    subscribe: Grant = field(default=EVERYTHING)
    admin: bool = False
    expires: float | None = None
    via: str = "anonymous"


#: The identity of every connection when ``auth.mode = off``.
ANONYMOUS: Final = Identity("", EVERYTHING, EVERYTHING, admin=True)
