"""Why a connection is closed: one enum for every dialect and transport.

Each :class:`Disconnect` carries the close ``code`` (a WebSocket close code; the native codes 4000-4399 of
:data:`hubbub.errors.CODES` double as WebSocket close codes, and TCP dialects send the matching error frame),
a fixed public ``reason`` and whether the condition is ``temporary`` (a client may reconnect and retry as it
is). Transports never close with a bare integer: they close with a member, and the member's ``code`` is what
goes on the wire. As nats-server's ``ClosedState`` and centrifuge's ``Disconnect`` values, the set is closed:
a new reason is a new member here, documented once.

The members are ``int`` subclasses (``IntEnum``), so a member compares equal to its code and goes to any API
that takes a close code (aiohttp's ``ws.close(code=...)``) as it is. :meth:`Disconnect.of` maps a
:class:`~hubbub.errors.HubbubError` code to its member.

This module is a leaf: standard library only, so dialects, core and transports all use it.
"""

from __future__ import annotations

import enum

__all__ = ["Disconnect"]


class Disconnect(enum.IntEnum):
    """A close reason: ``code`` (its value), ``reason`` (fixed public text) and ``temporary``."""

    _value_: int
    reason: str
    temporary: bool

    def __new__(cls, code: int, reason: str, temporary: bool) -> Disconnect:
        member = int.__new__(cls, code)
        member._value_ = code
        member.reason = reason
        member.temporary = temporary
        return member

    @property
    def code(self) -> int:
        """The close code on the wire."""
        return int(self._value_)

    @classmethod
    def of(cls, code: int) -> Disconnect:
        """The member for a close or error code (a :class:`~hubbub.errors.HubbubError` ``code``); an unknown
        code is :attr:`INTERNAL`, never a bare number on the wire."""
        return _BY_CODE.get(code, cls.INTERNAL)

    # -- WebSocket (RFC 6455 §7.4.1) close codes, for dialects that close with those ---------------------
    NORMAL = (1000, "normal closure", False)
    GOING_AWAY = (1001, "going away", True)
    PROTOCOL_ERROR = (1002, "protocol error", False)
    UNSUPPORTED_DATA = (1003, "unsupported data", False)
    #: A frame whose payload cannot be decoded (wearscript: not one msgpack array with a string channel).
    INVALID_PAYLOAD = (1007, "invalid frame payload data", False)
    POLICY_VIOLATION = (1008, "policy violation", False)
    MESSAGE_TOO_BIG = (1009, "message too big", False)
    INTERNAL_ERROR = (1011, "internal error", True)
    #: A slow consumer of a dialect that closes with WebSocket codes (guble, ivy).
    TRY_AGAIN_LATER = (1013, "try again later", True)

    # -- native codes (native.md §7, hubbub.errors.CODES): the connection-level ones ---------------------
    BAD_FRAME = (4000, "bad frame", False)
    BAD_REQUEST = (4001, "bad request", False)
    UNKNOWN_OP = (4002, "unknown op", False)
    FRAME_TOO_LARGE = (4003, "frame too large", False)
    BAD_CHANNEL = (4004, "bad channel", False)
    HELLO_REQUIRED = (4005, "hello required", False)
    UNSUPPORTED_VERSION = (4006, "unsupported version", False)
    TOO_MANY_SUBSCRIPTIONS = (4007, "too many subscriptions", False)
    RATE_LIMITED = (4008, "rate limited", True)
    TOO_MANY_CONNECTIONS = (4009, "too many connections", True)
    AUTH_REQUIRED = (4100, "auth required", False)
    BAD_TOKEN = (4101, "bad token", False)
    FORBIDDEN = (4102, "forbidden", False)
    TOKEN_EXPIRED = (4103, "token expired", True)
    ALREADY_SUBSCRIBED = (4200, "already subscribed", False)
    NOT_SUBSCRIBED = (4201, "not subscribed", False)
    EPOCH_MISMATCH = (4202, "epoch mismatch", False)
    RECOVERY_TOO_LARGE = (4203, "recovery too large", False)
    CONSUMER_NOT_FOUND = (4204, "consumer not found", False)
    CONSUMER_EXISTS = (4205, "consumer exists", False)
    CONSUMER_BUSY = (4206, "consumer busy", False)
    UNKNOWN_BATCH = (4207, "unknown batch", False)
    INTERNAL = (4300, "internal", True)
    UNAVAILABLE = (4301, "unavailable", True)
    SLOW_CONSUMER = (4302, "slow consumer", True)
    SHUTTING_DOWN = (4303, "shutting down", True)
    TIMEOUT = (4304, "timeout", True)


_BY_CODE: dict[int, Disconnect] = {m.code: m for m in Disconnect}
