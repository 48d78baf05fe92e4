"""What the qpubs HTTP surface and the qrpc listener share (protocols/qpubs.md): settings, the ``delivered``
count of an emit, the emit itself, and the mapping of core errors to qpubs's messages and codes.

``delivered`` (§3) counts the recipients at commit time: every connection of any dialect the event is queued
to, where each qpubs stream (an HTTP listen or once, a qrpc ``listen``/``once`` call) counts once and a
``listenExclusive`` group counts once, plus every durable subscription that journaled it. It is counted in
the publish's ``done`` callback, which the write batcher runs right before the live fan-out of the same
commit, in the same loop step: the subscriptions it sees are exactly those the fan-out delivers to. On a node
of several workers every other worker counts its own the same way as the event arrives there, and the emit
waits for them (``qpubs_delivered.py``).

Concurrency contract: everything runs on the event loop thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from hubbub.auth import Identity
from hubbub.core.api import ConsumerService, Core, Session, new_session_id
from hubbub.dialects import qpubs as qpd
from hubbub.errors import (
    AuthError,
    BadChannel,
    ConsumerBusy,
    ConsumerExists,
    ConsumerNotFound,
    HubbubError,
    LimitExceeded,
    RateLimited,
    TooManyConsumers,
    UnknownBatch,
)
from hubbub.events import Event, Publisher
from hubbub.log.base import AppendRequest, AppendResult
from hubbub.log.consumers import DEFAULT_BATCH_BYTES, DEFAULT_BATCH_WAIT_MS

__all__ = [
    "DIALECT",
    "OtherRecipients",
    "QpubsSettings",
    "Recipients",
    "emit",
    "qpubs_error",
    "recipients",
    "session_recipients",
]

DIALECT = "qpubs"


@dataclass(frozen=True, slots=True)
class QpubsSettings:
    """The ``qpubs.*`` configuration keys (docs/dialects/qpubs.md)."""

    separator: str = qpd.DEFAULT_SEPARATOR
    heartbeat_s: float = 15.0
    batch_bytes: int = DEFAULT_BATCH_BYTES
    batch_wait_ms: int = DEFAULT_BATCH_WAIT_MS
    #: ``qpubs.auth`` resolved: a token is required (HTTP: README §6; qrpc: an ``auth`` call first).
    auth: bool = False


#: The other worker processes' recipients of an event this one committed (``NodeDelivered.others``).
OtherRecipients = Callable[[Event], Awaitable[int]]


@runtime_checkable
class Recipients(Protocol):
    """A qpubs session encoder that knows how many of its streams an event reaches (each counts once)."""

    def recipients(self, event: Event, subs: Sequence[str]) -> int: ...


def recipients(
    node: Core, consumers: ConsumerService | None, result: AppendResult, origin: Session | None = None
) -> int:
    """``delivered`` for one committed event (see the module docstring). Called from the publish's ``done``
    callback, before the fan-out of its commit."""
    ev = result.event
    n = len(result.journal)
    if consumers is not None:
        n += consumers.groups_matching(ev.channel, ev.tags)
    return n + session_recipients(node, ev, origin)


def session_recipients(node: Core, ev: Event, origin: Session | None) -> int:
    """The connections of this process ``ev`` reaches (each qpubs stream once; ``origin``, the emitting
    connection, only when it hears its own events). Called before the event's fan-out here: a ``once``
    counted is not counted again."""
    subs = node.matching(ev.channel, ev.tags)
    if not subs:
        return 0
    n = 0
    by_session: dict[Session, list[str]] = {}
    for s in subs:
        by_session.setdefault(s.session, []).append(s.sub_id)
    for sess, ids in by_session.items():
        if sess is origin and not sess.echo:
            continue
        enc = sess.encoder
        if isinstance(enc, Recipients):
            n += enc.recipients(ev, ids)
        else:
            n += 1
    return n


async def emit(
    node: Core,
    consumers: ConsumerService | None,
    channel: str,
    payload: bytes,
    *,
    origin: Session | None = None,
    identity: Identity | None = None,
    others: OtherRecipients | None = None,
) -> int:
    """Publish one emitted value (compact JSON) on ``channel``; after the commit, ``delivered``, with
    ``others`` (the other worker processes' recipients: ``qpubs_delivered.py``) added. Raises the core's
    errors (``AuthError``, ``RateLimited``, ``StorageError``, ``ShuttingDown``)."""
    # An HTTP emit is a connection of its own: a fresh id as its app (mapping.md §1).
    sess_id = origin.id if origin is not None else new_session_id()
    user = identity.user if identity is not None else (origin.user if origin is not None else "")
    req = AppendRequest(
        channel=channel,
        publisher=Publisher(DIALECT, user, sess_id, ""),
        payload=payload,
        content_type=qpd.CONTENT_TYPE,
    )
    await node.writable()
    fut: asyncio.Future[tuple[int, Event]] = asyncio.get_running_loop().create_future()

    def done(r: AppendResult | HubbubError) -> None:
        if fut.done():
            return
        if isinstance(r, HubbubError):
            fut.set_exception(r)
        else:
            fut.set_result((recipients(node, consumers, r, origin), r.event))

    node.submit(req, origin, done, identity)
    n, event = await fut
    return n + (await others(event) if others is not None else 0)


def qpubs_error(exc: HubbubError, sub_id: str = "", batch: int = 0) -> qpd.QpubsError:
    """A core error as qpubs answers it (§3, §4 "Errors"); ``status`` is the HTTP status."""
    if isinstance(exc, AuthError):
        if exc.code == 4102:
            return qpd.QpubsError("forbidden", "EPERM", 403)
        return qpd.QpubsError("unauthorized", "EAUTH", 401)
    if isinstance(exc, ConsumerExists):
        return qpd.QpubsError(f"{sub_id}: exists, may not reuse", "EEXIST", 409)
    if isinstance(exc, ConsumerNotFound):
        return qpd.QpubsError(f"{sub_id}: not found", "ENOENT", 404)
    if isinstance(exc, ConsumerBusy):
        return qpd.QpubsError(f"{sub_id}: already listening", "EBUSY", 409)
    if isinstance(exc, UnknownBatch):
        return qpd.QpubsError(f"{sub_id}: unknown batch {batch}", "EBATCH", 400)
    if isinstance(exc, RateLimited):
        return qpd.QpubsError("rate limited", "ERATE", 429)
    if isinstance(exc, TooManyConsumers):
        return qpd.QpubsError("too many durable subscriptions", "ELIMIT", 400)
    if isinstance(exc, LimitExceeded):
        return qpd.QpubsError("too many listeners", "ELIMIT", 400)
    if isinstance(exc, BadChannel):
        return qpd.QpubsError("bad topic, expected string", "EBADTOPIC", 400)
    if exc.code in (4001, 4000):
        return qpd.QpubsError("bad request", "EBADREQ", 400)
    # Storage failure, shutting down, anything else: temporary, the text of its code (never internals).
    return qpd.QpubsError(exc.message, "EAGAIN", 503)
