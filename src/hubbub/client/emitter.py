"""qpubs' emitter API over the native client: ``emit``, ``listen``, ``once`` and ``ignore`` on topics, as
qpubs users know them (``shared/protocols/qpubs.md`` §1-§2).

::

    emitter = Emitter(client)                      # separator "." by default
    await emitter.listen("orders.*", on_order)     # on_order(value, topic): a function or coroutine function
    await emitter.emit("orders.eu", {"id": 7})
    value = await emitter.once("orders.us", timeout=5)
    await emitter.ignore("orders.*", on_order)

Topics map to channels as qpubs.md §1 says (``a.b`` is ``/a/b``): an exact topic, a head wildcard ``foo.*``
(every topic that starts with ``foo.``) or a tail wildcard ``*.bar`` (every topic that ends with ``.bar``);
``*`` at both ends is refused (``ValueError``), and a wildcard without the separator next to it matches
nothing. Values are any JSON value, published as ``application/json``; an event from another dialect
arrives as qpubs.md §2 says (a JSON payload parsed, text as a string). Listeners receive the events of every
dialect, including this client's own emits. Live only, at most once: durable, acknowledged delivery is
:meth:`AsyncClient.consume`.

Each listen is a native subscription (a head wildcard subscribes to the subtree, a tail wildcard to every
channel, and the client keeps the matching events). Concurrency contract: an :class:`Emitter` belongs to its
client's event loop; listeners run on it, one event at a time per listen, and a listener that raises is
logged and stays registered.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Callable
from typing import Any

import orjson

from hubbub.channels import from_separated, to_separated
from hubbub.client._wire import PublishAck
from hubbub.client.subscription import Subscription
from hubbub.events import Event

__all__ = ["Emitter", "Handler", "Listener", "topic_matcher"]

log = logging.getLogger("hubbub.client")

Handler = Callable[[Any, str], Any]


def topic_matcher(topic: str, sep: str = ".") -> tuple[str, Callable[[str], bool]]:
    """``(native pattern to subscribe, test of a topic)`` for a qpubs listen topic (qpubs.md §1)."""
    if not isinstance(topic, str):
        raise ValueError("bad topic, expected string")
    if len(topic) >= 1 and topic[0] == "*" and topic[-1] == "*":
        raise ValueError("cannot wildcard both head and tail")
    if topic.endswith("*"):
        head = topic[:-1]
        if not head.endswith(sep):
            return "/**", lambda t: False
        base = from_separated(head[: -len(sep)], sep) if head[: -len(sep)] else "/"
        return ("/**" if base == "/" else base + "/**"), lambda t: t.startswith(head)
    if topic.startswith("*"):
        tail = topic[1:]
        if not tail.startswith(sep):
            return "/**", lambda t: False
        return "/**", lambda t: t.endswith(tail)
    return from_separated(topic, sep), lambda t: t == topic


def _value(event: Event) -> Any:
    """qpubs.md §2 ``jsonval``: a JSON payload parsed, anything else as text."""
    if event.content_type.split(";")[0].strip().lower().endswith("json"):
        with contextlib.suppress(ValueError):
            return orjson.loads(event.payload)
    return event.payload.decode("utf-8", "replace")


class Listener:
    """One ``listen`` (or ``once``) of an :class:`Emitter`."""

    def __init__(self, emitter: Emitter, topic: str, fn: Handler, sub: Subscription, once: bool) -> None:
        self.topic = topic
        self.fn = fn
        self.once = once
        self._emitter = emitter
        self._sub = sub
        self._task: asyncio.Task[None] | None = None

    async def _run(self, test: Callable[[str], bool]) -> None:
        sep = self._emitter.separator
        async for item in self._sub:
            if not isinstance(item, Event):
                continue  # a gap: live listens start now, nothing to recover
            topic = to_separated(item.channel, sep)
            if not test(topic):
                continue
            try:
                result = self.fn(_value(item), topic)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("a qpubs listener for %r failed", self.topic)
            if self.once:
                break
        self._emitter._forget(self)
        await self._sub.unsubscribe()

    async def remove(self) -> None:
        """Stop listening. Idempotent."""
        self._emitter._forget(self)
        task = self._task
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._sub.unsubscribe()


class Emitter:
    """See the module docstring. ``client`` is an :class:`~hubbub.client.AsyncClient`."""

    def __init__(self, client: Any, separator: str = ".") -> None:
        if not separator or "*" in separator:
            raise ValueError("the separator must be non-empty and must not contain '*'")
        self.client = client
        self.separator = separator
        self._listeners: list[Listener] = []

    async def emit(self, topic: str, value: Any) -> PublishAck | None:
        """Publish ``value`` (any JSON value) on ``topic``, once stored: its acknowledgement."""
        if not isinstance(topic, str):
            raise ValueError("bad topic, expected string")
        ack: PublishAck | None = await self.client.publish(
            from_separated(topic, self.separator), orjson.dumps(value), content_type="application/json"
        )
        return ack

    async def listen(self, topic: str, fn: Handler) -> Listener:
        """Call ``fn(value, topic)`` for each event on a matching topic from now on; returns once the
        server confirmed the subscription."""
        return await self._add(topic, fn, once=False)

    async def once(self, topic: str, fn: Handler | None = None, *, timeout: float | None = None) -> Any:  # noqa: ASYNC109
        """With ``fn``: call it for the next matching event only (returns the :class:`Listener`). Without:
        wait for the next matching event and return its value (``TimeoutError`` after ``timeout`` s)."""
        if fn is not None:
            return await self._add(topic, fn, once=True)
        got: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        def take(value: Any, _topic: str) -> None:
            if not got.done():
                got.set_result(value)

        listener = await self._add(topic, take, once=True)
        try:
            async with asyncio.timeout(timeout):
                return await got
        finally:
            await listener.remove()

    async def ignore(self, topic: str, fn: Handler | None = None) -> int:
        """Remove the listeners of ``topic`` (only those calling ``fn``, when given): how many."""
        gone = [x for x in self._listeners if x.topic == topic and (fn is None or x.fn == fn)]
        for x in gone:
            await x.remove()
        return len(gone)

    def listeners(self, topic: str | None = None) -> list[Listener]:
        return [x for x in self._listeners if topic is None or x.topic == topic]

    async def close(self) -> None:
        """Remove every listener."""
        for x in list(self._listeners):
            await x.remove()

    async def _add(self, topic: str, fn: Handler, *, once: bool) -> Listener:
        pattern, test = topic_matcher(topic, self.separator)
        sub: Subscription = await self.client.subscribe(pattern).start()
        listener = Listener(self, topic, fn, sub, once)
        self._listeners.append(listener)
        listener._task = asyncio.create_task(listener._run(test), name=f"hubbub-emitter {topic}")
        return listener

    def _forget(self, listener: Listener) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(listener)
