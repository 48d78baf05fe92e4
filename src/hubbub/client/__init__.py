"""Python clients for hubbub's native protocol (native.md).

:class:`AsyncClient` is the asyncio client; :class:`Client` is the same API, blocking, running an
AsyncClient on a private event loop in a background thread. Subscriptions yield
:class:`~hubbub.events.Event` values and, when the server cannot recover part of a stream, :class:`Gap`
values, so a loss is always explicit. Both reconnect on their own and resume every subscription from the
last position it delivered, without gaps or duplicates.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

#: Where each name comes from. Imported on first use (PEP 562), so that a module needing only part of the
#: package (the pipeline's sink: ``hubbub.client.bulk``, ``hubbub.client._wire``) does not pay for the
#: asyncio client and aiohttp (0.2 s in each of Spark's fresh Python workers).
_FROM = {
    **dict.fromkeys(
        (
            "AsyncClient",
            "CannotConnect",
            "ClientClosed",
            "ClientConnectionError",
            "ClientStatistics",
            "ConnectionLost",
            "Gap",
            "PublishAck",
            "Subscription",
            "SubscriptionStatistics",
            "error_from_frame",
            "event_as_dict",
            "event_from_dict",
        ),
        "hubbub.client.aio",
    ),
    **dict.fromkeys(("Consumer", "ConsumerBatch", "ConsumerItem"), "hubbub.client.consumer"),
    **dict.fromkeys(("Emitter", "Listener"), "hubbub.client.emitter"),
    **dict.fromkeys(
        ("Client", "SyncBatch", "SyncConsumer", "SyncEmitter", "SyncSubscription"), "hubbub.client.sync"
    ),
}


def __getattr__(name: str) -> Any:
    module = _FROM.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


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
