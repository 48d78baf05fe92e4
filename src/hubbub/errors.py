"""One error tree for hubbub.

::

    HubbubError                     base of everything hubbub raises on purpose
    ├── ProtocolError               bad input from a peer; carries a wire ``code`` (native.md §7)
    │   ├── FrameTooLarge           a frame, line or body over ``limits.max_frame``       (4003)
    │   ├── BadFrame                not JSON/msgpack, not an object, bad UTF-8             (4000)
    │   ├── BadRequest              missing or invalid field                               (4001)
    │   ├── UnknownOp               unknown command                                        (4002)
    │   └── BadChannel              invalid channel or pattern, or over the limit          (4004)
    ├── LimitExceeded               too many subscriptions, tags or headers                (4007)
    │   ├── RateLimited             publishes over the connection's rate and burst         (4008)
    │   ├── TooManyConnections      over limits.max_connections(_per_ip)                   (4009)
    │   └── TooManyConsumers        a new durable consumer past limits.max_consumers       (4007)
    ├── AuthError                   authentication and permission                        (4100-4103)
    ├── SubscriptionError           already / not subscribed, recovery too large          (4200-4203)
    ├── ConsumerError               durable consumers (docs/consumers.md)                 (4204-4207)
    │   ├── ConsumerNotFound        no such consumer                                       (4204)
    │   ├── ConsumerExists          exists, and the open may not reuse it                  (4205)
    │   ├── ConsumerBusy            open elsewhere, and not shared on both sides           (4206)
    │   └── UnknownBatch            ack or nack of a batch that this opener does not hold  (4207)
    ├── EpochMismatch               a request names an epoch it cannot act on; ``head``    (4202)
    ├── TrimError                   ``LogStore.trim`` cannot do what it was asked
    │   ├── TrimOutOfRange          seq negative or beyond the epoch's top                 (4001)
    │   └── TrimEpochGone           the epoch is neither the current one nor a retired one (4202)
    │                               holding events (also an ``EpochMismatch``)
    ├── StorageError                the log cannot commit or read                          (4301)
    ├── ShuttingDown                the node is stopping                                   (4303)
    ├── PublishRefused              a pipelined publish the server refused; ``error``      (its code)
    └── PipelineError               a data pipeline failure, its message fit for the user  (4300)
        ├── EpochChanged            a read's channel was reset under it (a new epoch)
        └── DataLossError           a stream found a channel reset or trimmed past its offset

Codes 4000-4399 are the native protocol's (native.md §7) and double as WebSocket close codes. Dialects map
them to their own error replies. ``message`` is the fixed public text for the code (its name, native.md §7),
or where one code stands for several refusals, the fixed public text of the one refused (4007's ``too many
tags (at most 64)``, which names the limit; ``public``): it never carries internals (tracebacks, paths, SQL),
nor anything the request sent. Optional ``detail`` is a short, safe explanation for humans.
"""

from __future__ import annotations

from typing import Protocol

__all__ = [
    "CODES",
    "AuthError",
    "BadChannel",
    "BadFrame",
    "BadRequest",
    "ConsumerBusy",
    "ConsumerError",
    "ConsumerExists",
    "ConsumerNotFound",
    "DataLossError",
    "EpochChanged",
    "EpochMismatch",
    "FrameTooLarge",
    "HubbubError",
    "LimitExceeded",
    "PipelineError",
    "ProtocolError",
    "PublishRefused",
    "RateLimited",
    "ShuttingDown",
    "StorageError",
    "SubscriptionError",
    "TooManyConnections",
    "TooManyConsumers",
    "TrimEpochGone",
    "TrimError",
    "TrimOutOfRange",
    "UnknownBatch",
    "UnknownOp",
    "http_status",
    "is_fatal",
    "is_temporary",
]

# code -> (name, temporary, fatal, http status or 0)
CODES: dict[int, tuple[str, bool, bool, int]] = {
    4000: ("bad_frame", False, True, 400),
    4001: ("bad_request", False, False, 400),
    4002: ("unknown_op", False, False, 0),
    4003: ("frame_too_large", False, True, 413),
    4004: ("bad_channel", False, False, 400),
    4005: ("hello_required", False, True, 0),
    4006: ("unsupported_version", False, True, 0),
    4007: ("too_many_subscriptions", False, False, 400),
    4008: ("rate_limited", True, False, 429),
    4009: ("too_many_connections", True, True, 503),
    4100: ("auth_required", False, True, 401),
    4101: ("bad_token", False, True, 401),
    4102: ("forbidden", False, False, 403),
    4103: ("token_expired", True, True, 401),
    4200: ("already_subscribed", False, False, 0),
    4201: ("not_subscribed", False, False, 0),
    4202: ("epoch_mismatch", False, False, 409),
    4203: ("recovery_too_large", False, False, 400),
    4204: ("consumer_not_found", False, False, 404),
    4205: ("consumer_exists", False, False, 409),
    4206: ("consumer_busy", False, False, 409),
    4207: ("unknown_batch", False, False, 400),
    4300: ("internal", True, False, 500),
    4301: ("unavailable", True, False, 503),
    4302: ("slow_consumer", True, True, 0),
    4303: ("shutting_down", True, True, 503),
    4304: ("timeout", True, True, 0),
}


