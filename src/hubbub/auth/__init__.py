"""Authorization. For now one implementation: :class:`AllowAll` (``auth.mode = off``).

Concurrency contract: authorizers are pure and synchronous; they may be called from any thread.
"""

from __future__ import annotations

import abc

from hubbub.errors import AuthError

__all__ = ["AllowAll", "Authorizer"]


class Authorizer(abc.ABC):
    """Decides who may publish to and read from which channel."""

    @abc.abstractmethod
    def may_publish(self, user: str, channel: str) -> bool: ...

    @abc.abstractmethod
    def may_subscribe(self, user: str, channel: str) -> bool: ...

    def check_publish(self, user: str, channel: str) -> None:
        """Raise ``AuthError`` (4102 forbidden) when ``user`` may not publish to ``channel``."""
        if not self.may_publish(user, channel):
            raise AuthError("publish not allowed", code=4102)


class AllowAll(Authorizer):
    """Everyone may publish and subscribe everywhere (``auth.mode = off``)."""

    def may_publish(self, user: str, channel: str) -> bool:
        return True

    def may_subscribe(self, user: str, channel: str) -> bool:
        return True
