"""Authentication and authorization (protocols README §6).

* :class:`~hubbub.auth.tokens.Authenticator` turns a token into an :class:`~hubbub.auth.grants.Identity`
  (static tokens from ``auth.tokens``, JWTs signed HS256 or RS256). Every dialect only extracts the token
  from wherever it travels and hands it over (through ``Node.login`` / ``Node.authenticate`` in the core).
* :class:`Authorizer` decides, for an identity, whether it may publish to a channel, read a channel
  (subscribe, log reads) and run admin operations (trim). The node calls it at its one enforcement point
  for every dialect. :class:`AllowAll` is ``auth.mode = off``; :class:`TokenAuthorizer` is ``token``.

Concurrency contract: everything here is synchronous and pure (no sockets, no asyncio); key files are read
only by :func:`~hubbub.auth.tokens.load_keys`, at start-up and reload, from the composition root.
"""

from __future__ import annotations

import abc

from hubbub.errors import AuthError

from .grants import ANONYMOUS, EVERYTHING, NOTHING, Grant, Identity, covers
from .tokens import Authenticator, KeySet, StaticTokens, load_keys, parse_static_tokens

__all__ = [
    "ANONYMOUS",
    "EVERYTHING",
    "NOTHING",
    "AllowAll",
    "Authenticator",
    "Authorizer",
    "Grant",
    "Identity",
    "KeySet",
    "StaticTokens",
    "TokenAuthorizer",
    "covers",
    "load_keys",
    "parse_static_tokens",
]


class Authorizer(abc.ABC):
    """Decides who may publish to and read from which channel, and who may administer the log.

    ``identity`` is ``None`` for a connection that has not authenticated (a dialect whose token
    presentation is not served yet): a token authorizer refuses it everything.
    """

    #: False when every identity may do everything (``auth.mode = off``): callers skip per-event checks.
    enabled: bool = True

    @abc.abstractmethod
    def may_publish(self, identity: Identity | None, channel: str) -> bool: ...

    @abc.abstractmethod
    def may_subscribe(self, identity: Identity | None, channel: str) -> bool:
        """Whether ``identity`` may read ``channel``: receive its events, replay it, read its log."""

    @abc.abstractmethod
    def may_admin(self, identity: Identity | None) -> bool: ...

    def reads_everything(self, identity: Identity | None, pattern: object) -> bool:
        """Whether ``identity`` may read every channel ``pattern`` (a :class:`~hubbub.channels.Pattern`)
        can match, so that a subscription needs no per-event check."""
        return not self.enabled

    def check_publish(self, identity: Identity | None, channel: str) -> None:
        """Raise ``AuthError`` (4102 forbidden) when ``identity`` may not publish to ``channel``."""
        if not self.may_publish(identity, channel):
            raise AuthError("publish not allowed", code=4102)

    def check_read(self, identity: Identity | None, channel: str) -> None:
        """Raise ``AuthError`` (4102 forbidden) when ``identity`` may not read ``channel``."""
        if not self.may_subscribe(identity, channel):
            raise AuthError("read not allowed", code=4102)

    def check_admin(self, identity: Identity | None) -> None:
        """Raise ``AuthError`` (4102 forbidden) when ``identity`` is not an administrator."""
        if not self.may_admin(identity):
            raise AuthError("admin operation not allowed", code=4102)


class AllowAll(Authorizer):
    """Everyone may publish, read and administer everywhere (``auth.mode = off``)."""

    enabled = False

    def may_publish(self, identity: Identity | None, channel: str) -> bool:
        return True

    def may_subscribe(self, identity: Identity | None, channel: str) -> bool:
        return True

    def may_admin(self, identity: Identity | None) -> bool:
        return True

    def check_publish(self, identity: Identity | None, channel: str) -> None:
        return None


class TokenAuthorizer(Authorizer):
    """``auth.mode = token``: the identity's grants decide; no identity may do nothing."""

    def may_publish(self, identity: Identity | None, channel: str) -> bool:
        return identity is not None and identity.publish.allows(channel)

    def may_subscribe(self, identity: Identity | None, channel: str) -> bool:
        return identity is not None and identity.subscribe.allows(channel)

    def may_admin(self, identity: Identity | None) -> bool:
        return identity is not None and identity.admin

    def reads_everything(self, identity: Identity | None, pattern: object) -> bool:
        from hubbub.channels import Pattern

        return identity is not None and isinstance(pattern, Pattern) and identity.subscribe.covers(pattern)