def is_temporary(code: int) -> bool:
    return CODES.get(code, ("", False, False, 0))[1]


def is_fatal(code: int) -> bool:
    return CODES.get(code, ("", False, True, 0))[2]


def http_status(code: int) -> int:
    return CODES.get(code, ("", False, False, 500))[3] or 400


class HubbubError(Exception):
    """Base class. ``code`` is a native error code from :data:`CODES`."""

    code: int = 4300
    #: The public text that replaces the code's name in :attr:`message`, when set (see the module docstring).
    public: str = ""
    #: The row of a native ``publish_batch`` frame this error is about, when it is about one (the error frame
    #: then carries it as ``row``: docs/native.md "Batched publishes").
    row: int | None = None

    def __init__(
        self, detail: str = "", *, code: int | None = None, request_id: int | None = None, public: str = ""
    ) -> None:
        if code is not None:
            self.code = code
        if public:
            self.public = public
        self.detail = detail
        #: The id of the request this error answers, when known (native ``id``).
        self.request_id = request_id
        super().__init__(detail or self.message)

    @property
    def message(self) -> str:
        """The fixed public text: ``public``, or the code's name with ``_`` as spaces."""
        return self.public or CODES.get(self.code, ("internal",))[0].replace("_", " ")

    @property
    def temporary(self) -> bool:
        return is_temporary(self.code)

    @property
    def fatal(self) -> bool:
        return is_fatal(self.code)


class ProtocolError(HubbubError):
    code = 4000


class BadFrame(ProtocolError):
    code = 4000


class BadRequest(ProtocolError):
    code = 4001


class UnknownOp(ProtocolError):
    code = 4002


class FrameTooLarge(ProtocolError):
    code = 4003


class BadChannel(ProtocolError):
    code = 4004


class LimitExceeded(HubbubError):
    code = 4007


class RateLimited(LimitExceeded):
    code = 4008


class TooManyConnections(LimitExceeded):
    code = 4009


class TooManyConsumers(LimitExceeded):
    """Creating a durable consumer past ``limits.max_consumers``."""


class AuthError(HubbubError):
    code = 4101


class SubscriptionError(HubbubError):
    code = 4200


class ConsumerError(HubbubError):
    code = 4204


class ConsumerNotFound(ConsumerError):
    code = 4204


class ConsumerExists(ConsumerError):
    code = 4205


class ConsumerBusy(ConsumerError):
    code = 4206


class UnknownBatch(ConsumerError):
    code = 4207


class StorageError(HubbubError):
    code = 4301


class ShuttingDown(HubbubError):
    code = 4303


class Head(Protocol):
    """A channel's position as errors carry it (``hubbub.log.ChannelInfo`` is one)."""

    @property
    def channel(self) -> str: ...

    @property
    def epoch(self) -> str: ...

    @property
    def top(self) -> int: ...


class EpochMismatch(HubbubError):
    """A request named an epoch it cannot act on: not the channel's current one (or, for a trim, neither the
    current one nor a retired one holding events); ``head`` is the channel's current position (epoch ``""``
    for a channel that never had an event). HTTP answers 409 with that position."""

    code = 4202

    def __init__(self, head: Head, detail: str = "") -> None:
        super().__init__(detail or f"the channel's epoch is {head.epoch!r}")
        self.head = head


class TrimError(HubbubError):
    """``LogStore.trim`` cannot do what it was asked (the log is unchanged)."""

    code = 4001


class TrimOutOfRange(TrimError):
    """The seq to trim up to is negative or beyond the top of the epoch named (``top``; 0 for a channel that
    never had an event). A caller's error: HTTP answers 400."""

    code = 4001

    def __init__(self, seq: int, top: int) -> None:
        super().__init__(f"cannot trim to seq {seq}: must be between 0 and the top ({top})")
        self.seq = seq
        self.top = top


class TrimEpochGone(TrimError, EpochMismatch):
    """The epoch named is neither the channel's current one nor a retired one still holding events: never
    used, or a retired epoch gone with its last event (nothing can be added to it again). ``head`` is the
    channel's current position; HTTP answers 409 with it."""

    code = 4202

    def __init__(self, head: Head, epoch: str) -> None:
        EpochMismatch.__init__(self, head, f"the channel has no epoch {epoch!r} holding events")
        self.epoch = epoch


class PublishRefused(HubbubError):
    """A server refused one of many pipelined publishes (``hubbub.client.bulk``) for good: the publish's
    ``channel`` and ``idem`` key, and the server's ``error`` (whose code this error carries)."""

    def __init__(self, channel: str, idem: str | None, error: HubbubError) -> None:
        super().__init__(f"publishing to {channel}: {error.code} {error}", code=error.code)
        self.channel = channel
        self.idem = idem
        self.error = error


class PipelineError(HubbubError):
    """A data pipeline failure (``hubbub.pipeline``) with a message fit for the user; ``str()`` is that
    message."""

    code = 4300


class EpochChanged(PipelineError):
    """The channel's epoch is not the one the read was planned for (it was reset)."""


class DataLossError(PipelineError):
    """A streaming read found a channel reset (new epoch) or trimmed past its offset."""
