"""The declared interface of a dialect (ARCHITECTURE §2): what its sans-I/O connection looks like to a driver,
and the :class:`DialectSpec` value that names what the server wires for it.

A dialect is one connection class (bytes or frames in, :mod:`~hubbub.dialects.actions` out) and one spec.
The drivers in :mod:`hubbub.transports` pump a socket through the connection: the WebSocket driver hands it
each frame (:class:`FrameConnection`), the byte-stream driver each read (:class:`StreamConnection`). What
the spec declares (routes, listeners, overflow policy, close mapping) is data; the per-node state a dialect
needs beside the core (mist's token registry, WearScript's hub) is built by its binding in
``hubbub.transports`` from the spec's config ``section``.

Concurrency contract: a connection object belongs to one connection and is called from one thread; specs are
immutable values.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeAlias

from hubbub.config import DialectSection, NativeConfig
from hubbub.disconnect import Disconnect

__all__ = [
    "DialectSpec",
    "FrameConnection",
    "Overflow",
    "StreamConnection",
    "as_is",
]

#: A session's overflow policy, by the value of ``hubbub.core.session.Overflow``: drop the oldest event (best
#: effort, no way to report a gap), close the connection as a slow consumer, or catch up from the log.
Overflow: TypeAlias = Literal["drop_oldest", "disconnect", "catch_up"]


class FrameConnection(Protocol):
    """A connection fed WebSocket frames: each text (``str``) or binary (``bytes``) frame gives the actions
    it asks for."""

    def receive_frame(self, frame: bytes | str, binary: bool = False) -> Sequence[Any]: ...


class StreamConnection(Protocol):
    """A connection fed a byte stream: each read (of any size, cut anywhere) gives the actions of the messages
    it completes. ``messages`` counts the complete messages received (a listener's first-message deadline
    ends at the first); ``buffered`` is what waits for the rest of a message (bounded by the connection)."""

    @property
    def messages(self) -> int: ...

    @property
    def buffered(self) -> int: ...

    def receive_data(self, data: bytes | bytearray | memoryview) -> Sequence[Any]: ...


def as_is(reason: Disconnect) -> Disconnect:
    """The close mapping of a dialect whose peers see every reason as it is."""
    return reason


@dataclass(frozen=True, slots=True)
class DialectSpec:
    """What the server wires for one dialect.

    ``section`` is its configuration section (``<section>.enabled`` turns it on) and ``config`` that
    section's class, which lives with the dialect: its keys, defaults and checks (the composition root gives
    the registry's to the loader: a dialect's keys need no edit of ``hubbub.config``; native's, the node's
    base, is a core section, ``NativeConfig``, which the loader has already); ``ws_routes`` the
    paths of its WebSocket routes; ``stream_listeners`` the configuration keys of its byte-stream listeners
    (each a ``host:port``); ``overflow`` its sessions' policy when the queue is full; ``close_code`` maps a
    session's end or kick to the close its peers see; ``text`` whether its frames go out as WebSocket text
    (else binary); ``keepalive`` whether the WebSocket driver pings and times out silent peers (the keys
    ``ping_interval_s`` and ``read_timeout_s`` of the binding's settings).

    ``binding`` names the dialect's binding in :mod:`hubbub.transports` as ``"module:function"`` (the
    ``mount`` that builds its per-node state from the section; the transports' registry,
    :mod:`hubbub.transports.dialects`, imports it by that name, so a dialect never imports a transport and
    the transports' registry lists no dialect); ``labels`` are the ``dialect`` labels its sessions count
    under in ``/metrics`` (its name unless it has variants: mist's two generations)."""

    name: str
    section: str
    config: type[DialectSection] | type[NativeConfig]
    ws_routes: tuple[str, ...] = ()
    stream_listeners: tuple[str, ...] = ()
    overflow: Overflow = "drop_oldest"
    close_code: Callable[[Disconnect], Disconnect] = as_is
    text: bool = True
    keepalive: bool = True
    binding: str = ""
    labels: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.section != self.config.SECTION:
            raise ValueError(f"{self.name}: section {self.section!r} but config for {self.config.SECTION!r}")

    @property
    def metric_labels(self) -> tuple[str, ...]:
        """The ``dialect`` labels of its sessions: ``labels``, else its name."""
        return self.labels or (self.name,)
