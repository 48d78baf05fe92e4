"""The mist dialect, both generations (protocols/mist.md): one import for the wiring.

Re-exports the shared commands and outputs (:mod:`.mist_common`), the 2015 state machines
(:mod:`.mist2015`) and the 1.x ones (:mod:`.mist1`), and picks a TCP connection's generation from its first
bytes (:func:`tcp_connection`).

Concurrency contract: as the modules it re-exports (a connection object per connection, on the event loop).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Final

from hubbub.channels import canonical
from hubbub.config import Config, ConfigError, DialectSection, Secret, listen_field, parse_listen
from hubbub.errors import BadChannel

from .mist1 import Mist1Connection, Mist1WsConnection, render_event, render_reply
from .mist2015 import Mist2015Connection, Mist2015WsConnection, render_event_tcp, render_event_ws
from .mist_common import (
    CONTENT_TYPE,
    DEFAULT_CHANNEL,
    DEFAULT_MAX_FRAME,
    DEFAULT_MAX_SUBSCRIPTIONS,
    DEFAULT_MAX_TAG_BYTES,
    DEFAULT_MAX_TAGS,
    REPLICA_HEADER,
    Authenticate,
    Close,
    Command,
    ListAll,
    MistGrant,
    Output,
    Publish,
    Register,
    RegistryCommand,
    Send,
    SetTags,
    Subscribe,
    TokenTags,
    Unregister,
    UnsetTags,
    Unsubscribe,
    Who,
    detect_generation,
)
from .spec import DialectSpec

__all__ = [
    "CONTENT_TYPE",
    "DEFAULT_CHANNEL",
    "DEFAULT_MAX_FRAME",
    "DEFAULT_MAX_SUBSCRIPTIONS",
    "DEFAULT_MAX_TAGS",
    "DEFAULT_MAX_TAG_BYTES",
    "REPLICA_HEADER",
    "SPEC",
    "Authenticate",
    "Close",
    "Command",
    "ListAll",
    "Mist1Connection",
    "Mist1WsConnection",
    "Mist2015Connection",
    "Mist2015WsConnection",
    "MistConfig",
    "MistGrant",
    "Output",
    "Publish",
    "Register",
    "RegistryCommand",
    "Send",
    "SetTags",
    "Subscribe",
    "TokenTags",
    "Unregister",
    "UnsetTags",
    "Unsubscribe",
    "Who",
    "detect_generation",
    "render_event",
    "render_event_tcp",
    "render_event_ws",
    "render_reply",
    "tcp_connection",
]


def tcp_connection(
    first: bytes,
    *,
    max_frame: int = DEFAULT_MAX_FRAME,
    max_subscriptions: int = DEFAULT_MAX_SUBSCRIPTIONS,
    max_tags: int = DEFAULT_MAX_TAGS,
    max_tag_bytes: int = DEFAULT_MAX_TAG_BYTES,
    channel: str = DEFAULT_CHANNEL,
    auth_required: bool = False,
) -> Mist2015Connection | Mist1Connection | None:
    """The state machine for a mist TCP connection whose first received bytes are ``first`` (mist.md §1:
    ``{`` → 1.x, anything else → 2015), or None while ``first`` is empty. The caller then feeds it
    ``first`` itself and everything after."""
    generation = detect_generation(first)
    if generation is None:
        return None
    cls = Mist1Connection if generation == "mist1" else Mist2015Connection
    return cls(
        max_frame=max_frame,
        max_subscriptions=max_subscriptions,
        max_tags=max_tags,
        max_tag_bytes=max_tag_bytes,
        channel=channel,
        auth_required=auth_required,
    )


#: Mist as the server wires it (mist.md §1): the 2015 and 1.x WebSocket routes, one TCP listener for both
#: generations (told apart by the first byte), text frames, the oldest event dropped when a client falls
#: behind (best effort, no way to report a gap: protocols README §4).
@dataclass(frozen=True, slots=True)
class MistConfig(DialectSection):
    """mist's configuration section (protocols/mist.md §1; its limits are the shared limits.*)."""

    SECTION: ClassVar[str] = "mist"
    HELP: ClassVar[Mapping[str, str]] = {
        "enabled": "serve mist: the TCP listener and WebSocket /mist/ws and /mist/v1/ws (true/false)",
        "tcp_listen": "HOST:PORT of the mist TCP listener (the 2015 line protocol and 1.x JSON alike)",
        "channel": "the channel every mist publish is stored on (a canonical path)",
        "auth": "auth for mist (TCP and WebSocket); empty means auth.mode",
        "token": "an extra master (admin) token mist accepts (masked in logs)",
    }
    enabled: bool = True
    tcp_listen: str = listen_field("127.0.0.1:1445")
    channel: str = DEFAULT_CHANNEL
    auth: str = ""  # "" means auth.mode
    #: An extra master token (upstream's --token); masked in repr.
    token: Secret = field(default_factory=lambda: Secret(""))

    def validate(self, config: Config) -> None:
        DialectSection.validate(self, config)
        parse_listen(self.tcp_listen, "mist.tcp_listen")
        try:
            if canonical(self.channel, config.limits.max_channel_bytes) != self.channel:
                raise BadChannel("not canonical")
        except BadChannel:
            raise ConfigError("mist.channel: must be a canonical channel path such as /mist") from None


SPEC: Final = DialectSpec(
    name="mist",
    section="mist",
    config=MistConfig,
    ws_routes=("/mist/ws", "/mist/v1/ws"),
    stream_listeners=("mist.tcp_listen",),
    overflow="drop_oldest",
    binding="hubbub.transports.mist_tcp:mount",
    labels=("mist2015", "mist1"),
)
