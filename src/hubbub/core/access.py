"""Access control for the node: authentication, the permission checks, token expiry, and the audit log.

:class:`Access` is the node's one enforcement point for every dialect (protocols README §6). Transports
extract a token from wherever their dialect carries it and call :meth:`Node.login` (a connection) or
:meth:`Node.authenticate` (one HTTP request); the node then checks every publish, subscription, log read
and admin operation against the identity through its :class:`~hubbub.auth.Authorizer`.

* A connection's identity lives on its :class:`~hubbub.core.session.Session` (``identity``). A token with
  an expiry arms one timer per connection (``loop.call_at``); when it fires the session is kicked with 4103
  (``token_expired``), which each dialect turns into its error and close. A refresh re-arms it.
* Refusals are logged on the ``hubbub.audit`` logger, one structured line each (``event``, ``code``,
  ``reason``, ``dialect``, ``peer``, ``user``), at most :data:`AUDIT_PER_S` a second with a count of the
  lines held back. Token values are never logged, nor kept.

Concurrency contract: called from the event loop thread only.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from typing import Final

from hubbub.auth import ANONYMOUS, AllowAll, Authenticator, Authorizer, Identity
from hubbub.channels import Pattern
from hubbub.disconnect import Disconnect
from hubbub.errors import CODES, AuthError
from hubbub.events import Position
from hubbub.log.consumers import ConsumerSpec, reach

from .limits import Limiter
from .replay import ReplayPlan
from .session import Session

__all__ = ["AUDIT_PER_S", "Access", "only_visible"]

audit_log = logging.getLogger("hubbub.audit")

#: Audit lines per second before further refusals are only counted (a client hammering a forbidden
#: channel must not flood the log).
AUDIT_PER_S: Final = 20


class Access:
    """See the module docstring. ``authenticator`` is ``None`` with ``auth.mode = off`` (everyone is
    :data:`~hubbub.auth.ANONYMOUS`); it may be replaced at any time (a key reload): identities already
    bound keep their permissions and expiry."""

    def __init__(
        self,
        authorizer: Authorizer | None = None,
        authenticator: Authenticator | None = None,
        limiter: Limiter | None = None,
    ) -> None:
        self.authorizer: Authorizer = authorizer or AllowAll()
        self.authenticator = authenticator
        self.limiter = limiter or Limiter()
        #: refusals by error name (auth_required, bad_token, token_expired, forbidden)
        self.refusals: dict[str, int] = {}
        self._timers: dict[Session, asyncio.TimerHandle] = {}
        self._audit_second = 0
        self._audit_lines = 0
        self._audit_held = 0

    # -- authentication ---------------------------------------------------------------------------------

    def authenticate(self, token: str | None, dialect: str, peer: str = "") -> Identity:
        """The identity of ``token``, or :class:`AuthError` (4100, 4101, 4103), audited."""
        if self.authenticator is None:
            return ANONYMOUS
        try:
            return self.authenticator.authenticate(token)
        except AuthError as exc:
            self.refused(exc, dialect, peer)
            raise

    def bind(self, session: Session, identity: Identity) -> None:
        """Make ``identity`` the session's, and arm its expiry timer (replacing any earlier one)."""
        session.identity = identity
        if self.authenticator is not None:
            session.user = identity.user
        old = self._timers.pop(session, None)
        if old is not None:
            old.cancel()
        if identity.expires is not None:
            loop = asyncio.get_running_loop()
            delay = max(0.0, identity.expires - time.time())
            self._timers[session] = loop.call_at(loop.time() + delay, self._expired, session)

    def unbind(self, session: Session) -> None:
        """The session is gone: disarm its timer. Idempotent."""
        t = self._timers.pop(session, None)
        if t is not None:
            t.cancel()

    def _expired(self, session: Session) -> None:
        self._timers.pop(session, None)
        self.refused(AuthError("token expired", code=4103), session.dialect, "", session.user)
        session.kick(Disconnect.TOKEN_EXPIRED)

    @property
    def timers(self) -> int:
        """Expiry timers armed (one per connection whose token expires)."""
        return len(self._timers)

    # -- permissions ------------------------------------------------------------------------------------

    def visibility(self, identity: Identity | None, pattern: Pattern) -> Callable[[str], bool] | None:
        """``None`` when ``identity`` may read everything ``pattern`` matches, else the per-channel check a
        subscription of it must apply (README §3: events the token may not read are skipped silently)."""
        az = self.authorizer
        if not az.enabled or az.reads_everything(identity, pattern):
            return None
        return functools.partial(az.may_subscribe, identity)

    def check_publish(self, identity: Identity | None, channel: str, dialect: str) -> None:
        try:
            self.authorizer.check_publish(identity, channel)
        except AuthError as exc:
            self.refused(exc, dialect, "", identity.user if identity else "", channel)
            raise

    def check_read(self, identity: Identity | None, channel: str, dialect: str) -> None:
        try:
            self.authorizer.check_read(identity, channel)
        except AuthError as exc:
            self.refused(exc, dialect, "", identity.user if identity else "", channel)
            raise

    def may_read(self, identity: Identity | None, channel: str) -> bool:
        return self.authorizer.may_subscribe(identity, channel)

    def may_admin(self, identity: Identity | None) -> bool:
        """Whether ``identity`` is an administrator (everyone is with auth off). Not a refusal: for what an
        answer leaves out for others, never audited."""
        return not self.authorizer.enabled or self.authorizer.may_admin(identity)

    def reader(self, identity: Identity) -> Callable[[str], bool]:
        """:meth:`may_read` for one identity, as a predicate over channels (thread-safe: it only reads the
        identity's grants), for reads that leave out what the identity may not read."""
        return functools.partial(self.authorizer.may_subscribe, identity)

    def check_admin(self, identity: Identity | None, dialect: str) -> None:
        try:
            self.authorizer.check_admin(identity)
        except AuthError as exc:
            self.refused(exc, dialect, "", identity.user if identity else "")
            raise

    def check_consumer(
        self,
        identity: Identity | None,
        spec: ConsumerSpec,
        dialect: str,
        *,
        manage: bool = False,
        create: bool = False,
    ) -> None:
        """The durable consumers' rule (docs/consumers.md "Permissions"), for every dialect alike. A consumer
        hands out every event it journals, unfiltered, and an ack removes them for every opener: using one
        (creating it, opening it, and so acking and nacking its batches) takes the subscribe permission over
        its whole :func:`~hubbub.log.consumers.reach` (nothing for a qpubs topic that never matches).
        ``create`` (a new consumer, whose owner the identity's user becomes) takes an identity with a user:
        tokens without one would all own alike. ``manage`` (deleting it) takes being its owner too; a
        consumer without one (made with auth off, or by an admin without a user) is managed by admins only.
        Admin may do all of it. Else ``AuthError`` 4102, audited."""
        az = self.authorizer
        if not az.enabled or az.may_admin(identity):
            return
        scope = reach(spec)
        user = identity.user if identity is not None else ""
        if identity is None or (scope is not None and not az.reads_everything(identity, scope)):
            exc = AuthError("consume not allowed", code=4102)
        elif create and not user:
            exc = AuthError("a consumer is created by a token with a user", code=4102)
        elif manage and (not spec.owner or spec.owner != user):
            exc = AuthError("consumer of another user", code=4102)
        else:
            return
        self.refused(exc, dialect, "", user, scope.text if scope is not None else "")
        raise exc

    # -- audit ------------------------------------------------------------------------------------------

    def refused(
        self, exc: AuthError, dialect: str, peer: str = "", user: str = "", channel: str = ""
    ) -> None:
        """Count and audit one refusal. Never given, and so never logs, the token."""
        name = CODES.get(exc.code, ("auth_error",))[0]
        self.refusals[name] = self.refusals.get(name, 0) + 1
        now = int(time.monotonic())
        if now != self._audit_second:
            if self._audit_held:
                audit_log.warning(
                    "auth refusals not logged", extra={"event": "auth_suppressed", "count": self._audit_held}
                )
            self._audit_second, self._audit_lines, self._audit_held = now, 0, 0
        if self._audit_lines >= AUDIT_PER_S:
            self._audit_held += 1
            return
        self._audit_lines += 1
        extra = {"event": "auth_refused", "code": exc.code, "reason": exc.detail or name, "dialect": dialect}
        if peer:
            extra["peer"] = peer
        if user:
            extra["user"] = user
        if channel:
            extra["channel"] = channel
        audit_log.warning("auth refused: %s", name, extra=extra)


def only_visible(plan: ReplayPlan, pattern: Pattern, visible: Callable[[str], bool]) -> None:
    """Cut a replay plan down to the channels the subscriber may read (README §3: the others are skipped
    silently; an exact channel it may not read looks like a channel that never had an event)."""
    plan.events = [e for e in plan.events if visible(e.channel)]
    plan.gaps = [g for g in plan.gaps if visible(g.channel)]
    plan.ahead = [ch for ch in plan.ahead if visible(ch)]
    if plan.span is not None and not visible(plan.span.channel):
        plan.span = None
    if (
        pattern.is_exact
        and plan.position is not None
        and not visible("/" + "/".join(map(str, pattern.parts)))
    ):
        plan.position = Position(0, "")
