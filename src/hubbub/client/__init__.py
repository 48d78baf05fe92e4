"""Python clients for hubbub's native protocol (native.md).

:class:`AsyncClient` is the asyncio client; :class:`Client` is the same API, blocking, running an
AsyncClient on a private event loop in a background thread. Subscriptions yield
:class:`~hubbub.events.Event` values and, when the server cannot recover part of a stream, :class:`Gap`
values, so a loss is always explicit. Both reconnect on their own and resume every subscription from the
last position it delivered, without gaps or duplicates.
"""

from __future__ import annotations

from hubbub.client.aio import (
    AsyncClient,
    CannotConnect,
    ClientClosed,
    ClientConnectionError,
    ClientStatistics,
    ConnectionLost,
    Gap,
    PublishAck,
    Subscription,
    SubscriptionStatistics,
    error_from_frame,
    event_as_dict,
    event_from_dict,
)
from hubbub.client.consumer import Consumer, ConsumerBatch, ConsumerItem
from hubbub.client.emitter import Emitter, Listener
from hubbub.client.sync import Client, SyncBatch, SyncConsumer, SyncEmitter, SyncSubscription

__all__ = [
    "AsyncClient",
    "CannotConnect",
    "Client",
    "ClientClosed",
    "ClientConnectionError",
    "ClientStatistics",
    "ConnectionLost",
    "Consumer",
    "ConsumerBatch",
    "ConsumerItem",
    "Emitter",
    "Gap",
    "Listener",
    "PublishAck",
    "Subscription",
    "SubscriptionStatistics",
    "SyncBatch",
    "SyncConsumer",
    "SyncEmitter",
    "SyncSubscription",
    "error_from_frame",
    "event_as_dict",
    "event_from_dict",
]
