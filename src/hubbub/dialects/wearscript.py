"""The WearScript dialect (protocols/wearscript.md): frames, names, the hub's state and its test handler.

Every WearScript message, both ways, is one binary WebSocket frame holding a msgpack array
``[channel, arg1, …]``. hubbub is the **hub**: devices announce what they listen to on the ``subscriptions``
channel, and the hub forwards data messages to the connections whose announced set matches, and publishes
them into the shared tree.

Three pieces, none touching a socket, the loop, the router or the log:

* :func:`decode_frame` / :func:`pack` / :func:`render_event`: the codec (§1, mapping.md §4-§5), kept in
  :mod:`hubbub.dialects.wearscript_codec` and re-exported here.
* :class:`WearscriptHub`: the hub's state shared by every WearScript connection of a node: the devices each
  connection announced, the hub's own list (§3), and who matches a channel (§2). On a node of several
  processes (``serve --workers``) it also holds the other processes' connections as they announce them
  (:meth:`WearscriptHub.remote_announce`): the greeting lists them, test-handler replies and
  ``channelsExternal`` see them, and their departures are told here as a local connection's are.
* :class:`WearscriptConnection`: one connection's state machine. It is fed frames and returns **outputs**,
  to be carried out in order: :class:`Send` (a frame for this connection), :class:`Forward` (one frame for
  other connections), :class:`Close`, and the commands for the core: :class:`Publish` (store and deliver a
  data message), :class:`ListenChanged` (the connection's channel set changed: subscribe it in the core),
  :class:`Exists` (the test handler asks whether any subscription of any dialect matches a channel; answer
  with :meth:`WearscriptConnection.reply_exists`) and :class:`HubListChanged` (broadcast the hub list, at
  most once per 100 ms).

Names and channels: a name ``a:b`` is the canonical channel ``/a/b`` (mapping.md §2.4). A subscription name
``s`` matches channel ``c`` when ``c == s`` or ``c`` begins with ``s + ":"``; in canonical terms ``s`` is a
segment prefix of ``c``, except that ``""`` (the root) matches only ``""`` (§2).

Concurrency contract: a hub and its connections belong to one event loop and are called from it only. The
module-level functions are pure and thread-safe.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, TypeAlias

from hubbub.channels import MAX_CHANNEL_BYTES, Pattern, from_separated, to_separated
from hubbub.config import Config, ConfigError, DialectSection, Secret
from hubbub.disconnect import Disconnect
from hubbub.errors import AuthError, BadChannel, HubbubError, LimitExceeded, ShuttingDown

from .actions import Close, Send
from .spec import DialectSpec
from .wearscript_codec import (
    CLOSE_INVALID,
    CLOSE_POLICY,
    CLOSE_UNSUPPORTED,
    CONTENT_TYPE,
    HEAD_HEADER,
    MAX_DEPTH,
    BadFrame,
    Frame,
    decode_frame,
    pack,
    render_event,
)

__all__ = [
    "CONTENT_TYPE",
    "DEFAULT_GROUP_DEVICE",
    "HEAD_HEADER",
    "MAX_DEPTH",
    "SEPARATOR",
    "SPEC",
    "SUBSCRIPTIONS",
    "BadFrame",
    "Close",
    "Exists",
    "Forward",
    "Frame",
    "HubListChanged",
    "ListenChanged",
    "Output",
    "Publish",
    "Send",
    "WearscriptConfig",
    "WearscriptConnection",
    "WearscriptHub",
    "advertised_name",
    "channel_of",
    "decode_frame",
    "listen_patterns",
    "matches",
    "name_of",
    "pack",
    "refused",
    "render_event",
    "wire_close",
]

SEPARATOR: Final = ":"
SUBSCRIPTIONS: Final = "subscriptions"
DEFAULT_GROUP_DEVICE: Final = "server:0"


def channel_of(name: str, max_bytes: int = MAX_CHANNEL_BYTES) -> str:
    """The canonical channel of a WearScript name (mapping.md §2.4). Raises :class:`BadChannel` for a name
    that is not UTF-8 text or is too long."""
    return from_separated(name, SEPARATOR, max_bytes)


def name_of(channel: str) -> str:
    """The WearScript name of a canonical channel."""
    return to_separated(channel, SEPARATOR)


def matches(sub_channel: str, channel: str) -> bool:
    """Does a subscription (canonical) match a channel (canonical)? §2: a segment prefix, but the root
    matches only the root."""
    if sub_channel == "/":
        return channel == "/"
    return channel == sub_channel or channel.startswith(sub_channel + "/")


def listen_patterns(sub_channel: str) -> list[str]:
    """Native patterns that select what a WearScript subscription matches, for the core's router: the
    channel and its subtree (``/a/**`` matches ``/a`` too), or just ``/`` for the root."""
    return ["/"] if sub_channel == "/" else [sub_channel + "/**"]


def advertised_name(pattern: Pattern) -> str:
    """The name the hub advertises for another dialect's subscription (§3): its literal prefix, rendered as
    a WearScript name (``/a/*/c`` → ``a``; ``/**`` and the root → ``""``)."""
    lit: list[str] = []
    for p in pattern.parts:
        if p is None:
            break
        lit.append(p)
    if not lit or lit == [""]:
        return ""
    return name_of("/" + "/".join(lit))


def wire_close(reason: Disconnect) -> Disconnect:
    """The close a WearScript peer sees for a session's end or kick: an expired token closes with 1008 (§7,
    the dialect has no error reply), every other reason as it is."""
    return Disconnect.POLICY_VIOLATION if reason == Disconnect.TOKEN_EXPIRED else reason


def refused(cmd: object, exc: HubbubError) -> list[Output]:
    """The answer to the core refusing a publish: WearScript has no error reply, so the connection closes
    (§7: a publish not allowed, or over a limit, closes 1008; protocols README §5: a storage failure 1011,
    a stopping server 1001)."""
    if isinstance(exc, AuthError | LimitExceeded):
        return [Close(Disconnect.POLICY_VIOLATION, "publish not allowed")]
    if isinstance(exc, ShuttingDown):
        return [Close(Disconnect.GOING_AWAY)]
    return [Close(Disconnect.INTERNAL_ERROR)]


# -- outputs ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Forward:
    """One binary frame for each of ``targets`` (hub connection ids; this connection may be among them).
    ``reply`` is the canonical channel of a test-handler reply (published on it, §5: each target must be
    allowed to read it), ``None`` for ``subscriptions`` frames. ``relayed`` marks a reply that carries the
    asker's own values (the ``publish`` command): that is the asker's publish, which its identity must be
    allowed to make."""

    data: bytes
    targets: tuple[int, ...]
    reply: str | None = None
    relayed: bool = False


@dataclass(frozen=True, slots=True)
class Publish:
    """Store a data message on ``channel`` (canonical) with ``payload`` (the arguments' msgpack array, as
    received) and content type :data:`CONTENT_TYPE`, then deliver it to every matching subscriber of every
    dialect except this connection (§4 "Self"). A publish the connection's identity may not make closes it
    with 1008 (§7). ``head`` is the frame's :meth:`Frame.odd_head`: when not empty, store it in the event's
    :data:`HEAD_HEADER`."""

    channel: str
    payload: bytes
    head: str = ""


@dataclass(frozen=True, slots=True)
class ListenChanged:
    """The connection's external set changed: it now listens to exactly ``channels`` (canonical, sorted).
    The wiring subscribes it in the core with :func:`listen_patterns` of each, and drops the rest."""

    channels: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Exists:
    """Does any subscription of any dialect match ``channel`` (canonical)? Answer with
    :meth:`WearscriptConnection.reply_exists`, passing ``resp``."""

    channel: str
    resp: str


@dataclass(frozen=True, slots=True)
class HubListChanged:
    """The hub list changed: send :meth:`WearscriptHub.hub_list_frame` to every WearScript connection (at
    most once per 100 ms; the latest list wins)."""


Output: TypeAlias = Send | Forward | Close | Publish | ListenChanged | Exists | HubListChanged


# -- the hub ------------------------------------------------------------------------------------------------


class WearscriptHub:
    """The hub's state (§3): the devices each connection announced, in order, and the hub's own list.

    Connections are numbered by :meth:`attach` in the order they arrive, which is the greeting's "oldest
    connection first". Matching a channel against every connection's set is a scan over connections: meshes
    of devices are tens or hundreds of connections, and each connection's set is checked by prefix lookups,
    not by testing every name.
    """

    def __init__(
        self,
        group_device: str = DEFAULT_GROUP_DEVICE,
        *,
        test_handler: bool = True,
        hub_channels: Sequence[str] = (),
        advertise_foreign: bool = True,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self.group_device = group_device
        self.test_handler = test_handler
        self.advertise_foreign = advertise_foreign
        self._next = 0
        #: connection id -> {group:device -> names as announced}, both in announcement order
        self._devices: dict[int, dict[str, list[str]]] = {}
        #: connection id -> canonical channels of the union of its devices' lists
        self._external: dict[int, frozenset[str]] = {}
        self._bound: set[str] = {channel_of("test" + SEPARATOR + group_device)} if test_handler else set()
        self._fixed = set(hub_channels)
        self._foreign: Counter[str] = Counter()
        #: The wall clock (ns) that orders connections across the processes of a node (oldest first).
        self.clock = clock
        self._since: dict[int, int] = {}
        #: Called with ``(cid, group:device, names)`` when a connection of this process announces a list
        #: (names empty: the device is removed), and ``(cid, "", None)`` when it closes: what the transport
        #: tells the other processes of the node.
        self.observer: Callable[[int, str, list[str] | None], None] | None = None
        #: Other processes' connections: (process, its connection id) -> the id they have here, and back.
        self._remote: dict[tuple[str, int], int] = {}
        self._remote_of: dict[int, tuple[str, int]] = {}
        #: The other processes' advertised names (their foreign subscriptions), per process.
        self._remote_foreign: dict[str, frozenset[str]] = {}

    # -- connections --

    def attach(self) -> tuple[int, list[bytes]]:
        """A new connection: its id and its greeting frames (§3 "Greeting")."""
        cid = self._next
        self._next += 1
        frames = self.greeting_frames(cid)
        self._devices[cid] = {}
        self._external[cid] = frozenset()
        self._since[cid] = self.clock()
        return cid, frames

    def greeting_frames(self, cid: int) -> list[bytes]:
        """The greeting of connection ``cid`` as the hub stands now: its list, then every other connection's
        devices, oldest connection first."""
        frames = [self.hub_list_frame()]
        for other, devices in self._oldest_first():
            for gd, names in devices.items():
                if names and other != cid:
                    frames.append(pack([SUBSCRIPTIONS, gd, names]))
        return frames

    def _oldest_first(self) -> list[tuple[int, dict[str, list[str]]]]:
        """Every connection's devices, oldest connection first (this process's and the others')."""
        since = self._since
        return sorted(self._devices.items(), key=lambda item: (since.get(item[0], 0), item[0]))

    def detach(self, cid: int) -> list[bytes]:
        """A connection closed: the departure frames for every remaining connection, one per device it
        announced, in announcement order."""
        devices = self._devices.pop(cid, {})
        self._external.pop(cid, None)
        self._since.pop(cid, None)
        remote = self._remote_of.pop(cid, None)
        if remote is not None:
            del self._remote[remote]
        elif self.observer is not None:
            self.observer(cid, "", None)
        return [pack([SUBSCRIPTIONS, gd, []]) for gd, names in devices.items() if names]

    def connections(self) -> list[int]:
        """This process's connections (not the other processes' it knows of)."""
        return [c for c in self._devices if c not in self._remote_of]

    def is_remote(self, cid: int) -> bool:
        """Is ``cid`` another process's connection?"""
        return cid in self._remote_of

    # -- other processes' connections --

    def remote_announce(self, process: str, rcid: int, since: int, gd: str, names: list[str]) -> bool:
        """Connection ``rcid`` of ``process``, there since ``since`` (its :attr:`clock`), announced ``names``
        for ``gd`` (empty: removed). ``True`` when that changed what this hub knew (the frame is news to this
        process's connections). A name that is no channel is left out (its process closes that
        connection)."""
        cid = self._remote.get((process, rcid))
        if cid is None:
            if not names:
                return False
            cid = self._next
            self._next += 1
            self._remote[(process, rcid)] = cid
            self._remote_of[cid] = (process, rcid)
            self._devices[cid] = {}
            self._since[cid] = since
        devices = self._devices[cid]
        if devices.get(gd, []) == names:
            return False
        if names:
            devices[gd] = list(names)
        else:
            devices.pop(gd, None)
        ext: set[str] = set()
        for ns in devices.values():
            for n in ns:
                try:
                    ext.add(channel_of(n))
                except BadChannel:
                    continue
        self._external[cid] = frozenset(ext)
        return True

    def remote_detach(self, process: str, rcid: int) -> list[bytes]:
        """Connection ``rcid`` of ``process`` closed: its departure frames (see :meth:`detach`)."""
        cid = self._remote.get((process, rcid))
        return [] if cid is None else self.detach(cid)

    def remote_gone(self, process: str) -> list[bytes]:
        """``process`` is gone (it exited, or was killed): the departure frames of all its connections, oldest
        first (its advertised names: :meth:`remote_foreign` with None)."""
        out: list[bytes] = []
        for (p, _), cid in list(self._remote.items()):
            if p == process:
                out += self.detach(cid)
        return out

    def since(self, cid: int) -> int:
        """When connection ``cid`` arrived (:attr:`clock`)."""
        return self._since.get(cid, 0)

    def local_devices(self) -> list[tuple[int, str, list[str]]]:
        """This process's connections' devices, oldest first: what a new process of the node is told."""
        return [
            (cid, gd, list(names))
            for cid, devices in self._devices.items()
            if cid not in self._remote_of
            for gd, names in devices.items()
        ]

    def local_foreign(self) -> frozenset[str]:
        """The names this process advertises for other dialects' subscriptions."""
        return frozenset(n for n, k in self._foreign.items() if k > 0)

    def remote_foreign(self, process: str, names: frozenset[str] | None) -> bool:
        """``process`` advertises ``names`` now (None: it is gone); ``True`` when the hub list changed."""
        before = self.hub_list()
        if names:
            self._remote_foreign[process] = names
        else:
            self._remote_foreign.pop(process, None)
        return self.hub_list() != before

    def others(self, cid: int) -> tuple[int, ...]:
        return tuple(c for c in self._devices if c != cid)

    def announce(self, cid: int, gd: str, names: list[str], max_channels: int) -> frozenset[str] | None:
        """Replace ``gd``'s list on connection ``cid`` (an empty list removes the device). Returns the
        connection's new external set (canonical channels), or ``None`` when it would exceed
        ``max_channels`` (nothing is changed then). Raises :class:`BadChannel` for a name that is not a
        channel."""
        canon = {channel_of(n) for n in names}
        devices = self._devices[cid]
        union = set(canon)
        for other, ns in devices.items():
            if other != gd:
                union.update(channel_of(n) for n in ns)
        if len(union) > max_channels:
            return None
        if names:
            devices[gd] = list(names)
        else:
            devices.pop(gd, None)
        ext = frozenset(union)
        self._external[cid] = ext
        if self.observer is not None:
            self.observer(cid, gd, list(names))
        return ext

    def matching(self, channel: str, exclude: int | None = None) -> tuple[int, ...]:
        """Connections whose external set matches ``channel`` (canonical), in connection order."""
        probes = _prefixes(channel)
        return tuple(
            c for c, ext in self._external.items() if c != exclude and ext and not probes.isdisjoint(ext)
        )

    def external(self) -> dict[str, list[str]]:
        """Every known device's list (``channelsExternal``), oldest connection first."""
        out: dict[str, list[str]] = {}
        for _, devices in self._oldest_first():
            for gd, names in devices.items():
                out[gd] = list(names)
        return out

    # -- the hub list --

    def hub_list(self) -> list[str]:
        """The hub's own list (§3): sorted, no duplicates."""
        names = {name_of(c) for c in self._bound} | self._fixed
        if self.advertise_foreign:
            names.update(n for n, k in self._foreign.items() if k > 0)
            for remote in self._remote_foreign.values():
                names |= remote
        return sorted(names)

    def hub_list_frame(self) -> bytes:
        return pack([SUBSCRIPTIONS, self.group_device, self.hub_list()])

    def foreign_added(self, pattern: Pattern) -> bool:
        """Another dialect's connection subscribed ``pattern``; ``True`` when the hub list changed."""
        if not self.advertise_foreign:
            return False
        name = advertised_name(pattern)
        self._foreign[name] += 1
        return self._foreign[name] == 1 and name not in self._fixed and channel_of(name) not in self._bound

    def foreign_removed(self, pattern: Pattern) -> bool:
        """Another dialect's subscription went away; ``True`` when the hub list changed."""
        if not self.advertise_foreign:
            return False
        name = advertised_name(pattern)
        left = self._foreign[name] - 1
        if left > 0:
            self._foreign[name] = left
            return False
        self._foreign.pop(name, None)
        return name not in self._fixed and channel_of(name) not in self._bound

    # -- the test handler (§5) --

    def test_bound(self, channel: str) -> bool:
        """Is ``channel`` (canonical) handled by the test handler?"""
        return bool(self._bound) and not _prefixes(channel).isdisjoint(self._bound)

    def bind(self, name: str) -> bool:
        """``subscribe``: bind a channel to the test handler; ``True`` when the hub list changed."""
        before = self.hub_list()
        self._bound.add(channel_of(name))
        return self.hub_list() != before

    def unbind(self, name: str) -> bool:
        """``unsubscribe``; ``True`` when the hub list changed."""
        before = self.hub_list()
        self._bound.discard(channel_of(name))
        return self.hub_list() != before


def _prefixes(channel: str) -> set[str]:
    """The canonical subscriptions that match ``channel``: the channel and each segment prefix (the root only
    for the root itself)."""
    if channel == "/":
        return {"/"}
    out = {channel}
    i = channel.find("/", 1)
    while i != -1:
        if i > 1:  # "//a" (name ":a") has the prefix [""], which is the root: it matches only the root
            out.add(channel[:i])
        i = channel.find("/", i + 1)
    return out


# -- one connection -----------------------------------------------------------------------------------------


class WearscriptConnection:
    """One WearScript connection's state machine (§3-§5, §8).

    ``max_frame`` is ``limits.max_frame``; ``max_channels`` is ``limits.max_subscriptions``, the most
    channels one connection's external set may hold.
    """

    def __init__(self, hub: WearscriptHub, *, max_frame: int = 1 << 20, max_channels: int = 1024) -> None:
        self.hub = hub
        self.max_frame = max_frame
        self.max_channels = max_channels
        self.id, _ = hub.attach()
        self._greeted = False
        self.closed = False

    def greeting(self) -> list[Output]:
        """What to send right after the upgrade (once): the greeting as the hub stands now (a node of several
        processes may have learnt the others' state since the connection arrived)."""
        if self._greeted:
            return []
        self._greeted = True
        return [Send(f) for f in self.hub.greeting_frames(self.id)]

    def on_text(self) -> list[Output]:
        return [Close(CLOSE_UNSUPPORTED, "text frames are not WearScript")]

    def receive_frame(self, frame: bytes | str, binary: bool = False) -> list[Output]:
        """A WebSocket frame (the :class:`~hubbub.dialects.spec.FrameConnection` interface): every message
        is binary (§1), a text frame closes the connection."""
        return self.on_binary(frame) if isinstance(frame, bytes) and binary else self.on_text()

    def on_binary(self, data: bytes) -> list[Output]:
        if self.closed:
            return []
        try:
            frame = decode_frame(data, self.max_frame)
            if frame.name == SUBSCRIPTIONS:
                return self._subscriptions(frame, data)
            channel = channel_of(frame.name)
        except BadFrame as exc:
            return [Close(exc.code, str(exc))]
        except BadChannel as exc:
            return [Close(CLOSE_INVALID, str(exc))]
        if self.hub.test_bound(channel):
            return self._test(frame)
        return [Publish(channel, frame.args_bytes, frame.odd_head())]

    def on_close(self) -> list[Output]:
        """The connection is gone: departure frames for the others."""
        if self.closed:
            return []
        self.closed = True
        frames = self.hub.detach(self.id)
        targets = self.hub.connections()
        return [Forward(f, tuple(targets)) for f in frames] if targets else []

    def _subscriptions(self, frame: Frame, data: bytes) -> list[Output]:
        args = frame.args
        if (
            len(args) < 2
            or not isinstance(args[0], str)
            or not isinstance(args[1], list)
            or not all(isinstance(n, str) for n in args[1])
        ):
            return [Close(CLOSE_INVALID, "subscriptions needs a group:device and a list of channel names")]
        try:
            ext = self.hub.announce(self.id, args[0], args[1], self.max_channels)
        except BadChannel as exc:
            return [Close(CLOSE_INVALID, str(exc))]
        if ext is None:
            return [Close(CLOSE_POLICY, f"more than {self.max_channels} channels on one connection")]
        # The core subscriptions first: once the others learn the list, they may send to it at once.
        out: list[Output] = [ListenChanged(tuple(sorted(ext)))]
        others = self.hub.others(self.id)
        if others:
            out.append(Forward(data, others))
        return out

    # -- the test handler --

    def _test(self, frame: Frame) -> list[Output]:
        args = frame.args
        if len(args) < 2 or not isinstance(args[0], str) or not isinstance(args[1], str):
            return []
        command, resp, rest = args[0], args[1], args[2:]
        hub = self.hub
        group, _, device = hub.group_device.partition(SEPARATOR)
        value: list[Any]
        if command == "group":
            value = [group]
        elif command == "device":
            value = [device]
        elif command == "groupDevice":
            value = [hub.group_device]
        elif command == "channelsInternal":
            value = [hub.hub_list()]
        elif command == "channelsExternal":
            value = [hub.external()]
        elif command == "exists" and rest and isinstance(rest[0], str):
            try:
                return [Exists(channel_of(rest[0]), resp)]
            except BadChannel:
                return []
        elif command == "channel" and all(isinstance(p, str) for p in rest):
            value = [SEPARATOR.join(rest)]
        elif command == "subchannel" and rest and isinstance(rest[0], str):
            value = [rest[0] + SEPARATOR + hub.group_device]
        elif command == "ackchannel" and rest and isinstance(rest[0], str):
            value = [rest[0] + SEPARATOR + "ACK"]
        elif command == "publish":
            return self._reply(resp, list(rest), relayed=True)
        elif command in ("subscribe", "unsubscribe") and rest and isinstance(rest[0], str):
            try:
                changed = hub.bind(rest[0]) if command == "subscribe" else hub.unbind(rest[0])
            except BadChannel:
                return []
            return [HubListChanged()] if changed else []
        else:
            return []
        return self._reply(resp, value)

    def _reply(self, resp: str, value: Iterable[Any], *, relayed: bool = False) -> list[Output]:
        """A reply on ``resp`` to the connections whose set matches it, the asker included; not logged."""
        try:
            channel = channel_of(resp)
        except BadChannel:
            return []
        targets = self.hub.matching(channel)
        return [Forward(pack([resp, *value]), targets, channel, relayed)] if targets else []

    def reply_exists(self, resp: str, exists: bool) -> list[Output]:
        """Render the core's answer to :class:`Exists`."""
        return self._reply(resp, [exists])


#: The WearScript dialect as the server wires it: ``/wearscript/ws`` and ``/wearscript/ws/<secret>``, binary
#: frames, the oldest event dropped when a device falls behind (no way to report a gap, protocols README §4),
#: an expired token closed 1008 (§7).
@dataclass(frozen=True, slots=True)
class WearscriptConfig(DialectSection):
    """WearScript's configuration section (protocols/wearscript.md §1, §7; docs/dialects/wearscript.md)."""

    SECTION: ClassVar[str] = "wearscript"
    HELP: ClassVar[Mapping[str, str]] = {
        "enabled": "serve the WearScript dialect: WebSocket /wearscript/ws[/<secret>] (true/false)",
        "group_device": "the hub's own group:device (test handler channel test:<group:device>)",
        "test_handler": "answer the WearScript test-handler protocol (true/false)",
        "hub_channels": "JSON list of extra channels the WearScript hub always advertises",
        "advertise_foreign": "advertise other dialects' subscriptions to WearScript devices",
        "auth": "auth for the WearScript routes; empty means auth.mode",
        "upstream": "ws:// URL of a WearScript hub to link up to (its /wearscript/ws[/<secret>])",
    }
    enabled: bool = True
    group_device: str = DEFAULT_GROUP_DEVICE
    test_handler: bool = True
    hub_channels: tuple[str, ...] = ()
    advertise_foreign: bool = True
    auth: str = ""  # "" means auth.mode
    #: A WearScript hub this node links up to (ws://…/wearscript/ws[/<secret>]); masked in repr.
    upstream: Secret = field(default_factory=lambda: Secret(""))

    def validate(self, config: Config) -> None:
        DialectSection.validate(self, config)
        group, sep, device = self.group_device.partition(":")
        if not sep or not group or not device:
            raise ConfigError("wearscript.group_device: expected GROUP:DEVICE, such as server:0")
        if self.upstream and not self.upstream.lower().startswith(("ws://", "wss://")):
            raise ConfigError("wearscript.upstream: expected a ws:// or wss:// URL of a WearScript hub")


SPEC: Final = DialectSpec(
    name="wearscript",
    section="wearscript",
    config=WearscriptConfig,
    ws_routes=("/wearscript/ws", "/wearscript/ws/{secret}"),
    overflow="drop_oldest",
    close_code=wire_close,
    text=False,
    binding="hubbub.transports.wearscript_link:mount",
)
